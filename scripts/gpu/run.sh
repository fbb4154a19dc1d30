#!/bin/bash
# Device run for the CUDA backend: tests vs the CPU, conformance on the GPU, benchmarks vs PyTorch.
# Run from the repository root on the GPU machine: bash .gpu/cuda/run.sh (binaries copied there).
set -o pipefail
D=.gpu/cuda
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for l in /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib /usr/local/nvidia/lib64 /usr/local/cuda/lib64; do
  [ -d "$l" ] && LD_LIBRARY_PATH="$l:$LD_LIBRARY_PATH"
done
export LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv | tee "$OUT/env.txt"
ldconfig -p | grep -E 'libcuda|cudnn|cublas|nvrtc' | tee -a "$OUT/env.txt"
ls /opt/torch/.venv/lib/python3*/site-packages/nvidia/ 2>&1 | tee -a "$OUT/env.txt"
for l in cudnn cublas nvrtc; do ls /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib/lib$l* 2>/dev/null; done | tee -a "$OUT/env.txt"
PY=$(ls /opt/torch/.venv/bin/python 2>/dev/null || which python3)
export VIGIL_MODELS=$PWD/models VIGIL_ONNX_NODE_TESTS=$PWD/$D/node
chmod +x $D/cuda_backend
[ -z "$BENCH_ONLY" ] && timeout 300 $D/cuda_backend --test-threads=1 --nocapture 2>&1 | tee "$OUT/tests.txt" | grep -vE "rep [12] output" | tail -80
mkdir -p /tmp/onnx
PYTHONUNBUFFERED=1 timeout 420 $PY $D/torch_bench.py /tmp/onnx 2>&1 | grep -v Warning | tee "$OUT/torch.txt"
VIGIL_CUDA_BENCH="/tmp/onnx/resnet50.onnx:1,/tmp/onnx/resnet50.onnx:32,/tmp/onnx/mobilenetv3l.onnx:1,/tmp/onnx/mobilenetv3l.onnx:32,$PWD/models/efficientnet-lite0.onnx:1,$PWD/models/nanodet-m-416.onnx:1,$PWD/models/nanodet-m-416.onnx:32" \
  timeout 120 $D/cuda_backend bench_listed_models --nocapture 2>&1 | tee "$OUT/vigil-bench.txt" | grep -E "BENCH|panicked|error"
