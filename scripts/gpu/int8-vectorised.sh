#!/bin/bash
# Session s6, fifth call: 32-bit index math in generated kernels, vectorised int8 unfold and
# requantization, GEMMs straight on signed 1x1 activations. Checks (conformance, models vs CPU
# incl. QDQ ResNet-50 with u8 and s8 activations), then INT8 vs FP16 and an fp32/fp16 b1 sweep.
set -o pipefail
D=${D:-.gpu/s6}
. "$(dirname "$0")/int8-setup.sh"
echo "=== cuda_backend ($SECONDS s)"
VIGIL_ONNX_NODE_TESTS=$PWD/.gpu/cuda/node VIGIL_CUDA_COMPARE="/tmp/onnx/resnet50.onnx:1,/tmp/onnx/resnet50.qdq.onnx:2,/tmp/onnx/resnet50.qdq.s8.onnx:2,$PWD/models/nanodet-m-416.onnx:2" timeout 300 /tmp/cuda_backend --test-threads=1 --nocapture > "$OUT/tests.txt" 2>&1; echo "rc $?"
grep -E "^test |test result|conformance:|int8 GPU vs CPU|allocs" "$OUT/tests.txt" | cut -c1-200 | tail -16; grep -E "qdq.*rel diff" "$OUT/tests.txt" | sort -u -t: -k1,1 | head -4; grep -A3 panicked "$OUT/tests.txt" | head -12
echo "=== bench ($SECONDS s)"
VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="/tmp/onnx/resnet50.qdq.onnx:1,/tmp/onnx/resnet50.qdq.onnx:32,/tmp/onnx/resnet50.qdq.s8.onnx:1,/tmp/onnx/resnet50.qdq.s8.onnx:32,$PWD/$D/qdq/efficientnet-lite0.qdq.onnx:1,$PWD/$D/qdq/nanodet-m-416.qdq.onnx:1" timeout 100 /tmp/cuda_backend bench_listed_models --nocapture 2>&1 | tee "$OUT/bench-int8.txt" | grep -E "BENCH|panicked|error"
VIGIL_CUDA_PRECISIONS=fp32,fp16 VIGIL_CUDA_BENCH="/tmp/onnx/resnet50.onnx:1,/tmp/onnx/resnet50.onnx:32,/tmp/onnx/mobilenetv3l.onnx:1,$PWD/models/efficientnet-lite0.onnx:1,$PWD/models/nanodet-m-416.onnx:1" timeout 120 /tmp/cuda_backend bench_listed_models --nocapture 2>&1 | tee "$OUT/bench-fp.txt" | grep -E "BENCH|panicked|error"
[ $SECONDS -lt 520 ] && VIGIL_CUDA_PROFILE=1 VIGIL_CUDA_BENCH_ITERS=20 VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="/tmp/onnx/resnet50.qdq.s8.onnx:32" timeout 60 /tmp/cuda_backend bench_listed_models --nocapture > $OUT/prof.txt 2>&1
grep -E "^PROFILE" $OUT/prof.txt; grep -E "^PKIND" $OUT/prof.txt | head -8
echo "done ($SECONDS s)"
