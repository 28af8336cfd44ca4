#!/usr/bin/env bash
# The one prepared GPU run (issue 13, item 6). On a machine with one GPU, CUDA (nvcc), cmake,
# PyTorch and transformers (NVIDIA's cuBLAS/cuDNN/NCCL wheels under site-packages, as PyTorch
# brings them) and no network, from the repository root:
#
#   bash tests/gpu/run.sh            # results in $OUT/gpu-results.txt (else tests/gpu/out/)
#
# 1. configures and builds lib/model with its CUDA backend, the model tests and bench_gpu
#    (-DARCLIGHT_MODEL_ONLY=ON: no Kafka, Avro or curl needed);
# 2. runs every GPU test (ctest -L gpu: 1700-1703) and the CPU model tests (06xx);
# 3. benchmarks fwd + bwd + AdamW of a Qwen2.5-0.5B-shaped model on 4096-token packed
#    micro-batches (bench_gpu train) against transformers' Qwen2 in PyTorch bf16 eager and
#    torch.compile, and serve decode at 1 and 64 sequences (bench_gpu decode) against
#    transformers' generate on the same weights;
# 4. writes everything to one file. Each step has a time limit; the whole run stays inside
#    8 minutes (ARCLIGHT_GPU_BUDGET seconds, default 470).
# Without a CUDA device it stops after the build with exit status 3 (what this machine can
# check: that everything configures and compiles).
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
out_dir=${OUT:-$root/tests/gpu/out}
mkdir -p "$out_dir"
res=$out_dir/gpu-results.txt
log=$out_dir/gpu-log.txt
budget=${ARCLIGHT_GPU_BUDGET:-470}
build=${ARCLIGHT_GPU_BUILD:-$root/build-gpu}
jobs=$(nproc 2>/dev/null || echo 4)
: >"$res"
: >"$log"
say() { echo "$*" | tee -a "$res"; }
left() { echo $((budget - SECONDS)); }
# run LIMIT CMD...: a step with a time limit, output to the log (and the result lines to res)
run() {
  local lim=$1; shift
  local l; l=$(left)
  [ "$l" -lt 5 ] && { say "skipped (time budget spent): $*"; return 124; }
  [ "$lim" -gt "$l" ] && lim=$l
  echo "+ [${lim}s] $*" >>"$log"
  timeout --kill-after=5 "$lim" "$@" >>"$log" 2>&1
  local rc=$?
  [ $rc -eq 124 ] && say "timed out after ${lim}s: $*"
  return $rc
}

say "arclight GPU run $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
nvcc=${CUDACXX:-}
[ -z "$nvcc" ] && for c in /usr/local/cuda/bin/nvcc "$(command -v nvcc 2>/dev/null)"; do [ -n "$c" ] && [ -x "$c" ] && { nvcc=$c; break; }; done
[ -n "$nvcc" ] || { say "no nvcc found (set CUDACXX)"; exit 1; }
say "nvcc: $("$nvcc" --version | tail -1)"
say "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>/dev/null || echo none)"
py=${PYTHON:-python3}
say "python: $($py -c 'import sys, torch, transformers; print(sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())' 2>&1 | tail -1)"

# ---- 1. build ----
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
[ -f "$build/CMakeCache.txt" ] && ! grep -q "CMAKE_GENERATOR:INTERNAL=${gen[1]:-Unix Makefiles}" "$build/CMakeCache.txt" && rm -rf "$build"
if ! run 120 cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DARCLIGHT_MODEL_ONLY=ON \
    -DARCLIGHT_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES=90; then
  say "configure FAILED (see $log):"; grep -E "arclight|Error|error" "$log" | tail -20 | tee -a "$res"; exit 1
fi
grep -E '^-- arclight:' "$log" | sed 's/^-- /  /' | tee -a "$res" >/dev/null
t0=$SECONDS
if ! run 240 cmake --build "$build" -j"$jobs"; then
  say "build FAILED (see $log):"; grep -E "error|Error" "$log" | head -30 | tee -a "$res"; exit 1
fi
say "build: ok in $((SECONDS - t0)) s"

