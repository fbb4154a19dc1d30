# Sourced by the INT8 device scripts, with D set to the carried folder (the gzipped
# cuda_backend test binary, qdq.txz with the shared models' QDQ versions, torch_bench.py,
# torch_timing.py, qdq_resnet50.py): unpacks them, exports torchvision ResNet-50 and quantizes
# it with ONNX Runtime twice, uint8 activations (/tmp/onnx/resnet50.qdq.onnx) and int8
# symmetric ones (/tmp/onnx/resnet50.qdq.s8.onnx). Leaves T (the test binary) and CMP (both
# QDQ ResNet-50s at batch 2, for VIGIL_CUDA_COMPARE), S8 and U8 (the two QDQ ResNet-50s) and
# `bench LABEL PRECISION LIST [ENV...]` (bench_listed_models, output appended to $OUT/bench.txt)
# set for the scripts that source it. SETUP_NO_EXPORT=1 stops after the unpacking (no torch
# export, no ResNet-50); SETUP_S8_ONLY=1 skips the uint8 quantization (U8 and CMP then name a
# file that is not there).
. "$(dirname "${BASH_SOURCE[0]}")/device-env.sh"
export VIGIL_CUDA_POOL_MB=3072 VIGIL_MODELS=$PWD/models VIGIL_EVAL_IMAGES=$PWD/.gpu/cuda3/eval VIGIL_QDQ_MODELS=$PWD/$D/qdq
mkdir -p $D/qdq && xz -dc $D/qdq.txz | tar xf - -C $D
gunzip -c $D/cuda_backend.gz > /tmp/cuda_backend && chmod +x /tmp/cuda_backend
PY=/opt/torch/.venv/bin/python; mkdir -p /tmp/onnx
if [ -z "${SETUP_NO_EXPORT:-}" ]; then
  cd $D && VIGIL_EXPORT_ONLY=1 timeout 120 $PY torch_bench.py /tmp/onnx > $OUT/export.txt 2>&1; cd - >/dev/null; grep -c EXPORTED $OUT/export.txt
  if [ -z "${SETUP_S8_ONLY:-}" ]; then
    timeout 100 $PY $D/qdq_resnet50.py /tmp/onnx/resnet50.onnx /tmp/onnx/resnet50.qdq.onnx > $OUT/qdq.txt 2>&1; tail -1 $OUT/qdq.txt
  fi
  timeout 100 $PY $D/qdq_resnet50.py /tmp/onnx/resnet50.onnx /tmp/onnx/resnet50.qdq.s8.onnx s8 > $OUT/qdq8.txt 2>&1; tail -1 $OUT/qdq8.txt
