#!/bin/bash
# Seventeenth session, second call. Issue 5: ResNet-50 s8 at batch 32 with cuBLASLt favoured
# within 1, 2 or 3 µs (VIGIL_CUDA_LIB_STEP_US=-1..-3, one shared implicit-GEMM timing cache) and
# with every generated kernel preferring the full shared-memory carveout (VIGIL_CUDA_CARVEOUT=100,
# its own cache), against the default, two interleaved rounds; FP16 in the same call and the
# carveout arm's per-step profile. Issue 3 first: the fixed pool's stream-safety A/B, this
# session's pool (one small-block test per carve) against the previous binary, interleaved.
# run(command="bash scripts/gpu/int8-carveout.sh", carry=[".gpu/s23"])
# .gpu/s23: cuda_backend.gz, pool.gz (as in int8-libstep.sh), pool_prev.gz (the first call's
# pool binary), qdq.txz and the torch scripts.
set -o pipefail
D=${D:-.gpu/s23}
. "$(dirname "$0")/int8-setup.sh"
if [ "$PART" != int8 ]; then
  for b in pool pool_prev; do gunzip -c $D/$b.gz > /tmp/$b && chmod +x /tmp/$b; done
  for r in 1 2; do
    for b in pool pool_prev; do
      echo "=== $b round $r ($SECONDS s)"
      POOL_BENCH_ROWS=ab timeout 100 /tmp/$b ${ITERS:-20000000} > "$OUT/ab-$b-$r.txt" 2>&1
      grep -E "stream-safe layer|no CUDA" "$OUT/ab-$b-$r.txt" | sed "s/^/$b /"
    done
  done
fi
if [ "$PART" != pool ]; then
  C=$OUT/cache-lib.txt; CC=$OUT/cache-carve.txt
  for r in 1 2; do
    for us in 0 -1 -2 -3; do
      bench lib$us-r$r int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$C VIGIL_CUDA_LIB_STEP_US=$us
    done
    bench carve100-r$r int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$CC VIGIL_CUDA_CARVEOUT=100
  done
  bench fp16 fp16 "/tmp/onnx/resnet50.onnx:32" VIGIL_CUDA_TIMING_CACHE=$C
  for us in -2; do
    profile $C VIGIL_CUDA_LIB_STEP_US=$us; mv $OUT/prof.txt $OUT/prof-lib$us.txt
    echo "lib $us µs: $(grep -c "cublasLt int8" $OUT/prof-lib$us.txt) cuBLASLt convolutions"
  done
  profile $CC VIGIL_CUDA_CARVEOUT=100; mv $OUT/prof.txt $OUT/prof-carve.txt
fi
finish
