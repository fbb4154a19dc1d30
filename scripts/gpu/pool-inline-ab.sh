#!/bin/bash
# Issue 3 on the H200, twenty-fourth session: the pool's inlined fast path (alloc, free, the
# size-class search and the thread token inlined; the background region's pending-move work out
# of line) against the build before it, on one host. Runs the CUDA pool tests, then the
# allocator benchmark's `background` rows of the new build, the old build and the new build
# again (so a drift of the host shows), each row the median of 3 interleaved runs, on two pinned
# cores (the allocating thread and the page mover); then the stream-safety A/B
# (POOL_BENCH_ROWS=ab, 20 M steps, one pinned core) of the new, old and new builds.
# PARTS picks what runs (default "tests background ab").
# run(command="bash scripts/gpu/pool-inline-ab.sh", carry=[".gpu/s37"])
set -o pipefail
D=${D:-.gpu/s37}  # carried: cuda_pool.gz (cargo test --release -p vigil-engine --features cuda --test cuda_pool --no-run),
                  # pool.gz (cargo bench -p vigil-engine --features cuda --bench pool --no-run) and pool_old.gz
                  # (the same bench built at the commit before), stripped
. "$(dirname "$0")/device-env.sh"
for b in cuda_pool pool pool_old; do gunzip -c $D/$b.gz > /tmp/$b && chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$OUT/gpu.txt"
PARTS=${PARTS:-tests background ab}
[[ $PARTS == *tests* ]] && timeout 150 /tmp/cuda_pool --test-threads=1 --nocapture 2>&1 | tee "$OUT/cuda_pool.txt" | grep -E "^test |test result"
for b in pool pool_old pool; do
    [[ $PARTS == *background* ]] || break
    echo "== $b"
    POOL_BENCH_ROWS=background timeout ${BENCH_S:-140} taskset -c 2,3 /tmp/$b ${ITERS:-2000000} 2>&1 | tee -a "$OUT/pool_ab.txt" |
        grep -E "^\| |page moves|mover" | grep -v "^| ---"
done
for b in pool pool_old pool pool_old pool; do
    [[ $PARTS == *ab* ]] || break
    POOL_BENCH_ROWS=ab timeout 60 taskset -c 3 /tmp/$b ${AB_ITERS:-20000000} 2>&1 | tee -a "$OUT/pool_stream_ab.txt" |
        grep -E "stream-safe layer" | sed "s/^/$b: /" | cut -c1-170
done
