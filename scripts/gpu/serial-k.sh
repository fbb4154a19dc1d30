#!/bin/bash
# Thirty-eighth session (issue 5): serial K splits (`VIGIL_CUDA_SERIAL`, the last block of each
# output tile adds the others' int32 sums and requantizes) for the long-K convolutions whose grid
# fills the SMs poorly (layers 3 and 4 of ResNet-50 at batch 32). First the exactness check with
# them forced where they apply (ResNet-50 s8 at batch 2 against the CPU, fusions off); last the
# same with the fusions on, forced and off (the two must print the same differences: integer
# sums in any order are the same), after ResNet-50 s8 at batch 32 with them measured against the
# default, interleaved ROUNDS (2) times, FP16 once, and the serial arm's per-step profile.
# $D/cache-start.txt (optional) seeds the arms' timing caches (lines of other devices are kept
# but not used). FAST=1: a short call (see below).
# run(command="D=.gpu/s55 bash scripts/gpu/serial-k.sh", carry=[".gpu/s55", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s55}
export SETUP_S8_ONLY=1
. "$(dirname "$0")/int8-setup.sh"
for a in serial def fused-serial fused-off forced; do cp $D/cache-start.txt $OUT/cache-$a.txt 2>/dev/null; done
chmod u+w $OUT/cache-*.txt 2>/dev/null
if [ -n "${FAST:-}" ]; then
  # A short call, the timing first (a call cut short still says whether the split pays): one
  # round (serial, default), the GPU test (byte-identical to the unsplit kernels), the
  # exactness check at batch 32 (the shapes the split is for), serial again and FP16 if time.
  bench serial int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-serial.txt VIGIL_CUDA_SERIAL=1
  bench default int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-def.txt
  echo "=== serial splits against the unsplit kernels ($SECONDS s)"
  VIGIL_CUDA_TIMING_CACHE=$OUT/cache-forced.txt VIGIL_CUDA_COMPARE="$S8:2" timeout 120 \
    $T int8_serial_k_splits_match_the_unsplit_kernels --nocapture > $OUT/serial-test.txt 2>&1
  echo "rc $?"; grep -E "serial K-split kernels|test result|panicked" $OUT/serial-test.txt | head -4
  [ $SECONDS -lt 250 ] && FORCED_BATCH=32 forced_exact VIGIL_CUDA_SERIAL=force
  [ $SECONDS -lt 330 ] && bench serial2 int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-serial.txt VIGIL_CUDA_SERIAL=1
  [ $SECONDS -lt 360 ] && bench fp16 fp16 "/tmp/onnx/resnet50.onnx:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-def.txt
  echo "done ($SECONDS s)"
  exit 0
fi
forced_exact VIGIL_CUDA_SERIAL=force
mv $OUT/forced.txt $OUT/forced-serial.txt
R=${ROUNDS:-2}
for r in $(seq 1 "$R"); do
  echo "=== round $r ($SECONDS s)"
  bench serial int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-serial.txt VIGIL_CUDA_SERIAL=1
  bench default int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-def.txt
  [ "$r" = 1 ] && bench fp16 fp16 "/tmp/onnx/resnet50.onnx:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-def.txt
done
[ $SECONDS -lt 330 ] && PROFILE_OUT=prof-serial.txt profile $OUT/cache-serial.txt VIGIL_CUDA_SERIAL=1 \
  && grep -c " serial " $OUT/prof-serial.txt && grep " serial " $OUT/prof-serial.txt | cut -c1-200 | head -20
for arm in "serial VIGIL_CUDA_SERIAL=force" "off VIGIL_CUDA_SERIAL=0"; do
  [ $SECONDS -gt 330 ] && break
  set -- $arm
  echo "=== ResNet-50 s8 batch 2 against the CPU, fusions on, $2 ($SECONDS s)"
  env "$2" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-fused-$1.txt VIGIL_CUDA_COMPARE="$S8:2" \
    timeout $((430 - SECONDS)) $T listed_models_match_cpu --nocapture > $OUT/fused-$1.txt 2>&1; echo "rc $?"
  grep -E "rel diff|panicked" $OUT/fused-$1.txt | cut -c1-160 | head -4
done
echo "done ($SECONDS s)"
