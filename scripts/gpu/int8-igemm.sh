#!/bin/bash
# Fifth session: the int8 implicit-GEMM tensor-core convolution (codegen/igemm.rs). Checks it
# forced on every convolution it fits (exact against the CPU with VIGIL_CUDA_QFUSE=0), runs the
# full cuda_backend suite as shipped (path and tiling chosen by measurement), benches INT8
# against FP16 in the same call (and with the implicit GEMM off), profiles ResNet-50 s8 at
# batch 32, and last checks the forced kernel with the residual folds on (QDQ bounds).
# run(command="bash scripts/gpu/int8-igemm.sh", carry=[".gpu/s9", ".gpu/cuda/node", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s9}
. "$(dirname "$0")/int8-setup.sh"
echo "=== forced igemm, QFUSE=0 (exact) ($SECONDS s)"
VIGIL_CUDA_IGEMM=force VIGIL_CUDA_QFUSE=0 VIGIL_CUDA_COMPARE="$CMP" timeout 200 $T int8_qdq_models_match_cpu_int8 listed_models_match_cpu --test-threads=1 --nocapture > $OUT/forced-exact.txt 2>&1; echo "rc $?"
grep -E "^test |test result|worst logits|panicked" $OUT/forced-exact.txt | cut -c1-220 | head; grep -c "rel diff 0.00e0" $OUT/forced-exact.txt; grep "rel diff" $OUT/forced-exact.txt | grep -vc "rel diff 0.00e0"
echo "=== cuda_backend as shipped ($SECONDS s)"
VIGIL_ONNX_NODE_TESTS=$PWD/.gpu/cuda/node VIGIL_CUDA_COMPARE="$CMP,$PWD/models/nanodet-m-416.onnx:2" timeout 200 $T --test-threads=1 --nocapture > "$OUT/tests.txt" 2>&1; echo "rc $?"
grep -E "^test |test result|conformance:|allocs" "$OUT/tests.txt" | cut -c1-200 | tail -16; grep -A3 panicked "$OUT/tests.txt" | head -12
echo "=== bench ($SECONDS s)"
B="/tmp/onnx/resnet50.qdq.s8.onnx:1,/tmp/onnx/resnet50.qdq.s8.onnx:32,/tmp/onnx/resnet50.qdq.onnx:32,$PWD/$D/qdq/efficientnet-lite0.qdq-s8.onnx:1,$PWD/$D/qdq/nanodet-m-416.qdq-s8.onnx:1"
VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="$B" timeout 120 $T bench_listed_models --nocapture 2>&1 | tee "$OUT/bench-int8.txt" | grep -E "BENCH|panicked|error"
VIGIL_CUDA_PRECISIONS=fp16 VIGIL_CUDA_BENCH="/tmp/onnx/resnet50.onnx:1,/tmp/onnx/resnet50.onnx:32" timeout 60 $T bench_listed_models --nocapture 2>&1 | tee "$OUT/bench-fp.txt" | grep -E "BENCH|panicked|error"
VIGIL_CUDA_IGEMM=0 VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="/tmp/onnx/resnet50.qdq.s8.onnx:32" timeout 60 $T bench_listed_models --nocapture 2>&1 | grep -E "BENCH|panicked|error" | sed 's/^/igemm=0 /'
[ $SECONDS -lt 420 ] && VIGIL_CUDA_PROFILE=1 VIGIL_CUDA_BENCH_ITERS=20 VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="/tmp/onnx/resnet50.qdq.s8.onnx:32" timeout 50 $T bench_listed_models --nocapture > $OUT/prof.txt 2>&1
grep -E "^PROFILE" $OUT/prof.txt; grep -E "^PKIND" $OUT/prof.txt | head -4; echo "igemm steps: $(grep -c ' igemm ' $OUT/prof.txt)"
echo "=== forced igemm, fusions on ($SECONDS s)"
[ $SECONDS -lt 450 ] && VIGIL_CUDA_IGEMM=force VIGIL_CUDA_COMPARE="$CMP" timeout $((580 - SECONDS)) $T int8_qdq_models_match_cpu_int8 listed_models_match_cpu --test-threads=1 --nocapture > $OUT/forced.txt 2>&1; echo "rc $?"
grep -E "^test |test result|worst logits|panicked" $OUT/forced.txt | cut -c1-220 | head; grep -E "rel diff" $OUT/forced.txt | cut -c1-200 | head -3
echo "done ($SECONDS s)"
