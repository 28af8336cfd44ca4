#!/usr/bin/env bash
# Brings cuBLAS(Lt), cuDNN 9 and NCCL headers and libraries next to a CUDA toolkit that lacks
# them, so that the CUDA backend (lib/model/cuda) compiles and links wherever nvcc is (CI
# builds it although nothing runs it there). Called by scripts/setup.sh; idempotent.
#
# Where they come from: NVIDIA's own Python wheels (nvidia-cublas, nvidia-cudnn-cu13,
# nvidia-nccl-cu13), fetched with pip from the indexes pip is configured with (on this
# project's machines a local mirror; nothing else is reachable). Only the headers and the
# libraries a link needs are unpacked, into $ARCLIGHT_CUDA_DEPS (default
# ~/.cache/arclight/cuda-deps): include/ and lib/. A second run finds them there. cuDNN's
# libcudnn.so.9 is a small loader that opens its engine libraries when first used; only the
# loader is unpacked (nothing runs on a machine without a GPU), unless
# ARCLIGHT_CUDA_DEPS_FULL=1, which unpacks all of them.
#
# Tried and not usable: Maven Central's org.bytedeco:cuda platform jars (13.1-9.19-1.5.13)
# carry only their JNI wrappers, no NVIDIA headers or libraries, and its -redist jars are not
# on Central; Debian's non-free CUDA packages are CUDA 12 era and have no cuDNN.
set -euo pipefail

nvcc=""
for c in "${CUDACXX:-}" /usr/local/cuda/bin/nvcc "$(command -v nvcc 2>/dev/null || true)"; do
  if [ -n "$c" ] && [ -x "$c" ]; then nvcc=$c; break; fi
done
if [ -z "$nvcc" ]; then
  echo "cuda-deps: no nvcc, the CUDA backend is not built (nothing to fetch)"
  exit 0
fi
cuda_root=$(cd "$(dirname "$nvcc")/.." && pwd)

have_all() { # $1: include dir, $2: lib dir
  [ -f "$1/cublasLt.h" ] && [ -f "$1/cudnn.h" ] && [ -f "$1/nccl.h" ] &&
    ls "$2"/libcublasLt.so* >/dev/null 2>&1 && ls "$2"/libcudnn.so* >/dev/null 2>&1 &&
    ls "$2"/libnccl.so* >/dev/null 2>&1
}
if have_all "$cuda_root/include" "$cuda_root/lib64"; then
  echo "cuda-deps: cuBLAS, cuDNN and NCCL are in $cuda_root"
  exit 0
fi

dest=${ARCLIGHT_CUDA_DEPS:-$HOME/.cache/arclight/cuda-deps}
if have_all "$dest/include" "$dest/lib" && [ -f "$dest/.complete" ]; then
  echo "cuda-deps: cuBLAS, cuDNN and NCCL already unpacked in $dest"
  exit 0
fi
command -v unzip >/dev/null 2>&1 || { echo "cuda-deps: unzip is needed (apt-get install unzip)" >&2; exit 1; }
mkdir -p "$dest/include" "$dest/lib" "$dest/wheels"

# wheel name, then the paths inside it to unpack (globs)
fetch() {
  local pkg=$1; shift
  local whl
  whl=$(ls "$dest/wheels/${pkg//-/_}"-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$whl" ]; then
    if ! timeout 600 python3 -m pip download --no-deps --only-binary=:all: --disable-pip-version-check \
        -q -d "$dest/wheels" "$pkg" >"$dest/pip-$pkg.log" 2>&1; then
      echo "cuda-deps: pip could not fetch $pkg (see $dest/pip-$pkg.log); the CUDA backend needs it" >&2
      return 1
    fi
    whl=$(ls "$dest/wheels/${pkg//-/_}"-*.whl | head -1)
  fi
  local tmp
  tmp=$(mktemp -d)
  unzip -q -o "$whl" "$@" -d "$tmp" || [ $? -eq 11 ] # 11: a pattern matched nothing
  find "$tmp" -path '*/include/*' -type f | while read -r f; do
    rel=${f#*/include/}; mkdir -p "$dest/include/$(dirname "$rel")"; mv "$f" "$dest/include/$rel"
  done
  find "$tmp" -path '*/lib/*' -type f -name '*.so*' -exec mv {} "$dest/lib/" \;
  rm -rf "$tmp"
  echo "cuda-deps: unpacked $(basename "$whl")"
}

cudnn_libs='nvidia/cudnn/lib/libcudnn.so.9'
[ "${ARCLIGHT_CUDA_DEPS_FULL:-0}" = 1 ] && cudnn_libs='nvidia/cudnn/lib/*'
fetch nvidia-cublas 'nvidia/*/include/cublas*.h' 'nvidia/*/lib/libcublas.so.*' 'nvidia/*/lib/libcublasLt.so.*' \
  'nvidia/cublas/include/*' 'nvidia/cublas/lib/*'
fetch nvidia-cudnn-cu13 'nvidia/cudnn/include/*' "$cudnn_libs"
fetch nvidia-nccl-cu13 'nvidia/nccl/include/nccl.h' 'nvidia/nccl/lib/libnccl.so*'

# unversioned names for the linker
( cd "$dest/lib"
  for f in libcublas.so.* libcublasLt.so.* libcudnn.so.* libnccl.so.*; do
    [ -e "$f" ] || continue
    base=${f%%.so*}.so
    [ -e "$base" ] || ln -s "$f" "$base"
  done )
rm -rf "$dest/wheels"
if ! have_all "$dest/include" "$dest/lib"; then
  echo "cuda-deps: unpacked, but something is missing in $dest (want cublasLt.h, cudnn.h, nccl.h and their libraries)" >&2
  exit 1
fi
touch "$dest/.complete"
echo "cuda-deps: cuBLAS, cuDNN and NCCL in $dest"
