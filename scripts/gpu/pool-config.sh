#!/bin/bash
# Issue 3 on the GPU: each device's activation pool sized by the config and exported on
# /metrics. Runs app/tests/cuda_serve.rs (cuda_pool_mb = 384 through a config; the CPU/CUDA
# agreement test beside it), then `vigil serve` with cuda_pool_fraction = 0.05 and prints the
# pool's gauges against the device's free memory.
# D (carried): stripped, gzipped `vigil` (target/debug/vigil) and `cuda_serve` (cargo test -p
# vigil --test cuda_serve --no-run), and eval/ (a copy of ../shared/images/eval).
# run(command="D=.gpu/s43 bash scripts/gpu/pool-config.sh", carry=[".gpu/s43"])
set -o pipefail
D=${D:-.gpu/s43}
. "$(dirname "$0")/device-env.sh"
for b in vigil cuda_serve; do gunzip -c $D/$b.gz > /tmp/$b && chmod +x /tmp/$b; done
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.free --format=csv,noheader | tee "$OUT/gpu.txt"
export VIGIL_BIN=/tmp/vigil VIGIL_MODELS=$PWD/models VIGIL_EVAL_IMAGES=$PWD/$D/eval
unset VIGIL_CUDA_POOL_MB
timeout 300 /tmp/cuda_serve --test-threads=1 --nocapture 2>&1 | tee "$OUT/cuda_serve.txt" |
    grep -E "^test |test result|cuda0 pool|SKIP|panicked"
cat > /tmp/frac.toml <<TOML
[memory]
cuda_pool_fraction = 0.05
[[models]]
name = "nanodet-m-416"
path = "$PWD/models/nanodet-m-416.onnx"
device = "cuda"
TOML
free_before=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits)
/tmp/vigil serve --config /tmp/frac.toml --listen 127.0.0.1:18080 > "$OUT/frac_serve.txt" 2>&1 &
pid=$!
for i in $(seq 1 120); do
    curl -sf http://127.0.0.1:18080/v2/health/ready >/dev/null && break
    sleep 0.5
done
curl -s --data-binary @$D/eval/grace_hopper.jpg 'http://127.0.0.1:18080/v1/models/nanodet-m-416/infer' | cut -c1-200; echo
curl -s http://127.0.0.1:18080/metrics | grep -E '^vigil_memory_pool' | tee "$OUT/frac_metrics.txt"
echo "device free before serve: ${free_before} MiB; 0.05 of it: $((free_before / 20)) MiB"
kill $pid; wait $pid
grep -E "pool reserved" "$OUT/frac_serve.txt" | tail -2
