#!/usr/bin/env bash
# Makes DIR a Python virtual environment with torch 2.x (the CPU build) and transformers 5.x
# from this machine's local package index, for the checks that load a checkpoint directory
# the way vLLM and SGLang do (tests/train/hf_logprobs.py). Only local indexes are read (no
# network): pip's configured find-links and file:// indexes. Exit 0 when DIR's python imports
# both, else non-zero with the reason on stderr.
#   usage: tests/train/hf_venv.sh DIR
set -euo pipefail
dir=${1:?usage: hf_venv.sh DIR}
check='import torch, transformers, sys; sys.exit(0 if int(torch.__version__.split(".")[0]) == 2 and int(transformers.__version__.split(".")[0]) == 5 else 1)'
if [ -x "$dir/bin/python3" ] && "$dir/bin/python3" -c "$check" 2>/dev/null; then exit 0; fi
/usr/bin/python3 -m venv "$dir" || { echo "hf_venv: python3 -m venv $dir failed" >&2; exit 1; }
# The CPU build of torch where the machine has one (the CUDA build's dependencies are GBs).
torch_spec='torch>=2,<3'
for w in /opt/wheels/torch-2.*+cpu-*.whl; do [ -f "$w" ] && torch_spec=$w; done
indexes=()
for i in /opt/pypi/simple /opt/pypi-more/simple; do
  [ -d "$i" ] && indexes+=(--extra-index-url "file://$i")
done
log="$dir/pip-install.log"
if ! PIP_INDEX_URL="file:///nonexistent" "$dir/bin/pip" install -q --disable-pip-version-check \
     "${indexes[@]}" "$torch_spec" 'transformers>=5,<6' >"$log" 2>&1; then
  echo "hf_venv: pip install of torch and transformers failed (see $log)" >&2
  exit 1
fi
"$dir/bin/python3" -c "$check" || { echo "hf_venv: $dir has no torch 2.x + transformers 5.x" >&2; exit 1; }
