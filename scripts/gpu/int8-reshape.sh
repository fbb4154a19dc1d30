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
suite
finish
