#!/bin/bash
# Session s6, fourth call: stream retirement (contexts created and dropped past MAX_STREAMS),
# concurrency, the rest of cuda_backend, and the pool's two-stream corruption check.
set -o pipefail
D=${D:-.gpu/s6}  # carried: gzipped test binaries (cuda_backend, cuda_pool), qdq.txz, torch_bench.py, torch_timing.py, qdq_resnet50.py
. "$(dirname "$0")/device-env.sh"
export VIGIL_CUDA_POOL_MB=3072 VIGIL_MODELS=$PWD/models VIGIL_EVAL_IMAGES=$PWD/.gpu/cuda3/eval VIGIL_QDQ_MODELS=$PWD/$D/qdq
mkdir -p $D/qdq && xz -dc $D/qdq.txz | tar xf - -C $D
for f in cuda_backend cuda_pool; do gunzip -c $D/$f.gz > /tmp/$f && chmod +x /tmp/$f; done
timeout 60 /tmp/cuda_backend --nocapture contexts_come_and_go > $OUT/retire.txt 2>&1; echo "retire rc $?"; grep -E "contexts created|test result|panicked" -A2 $OUT/retire.txt | head -6
ok=0; for i in $(seq 5); do timeout 40 /tmp/cuda_backend contexts_share > $OUT/c.txt 2>&1 && ok=$((ok+1)); done; echo "concurrent contexts: $ok/5 passed"
VIGIL_ONNX_NODE_TESTS=$PWD/.gpu/cuda/node timeout 240 /tmp/cuda_backend --test-threads=1 --nocapture > "$OUT/tests.txt" 2>&1; echo "suite rc $?"
grep -E "test result|conformance:|int8 GPU vs CPU|allocs" "$OUT/tests.txt" | tail -6; grep -A3 panicked "$OUT/tests.txt" | head -8
timeout 60 /tmp/cuda_pool --test-threads=1 --nocapture > "$OUT/pool.txt" 2>&1; echo "pool rc $?"; grep -E "test result|intact|corrupt" "$OUT/pool.txt" | tail -4
