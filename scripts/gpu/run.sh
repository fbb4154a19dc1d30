#!/bin/bash
# cuda3 device call 2: GPU tests, serve test, benchmarks vs PyTorch in the same run, profile.
set -o pipefail
D=.gpu/cuda3
. "$(dirname "$0")/device-env.sh"
export VIGIL_CUDA_POOL_MB=3072
export VIGIL_MODELS=$PWD/models VIGIL_ONNX_NODE_TESTS=$PWD/.gpu/cuda/node VIGIL_EVAL_IMAGES=$PWD/.gpu/cuda3/eval
PY=$(ls /opt/torch/.venv/bin/python 2>/dev/null || which python3)
for f in cuda_backend cuda_serve vigil; do gunzip -c $D/$f.gz > /tmp/$f && chmod +x /tmp/$f; done
timeout 150 /tmp/cuda_backend --test-threads=1 --nocapture > "$OUT/tests.txt" 2>&1; echo "tests rc $?"
grep -E "^test |test result|panicked|worst|relative|conformance:|pass" "$OUT/tests.txt" | grep -vE "rep [12] output|seed [12] rep|UNSUPPORTED" | tail -30
if [ -x /tmp/cuda_serve ]; then
  VIGIL_BIN=/tmp/vigil timeout 120 /tmp/cuda_serve --nocapture > "$OUT/serve.txt" 2>&1; echo "serve rc $?"
  grep -vE "INFO|DEBUG" "$OUT/serve.txt" | tail -12
fi
mkdir -p /tmp/onnx
VIGIL_TORCH_COMPILE=0 PYTHONUNBUFFERED=1 timeout 110 $PY $D/torch_bench.py /tmp/onnx 2>&1 | grep -v Warning > "$OUT/torch.txt"; grep -E "TORCH|Error" "$OUT/torch.txt"
VIGIL_CUDA_PRECISIONS=fp32,fp16 VIGIL_CUDA_BENCH="/tmp/onnx/resnet50.onnx:1,/tmp/onnx/resnet50.onnx:32,/tmp/onnx/mobilenetv3l.onnx:1,/tmp/onnx/mobilenetv3l.onnx:32,$PWD/models/efficientnet-lite0.onnx:1,$PWD/models/nanodet-m-416.onnx:1,$PWD/models/nanodet-m-416.onnx:32" \
  timeout 120 /tmp/cuda_backend bench_listed_models --nocapture 2>&1 | tee "$OUT/vigil-bench.txt" | grep -E "BENCH|panicked|error"
VIGIL_CUDA_PROFILE=1 VIGIL_CUDA_BENCH_ITERS=30 VIGIL_CUDA_PRECISIONS=fp16 VIGIL_CUDA_BENCH="/tmp/onnx/resnet50.onnx:1,/tmp/onnx/mobilenetv3l.onnx:1" \
  timeout 60 /tmp/cuda_backend bench_listed_models --nocapture > $OUT/prof.txt 2>&1
grep -E "^PROFILE" $OUT/prof.txt; awk '/^PROFILE/{n++} /^PKIND/ && n<=2 {print n": "$0}' $OUT/prof.txt | head -24
