#!/bin/bash
# Thirty-seventh session (issue 5): where INT8 gains least over FP16. ResNet-50 at batch 32,
# INT8 (s8 QDQ, default tilings) and FP16, benched twice interleaved and profiled step by step
# with one timing cache; `scripts/gpu/layer-ratios.py OUT/prof.txt OUT/prof-fp16.txt` then sums
# each profile by ResNet stage and prints FP16 / INT8 per stage. On an H200 it first runs the
# placement test (scripts/gpu/placement.sh, the last session's next step) and profiles FP16
# with its default-tiling cache.
# run(command="D=.gpu/s53 bash scripts/gpu/fp16-int8-layers.sh", carry=[".gpu/s53", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s53}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $gpu"
if [[ $gpu == *H200* ]]; then
  bash "$(dirname "$0")/placement.sh"
  SETUP_NO_EXPORT=1 . "$(dirname "$0")/int8-setup.sh"
  PROFILE_PRECISION=fp16 PROFILE_MODEL=/tmp/onnx/resnet50.onnx PROFILE_OUT=prof-fp16.txt profile $OUT/cache-def.txt
  PROFILE_OUT=prof-def.txt profile $OUT/cache-def.txt
  exit
fi
SETUP_S8_ONLY=1 . "$(dirname "$0")/int8-setup.sh"
C=$OUT/cache.txt
for r in 1 2; do
  echo "=== round $r ($SECONDS s)"
  bench int8 int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$C
  bench fp16 fp16 "/tmp/onnx/resnet50.onnx:32" VIGIL_CUDA_TIMING_CACHE=$C
done
profile $C
PROFILE_PRECISION=fp16 PROFILE_MODEL=/tmp/onnx/resnet50.onnx PROFILE_OUT=prof-fp16.txt profile $C
echo "done ($SECONDS s)"
