#!/bin/bash
# Fourteenth session, last call: reshapes planned in place (no device copy where the input dies
# at the reshape). Benches this binary against the session's starting one
# (cuda_backend_prev.gz), interleaved, each with its own timing cache, plus FP16 and a
# per-step profile (the Flatten step should take no time), then runs the whole suite
# (suite.sh's test command) on this binary.
# run(command="bash scripts/gpu/int8-reshape.sh", carry=[".gpu/s19", ".gpu/cuda", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s19}
. "$(dirname "$0")/int8-setup.sh"
gunzip -c $D/cuda_backend_prev.gz > /tmp/cuda_backend_prev && chmod +x /tmp/cuda_backend_prev
OFF_T=/tmp/cuda_backend_prev ab final VIGIL_CUDA_HALO=1 VIGIL_CUDA_HALO=1
grep -E "^PSTEP +(0|1|2|5[6-9]|60) " $OUT/prof.txt | cut -c1-120
mkdir -p /tmp/node && xz -dc .gpu/cuda/node.txz | tar xf - -C /tmp/node
echo "=== suite ($SECONDS s)"
VIGIL_ONNX_NODE_TESTS=/tmp/node/node VIGIL_CUDA_TIMING_CACHE=$OUT/cache.txt VIGIL_CUDA_COMPARE="$CMP,$PWD/models/nanodet-m-416.onnx:2" \
  timeout $((590 - SECONDS)) $T --skip bench_ --test-threads=1 --nocapture > "$OUT/tests.txt" 2>&1; echo "rc $?"
grep -E "^test |test result|conformance|passed|panicked" "$OUT/tests.txt" | cut -c1-200 | tail -25
finish
