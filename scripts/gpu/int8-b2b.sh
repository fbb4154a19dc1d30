#!/bin/bash
# Eighteenth session. Issue 5: back-to-back kernels (a bottleneck's last 1x1 int8 convolution
# and the next one's first in one kernel, VIGIL_CUDA_B2B). First the exactness check (ResNet-50
# s8 and u8 at batch 2, implicit GEMM forced, back-to-back forced against off: same bytes), then
# ResNet-50 s8 at batch 32 with back-to-back measured (VIGIL_CUDA_B2B=1) against off, two
# interleaved rounds on one implicit-GEMM timing cache, FP16 in the same call, and the
# back-to-back plan's per-step profile.
# run(command="bash scripts/gpu/int8-b2b.sh", carry=[".gpu/s27"]); EXACT=0 skips the exactness
# check, ROUNDS sets the bench rounds (2), and FORCED=1 adds the per-step profile with every
# back-to-back pair forced (prof-forced.txt); BATCH sets the benches' batch (32).
# .gpu/s27: cuda_backend.gz (cargo test --release -p vigil-engine --features cuda --test
# cuda_backend --no-run, stripped), qdq.txz and the torch scripts as in int8-setup.sh.
set -o pipefail
D=${D:-.gpu/s27}
. "$(dirname "$0")/int8-setup.sh"
C=$OUT/cache-b2b.txt
PROFILE_BATCH=${BATCH:-32}
# A timing cache from an earlier call, if carried (the implicit GEMM then compiles no candidates).
[ -f $D/cache.txt ] && cp $D/cache.txt $C
[ -f $D/cache-forced.txt ] && cp $D/cache-forced.txt $OUT/cache-forced.txt
if [ "${EXACT:-1}" != 0 ]; then
  echo "=== exactness ($SECONDS s)"
  VIGIL_CUDA_TIMING_CACHE=$OUT/cache-forced.txt VIGIL_CUDA_COMPARE="${EXACT_LIST:-$S8:2,$U8:2}" \
    timeout 240 $T int8_back_to_back_kernels_match_the_separate_ones --nocapture > $OUT/b2b-exact.txt 2>&1; echo "rc $?"
  grep -E "^test |test result|back-to-back kernels|rel diff|panicked|left out" $OUT/b2b-exact.txt | cut -c1-200 | head -20
fi
for r in $(seq ${ROUNDS:-2}); do
  bench b2b-r$r int8 "$S8:${BATCH:-32}" VIGIL_CUDA_TIMING_CACHE=$C VIGIL_CUDA_B2B=1
  bench nob2b-r$r int8 "$S8:${BATCH:-32}" VIGIL_CUDA_TIMING_CACHE=$C VIGIL_CUDA_B2B=0
done
bench fp16 fp16 "/tmp/onnx/resnet50.onnx:${BATCH:-32}" VIGIL_CUDA_TIMING_CACHE=$C
profile $C VIGIL_CUDA_B2B=1
grep -E "back-to-back" $OUT/prof.txt | sed 's/ (cublasLt.*\[back/ [back/' | cut -c1-240 | head -20
if [ "${FORCED:-0}" = 1 ]; then
  profile $C VIGIL_CUDA_B2B=force; mv $OUT/prof.txt $OUT/prof-forced.txt
  grep -E "back-to-back" $OUT/prof-forced.txt | cut -c1-240 | head -20
fi
finish
