#!/bin/bash
# Issue 3 on the H200: the CUDA pool tests (two-stream corruption check over a cudaMalloc'd
# region, the paged region, the paged pool moving pages only after a reading stream is done),
# then the allocator benchmark with the paged device rows (cuMemMap) next to the fixed ones and
# cudaMallocAsync.
set -o pipefail
D=${D:-.gpu/s14}  # carried: cuda_pool.gz (cargo test --release -p vigil-engine --test cuda_pool --no-run)
                  # and pool.gz (cargo bench -p vigil-engine --bench pool --no-run), stripped
. "$(dirname "$0")/device-env.sh"
for b in cuda_pool pool; do gunzip -c $D/$b.gz > /tmp/$b && chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 120 /tmp/cuda_pool --test-threads=1 --nocapture 2>&1 | tee "$OUT/cuda_pool.txt" | tail -25
timeout ${BENCH_S:-420} /tmp/pool ${ITERS:-10000000} 2>&1 | tee "$OUT/pool_bench.txt" | tail -40
