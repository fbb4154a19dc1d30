#!/bin/bash
# Twelfth session: the halo kernel for space-to-depth stems (4x4 over 16 channels, two taps a
# wgmma). Checks ResNet-50 s8 against the CPU with halo tilings forced wherever they fit (the
# stem included), fusions off and the implicit GEMM forced (outputs must be identical), then
# benches this binary against the session's starting one (cuda_backend_prev.gz), interleaved,
# each with its own timing cache, plus FP16, and per-step profiles this binary's choice.
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
echo "=== bench ($SECONDS s)"
bench new int8 "$S8:32,$U8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-new.txt
T=/tmp/cuda_backend_prev bench prev int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-prev.txt
bench new2 int8 "$S8:32,$S8:1" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-new.txt
T=/tmp/cuda_backend_prev bench prev2 int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-prev.txt
bench fp16 fp16 "/tmp/onnx/resnet50.onnx:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-new.txt
echo "=== profile ($SECONDS s)"
VIGIL_CUDA_TIMING_CACHE=$OUT/cache-new.txt VIGIL_CUDA_PROFILE=1 VIGIL_CUDA_BENCH_ITERS=20 VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="$S8:32" timeout 60 $T bench_listed_models --nocapture > $OUT/prof.txt 2>&1
grep -E "^PROFILE|^PKIND" $OUT/prof.txt | head -3
grep -E "^PSTEP +[0-4] " $OUT/prof.txt | cut -c1-200
fi
echo "done ($SECONDS s)"
cd $OUT && tar czf all.tgz --remove-files $(ls | grep -v all.tgz)
