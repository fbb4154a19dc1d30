#!/bin/bash
# Fourth session: cuBLASLt int8 GEMMs that requantize in their epilogue (int8 result,
# per-channel alpha vector + f32 bias, residual QAdds folded in; uint8 activations stored as
# int8). Checks (full cuda_backend suite, QDQ ResNet-50 with u8 and s8 activations vs the CPU,
# exactness with VIGIL_CUDA_QFUSE=0), then INT8 with the fusions on and off against FP16 in the
# same call, and profiles of the s8 model at batch 32 and 1.
# run(command="bash scripts/gpu/int8-fused.sh", carry=[".gpu/s9", ".gpu/cuda/node", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s9}
. "$(dirname "$0")/int8-setup.sh"
echo "=== cuda_backend ($SECONDS s)"
VIGIL_ONNX_NODE_TESTS=$PWD/.gpu/cuda/node VIGIL_CUDA_COMPARE="/tmp/onnx/resnet50.qdq.onnx:2,/tmp/onnx/resnet50.qdq.s8.onnx:2,$PWD/models/nanodet-m-416.onnx:2" timeout 300 /tmp/cuda_backend --test-threads=1 --nocapture > "$OUT/tests.txt" 2>&1; echo "rc $?"
grep -E "^test |test result|conformance:|int8 GPU vs CPU|allocs" "$OUT/tests.txt" | cut -c1-200 | tail -18; grep -E "qdq.*rel diff" "$OUT/tests.txt" | cut -c1-160 | head -14; grep -A3 panicked "$OUT/tests.txt" | head -12
VIGIL_CUDA_QFUSE=0 timeout 100 /tmp/cuda_backend int8_qdq_models_match_cpu_int8 --nocapture 2>&1 | grep -E "worst logits|test result" | sed 's/^/QFUSE=0 /'
echo "=== bench ($SECONDS s)"
B="/tmp/onnx/resnet50.qdq.s8.onnx:1,/tmp/onnx/resnet50.qdq.s8.onnx:32,/tmp/onnx/resnet50.qdq.onnx:32,$PWD/$D/qdq/efficientnet-lite0.qdq-s8.onnx:1,$PWD/$D/qdq/nanodet-m-416.qdq-s8.onnx:1"
VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="$B" timeout 100 /tmp/cuda_backend bench_listed_models --nocapture 2>&1 | tee "$OUT/bench-int8.txt" | grep -E "BENCH|panicked|error"
VIGIL_CUDA_QFUSE=0 VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="$B" timeout 100 /tmp/cuda_backend bench_listed_models --nocapture 2>&1 | tee "$OUT/bench-int8-nofuse.txt" | grep -E "BENCH|panicked|error" | sed 's/^/nofuse /'
VIGIL_CUDA_PRECISIONS=fp16 VIGIL_CUDA_BENCH="/tmp/onnx/resnet50.onnx:1,/tmp/onnx/resnet50.onnx:32" timeout 100 /tmp/cuda_backend bench_listed_models --nocapture 2>&1 | tee "$OUT/bench-fp.txt" | grep -E "BENCH|panicked|error"
[ $SECONDS -lt 500 ] && VIGIL_CUDA_PROFILE=1 VIGIL_CUDA_BENCH_ITERS=20 VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="/tmp/onnx/resnet50.qdq.s8.onnx:32" timeout 60 /tmp/cuda_backend bench_listed_models --nocapture > $OUT/prof.txt 2>&1
grep -E "^PROFILE" $OUT/prof.txt; grep -E "^PKIND" $OUT/prof.txt | head -8; grep -c "int8 requant" $OUT/prof.txt; grep -m3 "fused requantization" $OUT/prof.txt | cut -c1-300

VIGIL_CUDA_PROFILE=1 VIGIL_CUDA_BENCH_ITERS=5 VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="/tmp/onnx/resnet50.qdq.s8.onnx:1" timeout 60 /tmp/cuda_backend bench_listed_models --nocapture > $OUT/prof1.txt 2>&1
echo "batch 32: $(grep -c 'int8 requant' $OUT/prof.txt) fused, $(grep -c '+ requantization' $OUT/prof.txt) split; batch 1: $(grep -c 'int8 requant' $OUT/prof1.txt) fused, $(grep -c '+ requantization' $OUT/prof1.txt) split"
echo "done ($SECONDS s)"
