#!/bin/bash
# Compiles every implicit-GEMM kernel the CUDA builder may time for ResNet-50's int8
# convolutions for sm_90a, without a GPU: NVRTC, then ptxas for registers and spills (the unit
# test `resnet50_int8_kernels_compile_for_sm90a` in engine/src/backend/cuda/codegen/compile_check.rs).
# Fetches NVRTC and ptxas from PyPI (nvidia-cuda-nvrtc, nvidia-cuda-nvcc; about 100 MB, kept in
# $CACHE, default target/cuda-tools) on the first run. Prints a line per kernel.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${CACHE:-target/cuda-tools}
mkdir -p "$CACHE"
for pkg in nvidia-cuda-nvrtc nvidia-cuda-nvcc; do
  if ! ls "$CACHE"/${pkg//-/_}-*.whl >/dev/null 2>&1; then
    python3 -m pip download --no-deps -q -d "$CACHE" "$pkg"
  fi
  [ -d "$CACHE/$pkg" ] || { mkdir -p "$CACHE/$pkg" && unzip -q -o "$CACHE"/${pkg//-/_}-*.whl -d "$CACHE/$pkg"; }
done
lib=$(dirname "$(find "$PWD/$CACHE/nvidia-cuda-nvrtc" -name 'libnvrtc.so*' | head -1)")
ptxas=$(find "$PWD/$CACHE/nvidia-cuda-nvcc" -name ptxas -type f | head -1)
chmod +x "$ptxas"
LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" VIGIL_PTXAS="$ptxas" \
  cargo test --release -p vigil-engine --lib resnet50_int8_kernels_compile_for_sm90a -- --nocapture
