#!/bin/bash
# Eighth session: programmatic dependent launch (PDL) between generated kernels. Benches INT8
# and FP16 with PDL on (default) and off (VIGIL_CUDA_PDL=0) in the same call, compares ResNet-50
# u8/s8 at batch 2 against the CPU, profiles ResNet-50 s8 batch 32 per step, and reads each
# kernel's DRAM bytes, duration and occupancy with ncu. SUITE_ONLY=1: the whole cuda_backend
# suite as shipped instead, then BENCH_AFTER's INT8 models. Everything comes back in all.tgz.
# Final call: SUITE_ONLY=1 SUITE_END=420 BENCH_AFTER="<s8>:32,<u8>:32,<s8>:1" bash scripts/gpu/int8-pdl.sh
# run(command="bash scripts/gpu/int8-pdl.sh", carry=[".gpu/s12", ".gpu/cuda/node", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s12}
. "$(dirname "$0")/int8-setup.sh"
export VIGIL_CUDA_TIMING_CACHE=$OUT/timing-cache.txt
if [ -z "$SUITE_ONLY" ]; then
echo "=== bench ($SECONDS s)"
bench pdl int8 "$S8:32,$U8:32,$S8:1,$PWD/$D/qdq/efficientnet-lite0.qdq-s8.onnx:1,$PWD/$D/qdq/nanodet-m-416.qdq-s8.onnx:1"
bench pdl fp16 "/tmp/onnx/resnet50.onnx:1,/tmp/onnx/resnet50.onnx:32"
bench nopdl int8 "$S8:32,$U8:32,$S8:1" VIGIL_CUDA_PDL=0
bench nopdl fp16 "/tmp/onnx/resnet50.onnx:32" VIGIL_CUDA_PDL=0
bench pdl2 int8 "$S8:32" 
echo "=== compare against the CPU ($SECONDS s)"
VIGIL_CUDA_COMPARE="$CMP" timeout 200 $T listed_models_match_cpu --nocapture > $OUT/compare.txt 2>&1; echo "rc $?"
grep -E "^test |test result|rel diff|cosine|panicked" $OUT/compare.txt | cut -c1-200 | head -12
echo "=== profile ($SECONDS s)"
VIGIL_CUDA_PROFILE=1 VIGIL_CUDA_BENCH_ITERS=20 VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="$S8:32" timeout 60 $T bench_listed_models --nocapture > $OUT/prof.txt 2>&1
grep -E "^PROFILE" $OUT/prof.txt; grep -E "^PKIND" $OUT/prof.txt | head -6
NCU=$(which ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ]; then
  echo "=== ncu ($SECONDS s)"
  VIGIL_CUDA_PROFILE=1 VIGIL_CUDA_BENCH_ITERS=4 VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="$S8:32" \
    timeout 200 $NCU --clock-control none --profile-from-start off \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,launch__grid_size,lts__t_sector_hit_rate.pct,sm__pipe_tensor_op_imma_cycles_active.avg.pct_of_peak_sustained_active \
    --csv $T bench_listed_models --nocapture > $OUT/ncu.csv 2> $OUT/ncu.err
  echo "rc $?"; tail -2 $OUT/ncu.err
fi
fi
if [ -n "$SUITE_ONLY" ]; then
echo "=== cuda_backend as shipped ($SECONDS s)"
VIGIL_ONNX_NODE_TESTS=$PWD/.gpu/cuda/node VIGIL_CUDA_COMPARE="$CMP,$PWD/models/nanodet-m-416.onnx:2" timeout $((${SUITE_END:-590} - SECONDS)) $T --test-threads=1 --nocapture > "$OUT/tests.txt" 2>&1; echo "rc $?"
grep -E "^test |test result|conformance:|allocs" "$OUT/tests.txt" | cut -c1-200 | tail -16; grep -A3 panicked "$OUT/tests.txt" | head -12
[ -n "$BENCH_AFTER" ] && bench after int8 "$BENCH_AFTER" && bench after fp16 "/tmp/onnx/resnet50.onnx:32"
fi
echo "done ($SECONDS s)"
cd $OUT && tar czf all.tgz --remove-files $(ls | grep -v all.tgz)
