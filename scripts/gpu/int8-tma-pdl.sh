#!/bin/bash
# Twenty-first session, third call. Issue 5: is the TMA tilings' loss in the graph theirs, or
# programmatic dependent launch's? ResNet-50 s8 at batch 32 on the second call's timing
# caches (carried in $D: cache-tma.txt with VIGIL_CUDA_TMA=1, cache-notma.txt without), with
# programmatic launch off and on, interleaved.
# run(command="bash scripts/gpu/int8-tma-pdl.sh", carry=[".gpu/s30", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s30}
. "$(dirname "$0")/int8-setup.sh"
cp $D/cache-tma.txt $D/cache-notma.txt $OUT/
for pdl in 0 1; do
  bench tma-pdl$pdl int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-tma.txt VIGIL_CUDA_TMA=1 VIGIL_CUDA_PDL=$pdl
  bench notma-pdl$pdl int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-notma.txt VIGIL_CUDA_PDL=$pdl
done
bench tma-pdl0b int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-tma.txt VIGIL_CUDA_TMA=1 VIGIL_CUDA_PDL=0
bench notma-pdl0b int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-notma.txt VIGIL_CUDA_PDL=0
finish
