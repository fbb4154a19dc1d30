#!/bin/bash
# Allocator benchmark on the H200 (issue 3): Vigil's pool vs cudaMallocAsync, pair and window, one and two streams.
set -o pipefail
D=${D:-.gpu/s8}  # carried: pool_bench.gz, the stripped gzipped `cargo bench -p vigil-engine --bench pool` binary
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for l in /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib /usr/local/nvidia/lib64 /usr/local/cuda/lib64; do
  [ -d "$l" ] && LD_LIBRARY_PATH="$l:$LD_LIBRARY_PATH"
done
export LD_LIBRARY_PATH
gunzip -c $D/pool_bench.gz > /tmp/pool_bench && chmod +x /tmp/pool_bench
timeout 400 /tmp/pool_bench 10000000 2>&1 | tee "$OUT/pool_bench.txt" | tail -30
