#!/bin/bash
# Eighth session: does the per-convolution choice between the implicit GEMM and cuBLASLt (timed
# each on its own) hold inside the graph? ResNet-50 s8 batch 32 as chosen, with cuBLASLt off
# (the implicit GEMM everywhere), and with cuBLASLt off and the cluster K split measured.
# run(command="bash scripts/gpu/int8-lt-ab.sh", carry=[".gpu/s12", ".gpu/cuda/node", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s12}
. "$(dirname "$0")/int8-setup.sh"
export VIGIL_CUDA_TIMING_CACHE=$OUT/timing-cache.txt
bench chosen int8 "$S8:32"
bench lt0 int8 "$S8:32" VIGIL_CUDA_LT=0
bench lt0-cluster int8 "$S8:32" VIGIL_CUDA_LT=0 VIGIL_CUDA_CLUSTER=1
bench chosen-again int8 "$S8:32"
echo "done ($SECONDS s)"
