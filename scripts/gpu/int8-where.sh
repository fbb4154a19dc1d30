#!/bin/bash
# Twelfth session, call 1: where ResNet-50 INT8 batch 32 spends its time, step by step, against
# each step's DRAM and tensor floors. Benches s8 (twice) and FP16, profiles the steps
# (VIGIL_CUDA_PROFILE=1: an event per step), then Nsight Compute's speed-of-light, occupancy
# and launch sections for every kernel of one inference (CSV, with the program's PSTEP lines).
# run(command="bash scripts/gpu/int8-where.sh", carry=[".gpu/s17", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s17}
. "$(dirname "$0")/int8-setup.sh"
echo "=== bench ($SECONDS s)"
bench s8 int8 "$S8:32,$U8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache.txt
bench s8b int8 "$S8:32,$S8:1" VIGIL_CUDA_TIMING_CACHE=$OUT/cache.txt
bench fp16 fp16 "/tmp/onnx/resnet50.onnx:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache.txt
profile $OUT/cache.txt
NCU=$(which ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "=== ncu ($SECONDS s)"
VIGIL_CUDA_TIMING_CACHE=$OUT/cache.txt VIGIL_CUDA_PROFILE=1 VIGIL_CUDA_BENCH_ITERS=4 VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="$S8:32" \
  timeout ${NCU_S:-240} $NCU --clock-control none --profile-from-start off \
  --section SpeedOfLight --section Occupancy --section LaunchStats \
  --csv --page details --log-file $OUT/ncu-details.csv $T bench_listed_models --nocapture > $OUT/ncu-prog.txt 2>&1
echo "rc $?"; wc -l $OUT/ncu-details.csv
finish
