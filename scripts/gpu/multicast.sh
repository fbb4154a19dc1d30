#!/bin/bash
# Fortieth session (issue 5): multicast TMA tilings (`VIGIL_CUDA_MULTICAST`: the two channel blocks
# of a pixel tile, or the two pixel blocks of a channel tile, or both, form a cluster; each block
# copies half of a shared tile into both rings, so the tile crosses L2 once for the pair). First the GPU test (byte-identical to the unicast kernels at
# batch 2, eager, captured and replayed; a hang in the cluster protocol shows here, under a short
# timeout, and stops the script); then ResNet-50 s8 at batch 32 with them measured against the
# default (every candidate's time logged, `VIGIL_CUDA_TIMING_LOG=1`, and summarised per
# geometry: best unicast TMA tiling against best multicast one), the exactness check against the
# CPU with them forced at batch 32, a second round, FP16.
# $D/cache-start.txt (optional) seeds the arms' timing caches.
# run(command="D=.gpu/s57 bash scripts/gpu/multicast.sh", carry=[".gpu/s57", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s57}
export SETUP_S8_ONLY=1
. "$(dirname "$0")/int8-setup.sh"
for a in mc def forced; do cp $D/cache-start.txt $OUT/cache-$a.txt 2>/dev/null; done
chmod u+w $OUT/cache-*.txt 2>/dev/null
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
echo "=== multicast pairs against the unicast kernels ($SECONDS s)"
VIGIL_CUDA_TIMING_CACHE=$OUT/cache-test.txt VIGIL_CUDA_COMPARE="$S8:2" timeout 150 \
  $T int8_multicast_pairs_match_the_unicast_kernels --nocapture > $OUT/mc-test.txt 2>&1
rc=$?
echo "rc $rc"; grep -E "multicast TMA kernels|test result|panicked" $OUT/mc-test.txt | head -4
if [ $rc != 0 ]; then tail -20 $OUT/mc-test.txt; echo "done ($SECONDS s)"; exit 0; fi
bench mc int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-mc.txt VIGIL_CUDA_MULTICAST=1 VIGIL_CUDA_TIMING_LOG=1
bench default int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-def.txt
# Per geometry: the best unicast TMA tiling and the best multicast one, as timed alone.
$PY - "$OUT/bench.txt" <<'EOF'
import re, sys
best = {}
for line in open(sys.argv[1]):
    m = re.match(r"TIMING (.*?res) (.*) ([0-9.]+) us$", line.strip())
    if not m:
        continue
    geo, t, us = m.group(1), m.group(2), float(m.group(3))
    mc = re.search(r" (mcA|mcB|mcAB)$", t)
    kind = mc.group(1) if mc else ("tma" if t.endswith(" tma") else "other")
    cur = best.setdefault(geo, {}).get(kind)
    if cur is None or us < cur[1]:
        best[geo][kind] = (t, us)
for geo, b in best.items():
    if any(k.startswith("mc") for k in b):
        print("MC %-36s" % geo, "  ".join("%s %s %.2f" % (k, b[k][0], b[k][1]) for k in ("other", "tma", "mcA", "mcB", "mcAB") if k in b))
EOF
[ $SECONDS -lt 330 ] && FORCED_BATCH=32 forced_exact VIGIL_CUDA_MULTICAST=force
[ $SECONDS -lt 380 ] && bench mc2 int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-mc.txt VIGIL_CUDA_MULTICAST=1
[ $SECONDS -lt 400 ] && bench default2 int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-def.txt
[ $SECONDS -lt 420 ] && bench fp16 fp16 "/tmp/onnx/resnet50.onnx:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-def.txt
echo "multicast tilings chosen: $(awk -F'\t' '{n=split($3,a," "); if (n==15 && a[15]>0) c++} END {print c+0}' $OUT/cache-mc.txt)"
echo "done ($SECONDS s)"
