#!/bin/bash
# Seventeenth session. Issue 5: does charging a cuBLASLt step for the overlap it costs in the
# graph (VIGIL_CUDA_LIB_STEP_US, with programmatic launch) pick faster ResNet-50 INT8 plans?
# ResNet-50 s8 at batch 32 with 0, 1, 2 and 3 µs a library step, two interleaved rounds, every
# arm on one implicit-GEMM timing cache (so only the cuBLASLt comparison differs), FP16 in the
# same call, and the per-step profiles of the 0 and 2 µs plans (their cuBLASLt step counts).
# Issue 3 first: the stream-safety A/B of the fixed pool (POOL_BENCH_ROWS=ab, 20 M steps).
# run(command="bash scripts/gpu/int8-libstep.sh", carry=[".gpu/s22"])
# .gpu/s22: cuda_backend.gz (cargo test --release -p vigil-engine --features cuda --test
# cuda_backend --no-run), pool.gz (cargo bench -p vigil-engine --features cuda --bench pool
# --no-run), both stripped; qdq.txz and the torch scripts as in int8-setup.sh.
set -o pipefail
D=${D:-.gpu/s22}
. "$(dirname "$0")/int8-setup.sh"
if [ "$PART" != int8 ]; then
  echo "=== pool stream-safety A/B ($SECONDS s)"
  gunzip -c $D/pool.gz > /tmp/pool && chmod +x /tmp/pool
  POOL_BENCH_ROWS=ab timeout 120 /tmp/pool ${ITERS:-20000000} > "$OUT/pool_ab.txt" 2>&1
  grep -E "stream-safe layer|no CUDA" "$OUT/pool_ab.txt"
fi
if [ "$PART" != pool ]; then
  C=$OUT/cache-libstep.txt
  for r in 1 2; do
    for us in ${STEPS_US:-0 1 2 3}; do
      bench lib$us-r$r int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$C VIGIL_CUDA_LIB_STEP_US=$us
    done
  done
  bench fp16 fp16 "/tmp/onnx/resnet50.onnx:32" VIGIL_CUDA_TIMING_CACHE=$C
  for us in 0 2; do
    profile $C VIGIL_CUDA_LIB_STEP_US=$us; mv $OUT/prof.txt $OUT/prof-lib$us.txt
    echo "lib $us µs: $(grep -c "cublasLt int8" $OUT/prof-lib$us.txt) cuBLASLt convolutions"
  done
fi
finish
