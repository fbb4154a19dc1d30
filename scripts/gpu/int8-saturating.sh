#!/bin/bash
# Fourteenth session: saturating requantization (`requant_saturating`: `cvt.pack.sat` packs
# two codes and clamps them, which ptxas fuses with the conversions into one `F2IP`). Checks
# ResNet-50 s8 and u8 at batch 32 against the CPU with the fusions off and the implicit GEMM
# forced, s8 once more with only halo tilings where they fit (outputs must be identical), then
# benches this binary against the session's starting one (cuda_backend_prev.gz), interleaved,
# each with its own timing cache, plus FP16, and profiles this binary's choice per step.
# run(command="bash scripts/gpu/int8-saturating.sh", carry=[".gpu/s19", ".gpu/cuda3/eval"])
# PART=check runs only the checks, PART=bench only the benches.
set -o pipefail
D=${D:-.gpu/s19}
. "$(dirname "$0")/int8-setup.sh"
gunzip -c $D/cuda_backend_prev.gz > /tmp/cuda_backend_prev && chmod +x /tmp/cuda_backend_prev
if [ "$PART" != bench ]; then
FORCED_BATCH=32 forced_exact VIGIL_CUDA_HALO=0; mv $OUT/forced.txt $OUT/forced-s8.txt
FORCED_BATCH=32 forced_exact VIGIL_CUDA_HALO=force VIGIL_CUDA_PERSIST=force; mv $OUT/forced.txt $OUT/forced-s8-halo.txt
FORCED_MODEL=$U8 FORCED_BATCH=32 forced_exact VIGIL_CUDA_HALO=0; mv $OUT/forced.txt $OUT/forced-u8.txt
echo "convolutions timed: $(grep -c 'Geom' $OUT/cache-forced.txt), with halo tilings chosen: $(grep -c halo $OUT/cache-forced.txt)"
fi
if [ "$PART" != check ]; then
OFF_T=/tmp/cuda_backend_prev ab sat VIGIL_CUDA_HALO=1 VIGIL_CUDA_HALO=1
fi
finish
