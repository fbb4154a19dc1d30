#!/bin/bash
# Twenty-first session, second call. Issue 5: the TMA tilings (VIGIL_CUDA_TMA=1) with their
# tensor maps prefetched and the ring's first weight tiles copied before the kernel waits for
# its predecessor. The exactness check with them forced, then ResNet-50 s8 at batch 32 with
# them measured against the default, interleaved twice (own timing caches), and the TMA arm's
# per-step profile.
# run(command="bash scripts/gpu/int8-tma-early.sh", carry=[".gpu/s30", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s30}
. "$(dirname "$0")/int8-setup.sh"
forced_exact VIGIL_CUDA_TMA=force
grep -q "test result: ok" $OUT/forced.txt || { finish; exit 1; }
for r in 1 2; do
  bench tma-r$r int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-tma.txt VIGIL_CUDA_TMA=1
  bench notma-r$r int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-notma.txt
done
profile $OUT/cache-tma.txt VIGIL_CUDA_TMA=1
cp $OUT/prof.txt $OUT/prof-tma.txt
profile $OUT/cache-notma.txt
echo "steps taking TMA tilings: $(grep -c ' tma ' $OUT/prof-tma.txt)"
finish
