#!/bin/bash
# Nineteenth session, last call: the final binary, where the fused stem-and-pool kernel is
# opt-in (VIGIL_CUDA_STEM_POOL=1 measures it). Its exactness forced against off (ResNet-50 s8 at
# batch 2), ResNet-50 s8's per-step profile at batch 1 and 32 with it measured (is it taken, and
# what does it cost in the graph), and batch 32 as shipped against it measured.
# run(command="bash scripts/gpu/int8-stem-pool-check.sh", carry=[".gpu/s28"])
set -o pipefail
D=${D:-.gpu/s28}
. "$(dirname "$0")/int8-setup.sh"
C=$OUT/cache-stem.txt
[ -f $D/cache.txt ] && cp $D/cache.txt $C
echo "=== exactness ($SECONDS s)"
VIGIL_QDQ_MODELS=/nonexistent VIGIL_CUDA_TIMING_CACHE=$C VIGIL_CUDA_COMPARE="$S8:2" \
  timeout 120 $T int8_fused_stem_matches_the_separate_kernels --nocapture > $OUT/stem-exact.txt 2>&1; echo "rc $?"
grep -E "^test |test result|fused stem kernels|panicked" $OUT/stem-exact.txt | cut -c1-200 | head; grep -c "rel diff 0.00e0" $OUT/stem-exact.txt
for b in 1 32; do
  PROFILE_BATCH=$b profile $C VIGIL_CUDA_STEM_POOL=1; mv $OUT/prof.txt $OUT/prof-b$b.txt
  grep -E "PSTEP +[0-3] " $OUT/prof-b$b.txt | cut -c1-220
done
bench shipped int8 "$S8:32,$S8:1" VIGIL_CUDA_TIMING_CACHE=$C
bench measured int8 "$S8:32,$S8:1" VIGIL_CUDA_TIMING_CACHE=$C VIGIL_CUDA_STEM_POOL=1
finish
