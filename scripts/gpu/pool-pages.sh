#!/bin/bash
# Issue 3 on the H200, sixteenth session: 4 MiB pages for the paged pool. Runs the CUDA pool
# tests (the paged region with 2 and 4 MiB pages among them), then the allocator benchmark: the
# fixed pool over a cudaMalloc'd region, the paged pool with 2 and 4 MiB pages, and
# cudaMallocAsync, in one binary. (The session's call ran a build that also had a background
# unmapper, since removed: docs/benchmarks.md, sixteenth session.)
# run(command="bash scripts/gpu/pool-pages.sh", carry=[".gpu/s21"])
set -o pipefail
D=${D:-.gpu/s21}  # carried: cuda_pool.gz (cargo test --release -p vigil-engine --test cuda_pool --no-run)
                  # and pool.gz (cargo bench -p vigil-engine --bench pool --no-run), stripped
. "$(dirname "$0")/device-env.sh"
for b in cuda_pool pool; do gunzip -c $D/$b.gz > /tmp/$b && chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$OUT/gpu.txt"
timeout 120 /tmp/cuda_pool --test-threads=1 --nocapture 2>&1 | tee "$OUT/cuda_pool.txt" | grep -E "^test |test result|page .* B, background"
timeout ${BENCH_S:-450} /tmp/pool ${ITERS:-10000000} 2>&1 | tee "$OUT/pool_bench.txt" | grep -v "^  " | tail -45
