#!/usr/bin/env bash
# HTTP end-to-end throughput on loopback (wrk posting a real photo to /v1/models/M/infer)
# against raw engine throughput (`vigil bench`), in one run. The difference per request is the
# API's overhead: HTTP, JPEG/PNG decode, preprocessing, postprocessing and JSON.
# Needs Debian's wrk. Usage: scripts/bench-http.sh [MODEL] [IMAGE]
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-efficientnet-lite0}
IMAGE=${2:-../shared/images/eval/coffee.png}
PORT=${PORT:-18080}
DURATION=${DURATION:-10s}
cargo build --release -q -p vigil
./target/release/vigil serve --listen "127.0.0.1:$PORT" >/tmp/vigil-bench-serve.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$PORT/v2/health/ready" >/dev/null && break
    sleep 0.2
done
lua=$(mktemp --suffix=.lua)
cat >"$lua" <<LUA
local f = io.open("$IMAGE", "rb")
wrk.method = "POST"
wrk.body = f:read("*all")
f:close()
wrk.headers["Content-Type"] = "application/octet-stream"
LUA
raw=$(./target/release/vigil bench "$MODEL" --iterations 200 --json 2>/dev/null)
echo "raw engine ($MODEL, default threads): $(python3 -c "import json,sys; s=json.loads(sys.argv[1])['stats']; print(f\"p50 {s['p50_ms']:.2f} ms, {s['throughput']:.1f} inferences/s\")" "$raw")"
for c in 1 2 4; do
    out=$(wrk -t1 -c"$c" -d"$DURATION" -s "$lua" "http://127.0.0.1:$PORT/v1/models/$MODEL/infer")
    rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
    lat=$(echo "$out" | awk '/Latency/ {print $2; exit}')
    non2xx=$(echo "$out" | awk '/Non-2xx/ {print $NF}')
    echo "wrk -c$c: $rps req/s, mean latency $lat, non-2xx ${non2xx:-0}"
done
