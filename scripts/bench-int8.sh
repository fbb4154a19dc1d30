#!/usr/bin/env bash
# INT8 CPU latency, measured in one run on this machine: Vigil running the QDQ model (INT8
# kernels) against Vigil running the FP32 model and ONNX Runtime running the same QDQ model,
# batch 1, at 1 and 2 threads. The QDQ models are made by ORT's static quantizer
# (scripts/make-qdq-models.py, into target/qdq/). Every arm stays loaded and they run in short
# interleaved rounds (scripts/bench-paired.py), so a shared VM's drifting clock moves all arms of
# a round alike. Prints a markdown table of p50s and of the medians over rounds of each round's
# ratio with their 95% bootstrap intervals: FP32 / INT8 above 1.0 means INT8 is faster, ORT /
# Vigil above 1.0 means Vigil is faster. The last column is ORT running the QDQ model as written
# (DQ, float op, Q: ORT_AS_WRITTEN in scripts/bench_ort.py), its exact path on x86 CPUs without
# VNNI, where its fused u8s8 kernels saturate.
# ROUNDS=R (default 40) rounds of PER=N (default 10) inferences per arm.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-40}
PER=${PER:-10}
cargo build --release -q -p vigil
python3 scripts/make-qdq-models.py >/dev/null 2>&1 || python3 scripts/make-qdq-models.py
echo "| model | threads | Vigil INT8 p50 ms | Vigil FP32 p50 ms | ORT $(python3 -c 'import onnxruntime as o; print(o.__version__)') QDQ p50 ms | FP32 / INT8 (95% CI) | ORT-QDQ / Vigil-INT8 (95% CI) | ORT as written p50 ms |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
for model in efficientnet-lite0 nanodet-m-416; do
    for t in 1 2; do
        q="target/qdq/$model.qdq.onnx"
        json=$(python3 scripts/bench-paired.py --json --threads "$t" --rounds "$ROUNDS" --per-round "$PER" \
            "vigil:$q" "vigil:models/$model.onnx" "ort:$q" "ort-written:$q")
        python3 - "$model" "$t" "$json" <<'PY'
import json, sys
model, t, r = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
i8, fp, ort, orw = r["arms"]
def ratio(a):
    q = a["ratio_to_first"]
    return f"{q['median']:.2f} ({q['ci95'][0]:.2f}-{q['ci95'][1]:.2f})"
print(f"| {model} | {t} | {i8['p50_ms']:.2f} | {fp['p50_ms']:.2f} | {ort['p50_ms']:.2f} | {ratio(fp)} | {ratio(ort)} | {orw['p50_ms']:.2f} |")
PY
    done
done
