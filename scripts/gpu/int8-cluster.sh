#!/bin/bash
# Eighth session, call 2: K split inside thread-block clusters (distributed shared memory) and
# the 64-column tilings. Checks the cluster split forced wherever it applies (exact against the
# CPU with VIGIL_CUDA_QFUSE=0), benches INT8 and FP16 in the same call (and ResNet-50 s8 batch
# 32 with VIGIL_CUDA_CLUSTER=0), profiles ResNet-50 s8 batch 32. Everything comes back in all.tgz.
# run(command="bash scripts/gpu/int8-cluster.sh", carry=[".gpu/s12", ".gpu/cuda/node", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s12}
. "$(dirname "$0")/int8-setup.sh"
export VIGIL_CUDA_TIMING_CACHE=$OUT/timing-cache.txt
echo "=== cluster split forced, QFUSE=0 (exact) ($SECONDS s)"
(unset VIGIL_CUDA_TIMING_CACHE; VIGIL_CUDA_IGEMM=force VIGIL_CUDA_SPLITK=force VIGIL_CUDA_CLUSTER=force VIGIL_CUDA_QFUSE=0 VIGIL_CUDA_PROFILE=1 VIGIL_CUDA_COMPARE="$CMP" \
  timeout ${FORCED_S:-170} $T listed_models_match_cpu int8_qdq_models_match_cpu_int8 --test-threads=1 --nocapture > $OUT/forced.txt 2>&1)
echo "rc $? cluster steps $(grep -c ' cluster' $OUT/forced.txt)"
grep -E "^test |test result|worst logits|panicked" $OUT/forced.txt | cut -c1-220 | head; grep -c "rel diff 0.00e0" $OUT/forced.txt; grep "rel diff" $OUT/forced.txt | grep -v "rel diff 0.00e0" | cut -c1-200 | head -4
echo "=== bench ($SECONDS s)"
bench new int8 "$S8:32,$U8:32,$S8:1,$PWD/$D/qdq/efficientnet-lite0.qdq-s8.onnx:1,$PWD/$D/qdq/nanodet-m-416.qdq-s8.onnx:1"
bench new fp16 "/tmp/onnx/resnet50.onnx:1,/tmp/onnx/resnet50.onnx:32"
bench nocluster int8 "$S8:32" VIGIL_CUDA_CLUSTER=0
bench again int8 "$S8:32"
echo "=== profile ($SECONDS s)"
VIGIL_CUDA_PROFILE=1 VIGIL_CUDA_BENCH_ITERS=20 VIGIL_CUDA_PRECISIONS=int8 VIGIL_CUDA_BENCH="$S8:32" timeout 60 $T bench_listed_models --nocapture > $OUT/prof.txt 2>&1
grep -E "^PROFILE" $OUT/prof.txt; grep -E "^PKIND" $OUT/prof.txt | head -6; grep -c " cluster" $OUT/prof.txt
echo "done ($SECONDS s)"
cd $OUT && tar czf all.tgz --remove-files $(ls | grep -v all.tgz)
