#!/bin/bash
# Eleventh session: 3x3 convolutions over halo tiles (codegen/halo.rs). Checks ResNet-50 s8
# against the CPU with the fusions off, the implicit GEMM forced and the halo kernel forced
# wherever it fits (the outputs must agree to 1e-3 of their range: no residual joins inside
# a halo kernel), then benches the binary with halo tilings measured against the same binary
# without them (VIGIL_CUDA_HALO=0), interleaved, each with its own timing cache, plus FP16,
# and per-step profiles the shipped choice.
# run(command="bash scripts/gpu/int8-halo.sh", carry=[".gpu/s16", ".gpu/cuda/node", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s16}
. "$(dirname "$0")/int8-setup.sh"
if [ "$PART" != bench ]; then
forced_exact VIGIL_CUDA_HALO=force
grep -c "halo" $OUT/cache-forced.txt
fi
if [ "$PART" != check ]; then
ab halo VIGIL_CUDA_HALO=1 VIGIL_CUDA_HALO=0
grep -E "^PSTEP.*(conv2|halo)" $OUT/prof.txt | cut -c1-150 | head -20
fi
finish
