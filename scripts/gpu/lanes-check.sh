#!/bin/bash
# For a short device budget: the laned tests against the CPU (both shared models at batch 4 as
# 2 lanes), then EfficientNet-Lite0's s8 QDQ model at batch 32 as 2 lanes and as 1 (no torch
# export needed). Same carry as lanes.sh.
# run(command="D=.gpu/s50 bash scripts/gpu/lanes-check.sh", carry=[".gpu/s50", ".gpu/cuda3/eval"])
D=${D:-.gpu/s50}
. "$(dirname "$0")/device-env.sh"
export VIGIL_CUDA_POOL_MB=3072 VIGIL_MODELS=$PWD/models
mkdir -p $D/qdq && xz -dc $D/qdq.txz | tar xf - -C $D
gunzip -c $D/cuda_backend.gz > /tmp/cuda_backend && chmod +x /tmp/cuda_backend
T=/tmp/cuda_backend C=$OUT/cache.txt
nvidia-smi --query-gpu=name --format=csv,noheader
VIGIL_CUDA_TIMING_CACHE=$C timeout 120 $T laned_models_match_cpu --nocapture > $OUT/laned.txt 2>&1; echo "rc $? ($SECONDS s)"
grep -E "^test |test result|panicked|seed 2 rep 2" $OUT/laned.txt | cut -c1-200
for lanes in 2 1 2 1; do
  VIGIL_CUDA_LANES=$lanes VIGIL_CUDA_TIMING_CACHE=$C VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="$PWD/$D/qdq/efficientnet-lite0.qdq-s8.onnx:32" \
    timeout 100 $T bench_listed_models --nocapture 2>&1 | tee -a $OUT/bench.txt | grep -E "BENCH|panicked"
done
echo "done ($SECONDS s)"
