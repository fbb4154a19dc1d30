#!/bin/bash
# Fifteenth session: both ends of ResNet-50 INT8. The image's QuantizeLinear and NHWC
# transpose run inside the stem's space-to-depth copy (one kernel from the float planes), the
# classifier's QGemm and DequantizeLinear run as one narrow mma.sync kernel, and the pool before
# it reads four channels a lane. Checks ResNet-50 s8 and u8 at batch 32 against the CPU with the
# fusions off and the implicit GEMM forced (outputs must be identical), then benches this
# binary against the session's starting one (cuda_backend_prev.gz), interleaved, each with its
# own timing cache, plus FP16 and a per-step profile; PART=all then runs the whole suite.
# run(command="bash scripts/gpu/int8-ends.sh", carry=[".gpu/s20", ".gpu/cuda", ".gpu/cuda3/eval"])
# PART=check runs only the checks, PART=bench only the benches, PART=suite only the suite.
set -o pipefail
D=${D:-.gpu/s20}
. "$(dirname "$0")/int8-setup.sh"
gunzip -c $D/cuda_backend_prev.gz > /tmp/cuda_backend_prev && chmod +x /tmp/cuda_backend_prev
if [ "$PART" != bench ] && [ "$PART" != suite ]; then
FORCED_BATCH=32 forced_exact VIGIL_CUDA_HALO=0; mv $OUT/forced.txt $OUT/forced-s8.txt
FORCED_MODEL=$U8 FORCED_BATCH=32 forced_exact VIGIL_CUDA_HALO=0; mv $OUT/forced.txt $OUT/forced-u8.txt
fi
if [ "$PART" != check ] && [ "$PART" != suite ]; then
OFF_T=/tmp/cuda_backend_prev ab ends VIGIL_CUDA_HALO=1 VIGIL_CUDA_HALO=1
grep -E "^PSTEP +(0|1|2|5[5-9]|60) " $OUT/prof.txt | cut -c1-140
fi
if [ "$PART" = all ] || [ "$PART" = suite ]; then
suite
fi
finish
