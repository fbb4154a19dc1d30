#!/bin/bash
# For a short device budget: the laned tests against the CPU (both shared models at batch 4 as
# 2 lanes), then EfficientNet-Lite0's s8 QDQ model at batch 32 as 2 lanes and as 1 (no torch
# export needed). Same carry as lanes.sh.
# run(command="D=.gpu/s50 bash scripts/gpu/lanes-check.sh", carry=[".gpu/s50", ".gpu/cuda3/eval"])
D=${D:-.gpu/s50}
SETUP_NO_EXPORT=1 . "$(dirname "$0")/int8-setup.sh"
C=$OUT/cache.txt
nvidia-smi --query-gpu=name --format=csv,noheader
VIGIL_CUDA_TIMING_CACHE=$C timeout 120 $T laned_models_match_cpu --nocapture > $OUT/laned.txt 2>&1; echo "rc $? ($SECONDS s)"
grep -E "^test |test result|panicked|seed 2 rep 2" $OUT/laned.txt | cut -c1-200
for lanes in 2 1 2 1; do
  bench "lanes $lanes" int8 "$PWD/$D/qdq/efficientnet-lite0.qdq-s8.onnx:32" VIGIL_CUDA_TIMING_CACHE=$C VIGIL_CUDA_LANES=$lanes
done
echo "done ($SECONDS s)"
