#!/bin/bash
# Twelfth session: resident-block tilings (Tiling::min_blocks; shallower rings compiled with
# __launch_bounds__(threads, blocks)). Checks ResNet-50 s8 and EfficientNet-Lite0 against the
# CPU with them forced (fusions off, implicit GEMM forced: outputs must be identical), then
# benches the binary with them measured (VIGIL_CUDA_RESIDENT=1) against the same binary
# without them (VIGIL_CUDA_RESIDENT=0), interleaved, each with its own timing cache, plus FP16,
# and per-step profiles the first arm's choice.
# run(command="bash scripts/gpu/int8-resident.sh", carry=[".gpu/s17", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s17}
. "$(dirname "$0")/int8-setup.sh"
if [ "$PART" != bench ]; then
forced_exact VIGIL_CUDA_RESIDENT=force
VIGIL_CUDA_RESIDENT=force VIGIL_CUDA_QFUSE=0 VIGIL_CUDA_IGEMM=force VIGIL_CUDA_TIMING_CACHE=$OUT/cache-forced.txt timeout 200 $T int8_qdq --nocapture > $OUT/forced-qdq.txt 2>&1; echo "rc $?"
grep -E "^test |test result|panicked|identical|matched|cosine" $OUT/forced-qdq.txt | cut -c1-200 | head -12
grep -c " x[0-9]" $OUT/cache-forced.txt
fi
if [ "$PART" != check ]; then
ab res VIGIL_CUDA_RESIDENT=1 VIGIL_CUDA_RESIDENT=0
grep -E "^PSTEP.* x[0-9]" $OUT/prof.txt | cut -c1-170 | head -40
fi
finish
