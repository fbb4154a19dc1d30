#!/bin/bash
# The whole cuda_backend suite on the device (benches skipped), as shipped: FP32/FP16 against
# the CPU, INT8 QDQ models against the CPU (EfficientNet-Lite0, NanoDet-m, both ResNet-50 QDQ
# exports at batch 2 through VIGIL_CUDA_COMPARE), concurrent contexts, the pool, no device
# allocations in the steady state and ONNX's node conformance cases (.gpu/cuda/node.txz, the
# onnx==1.22.0 package's backend/test/data/node, packed).
# run(command="bash scripts/gpu/suite.sh", carry=[".gpu/s17f", ".gpu/cuda", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s17f}
. "$(dirname "$0")/int8-setup.sh"
suite
finish
