#!/bin/bash
# Allocator benchmark on the H200 (issue 3): Vigil's pool vs cudaMallocAsync, pair and window, one and two streams.
set -o pipefail
D=${D:-.gpu/s8}  # carried: pool_bench.gz, the stripped gzipped `cargo bench -p vigil-engine --bench pool` binary
. "$(dirname "$0")/device-env.sh"
gunzip -c $D/pool_bench.gz > /tmp/pool_bench && chmod +x /tmp/pool_bench
timeout 400 /tmp/pool_bench 10000000 2>&1 | tee "$OUT/pool_bench.txt" | tail -30
