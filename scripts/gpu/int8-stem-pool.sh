#!/bin/bash
# Nineteenth session. Issue 5: the fused stem kernel (the image's QuantizeLinear, the 7x7 stem
# and its max pool in one kernel, VIGIL_CUDA_STEM_POOL). First the exactness check (ResNet-50 s8
# and u8 at batch 2 and the shared NanoDet-m QDQ models: forced against off, same bytes) and the
# INT8 QDQ models against the CPU with the default paths; then ResNet-50 s8 at batch 32 (and
# batch 1) with the fused stem measured (the default) against off, interleaved rounds on one
# timing cache, FP16 in the same call, and the default plan's per-step profile.
# run(command="bash scripts/gpu/int8-stem-pool.sh", carry=[".gpu/s28", ".gpu/cuda3/eval"]); EXACT=0
# skips the checks, ROUNDS sets the bench rounds (2), NCU=1 adds Nsight Compute's sections for
# the first kernels of one profiled inference with the fused stem forced (ncu-stem.csv).
# .gpu/s28: cuda_backend.gz (cargo test --release -p vigil-engine --features cuda --test
# cuda_backend --no-run, stripped), qdq.txz and the torch scripts as in int8-setup.sh, and
# cache.txt (a timing cache of an earlier call) when there is one.
set -o pipefail
D=${D:-.gpu/s28}
. "$(dirname "$0")/int8-setup.sh"
C=$OUT/cache-stem.txt
[ -f $D/cache.txt ] && cp $D/cache.txt $C
if [ "${EXACT:-1}" != 0 ]; then
  echo "=== exactness ($SECONDS s)"
  VIGIL_CUDA_TIMING_CACHE=$C VIGIL_CUDA_COMPARE="$S8:2,$U8:2" \
    timeout 200 $T int8_fused_stem_matches_the_separate_kernels int8_qdq_models_match_cpu_int8 --test-threads=1 --nocapture > $OUT/stem-exact.txt 2>&1; echo "rc $?"
  grep -E "^test |test result|fused stem|rel diff|panicked|left out|cosine|top-1" $OUT/stem-exact.txt | cut -c1-200 | head -40
fi
for r in $(seq ${ROUNDS:-2}); do
  bench stem-r$r int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$C
  bench nostem-r$r int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$C VIGIL_CUDA_STEM_POOL=0
done
bench stem-b1 int8 "$S8:1" VIGIL_CUDA_TIMING_CACHE=$C
bench nostem-b1 int8 "$S8:1" VIGIL_CUDA_TIMING_CACHE=$C VIGIL_CUDA_STEM_POOL=0
bench fp16 fp16 "/tmp/onnx/resnet50.onnx:32" VIGIL_CUDA_TIMING_CACHE=$C
profile $C
grep -E "MaxPool|QConv '.*conv1'|stem" $OUT/prof.txt | cut -c1-240 | head -12
if [ "${NCU:-0}" = 1 ]; then
  NCUB=$(which ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  echo "=== ncu ($SECONDS s)"
  VIGIL_CUDA_STEM_POOL=force VIGIL_CUDA_TIMING_CACHE=$C VIGIL_CUDA_PROFILE=1 VIGIL_CUDA_BENCH_ITERS=4 VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="$S8:32" \
    timeout 200 $NCUB --clock-control none --profile-from-start off --launch-count 3 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
    --csv --page details --log-file $OUT/ncu-stem.csv $T bench_listed_models --nocapture > $OUT/ncu-prog.txt 2>&1
  echo "rc $?"; grep -E "==ERROR==" $OUT/ncu-prog.txt | head -3; wc -l $OUT/ncu-stem.csv
fi
finish
