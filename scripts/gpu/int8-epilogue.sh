#!/bin/bash
# Tenth session: integer-domain requantization (round with __float2int_rn, clamp with
# min/max or min.relu, pack with __byte_perm) and unrolled output-tile loops in the implicit
# GEMM. Carries this session's cuda_backend (cuda_backend.gz) and the eighth session's final one
# (cuda_backend_prev.gz) and benches them interleaved in one call, each binary with its own
# timing cache; then checks INT8 exactness against the CPU with the fusions off, with the
# implicit GEMM forced everywhere and as shipped, and per-step profiles the new binary.
# PART=bench: the benches and the profile only; PART=check: the correctness runs only.
# run(command="PART=bench bash scripts/gpu/int8-epilogue.sh", carry=[".gpu/s15", ".gpu/cuda/node", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s15}
. "$(dirname "$0")/int8-setup.sh"
gunzip -c $D/cuda_backend_prev.gz > /tmp/cuda_prev && chmod +x /tmp/cuda_prev
NEW=$T
binbench() { # LABEL BINARY CACHE PRECISION LIST [ENV...]
  local label=$1 bin=$2 cache=$3 prec=$4 list=$5; shift 5
  env "$@" VIGIL_CUDA_TIMING_CACHE=$OUT/$cache VIGIL_CUDA_PRECISIONS=$prec VIGIL_CUDA_BENCH="$list" timeout 200 $bin bench_listed_models --nocapture 2>&1 \
    | tee -a "$OUT/bench.txt" | grep -E "BENCH|panicked|error" | sed "s/^/$label /"
}
if [ "$PART" != check ]; then
echo "=== bench ($SECONDS s)"
binbench new $NEW cache-new.txt int8 "$S8:32,$U8:32"
binbench prev /tmp/cuda_prev cache-prev.txt int8 "$S8:32,$U8:32"
binbench new2 $NEW cache-new.txt int8 "$S8:32,$S8:1"
binbench prev2 /tmp/cuda_prev cache-prev.txt int8 "$S8:32"
binbench fp16 $NEW cache-new.txt fp16 "/tmp/onnx/resnet50.onnx:32"
echo "=== profile ($SECONDS s)"
VIGIL_CUDA_TIMING_CACHE=$OUT/cache-new.txt VIGIL_CUDA_PROFILE=1 VIGIL_CUDA_BENCH_ITERS=20 VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="$S8:32" timeout 60 $T bench_listed_models --nocapture > $OUT/prof.txt 2>&1
grep -E "^PROFILE|^PKIND" $OUT/prof.txt | head -8
fi
if [ "$PART" != bench ]; then
echo "=== exact with the fusions off, implicit GEMM forced ($SECONDS s)"
VIGIL_CUDA_QFUSE=0 VIGIL_CUDA_IGEMM=force VIGIL_CUDA_TIMING_CACHE=$OUT/cache-forced.txt timeout 150 $T int8_qdq_models_match_cpu_int8 --nocapture > $OUT/forced.txt 2>&1; echo "rc $?"
grep -E "^test |test result|worst|panicked" $OUT/forced.txt | cut -c1-200 | head -8
echo "=== as shipped: int8 tests and ResNet-50 against the CPU ($SECONDS s)"
VIGIL_CUDA_TIMING_CACHE=$OUT/cache-new.txt timeout 120 $T int8_qdq_models_match_cpu_int8 --nocapture > $OUT/int8.txt 2>&1; echo "rc $?"
grep -E "^test |test result|worst|panicked" $OUT/int8.txt | cut -c1-200 | head -8
VIGIL_CUDA_TIMING_CACHE=$OUT/cache-new.txt VIGIL_CUDA_COMPARE="$CMP" timeout 150 $T listed_models_match_cpu --nocapture > $OUT/compare.txt 2>&1; echo "rc $?"
grep -E "^test |test result|rel diff|cosine|panicked" $OUT/compare.txt | cut -c1-200 | head -8
fi
echo "done ($SECONDS s)"
cd $OUT && tar czf all.tgz --remove-files $(ls | grep -v all.tgz)
