#!/bin/bash
# Eighth session, last call: where the INT8 ResNet-50 batch-32 kernels stall. Nsight Compute's
# speed-of-light, memory-workload, warp-state, scheduler and occupancy sections for every kernel
# of one profiled inference (VIGIL_CUDA_PROFILE=1 brackets run 3 with cuProfilerStart/Stop), as
# CSV; the program's own output (PSTEP lines: which step each kernel is) beside it.
# run(command="bash scripts/gpu/int8-ncu.sh", carry=[".gpu/s12", ".gpu/cuda/node", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s12}
. "$(dirname "$0")/int8-setup.sh"
NCU=$(which ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "=== ncu sections ($SECONDS s)"
VIGIL_CUDA_PROFILE=1 VIGIL_CUDA_BENCH_ITERS=4 VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="/tmp/onnx/resnet50.qdq.s8.onnx:32" \
  timeout ${NCU_S:-420} $NCU --clock-control none --profile-from-start off \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
  --csv --page details --log-file $OUT/ncu-details.csv $T bench_listed_models --nocapture > $OUT/ncu-prog.txt 2>&1
echo "rc $?"; grep -E "^BENCH|^PROFILE|==ERROR==" $OUT/ncu-prog.txt | head; wc -l $OUT/ncu-details.csv
echo "done ($SECONDS s)"
cd $OUT && tar czf all.tgz --remove-files $(ls | grep -v all.tgz)
