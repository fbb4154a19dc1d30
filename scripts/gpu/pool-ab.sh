#!/bin/bash
# Seventeenth session, third call. Issue 3: the CUDA pool tests on this session's pool, then the
# fixed pool's stream-safety A/B (POOL_BENCH_ROWS=ab, 20 M steps, pinned to one core) of this
# session's pool against the session's starting binary, three interleaved rounds each. Issue 5:
# ResNet-50 s8 at batch 32 with VIGIL_CUDA_LIB_STEP_US 0 and -1 (cuBLASLt favoured within 1 µs),
# four interleaved rounds on one timing cache.
# run(command="bash scripts/gpu/pool-ab.sh", carry=[".gpu/s24"])
# .gpu/s24: pool.gz, cuda_pool.gz (stripped: cargo bench -p vigil-engine --features cuda --bench
# pool --no-run; cargo test --release -p vigil-engine --features cuda --test cuda_pool --no-run),
# pool_prev.gz (the session's first pool binary), cuda_backend.gz, qdq.txz, torch scripts.
set -o pipefail
D=${D:-.gpu/s24}
. "$(dirname "$0")/int8-setup.sh"
for b in pool pool_prev cuda_pool; do gunzip -c $D/$b.gz > /tmp/$b && chmod +x /tmp/$b; done
lscpu | grep -E "Model name|^CPU\(s\)|MHz" | tee "$OUT/cpu.txt"
timeout 120 /tmp/cuda_pool --test-threads=1 --nocapture > "$OUT/cuda_pool.txt" 2>&1
grep -E "^test |test result" "$OUT/cuda_pool.txt"
for r in 1 2 3; do
  for b in pool pool_prev; do
    POOL_BENCH_ROWS=ab timeout 100 taskset -c 3 /tmp/$b ${ITERS:-20000000} > "$OUT/ab-$b-$r.txt" 2>&1
    grep -E "stream-safe layer|no CUDA" "$OUT/ab-$b-$r.txt" | sed "s/^/$b r$r /" | cut -c1-150
  done
done
C=$OUT/cache-lib.txt
for r in 1 2 3 4; do
  for us in 0 -1; do
    bench lib$us-r$r int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$C VIGIL_CUDA_LIB_STEP_US=$us
  done
done
finish
