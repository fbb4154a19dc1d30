#!/bin/bash
# Thirteenth session: persistent halo blocks (`halo_tilings`' persistent candidates), which
# keep a stem's weights and load the next tile while storing the current one. Checks
# ResNet-50 s8 at batch 32 (so blocks walk several tiles) against the CPU with only
# persistent halo tilings wherever the halo fits, fusions off and the implicit GEMM forced
# (outputs must be identical), then benches this binary against the session's starting one
# (cuda_backend_prev.gz, `ab`'s OFF_T), interleaved, each with its own timing cache, plus
# FP16, and per-step profiles this binary's choice.
# run(command="bash scripts/gpu/int8-persistent-halo.sh", carry=[".gpu/s18", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s18}
. "$(dirname "$0")/int8-setup.sh"
gunzip -c $D/cuda_backend_prev.gz > /tmp/cuda_backend_prev && chmod +x /tmp/cuda_backend_prev
if [ "$PART" != bench ]; then
FORCED_BATCH=32 forced_exact VIGIL_CUDA_HALO=force VIGIL_CUDA_PERSIST=force
grep -E "halo" $OUT/cache-forced.txt | cut -c1-160 | head -4
fi
if [ "$PART" != check ]; then
OFF_T=/tmp/cuda_backend_prev ab phalo VIGIL_CUDA_HALO=1 VIGIL_CUDA_HALO=1
grep -E "^PSTEP +[0-4] |^PSTEP.*halo" $OUT/prof.txt | cut -c1-200
grep -E "halo" $OUT/cache-phalo.txt | cut -c1-160
fi
finish
