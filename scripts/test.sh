#!/usr/bin/env bash
# Builds arclight twice (release with CUDA parts when nvcc is found; ASan+UBSan for the
# tests) and runs every test through ctest. Ends with ctest's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/tmp/arclight-cmake-release.log 2>&1 \
  || { cat /tmp/arclight-cmake-release.log; exit 1; }
grep -E '^-- arclight:' /tmp/arclight-cmake-release.log || true
cmake --build build -j"$jobs" 2>&1 | grep -E 'warning|error|Error' || true
test "${PIPESTATUS[0]}" -eq 0 || { echo "release build failed"; exit 1; }
# Test-only fault points (lib/core/fault.h) never reach a release binary.
if grep -a -q -E 'ARCLIGHT_[A-Z]+_TEST_KILL_AT' build/arclight; then
  echo "build/arclight holds test fault points (ARCLIGHT_FAULT_POINTS must be off outside the test build)"
  exit 1
fi

# The CUDA backend is built in the release tree only: check there that its module loads with
# every symbol resolved (nothing runs it on a machine without a GPU, so this is where a missing
# library shows).
if [ -x build/t1706_cuda_module ]; then
  build/t1706_cuda_module || { echo "the CUDA module does not load (build/t1706_cuda_module)"; exit 1; }
fi

cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DARCLIGHT_SANITIZE=ON -DARCLIGHT_CUDA=OFF \
  >/tmp/arclight-cmake-asan.log 2>&1 || { cat /tmp/arclight-cmake-asan.log; exit 1; }
cmake --build build-asan -j"$jobs" 2>&1 | grep -E 'warning|error|Error' || true
test "${PIPESTATUS[0]}" -eq 0 || { echo "sanitizer build failed"; exit 1; }

cd build-asan
# The soak (label soak: t1505, ten minutes) runs on its own: `cd build-asan && ctest -L soak`.
ctest --output-on-failure -j"$jobs" -LE soak "$@"
