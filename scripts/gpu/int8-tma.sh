#!/bin/bash
# Twenty-first session. Issue 5: TMA-fed wgmma tilings for the 1x1 stride-1 convolutions
# (VIGIL_CUDA_TMA=1 measures them, opt-in). First the exactness check with them forced (fusions
# off, against the CPU); then ResNet-50 s8 at batch 32 with them measured against
# the default (without them), interleaved twice, each arm with its own timing cache; FP16 in the same
# call; the TMA arm's per-step profile (which convolutions took them).
# run(command="bash scripts/gpu/int8-tma.sh", carry=[".gpu/s30", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s30}
. "$(dirname "$0")/int8-setup.sh"
forced_exact VIGIL_CUDA_TMA=force
# A TMA kernel that is wrong or hangs makes the rest meaningless: stop and keep the device time.
grep -q "test result: ok" $OUT/forced.txt || { finish; exit 1; }
for r in 1 2; do
  bench tma-r$r int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-tma.txt VIGIL_CUDA_TMA=1
  bench notma-r$r int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-notma.txt
done
bench fp16 fp16 "/tmp/onnx/resnet50.onnx:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-tma.txt
profile $OUT/cache-tma.txt VIGIL_CUDA_TMA=1
echo "steps taking TMA tilings: $(grep -c ' tma ' $OUT/prof.txt)"
grep " tma " $OUT/prof.txt | cut -c1-220 | head -40
finish