if ! "$build/t1706_cuda_module" >>"$log" 2>&1; then
  say "the CUDA module does not load (see $log):"; grep -E "module|lacks|FAIL" "$log" | tail -5 | tee -a "$res"; exit 1
fi
"$build/t1700_backend_ops" embedding >>"$log" 2>&1
if [ $? -eq 77 ]; then say "CUDA module loads; no CUDA device here: stopping after the build (exit 3)"; exit 3; fi

# ---- 2. tests ----
t0=$SECONDS
run 200 ctest --test-dir "$build" -L gpu --output-on-failure
gpu_rc=$?
grep -E "^(ok|FAIL) |rel L2|max err|differ|loss |tests passed|tests failed|Failed|Passed|Skipped|device:" "$log" | grep -v "^+" | sed 's/^/  /' >>"$res"
say "gpu tests: $( [ $gpu_rc -eq 0 ] && echo passed || echo FAILED ) in $((SECONDS - t0)) s"
run 120 ctest --test-dir "$build" -R "^t06" -j"$jobs"
cpu_rc=$?
say "cpu model tests (06xx): $( [ $cpu_rc -eq 0 ] && echo passed || echo FAILED )"

# ---- 3. benchmarks ----
bench() { # name limit cmd...: runs, copies its result line
  local name=$1 lim=$2; shift 2
  local before; before=$(wc -l <"$log")
  run "$lim" "$@"
  local rc=$?
  tail -n +"$((before + 1))" "$log" | grep '^result' | sed "s/^result/  $name/" | tee -a "$res"
  [ $rc -ne 0 ] && say "  $name: exit $rc (see $log)"
  return 0
}
say "train: fwd+bwd+AdamW, Qwen2.5-0.5B shape, 4096 tokens = 8 x 512 per micro-batch"
bench arclight 90 "$build/bench_gpu" train --tokens 4096 --seqs 8 --steps 10
bench torch-eager 90 "$py" tests/gpu/torch_ref.py train --mode eager --tokens 4096 --seqs 8 --steps 10
wdir=$out_dir/qwen05b-random
mkdir -p "$wdir"
bench save 60 "$build/bench_gpu" save "$wdir"
say "decode: greedy, 128-token prompts, 128 new tokens"
bench arclight-decode 90 "$build/bench_gpu" decode --batch 1,64 --prompt 128 --new 128
bench generate-b1 60 "$py" tests/gpu/torch_ref.py decode --model "$wdir" --batch 1 --prompt 128 --new 128
bench generate-b64 60 "$py" tests/gpu/torch_ref.py decode --model "$wdir" --batch 64 --prompt 128 --new 128
bench torch-compile 150 "$py" tests/gpu/torch_ref.py train --mode compile --tokens 4096 --seqs 8 --steps 10
rm -rf "$wdir"

# ratios against the references measured above
"$py" - "$res" <<'EOF' | tee -a "$res"
import re, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"\s+(\S+) bench=(\w+) .*?tokens_per_s=([\d.]+)", line)
    if m:
        name = m.group(1)
        b = re.search(r" batch=(\d+)", line)
        if name == "arclight-decode" and b: name = "arclight-b" + b.group(1)
        rows[name] = float(m.group(3))
        mfu = re.search(r"mfu=([\d.]+)", line)
        if mfu: rows[m.group(1) + ":mfu"] = float(mfu.group(1))
def ratio(a, b, what):
    if a in rows and b in rows and rows[b] > 0:
        print(f"ratio {what}: {rows[a] / rows[b]:.2f}x")
ratio("arclight", "torch-eager", "train tokens/s arclight / torch eager")
ratio("arclight", "torch-compile", "train tokens/s arclight / torch.compile")
if "arclight:mfu" in rows: print(f"arclight train MFU: {100 * rows['arclight:mfu']:.1f}% (target 45%)")
ratio("arclight-b1", "generate-b1", "decode tokens/s at 1 sequence, arclight / generate")
ratio("arclight-b64", "generate-b64", "decode tokens/s at 64 sequences, arclight / generate (target 3x)")
EOF
say "total: $SECONDS s; log: $log"
[ $gpu_rc -eq 0 ] && [ $cpu_rc -eq 0 ]
