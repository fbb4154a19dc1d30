#!/bin/bash
# Device run for the CUDA backend, fp32 + fp16: GPU-vs-CPU tests (fp16 tolerance, eval-photo
# top-1 and detections), conformance on the GPU, then benchmarks vs PyTorch in the same run
# (device time by CUDA events and wall time). Run from the lead checkout's root:
#   bash .gpu/cuda2/run.sh   (binaries, eval photos and scripts copied to .gpu/cuda2/)
set -o pipefail
D=.gpu/cuda2
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for l in /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib /usr/local/nvidia/lib64 /usr/local/cuda/lib64; do
  [ -d "$l" ] && LD_LIBRARY_PATH="$l:$LD_LIBRARY_PATH"
done
export LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm --format=csv | tee "$OUT/env.txt"
PY=$(ls /opt/torch/.venv/bin/python 2>/dev/null || which python3)
export VIGIL_MODELS=$PWD/models VIGIL_ONNX_NODE_TESTS=$PWD/.gpu/cuda/node VIGIL_EVAL_IMAGES=$PWD/$D/eval
chmod +x $D/cuda_backend $D/vigil
if [ -z "$BENCH_ONLY" ]; then
  timeout 150 $D/cuda_backend --test-threads=1 --nocapture 2>&1 | tee "$OUT/tests.txt" \
    | grep -vE "rep [12] output|seed [12] rep" | grep -vE "^gpu conformance UNSUPPORTED" | tail -70
fi
mkdir -p /tmp/onnx
VIGIL_TORCH_COMPILE=${VIGIL_TORCH_COMPILE:-0} PYTHONUNBUFFERED=1 timeout 110 $PY $D/torch_bench.py /tmp/onnx 2>&1 | grep -v Warning | tee "$OUT/torch.txt" | grep -E "TORCH|Error|error" 
VIGIL_CUDA_PRECISIONS=fp32,fp16 VIGIL_CUDA_BENCH="/tmp/onnx/resnet50.onnx:1,/tmp/onnx/resnet50.onnx:32,/tmp/onnx/mobilenetv3l.onnx:1,/tmp/onnx/mobilenetv3l.onnx:32,$PWD/models/efficientnet-lite0.onnx:1,$PWD/models/nanodet-m-416.onnx:1,$PWD/models/nanodet-m-416.onnx:32" \
  timeout 100 $D/cuda_backend bench_listed_models --nocapture 2>&1 | tee "$OUT/vigil-bench.txt" | grep -E "BENCH|panicked|error"
echo "== vigil bench CLI"
timeout 30 $D/vigil bench --device cuda --precision fp16 --models-dir models --iterations 200 efficientnet-lite0 2>&1 | tail -6 | tee "$OUT/cli-bench.txt"
