#!/bin/bash
# Issue 3 on the H200, sessions 26 to 28 (.gpu/s42: the crossings build e5fe32a against
# db6e00b). Over a fixed region, a span freed for one stream
# stays apart from the space free for any stream while several streams are in use, so that
# stream-alternating work records no event (the build before it, 63214b1, promoted the other
# stream's span every step). The allocator benchmark's `background` rows now include the fixed
# region's two-stream pair and window. Second part (.gpu/s40): a background pool hands a span
# (or run of spans) kept for another stream, or a pending one, to the allocating stream in
# place, ordered on the device after the giving streams' points, instead of moving pages.
# Parts (PARTS, default "tests background ab"):
# - tests: the CUDA pool tests (the two-stream corruption check among them);
# - background: POOL_BENCH_ROWS=background of the builds in BENCHES (default "pool pool_old"),
#   on one host;
# - ab: the stream-safety A/B (POOL_BENCH_ROWS=ab, 20 M steps) of the new and old builds.
# run(command="bash scripts/gpu/pool-streams-apart.sh", carry=[".gpu/s39"]), and with
# D=.gpu/s40 carry=[".gpu/s40"] for the hand-over build
set -o pipefail
D=${D:-.gpu/s39}  # carried, stripped and gzipped: cuda_pool (cargo test --release -p vigil-engine
                  # --features cuda --test cuda_pool --no-run), pool (cargo bench -p vigil-engine
                  # --features cuda --bench pool --no-run), and pool_old: 63214b1's engine with
                  # this session's benches/pool.rs
. "$(dirname "$0")/device-env.sh"
for b in cuda_pool pool pool_old; do gunzip -c $D/$b.gz > /tmp/$b && chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
lscpu | grep -E "Model name|^CPU\(s\)|MHz" | tee -a "$OUT/gpu.txt"
PARTS=${PARTS:-tests background ab}
[[ $PARTS == *tests* ]] && timeout 150 /tmp/cuda_pool --test-threads=1 --nocapture 2>&1 | tee "$OUT/cuda_pool.txt" | grep -E "^test |test result|intact|corrupt"
for b in ${BENCHES:-pool pool_old}; do
    [[ $PARTS == *background* ]] || break
    echo "== $b"
    POOL_BENCH_ROWS=background timeout ${BENCH_S:-170} taskset -c 2,3 /tmp/$b ${ITERS:-2000000} 2>&1 | tee -a "$OUT/pool_$b.txt" |
        grep -E "^\| |page moves|mover|alone" | grep -v "^| ---"
done
for b in ${AB_BENCHES:-pool pool_old pool}; do
    [[ $PARTS == *ab* ]] || break
    POOL_BENCH_ROWS=ab timeout 60 taskset -c 3 /tmp/$b ${AB_ITERS:-20000000} 2>&1 | tee -a "$OUT/pool_stream_ab.txt" |
        grep -E "stream-safe layer" | sed "s/^/$b: /" | cut -c1-170
done
