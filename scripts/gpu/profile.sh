#!/bin/bash
# cuda3 device call 1: per-step profile (fused vs unfused), ncu kernel list.
set -o pipefail
D=.gpu/cuda3
. "$(dirname "$0")/device-env.sh"
export VIGIL_MODELS=$PWD/models VIGIL_CUDA_POOL_MB=3072
which nsys ncu; nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm --format=csv,noheader
ls /opt/torch/.venv/lib/python3*/site-packages/nvidia/ | tr '\n' ' '; echo
PY=$(ls /opt/torch/.venv/bin/python 2>/dev/null || which python3)
chmod +x $D/cuda_backend
mkdir -p /tmp/onnx
VIGIL_EXPORT_ONLY=1 timeout 90 $PY $D/torch_bench.py /tmp/onnx > $OUT/export.txt 2>&1; grep -c EXPORTED $OUT/export.txt
L="/tmp/onnx/resnet50.onnx:1,/tmp/onnx/mobilenetv3l.onnx:1,$PWD/models/efficientnet-lite0.onnx:1,/tmp/onnx/resnet50.onnx:32"
for F in 1 0; do
  VIGIL_CUDA_FUSE=$F VIGIL_CUDA_PROFILE=1 VIGIL_CUDA_BENCH_ITERS=40 VIGIL_CUDA_PRECISIONS=fp16,fp32 VIGIL_CUDA_BENCH="$L" \
    timeout 120 $D/cuda_backend bench_listed_models --nocapture > $OUT/prof_fuse$F.txt 2>&1
  echo "=== FUSE=$F rc $?"; grep -E "^(BENCH|PROFILE)|panicked" $OUT/prof_fuse$F.txt
done
echo "=== kinds, fuse=1"; awk '/^PROFILE/{n++} /^PKIND/ && (n==1||n==2||n==3) {print n": "$0}' $OUT/prof_fuse1.txt | head -60
echo "=== top steps resnet fp16 b1 fuse=1"; awk '/^PROFILE/{n++} /^PSTEP/ && n==1' $OUT/prof_fuse1.txt | sort -k3 -n -r | head -25 | cut -c1-230
echo "=== top steps mobilenet fp16 b1 fuse=1"; awk '/^PROFILE/{n++} /^PSTEP/ && n==3' $OUT/prof_fuse1.txt | sort -k3 -n -r | head -12 | cut -c1-230
NCU=$(which ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ]; then
  VIGIL_CUDA_PROFILE=1 VIGIL_CUDA_BENCH_ITERS=4 VIGIL_CUDA_PRECISIONS=fp16 VIGIL_CUDA_BENCH="/tmp/onnx/resnet50.onnx:1,/tmp/onnx/mobilenetv3l.onnx:1" \
    timeout 150 $NCU --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \
    $D/cuda_backend bench_listed_models --nocapture > $OUT/ncu.csv 2> $OUT/ncu.err
  echo "=== ncu rc $?"; tail -3 $OUT/ncu.err
  $PY - "$OUT/ncu.csv" <<'PYEOF' | tee $OUT/ncu_summary.txt | head -80
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1], errors="replace")) if len(r) > 10]
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value"); ii = h.index("ID")
rs = rows[1:]
print("kernels profiled:", len(rs))
agg = collections.OrderedDict()
for r in rs:
    k = r[ki][:110]
    v = float(r[vi].replace(",", "")) if r[vi] else 0
    a = agg.setdefault(k, [0, 0.0]); a[0] += 1; a[1] += v
for k, (c, t) in sorted(agg.items(), key=lambda e: -e[1][1])[:45]:
    print(f"{c:4d} {t/1000:9.1f} us  {k}")
PYEOF
fi
