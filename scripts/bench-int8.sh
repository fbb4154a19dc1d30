#!/usr/bin/env bash
# INT8 CPU latency, measured in one run on this machine: Vigil running the QDQ model (INT8
# kernels) against Vigil running the FP32 model and ONNX Runtime running the same QDQ model.
# Batch 1, median of N iterations, 1 and 2 threads. The QDQ models are made by ORT's static
# quantizer (scripts/make-qdq-models.py, into target/qdq/). Prints a markdown table:
# FP32 / INT8 above 1.0 means INT8 is faster; ORT / Vigil above 1.0 means Vigil is faster.
# The last column is ORT running the QDQ model as written (ORT_AS_WRITTEN=1: DQ, float op, Q),
# its exact path on x86 CPUs without VNNI, where its fused u8s8 kernels saturate.
# ROUNDS=R (default 1) runs the four measurements R times in turn and prints the median of the
# rounds' p50s and of the rounds' ratios (each round's ORT / Vigil ratio in a last column), so a
# drift of a shared VM moves both sides of a ratio alike.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-200}
ROUNDS=${ROUNDS:-1}
cargo build --release -q -p vigil
python3 scripts/make-qdq-models.py >/dev/null 2>&1 || python3 scripts/make-qdq-models.py
extra=() sep=()
[ "$ROUNDS" -gt 1 ] && extra=(" ORT-QDQ / Vigil-INT8 by round |") sep=(" --- |")
echo "| model | threads | Vigil FP32 p50 ms | Vigil INT8 p50 ms | ORT $(python3 -c 'import onnxruntime as o; print(o.__version__)') QDQ p50 ms | FP32 / INT8 | ORT-QDQ / Vigil-INT8 | ORT as written p50 ms |${extra[*]}"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |${sep[*]}"
for model in efficientnet-lite0 nanodet-m-416; do
    for t in 1 2; do
        fp=() q=() ort=() orw=()
        for _ in $(seq "$ROUNDS"); do
            fp+=("$(./target/release/vigil bench "models/$model.onnx" --threads "$t" --iterations "$N" --json 2>/dev/null)")
            q+=("$(./target/release/vigil bench "target/qdq/$model.qdq.onnx" --threads "$t" --iterations "$N" --json 2>/dev/null)")
            ort+=("$(python3 scripts/bench_ort.py "target/qdq/$model.qdq.onnx" "$t" "$N")")
            orw+=("$(ORT_AS_WRITTEN=1 python3 scripts/bench_ort.py "target/qdq/$model.qdq.onnx" "$t" "$N")")
        done
        python3 - "$model" "$t" "$ROUNDS" "${fp[@]}" "${q[@]}" "${ort[@]}" "${orw[@]}" <<'PY'
import json, statistics, sys
model, t, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
runs = [json.loads(a) for a in sys.argv[4:]]
fp, q, ort, orw = (runs[k * n:(k + 1) * n] for k in range(4))
f = [r["stats"]["p50_ms"] for r in fp]
i = [r["stats"]["p50_ms"] for r in q]
o = [r["p50_ms"] for r in ort]
w = [r["p50_ms"] for r in orw]
m = statistics.median
fi = m([a / b for a, b in zip(f, i)])
oi = [a / b for a, b in zip(o, i)]
rounds = f" {', '.join(f'{r:.2f}' for r in oi)} |" if n > 1 else ""
print(f"| {model} | {t} | {m(f):.2f} | {m(i):.2f} | {m(o):.2f} | {fi:.2f} | {m(oi):.2f} | {m(w):.2f} |{rounds}")
PY
    done
done
