#!/bin/bash
# Issue 3 on the H200, twenty-second session: the paged pool whose pages move on a mover thread
# (BackgroundPagedRegion; the allocating thread queues the moves, streams wait for them on the
# device). Runs the CUDA pool tests (the new background-move tests among them), then the
# allocator benchmark's `background` rows: the fixed pool over a cudaMalloc'd region, the paged
# pool with 4 MiB pages moving inline and moving in the background, and cudaMallocAsync, in one
# binary.
# run(command="bash scripts/gpu/pool-background.sh", carry=[".gpu/s31"])
set -o pipefail
D=${D:-.gpu/s31}  # carried: cuda_pool.gz (cargo test --release -p vigil-engine --features cuda --test cuda_pool --no-run)
                  # and pool.gz (cargo bench -p vigil-engine --features cuda --bench pool --no-run), stripped
. "$(dirname "$0")/device-env.sh"
for b in cuda_pool pool; do gunzip -c $D/$b.gz > /tmp/$b && chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$OUT/gpu.txt"
timeout 150 /tmp/cuda_pool --test-threads=1 --nocapture 2>&1 | tee "$OUT/cuda_pool.txt" | grep -E "^test |test result|background moves|child:|home mappings"
POOL_BENCH_ROWS=background timeout ${BENCH_S:-300} /tmp/pool ${ITERS:-10000000} 2>&1 | tee "$OUT/pool_bench.txt" | grep -v "^  " | tail -60
