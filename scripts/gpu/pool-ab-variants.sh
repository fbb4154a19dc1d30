#!/bin/bash
# Seventeenth session, fourth call. Issue 3: is the stream-safe layer's smaller overhead in the
# third call a faster "on" arm or a slower "off" one? The fixed pool's stream-safety A/B
# (POOL_BENCH_ROWS=ab, 20 M steps, pinned to one core) for three builds of the pool bench,
# four interleaved rounds: the session's start (pool_prev), the small-block test once per carve
# only (pool_split), and that plus the out-of-line slow paths (pool_full, this session's pool).
# run(command="bash scripts/gpu/pool-ab-variants.sh", carry=[".gpu/s25"])
# Fifth call: the same for pool_v3 (the cold paths of the remote-free drain and of an oversized
# request also out of line), with D=.gpu/s26 BINS="pool_prev pool_full pool_v3" ROUNDS=3; it was
# no better than pool_full and was not kept.
set -o pipefail
D=${D:-.gpu/s25}
. "$(dirname "$0")/device-env.sh"
BINS=${BINS:-pool_prev pool_split pool_full}
for b in $BINS; do gunzip -c $D/$b.gz > /tmp/$b && chmod +x /tmp/$b; done
for r in $(seq ${ROUNDS:-4}); do
  for b in $BINS; do
    POOL_BENCH_ROWS=ab timeout 60 taskset -c 3 /tmp/$b ${ITERS:-20000000} > "$OUT/ab-$b-$r.txt" 2>&1
    grep -E "stream-safe layer|no CUDA" "$OUT/ab-$b-$r.txt" | sed "s/^Vigil FixedPool, cudaMalloc'd region, /$b r$r /; s/stream-safe layer on the default stream //; s/(median of 10 alternating rounds of 2000000 steps; //"
  done
done
echo "done ($SECONDS s)"
