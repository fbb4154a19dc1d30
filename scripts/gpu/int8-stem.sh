#!/bin/bash
# Seventh session: space-to-depth stems, short-K residual prefetch and persistent blocks in the
# int8 implicit GEMM. FORCED picks the forced runs (wgmma settings, or persist).
# Checks the implicit GEMM forced wherever it fits (mma tilings, then wgmma ones; exact against
# the CPU with VIGIL_CUDA_QFUSE=0), benches INT8 against FP16 in the same call (and ResNet-50 s8
# batch 32 with VIGIL_CUDA_S2D=0), profiles ResNet-50 s8 at batch 32; SUITE=1 then runs the
# whole cuda_backend suite as shipped (SUITE_ONLY=1: only it, ending by SUITE_END seconds;
# BENCH_AFTER: INT8 models to bench after it).
# run(command="bash scripts/gpu/int8-stem.sh", carry=[".gpu/s11", ".gpu/cuda/node", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s11}
. "$(dirname "$0")/int8-setup.sh"
if [ -z "$SUITE_ONLY" ]; then
for W in ${FORCED:-0 force}; do
  # W: VIGIL_CUDA_WGMMA, or "persist" (persistent tilings forced where they apply).
  P=0; [ "$W" = persist ] && P=force && W=
  echo "=== forced igemm, wgmma=$W persist=$P, QFUSE=0 (exact) ($SECONDS s)"
  VIGIL_CUDA_IGEMM=force VIGIL_CUDA_WGMMA=$W VIGIL_CUDA_PERSIST=$P VIGIL_CUDA_SPLITK=0 VIGIL_CUDA_QFUSE=0 VIGIL_CUDA_PROFILE=1 VIGIL_CUDA_COMPARE="$CMP" timeout ${FORCED_S:-150} $T listed_models_match_cpu int8_qdq_models_match_cpu_int8 --test-threads=1 --nocapture > $OUT/forced-$W$P.txt 2>&1; echo "rc $? s2d steps $(grep -c 'space-to-depth' $OUT/forced-$W$P.txt) persistent steps $(grep -c ' persistent ' $OUT/forced-$W$P.txt)"
  grep -E "^test |test result|worst logits|panicked" $OUT/forced-$W$P.txt | cut -c1-220 | head; grep -c "rel diff 0.00e0" $OUT/forced-$W$P.txt; grep "rel diff" $OUT/forced-$W$P.txt | grep -v "rel diff 0.00e0" | cut -c1-200 | head -4
done
echo "=== bench ($SECONDS s)"
B=${B:-"/tmp/onnx/resnet50.qdq.s8.onnx:1,/tmp/onnx/resnet50.qdq.s8.onnx:32,/tmp/onnx/resnet50.qdq.onnx:32,$PWD/$D/qdq/efficientnet-lite0.qdq-s8.onnx:1,$PWD/$D/qdq/nanodet-m-416.qdq-s8.onnx:1"}
VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="$B" timeout 200 $T bench_listed_models --nocapture 2>&1 | tee "$OUT/bench-int8.txt" | grep -E "BENCH|panicked|error"
VIGIL_CUDA_PRECISIONS=fp16 VIGIL_CUDA_BENCH="/tmp/onnx/resnet50.onnx:1,/tmp/onnx/resnet50.onnx:32" timeout 60 $T bench_listed_models --nocapture 2>&1 | tee "$OUT/bench-fp.txt" | grep -E "BENCH|panicked|error"
[ -z "$NO_AB" ] && VIGIL_CUDA_S2D=0 VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="/tmp/onnx/resnet50.qdq.s8.onnx:32" timeout 60 $T bench_listed_models --nocapture 2>&1 | grep -E "BENCH|panicked|error" | sed 's/^/s2d=0 /'
VIGIL_CUDA_PROFILE=1 VIGIL_CUDA_BENCH_ITERS=20 VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="/tmp/onnx/resnet50.qdq.s8.onnx:32" timeout 60 $T bench_listed_models --nocapture > $OUT/prof.txt 2>&1
grep -E "^PROFILE" $OUT/prof.txt; grep -E "^PKIND" $OUT/prof.txt | head -4; grep -E "space-to-depth| persistent " $OUT/prof.txt | cut -c1-200
fi
if [ -n "$SUITE" ] || [ -n "$SUITE_ONLY" ]; then
echo "=== cuda_backend as shipped ($SECONDS s)"
VIGIL_ONNX_NODE_TESTS=$PWD/.gpu/cuda/node VIGIL_CUDA_COMPARE="$CMP,$PWD/models/nanodet-m-416.onnx:2" timeout $((${SUITE_END:-590} - SECONDS)) $T --test-threads=1 --nocapture > "$OUT/tests.txt" 2>&1; echo "rc $?"
grep -E "^test |test result|conformance:|allocs" "$OUT/tests.txt" | cut -c1-200 | tail -16; grep -A3 panicked "$OUT/tests.txt" | head -12
fi
if [ -n "$BENCH_AFTER" ]; then
echo "=== bench after the suite ($SECONDS s)"
VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="$BENCH_AFTER" timeout $((540 - SECONDS)) $T bench_listed_models --nocapture 2>&1 | tee "$OUT/bench-after.txt" | grep -E "BENCH|panicked|error"
VIGIL_CUDA_PRECISIONS=fp16 VIGIL_CUDA_BENCH="/tmp/onnx/resnet50.onnx:32" timeout $((590 - SECONDS)) $T bench_listed_models --nocapture 2>&1 | tee "$OUT/bench-after-fp16.txt" | grep -E "BENCH|panicked|error"
fi
echo "done ($SECONDS s)"
