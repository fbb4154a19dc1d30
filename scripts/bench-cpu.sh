#!/usr/bin/env bash
# CPU latency of Vigil against ONNX Runtime, measured in one run on this machine: batch 1, median
# of N iterations, 1 and 2 threads, both shared models. Prints a markdown table of ratios
# (Vigil / ORT: below 1.0 means Vigil is faster). Needs pip onnxruntime==1.32.*.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-200}
cargo build --release -q -p vigil
echo "| model | threads | Vigil p50 ms | ORT $(python3 -c 'import onnxruntime as o; print(o.__version__)') p50 ms | Vigil / ORT |"
echo "| --- | --- | --- | --- | --- |"
for model in efficientnet-lite0 nanodet-m-416; do
    for t in 1 2; do
        ort=$(python3 scripts/bench_ort.py "models/$model.onnx" "$t" "$N")
        vig=$(./target/release/vigil bench "models/$model.onnx" --threads "$t" --iterations "$N" --json 2>/dev/null)
        python3 - "$model" "$t" "$vig" "$ort" <<'PY'
import json, sys
model, t, vig, ort = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
v, o = vig["stats"]["p50_ms"], ort["p50_ms"]
print(f"| {model} | {t} | {v:.2f} | {o:.2f} | {v / o:.2f} |")
PY
    done
done
