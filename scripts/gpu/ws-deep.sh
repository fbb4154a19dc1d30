#!/bin/bash
# Twentieth session. Issue 5: deeper rings (VIGIL_CUDA_DEEP: wgmma tilings over 8 slots, halo
# tilings over 6). First the probe (VIGIL_CUDA_WS_PROBE=1, with the launch-only variant) with
# the deep tilings timed beside the others, and with them forced; then the exactness check with
# them forced (fusions off, against the CPU); then ResNet-50 s8 at batch 32, deep measured
# against the default, interleaved, each with its own timing cache, FP16 in the same call.
# run(command="bash scripts/gpu/ws-deep.sh", carry=[".gpu/s29", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s29}
. "$(dirname "$0")/int8-setup.sh"
probe deep VIGIL_CUDA_DEEP=1
probe deepforce VIGIL_CUDA_DEEP=force
forced_exact VIGIL_CUDA_DEEP=force
for r in 1 2; do
  bench deep-r$r int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-deep.txt VIGIL_CUDA_DEEP=1
  bench default-r$r int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-default.txt
done
bench fp16 fp16 "/tmp/onnx/resnet50.onnx:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-default.txt
grep -h "WSPROBE" $OUT/probe-deep.txt | grep -c "/8\|/6 "
finish
