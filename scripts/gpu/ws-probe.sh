#!/bin/bash
# Twentieth session. Issue 5: what bounds the wgmma convolutions of ResNet-50 s8 at batch 32.
# With VIGIL_CUDA_WS_PROBE=1 the model build times each convolution's chosen wgmma tiling again
# with its ring loads left out, with its wgmmas left out, and with both (codegen/probe.rs), and
# prints a WSPROBE line per convolution. Arms, each with a fresh timing cache: the default
# candidates; wgmma tilings only with the warp-specialized ones timed too; warp-specialized only.
# run(command="bash scripts/gpu/ws-probe.sh", carry=[".gpu/s29", ".gpu/cuda3/eval"])
# .gpu/s29: cuda_backend.gz (cargo test --release -p vigil-engine --features cuda --test
# cuda_backend --no-run, stripped), qdq.txz and the torch scripts as in int8-setup.sh.
set -o pipefail
D=${D:-.gpu/s29}
. "$(dirname "$0")/int8-setup.sh"
probe() {
  local name=$1; shift
  echo "=== probe $name ($SECONDS s)"
  env "$@" VIGIL_CUDA_WS_PROBE=1 VIGIL_CUDA_TIMING_CACHE=$OUT/cache-$name.txt VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="$S8:32" \
    timeout 240 $T bench_listed_models --nocapture > $OUT/probe-$name.txt 2>&1; echo "rc $?"
  grep -E "^BENCH|panicked" $OUT/probe-$name.txt | cut -c1-200
  grep -c WSPROBE $OUT/probe-$name.txt
}
probe default
probe wgmma-ws VIGIL_CUDA_WGMMA=force VIGIL_CUDA_WS=1
probe ws VIGIL_CUDA_WGMMA=force VIGIL_CUDA_WS=force
finish
