#!/bin/bash
# Fills the git-ignored folders the INT8 device scripts carry, from this checkout alone (a new
# checkout has none of them):
#   $D (default .gpu/s52): cuda_backend.gz (the stripped, gzipped `cuda_backend` test binary with
#     the `cuda` feature), qdq.txz (scripts/make-qdq-models.py with and without --s8, packed)
#     and the torch scripts torch_bench.py, torch_timing.py and qdq_resnet50.py;
#   .gpu/cuda/node.txz: onnx's node conformance cases (backend/test/data/node), packed;
#   .gpu/cuda3/eval: a copy of ../shared/images/eval.
# Needs python3 with onnx==1.22.0, onnxruntime, pillow and numpy (pip install). Parts already
# there are kept unless FRESH=1; the binary is always rebuilt.
# Then: run(command="D=$D bash -c '. scripts/gpu/int8-setup.sh; suite'",
#           carry=["$D", ".gpu/cuda3/eval", ".gpu/cuda"])
set -euo pipefail
cd "$(dirname "$0")/../.."
D=${D:-.gpu/s52}
SHARED=${VIGIL_SHARED:-../shared}
mkdir -p "$D" .gpu/cuda .gpu/cuda3
[ -n "${FRESH:-}" ] && rm -f "$D/qdq.txz" .gpu/cuda/node.txz && rm -rf .gpu/cuda3/eval

bin=$(cargo test --release -p vigil-engine --features cuda --test cuda_backend --no-run \
    --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "cuda_backend" and m.get("executable"):
        print(m["executable"])')
[ -n "$bin" ] || { echo "the cuda_backend test binary did not build" >&2; exit 1; }
strip -o "$D/cuda_backend" "$bin" && gzip -f "$D/cuda_backend"
echo "binary: $bin ($(git rev-parse --short HEAD)$(git diff --quiet || echo ', uncommitted changes'))"

if [ ! -f "$D/qdq.txz" ]; then
    tmp=$(mktemp -d)
    python3 scripts/make-qdq-models.py "$tmp/qdq" >/dev/null
    python3 scripts/make-qdq-models.py --s8 "$tmp/qdq" >/dev/null
    tar cf - -C "$tmp" qdq | xz -9 > "$D/qdq.txz"
    rm -rf "$tmp"
fi
cp scripts/gpu/torch_bench.py scripts/gpu/torch_timing.py scripts/gpu/qdq_resnet50.py "$D/"

if [ ! -f .gpu/cuda/node.txz ]; then
    data=$(python3 -c 'import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data"))')
    tar cf - -C "$data" node | xz -6 > .gpu/cuda/node.txz
fi
[ -d .gpu/cuda3/eval ] || cp -r "$SHARED/images/eval" .gpu/cuda3/eval
du -sh "$D" .gpu/cuda .gpu/cuda3
