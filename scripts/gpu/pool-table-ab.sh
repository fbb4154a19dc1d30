#!/bin/bash
# Issue 3 on the H200, twenty-fifth session: the pool's node and tag tables without bounds checks
# (c0f3ca7), and the background region's wake-ups only for parked threads (d31259c), against the
# build before them (9408af0), on one host, and where the background pool's pair goes. (The
# session also measured a mover that spun 20 us before parking, with SPIN=0 for the other arm:
# no measurable difference, so it was removed; docs/benchmarks.md.)
# Parts (PARTS, default "tests pair background ab"):
# - tests: the CUDA pool tests;
# - pair: the pair loop alone over fake regions (`examples/pool_pair`, host only, one pinned
#   core), new and old builds interleaved, 3 rounds: fixed, paged and background shapes, and the
#   new build's paged and background shapes with the other's top-carve threshold
#   (POOL_PAIR_SMALL_PAGES), so the host's response to the placement shows apart from the
#   device region's; then the new build's window steps over the fixed and background shapes;
# - background: the allocator benchmark's `background` rows (which now time the background
#   region's `order_after_moves` alone) of the new, old and new builds;
# - ab: the stream-safety A/B (POOL_BENCH_ROWS=ab, 20 M steps) of the new, old and new builds.
# run(command="bash scripts/gpu/pool-table-ab.sh", carry=[".gpu/s38"])
set -o pipefail
D=${D:-.gpu/s38}  # carried, stripped and gzipped: cuda_pool (cargo test --release -p vigil-engine
                  # --features cuda --test cuda_pool --no-run), pool (cargo bench -p vigil-engine
                  # --features cuda --bench pool --no-run), pool_pair (cargo build --release -p
                  # vigil-engine --example pool_pair), and pool_old, pool_pair_old built at 9408af0
. "$(dirname "$0")/device-env.sh"
for b in cuda_pool pool pool_old pool_pair pool_pair_old; do gunzip -c $D/$b.gz > /tmp/$b && chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
lscpu | grep -E "Model name|^CPU\(s\)|MHz" | tee -a "$OUT/gpu.txt"
PARTS=${PARTS:-tests pair background ab}
[[ $PARTS == *tests* ]] && timeout 150 /tmp/cuda_pool --test-threads=1 --nocapture 2>&1 | tee "$OUT/cuda_pool.txt" | grep -E "^test |test result"
if [[ $PARTS == *pair* ]]; then
    for r in 1 2 3; do
        for b in pool_pair pool_pair_old; do
            for s in fixed paged background; do
                echo "round $r $b $(taskset -c 2 /tmp/$b $s ${PAIR_STEPS:-10000000})"
            done
        done
        echo "round $r pool_pair small=2 $(POOL_PAIR_SMALL_PAGES=2 taskset -c 2 /tmp/pool_pair paged ${PAIR_STEPS:-10000000})"
        echo "round $r pool_pair small=1 $(POOL_PAIR_SMALL_PAGES=1 taskset -c 2 /tmp/pool_pair background ${PAIR_STEPS:-10000000})"
        for s in fixed background; do
            echo "round $r pool_pair window $(POOL_PAIR_WINDOW=1 taskset -c 2 /tmp/pool_pair $s 2000000)"
        done
    done 2>&1 | tee "$OUT/pool_pair.txt"
fi
for b in ${BENCHES:-pool pool_old pool}; do
    [[ $PARTS == *background* ]] || break
    echo "== $b"
    POOL_BENCH_ROWS=background timeout ${BENCH_S:-140} taskset -c 2,3 /tmp/$b ${ITERS:-2000000} 2>&1 | tee -a "$OUT/pool_ab.txt" |
        grep -E "^\| |page moves|mover|alone" | grep -v "^| ---"
done
for b in pool pool_old pool pool_old pool; do
    [[ $PARTS == *ab* ]] || break
    POOL_BENCH_ROWS=ab timeout 60 taskset -c 3 /tmp/$b ${AB_ITERS:-20000000} 2>&1 | tee -a "$OUT/pool_stream_ab.txt" |
        grep -E "stream-safe layer" | sed "s/^/$b: /" | cut -c1-170
done
