#!/bin/bash
# Twentieth session. Issue 5: the final binary, with the deeper rings measured by default
# (VIGIL_CUDA_DEEP). ResNet-50 s8 at batch 32 against VIGIL_CUDA_DEEP=0, interleaved rounds,
# each arm with its own timing cache; batch 1, FP16 in the same call; the default's per-step
# profile; then Nsight Compute's memory, compute and warp-state sections for ten kernels of one
# profiled inference around layer 3's second bottleneck (ncu-layer3.csv).
# run(command="bash scripts/gpu/int8-deep.sh", carry=[".gpu/s29", ".gpu/cuda3/eval"]); ROUNDS sets the
# rounds (2), EXTRA=0 skips batch 1 and FP16, NCU=0 skips Nsight Compute, SKIP the kernels before it.
set -o pipefail
D=${D:-.gpu/s29}
. "$(dirname "$0")/int8-setup.sh"
C=$OUT/cache-deep.txt
for r in $(seq ${ROUNDS:-2}); do
  bench deep-r$r int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$C
  bench nodeep-r$r int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-nodeep.txt VIGIL_CUDA_DEEP=0
done
if [ "${EXTRA:-1}" = 1 ]; then
  bench deep-b1 int8 "$S8:1" VIGIL_CUDA_TIMING_CACHE=$C
  bench fp16 fp16 "/tmp/onnx/resnet50.onnx:32" VIGIL_CUDA_TIMING_CACHE=$C
fi
profile $C
grep -c "/8 " $OUT/prof.txt
[ "${NCU:-1}" = 1 ] || { finish; exit; }
NCUB=$(which ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "=== ncu ($SECONDS s)"
VIGIL_CUDA_TIMING_CACHE=$C VIGIL_CUDA_PROFILE=1 VIGIL_CUDA_BENCH_ITERS=4 VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="$S8:32" \
  timeout 240 $NCUB --clock-control none --profile-from-start off --launch-skip ${SKIP:-26} --launch-count 10 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis \
  --section WarpStateStats --section SchedulerStats --section LaunchStats \
  --csv --page details --log-file $OUT/ncu-layer3.csv $T bench_listed_models --nocapture > $OUT/ncu-prog.txt 2>&1
echo "rc $?"; grep -E "==ERROR==" $OUT/ncu-prog.txt | head -3; wc -l $OUT/ncu-layer3.csv
finish
