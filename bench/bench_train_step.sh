#!/bin/sh
# One training step (forward + backward + AdamW) of bench/bench_train_step.json (~9.4M
# parameters, Qwen2-style) on a packed micro-batch, arclight CPU vs PyTorch 1.13 CPU, both on
# 2 threads, measured in this run. Prints the ratio (> 1: arclight is faster).
#   sh bench/bench_train_step.sh BUILD/bench_train_step_c [--seqlens 256,256]
set -e
bin=${1:?usage: bench_train_step.sh BENCH_BINARY [--seqlens A,B]}
shift
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 MKL_NUM_THREADS=2
cfg=bench/bench_train_step.json
a=$("$bin" "$cfg" "$@")
echo "$a" | grep -v _STEP_MS
p=$(/usr/bin/python3 bench/bench_train_step.py "$cfg" "$@")
echo "$p" | grep -v _STEP_MS
am=$(echo "$a" | sed -n 's/^ARCLIGHT_STEP_MS //p')
pm=$(echo "$p" | sed -n 's/^PYTORCH_STEP_MS //p')
awk -v a="$am" -v p="$pm" 'BEGIN { printf "train step: arclight %.1f ms, pytorch %.1f ms, speed ratio pytorch/arclight = %.2fx\n", a, p, p / a }'
