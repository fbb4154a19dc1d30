#!/bin/bash
# Twenty-first session, last call: the landed code's TMA tilings forced (the exactness check of
# int8-setup.sh's `forced_exact`, ResNet-50 s8 at batch 2 against the CPU, fusions off), with
# only the s8 model exported and quantized, to fit the session's last device seconds.
# run(command="bash scripts/gpu/int8-tma-check.sh", carry=[".gpu/s30"])
set -o pipefail
D=${D:-.gpu/s30}
. "$(dirname "$0")/device-env.sh"
export VIGIL_CUDA_POOL_MB=3072 VIGIL_MODELS=$PWD/models
gunzip -c $D/cuda_backend.gz > /tmp/cuda_backend && chmod +x /tmp/cuda_backend
PY=/opt/torch/.venv/bin/python; mkdir -p /tmp/onnx
cd $D && VIGIL_EXPORT_ONLY=1 timeout 60 $PY torch_bench.py /tmp/onnx > $OUT/export.txt 2>&1; cd - >/dev/null
timeout 60 $PY $D/qdq_resnet50.py /tmp/onnx/resnet50.onnx /tmp/onnx/resnet50.qdq.s8.onnx s8 > $OUT/qdq8.txt 2>&1; tail -1 $OUT/qdq8.txt
S8=/tmp/onnx/resnet50.qdq.s8.onnx
echo "=== forced ($SECONDS s)"
VIGIL_CUDA_TMA=force VIGIL_CUDA_QFUSE=0 VIGIL_CUDA_IGEMM=force VIGIL_CUDA_COMPARE="$S8:2" \
  timeout $((140 - SECONDS)) /tmp/cuda_backend listed_models_match_cpu --nocapture > $OUT/forced.txt 2>&1; echo "rc $?"
grep -E "test result|rel diff|panicked" $OUT/forced.txt | cut -c1-160 | head -12
echo "done ($SECONDS s)"
