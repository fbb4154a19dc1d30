#!/usr/bin/env bash
# Instructions per alloc+free pair of the fixed pool's fast path, counted by cachegrind: a
# deterministic figure where a noisy VM's timings are not (docs/benchmarks.md). Counts two runs
# of N and 2N pairs and divides the difference, so set-up costs cancel.
# Usage: scripts/pool-pair-instructions.sh [fixed|paged|background ...]   (N=200000 by default;
# OFF=1 turns stream safety off, the stream-safety A/B's other arm: fixed region only;
# POOL_PAIR_WINDOW=1 counts the window workload's steps instead; POOL_PAIR_STREAMS=2 alternates
# the allocations between two streams)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 1; }
N=${N:-200000}
cargo build --release -q -p vigil-engine --example pool_pair
bin=${CARGO_TARGET_DIR:-target}/release/examples/pool_pair
count() {
    valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null "$bin" "$1" "$2" ${OFF:+off} 2>&1 |
        awk '/I *refs/ { gsub(",", "", $NF); print $NF }'
}
shapes=("$@")
[ ${#shapes[@]} -gt 0 ] || shapes=(fixed paged background)
for s in "${shapes[@]}"; do
    "$bin" "$s" 1 ${OFF:+off} >/dev/null # says why a shape cannot run (paged pools need stream safety)
    a=$(count "$s" "$N")
    b=$(count "$s" $((2 * N)))
    what=pair; [ -n "${POOL_PAIR_WINDOW:-}" ] && what="window step"
    echo "$s${OFF:+ (stream safety off)}${POOL_PAIR_STREAMS:+, $POOL_PAIR_STREAMS streams}: $(((b - a) / N)) instructions per $what"
done