fi
T=/tmp/cuda_backend
CMP="/tmp/onnx/resnet50.qdq.onnx:2,/tmp/onnx/resnet50.qdq.s8.onnx:2"
S8=/tmp/onnx/resnet50.qdq.s8.onnx; U8=/tmp/onnx/resnet50.qdq.onnx
bench() {
  local label=$1 prec=$2 list=$3; shift 3
  env "$@" VIGIL_CUDA_PRECISIONS=$prec VIGIL_CUDA_BENCH="$list" timeout 200 $T bench_listed_models --nocapture 2>&1 \
    | tee -a "$OUT/bench.txt" | grep -E "BENCH|panicked|error" | sed "s/^/$label /"
}
# `profile CACHE [ENV...]`: ResNet-50 s8 at batch $PROFILE_BATCH (32) profiled step by step (an event per
# step) with timing cache CACHE, into $OUT/prof.txt; prints the totals per kind. PROFILE_PRECISION
# (int8), PROFILE_MODEL ($S8) and PROFILE_OUT (prof.txt) profile another precision or model.
profile() {
  local cache=$1 out=$OUT/${PROFILE_OUT:-prof.txt}; shift
  echo "=== profile ${PROFILE_PRECISION:-int8} ($SECONDS s)"
  env "$@" VIGIL_CUDA_TIMING_CACHE=$cache VIGIL_CUDA_PROFILE=1 VIGIL_CUDA_BENCH_ITERS=20 \
    VIGIL_CUDA_PRECISIONS=${PROFILE_PRECISION:-int8} VIGIL_CUDA_BENCH="${PROFILE_MODEL:-$S8}:${PROFILE_BATCH:-32}" \
    timeout 60 $T bench_listed_models --nocapture > $out 2>&1
  grep -E "^PROFILE|^PKIND" $out | head -12
}
# `ab NAME ON OFF`: a session's kernels measured (ON, an environment assignment) against the
# same binary without them (OFF) — or against the binary OFF_T, when set — ResNet-50 at batch
# 32 interleaved, each arm with its own timing cache ($OUT/cache-NAME.txt,
# $OUT/cache-noNAME.txt); then FP16 and the ON arm's per-step profile.
ab() {
  local name=$1 on=$2 off=$3 t_off=${OFF_T:-$T}
  echo "=== bench ($SECONDS s)"
  bench $name int8 "$S8:32,$U8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-$name.txt $on
  T=$t_off bench no$name int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-no$name.txt $off
  bench ${name}2 int8 "$S8:32,$S8:1" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-$name.txt $on
  T=$t_off bench no${name}2 int8 "$S8:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-no$name.txt $off
  bench fp16 fp16 "/tmp/onnx/resnet50.onnx:32" VIGIL_CUDA_TIMING_CACHE=$OUT/cache-$name.txt $on
  profile $OUT/cache-$name.txt $on
}
# `probe NAME [ENV...]`: ResNet-50 s8 at batch 32 built with VIGIL_CUDA_WS_PROBE=1 (each
# convolution's chosen wgmma tiling timed again as the probe's variants) and ENV, on a fresh
# timing cache $OUT/cache-NAME.txt; output $OUT/probe-NAME.txt.
probe() {
  local name=$1; shift
  echo "=== probe $name ($SECONDS s)"
  env "$@" VIGIL_CUDA_WS_PROBE=1 VIGIL_CUDA_TIMING_CACHE=$OUT/cache-$name.txt VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="$S8:32" \
    timeout 240 $T bench_listed_models --nocapture > $OUT/probe-$name.txt 2>&1; echo "rc $?"
  grep -E "^BENCH|panicked" $OUT/probe-$name.txt | cut -c1-200
  grep -c WSPROBE $OUT/probe-$name.txt
}
# `forced_exact ENV...`: ResNet-50 ($FORCED_MODEL, default s8) at batch $FORCED_BATCH (default
# 2) against the CPU with the fusions off, the implicit GEMM forced and ENV (a path forced); the
# outputs must be identical. Timing cache $OUT/cache-forced.txt, output $OUT/forced.txt.
forced_exact() {
  echo "=== ResNet-50 ${FORCED_MODEL:-$S8} against the CPU, fusions off, $* ($SECONDS s)"
  env "$@" VIGIL_CUDA_QFUSE=0 VIGIL_CUDA_IGEMM=force VIGIL_CUDA_TIMING_CACHE=$OUT/cache-forced.txt VIGIL_CUDA_COMPARE="${FORCED_MODEL:-$S8}:${FORCED_BATCH:-2}" \
    timeout 200 $T listed_models_match_cpu --nocapture > $OUT/forced.txt 2>&1; echo "rc $?"
  grep -E "^test |test result|rel diff|panicked" $OUT/forced.txt | cut -c1-200 | head -12
}
# `suite`: the whole cuda_backend suite (benches skipped) with ONNX's node conformance cases
# (.gpu/cuda/node.txz) and the QDQ ResNet-50s and NanoDet-m at batch 2 against the CPU, in the
# call's remaining time; output $OUT/tests.txt.
suite() {
  mkdir -p /tmp/node && xz -dc .gpu/cuda/node.txz | tar xf - -C /tmp/node
  echo "=== suite ($SECONDS s)"
  VIGIL_ONNX_NODE_TESTS=/tmp/node/node VIGIL_CUDA_TIMING_CACHE=$OUT/cache.txt VIGIL_CUDA_COMPARE="$CMP,$PWD/models/nanodet-m-416.onnx:2" \
    timeout $((590 - SECONDS)) $T --skip bench_ --test-threads=1 --nocapture > "$OUT/tests.txt" 2>&1; echo "rc $?"
  grep -E "^test |test result|conformance|passed|panicked" "$OUT/tests.txt" | cut -c1-200 | tail -25
}
# `finish`: packs what the run left in $OUT into one archive.
finish() {
  echo "done ($SECONDS s)"
  cd $OUT && tar czf all.tgz --remove-files $(ls | grep -v all.tgz)
}
