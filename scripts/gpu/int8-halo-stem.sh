#!/bin/bash
# Twelfth session: the halo kernel for space-to-depth stems (4x4 over 16 channels, two taps a
# wgmma). Checks ResNet-50 s8 against the CPU with halo tilings forced wherever they fit (the
# stem included), fusions off and the implicit GEMM forced (outputs must be identical), then
# benches this binary against the session's starting one (cuda_backend_prev.gz, `ab`'s
# OFF_T), interleaved, each with its own timing cache, plus FP16, and per-step profiles this
# binary's choice.
# run(command="bash scripts/gpu/int8-halo-stem.sh", carry=[".gpu/s17", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s17}
. "$(dirname "$0")/int8-setup.sh"
gunzip -c $D/cuda_backend_prev.gz > /tmp/cuda_backend_prev && chmod +x /tmp/cuda_backend_prev
if [ "$PART" != bench ]; then
forced_exact VIGIL_CUDA_HALO=force
grep -E "halo" $OUT/cache-forced.txt | cut -c1-160 | head -3
fi
if [ "$PART" != check ]; then
OFF_T=/tmp/cuda_backend_prev ab stem VIGIL_CUDA_HALO=1 VIGIL_CUDA_HALO=1
grep -E "^PSTEP +[0-4] " $OUT/prof.txt | cut -c1-200
fi
finish
