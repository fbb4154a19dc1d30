#!/bin/bash
# Sixth session: Hopper wgmma tilings and split K for the int8 implicit GEMM (codegen/igemm.rs).
# Benches INT8 against FP16 in the same call (AB=1: also with both off), profiles ResNet-50 s8 at
# batch 32, checks wgmma + split-K forced wherever they apply (exact against the CPU with
# VIGIL_CUDA_QFUSE=0; FORCED_TESTS picks the tests), then runs the full suite as shipped.
# run(command="bash scripts/gpu/int8-wgmma.sh", carry=[".gpu/s10", ".gpu/cuda/node", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s10}
. "$(dirname "$0")/int8-setup.sh"
echo "=== bench ($SECONDS s)"
B="/tmp/onnx/resnet50.qdq.s8.onnx:1,/tmp/onnx/resnet50.qdq.s8.onnx:32,/tmp/onnx/resnet50.qdq.onnx:32,$PWD/$D/qdq/efficientnet-lite0.qdq-s8.onnx:1,$PWD/$D/qdq/nanodet-m-416.qdq-s8.onnx:1"
VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="$B" timeout 240 $T bench_listed_models --nocapture 2>&1 | tee "$OUT/bench-int8.txt" | grep -E "BENCH|panicked|error"
VIGIL_CUDA_PRECISIONS=fp16 VIGIL_CUDA_BENCH="/tmp/onnx/resnet50.onnx:1,/tmp/onnx/resnet50.onnx:32" timeout 60 $T bench_listed_models --nocapture 2>&1 | tee "$OUT/bench-fp.txt" | grep -E "BENCH|panicked|error"
[ -n "$AB" ] && VIGIL_CUDA_SPLITK=0 VIGIL_CUDA_WGMMA=0 VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="/tmp/onnx/resnet50.qdq.s8.onnx:32" timeout 60 $T bench_listed_models --nocapture 2>&1 | grep -E "BENCH|panicked|error" | sed 's/^/splitk=0 wgmma=0 /'
VIGIL_CUDA_PROFILE=1 VIGIL_CUDA_BENCH_ITERS=20 VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="/tmp/onnx/resnet50.qdq.s8.onnx:32" timeout 60 $T bench_listed_models --nocapture > $OUT/prof.txt 2>&1
grep -E "^PROFILE" $OUT/prof.txt; grep -E "^PKIND" $OUT/prof.txt | head -4; echo "igemm steps: $(grep -c ' igemm ' $OUT/prof.txt), wgmma: $(grep -c ' igemm wg' $OUT/prof.txt), split: $(grep -c 'split-k' $OUT/prof.txt)"
echo "=== forced wgmma + split-K, QFUSE=0 (exact) ($SECONDS s)"
VIGIL_CUDA_IGEMM=force VIGIL_CUDA_WGMMA=force VIGIL_CUDA_SPLITK=force VIGIL_CUDA_QFUSE=0 VIGIL_CUDA_PROFILE=1 VIGIL_CUDA_COMPARE="$CMP" timeout 150 $T ${FORCED_TESTS:-listed_models_match_cpu} --test-threads=1 --nocapture > $OUT/forced-exact.txt 2>&1; echo "rc $? split steps $(grep -c 'split-k' $OUT/forced-exact.txt)"
grep -E "^test |test result|worst logits|panicked" $OUT/forced-exact.txt | cut -c1-220 | head; grep -c "rel diff 0.00e0" $OUT/forced-exact.txt; grep "rel diff" $OUT/forced-exact.txt | grep -v "rel diff 0.00e0" | cut -c1-200 | head -4
echo "=== cuda_backend as shipped ($SECONDS s)"
VIGIL_ONNX_NODE_TESTS=$PWD/.gpu/cuda/node VIGIL_CUDA_COMPARE="$CMP,$PWD/models/nanodet-m-416.onnx:2" timeout $((590 - SECONDS)) $T --test-threads=1 --nocapture > "$OUT/tests.txt" 2>&1; echo "rc $?"
grep -E "^test |test result|conformance:|allocs" "$OUT/tests.txt" | cut -c1-200 | tail -16; grep -A3 panicked "$OUT/tests.txt" | head -12
echo "done ($SECONDS s)"
