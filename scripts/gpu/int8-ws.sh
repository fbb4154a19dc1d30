#!/bin/bash
# Eleventh session, first call: warp-specialized wgmma implicit GEMMs (loader warps beside the
# math warpgroups, per-slot mbarriers instead of a block barrier per K tile). Checks INT8
# exactness against the CPU with every long-K convolution forced onto a warp-specialized
# tiling (fusions off, implicit GEMM forced), then benches the binary with them measured
# (VIGIL_CUDA_WS=1; they are opt-in) against the same binary without them (VIGIL_CUDA_WS=0),
# interleaved, each with its own timing cache, plus FP16; then per-step profiles and compares
# ResNet-50 against the CPU.
# run(command="bash scripts/gpu/int8-ws.sh", carry=[".gpu/s16", ".gpu/cuda/node", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s16}
. "$(dirname "$0")/int8-setup.sh"
if [ "$PART" != bench ]; then
echo "=== exact, warp-specialized tilings forced ($SECONDS s)"
VIGIL_CUDA_WS=force VIGIL_CUDA_QFUSE=0 VIGIL_CUDA_IGEMM=force VIGIL_CUDA_TIMING_CACHE=$OUT/cache-forced.txt timeout 150 $T int8_qdq_models_match_cpu_int8 --nocapture > $OUT/forced.txt 2>&1; echo "rc $?"
grep -E "^test |test result|worst|panicked" $OUT/forced.txt | cut -c1-200 | head -8
grep -c " ws[0-9]" $OUT/forced.txt
fi
if [ "$PART" != check ]; then
echo "=== bench ($SECONDS s)"
bench ws int8 "$S8:32,$U8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-ws.txt VIGIL_CUDA_WS=1
bench nows int8 "$S8:32,$U8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-nows.txt VIGIL_CUDA_WS=0
bench ws2 int8 "$S8:32,$S8:1" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-ws.txt VIGIL_CUDA_WS=1
bench nows2 int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-nows.txt VIGIL_CUDA_WS=0
bench fp16 fp16 "/tmp/onnx/resnet50.onnx:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-ws.txt
echo "=== profile ($SECONDS s)"
VIGIL_CUDA_WS=1 VIGIL_CUDA_TIMING_CACHE=$OUT/cache-ws.txt VIGIL_CUDA_PROFILE=1 VIGIL_CUDA_BENCH_ITERS=20 VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="$S8:32" timeout 60 $T bench_listed_models --nocapture > $OUT/prof.txt 2>&1
grep -E "^PROFILE|^PKIND" $OUT/prof.txt | head -8
grep -c " ws[0-9]" $OUT/prof.txt
fi
if [ "$PART" != bench ]; then
echo "=== as shipped: ResNet-50 against the CPU ($SECONDS s)"
VIGIL_CUDA_WS=1 VIGIL_CUDA_TIMING_CACHE=$OUT/cache-ws.txt VIGIL_CUDA_COMPARE="$CMP" timeout 150 $T listed_models_match_cpu --nocapture > $OUT/compare.txt 2>&1; echo "rc $?"
grep -E "^test |test result|rel diff|cosine|panicked" $OUT/compare.txt | cut -c1-200 | head -8
fi
echo "done ($SECONDS s)"
cd $OUT && tar czf all.tgz --remove-files $(ls | grep -v all.tgz)
