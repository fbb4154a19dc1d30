#!/bin/bash
# Thirty-seventh session (issue 5): the TMA-fed 1x1 tilings measured (`VIGIL_CUDA_TMA=1`), with
# the kernel after each one launched plainly (the default since this session), against the
# default tilings (TMA tilings not timed: `VIGIL_CUDA_TMA=0`): the check for making them the
# default. ResNet-50 s8 at batch 32, four interleaved rounds, FP16 in the first
# and last, each arm on the timing cache of its tilings from the last call ($D/cache-tma.txt and
# $D/cache-def.txt, copied to $OUT), and a third arm with the persistent kernels launched plainly
# too (`VIGIL_CUDA_PDL_PLAIN=persistent`); then ResNet-50 s8 at batch 2 against the CPU with only TMA
# tilings where they fit, and the TMA arm's per-step profile. ROUNDS sets the rounds (4);
# SUITE=1 runs the whole cuda_backend suite (needs .gpu/cuda carried) instead of the profile;
# TESTS="name ..." runs only the tests those filters name, on the TMA arm's timing cache.
# run(command="D=.gpu/s54 bash scripts/gpu/tma-default.sh", carry=[".gpu/s54", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s54}
[ -n "${SUITE:-}${TESTS:-}" ] || export SETUP_S8_ONLY=1  # the tests compare the u8 model too
. "$(dirname "$0")/int8-setup.sh"
# Without the carried caches each arm times its tilings afresh (about a minute each).
cp $D/cache-tma.txt $OUT/cache-new.txt 2>/dev/null; cp $D/cache-def.txt $OUT/cache-old.txt 2>/dev/null
chmod u+w $OUT/cache-*.txt 2>/dev/null
R=${ROUNDS:-4}
for r in $(seq 1 "$R"); do
  echo "=== round $r ($SECONDS s)"
  bench new int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-new.txt VIGIL_CUDA_TMA=1
  bench old int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-old.txt VIGIL_CUDA_TMA=0
  bench new-plain-persistent int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-new.txt VIGIL_CUDA_TMA=1 \
    VIGIL_CUDA_PDL_PLAIN=persistent
  if [ "$r" = 1 ] || [ "$r" = "$R" ]; then
    bench fp16 fp16 "/tmp/onnx/resnet50.onnx:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-old.txt
  fi
done
forced_exact VIGIL_CUDA_TMA=force
export VIGIL_CUDA_TMA=1  # the tests and the profile below with the TMA tilings measured
if [ -n "${SUITE:-}" ]; then
  suite
elif [ -n "${TESTS:-}" ]; then
  echo "=== tests $TESTS ($SECONDS s)"
  # shellcheck disable=SC2086 # TESTS is a list of test-name filters
  VIGIL_CUDA_TIMING_CACHE=$OUT/cache-new.txt VIGIL_CUDA_COMPARE="$CMP" timeout $((590 - SECONDS)) \
    $T $TESTS --test-threads=1 --nocapture > "$OUT/tests.txt" 2>&1; echo "rc $?"
  grep -E "^test |test result|rel diff|panicked" "$OUT/tests.txt" | cut -c1-200 | tail -20
else
  PROFILE_OUT=prof-new.txt profile $OUT/cache-new.txt
fi
echo "done ($SECONDS s)"
