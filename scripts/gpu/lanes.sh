#!/bin/bash
# Thirty-third session (issue 5): ResNet-50 at batch 32 run as 1, 2 and 4 lanes (equal parts of
# the batch at once, each on its own stream, fork-joined in one captured graph), INT8 (s8 QDQ)
# and FP16, each arm twice, interleaved, on one shared timing cache (its keys carry the batch);
# then the laned results against the CPU (both shared models at batch 4 as 2 lanes, and
# ResNet-50 s8 at batch 4 as 2 lanes); then lanes with the halo tilings or the K split off.
# run(command="D=.gpu/s50 bash scripts/gpu/lanes.sh", carry=[".gpu/s50", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s50}
# int8-setup.sh without the uint8 quantization this script does not use; its `finish` (which
# packs $OUT) is replaced by one that only reports the time.
SETUP_S8_ONLY=1 . "$(dirname "$0")/int8-setup.sh"
finish() { echo "done ($SECONDS s)"; }
C=$OUT/cache.txt
int8() { bench "$1" int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$C VIGIL_CUDA_LANES=$2; }
fp16() { bench "$1" fp16 "/tmp/onnx/resnet50.onnx:32" VIGIL_CUDA_TIMING_CACHE=$C VIGIL_CUDA_LANES=$2; }
echo "=== round 1 ($SECONDS s)"
int8 r1 1; int8 r1 2; fp16 r1 1; fp16 r1 2
echo "=== laned against the CPU ($SECONDS s)"
VIGIL_CUDA_TIMING_CACHE=$C timeout 150 $T laned_models_match_cpu --nocapture > $OUT/laned.txt 2>&1; echo "rc $?"
grep -E "^test |test result|panicked|lanes 2 seed 2 rep 2" $OUT/laned.txt | cut -c1-200
VIGIL_CUDA_LANES=2 VIGIL_CUDA_TIMING_CACHE=$C VIGIL_CUDA_COMPARE="$S8:4" timeout 150 $T listed_models_match_cpu --nocapture > $OUT/laned-r50.txt 2>&1; echo "rc $?"
grep -E "^test |test result|panicked|rep 2" $OUT/laned-r50.txt | cut -c1-200
echo "=== round 2 ($SECONDS s)"
int8 r2 2; int8 r2 1; fp16 r2 2; fp16 r2 1
int8 r2 4
# Lanes with tilings that leave room for the other lane: no persistent halo blocks, no K split
# (each arm on its own timing cache, since the cache keeps the choice among what was timed).
for arm in VIGIL_CUDA_HALO=0 VIGIL_CUDA_SPLITK=0; do
  [ $SECONDS -lt 430 ] || break
  for lanes in 2 1; do
    bench "$arm" int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-${arm#VIGIL_CUDA_}.txt VIGIL_CUDA_LANES=$lanes $arm
  done
done
finish
