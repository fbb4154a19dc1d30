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
probe default
probe wgmma-ws VIGIL_CUDA_WGMMA=force VIGIL_CUDA_WS=1
probe ws VIGIL_CUDA_WGMMA=force VIGIL_CUDA_WS=force
finish
