#!/bin/bash
# Twentieth session, last call. Issue 5, with the deeper rings measured by default: the probe
# (VIGIL_CUDA_WS_PROBE=1; in the session's run it also timed each variant inside a CUDA graph,
# which failed on the builder's legacy stream and was taken out); ResNet-50 s8 at batch 32
# against VIGIL_CUDA_DEEP=0 (the deep arm on the probe's timing cache, the other on its own);
# FP16; then the whole cuda_backend suite in the call's remaining time.
# run(command="bash scripts/gpu/int8-deep-final.sh", carry=[".gpu/s29", ".gpu/cuda", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s29}
. "$(dirname "$0")/int8-setup.sh"
echo "=== probe ($SECONDS s)"
VIGIL_CUDA_WS_PROBE=1 VIGIL_CUDA_TIMING_CACHE=$OUT/cache-deep.txt VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="$S8:32" \
  timeout 200 $T bench_listed_models --nocapture > $OUT/probe-graph.txt 2>&1; echo "rc $?"
grep -E "^BENCH|panicked" $OUT/probe-graph.txt | cut -c1-200; grep -c WSPROBE $OUT/probe-graph.txt
bench deep int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-deep.txt
bench nodeep int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-nodeep.txt VIGIL_CUDA_DEEP=0
bench fp16 fp16 "/tmp/onnx/resnet50.onnx:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-deep.txt
suite
finish
