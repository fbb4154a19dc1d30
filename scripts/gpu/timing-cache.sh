#!/bin/bash
# The CUDA timing cache (VIGIL_CUDA_TIMING_CACHE) on the H200: ResNet-50 s8 (batch 2 against the
# CPU, then batch 32 benched) built three times, the first filling an empty cache; reports each
# process's wall seconds, the cache's lines, and the results.
# run(command="bash scripts/gpu/timing-cache.sh", carry=[".gpu/s11", ".gpu/cuda/node", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s11}
. "$(dirname "$0")/int8-setup.sh"
export VIGIL_CUDA_TIMING_CACHE=$OUT/timing-cache.txt
S8="/tmp/onnx/resnet50.qdq.s8.onnx"
for run in 1 2; do
  start=$SECONDS
  VIGIL_CUDA_COMPARE="$S8:2" timeout 150 $T listed_models_match_cpu --nocapture > $OUT/compare-$run.txt 2>&1; rc=$?
  echo "compare run $run: rc $rc, $((SECONDS - start)) s, cache lines $(wc -l < $VIGIL_CUDA_TIMING_CACHE)"
  grep -E "resnet50.qdq.s8.onnx batch 2 seed 0 rep 0|test result|panicked" $OUT/compare-$run.txt | cut -c1-200
done
start=$SECONDS
VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="$S8:32" timeout 150 $T bench_listed_models --nocapture 2>&1 | grep -E "BENCH|panicked"
echo "bench with the batch-32 geometries uncached: $((SECONDS - start)) s, cache lines $(wc -l < $VIGIL_CUDA_TIMING_CACHE)"
start=$SECONDS
VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="$S8:32" timeout 100 $T bench_listed_models --nocapture 2>&1 | grep -E "BENCH|panicked"
echo "bench cached: $((SECONDS - start)) s"
echo "done ($SECONDS s)"
