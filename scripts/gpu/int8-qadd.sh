#!/bin/bash
# Session s6, third call: QAdd on the GPU (INT8 QDQ models vs the CPU's INT8, conformance),
# then ResNet-50 INT8 (QDQ) vs FP16 at batch 1 and 32 with the per-kind profile.
set -o pipefail
D=${D:-.gpu/s6}  # carried: gzipped test binaries (cuda_backend, cuda_pool), qdq.txz, torch_bench.py, torch_timing.py, qdq_resnet50.py
. "$(dirname "$0")/int8-setup.sh"
echo "=== cuda_backend ($SECONDS s)"
VIGIL_ONNX_NODE_TESTS=$PWD/.gpu/cuda/node VIGIL_CUDA_COMPARE="/tmp/onnx/resnet50.onnx:1,$PWD/models/nanodet-m-416.onnx:2" timeout 240 /tmp/cuda_backend --test-threads=1 --nocapture > "$OUT/tests.txt" 2>&1; echo "rc $?"
grep -E "^test |test result|conformance:|int8 GPU vs CPU|allocs" "$OUT/tests.txt" | tail -16; grep -E "unmatched [1-9]" "$OUT/tests.txt" | head -3; grep -A3 panicked "$OUT/tests.txt" | head -12
echo "=== int8 vs fp16 ($SECONDS s)"
VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="/tmp/onnx/resnet50.qdq.onnx:1,/tmp/onnx/resnet50.qdq.onnx:32,$PWD/$D/qdq/efficientnet-lite0.qdq.onnx:1,$PWD/$D/qdq/nanodet-m-416.qdq.onnx:1" timeout 90 /tmp/cuda_backend bench_listed_models --nocapture 2>&1 | tee "$OUT/bench-int8.txt" | grep -E "BENCH|panicked|error"
VIGIL_CUDA_PRECISIONS=fp16 VIGIL_CUDA_BENCH="/tmp/onnx/resnet50.onnx:32" timeout 50 /tmp/cuda_backend bench_listed_models --nocapture 2>&1 | tee "$OUT/bench-fp16.txt" | grep -E "BENCH|panicked|error"
VIGIL_CUDA_PROFILE=1 VIGIL_CUDA_BENCH_ITERS=20 VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="/tmp/onnx/resnet50.qdq.onnx:32" timeout 60 /tmp/cuda_backend bench_listed_models --nocapture > $OUT/prof.txt 2>&1
grep -E "^PROFILE" $OUT/prof.txt; grep -E "^PKIND" $OUT/prof.txt | head -12
echo "done ($SECONDS s)"
