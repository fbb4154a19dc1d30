#!/bin/bash
# Thirty-sixth session (issue 5): the placement hypothesis of docs/cuda.md. The TMA-fed 1x1
# tilings win in isolation but lose 2% in the programmatic-launch graph; the suspect is the
# persistent halo 3x3 blocks after each conv1, launched early beside its blocks. ResNet-50 s8
# at batch 32, INT8, three rounds interleaved (the third if time allows): the default tilings
# and the TMA ones measured (`VIGIL_CUDA_TMA=1`), each with programmatic launch as shipped and
# with persistent blocks launched plainly (`VIGIL_CUDA_PDL_PLAIN=persistent`), and (TMA) with
# the launch after a TMA kernel plain (`VIGIL_CUDA_PDL_PLAIN_AFTER=tma`); FP16 in the same
# run. The plain arms share their tilings' timing cache, so they differ from the shipped arm
# only in how they launch. Since the thirty-seventh session the launch after a TMA kernel is
# plain by default, so the `tma` arms set `VIGIL_CUDA_PDL_PLAIN_AFTER` empty to launch it early.
# run(command="D=.gpu/s52 bash scripts/gpu/placement.sh", carry=[".gpu/s52", ".gpu/cuda3/eval"])
set -o pipefail
D=${D:-.gpu/s52}
SETUP_S8_ONLY=1 . "$(dirname "$0")/int8-setup.sh"
CD=$OUT/cache-def.txt CT=$OUT/cache-tma.txt
arm() { local label=$1; shift; bench "$label" int8 "$S8:32" "$@"; }
round() {
  echo "=== round $1 ($SECONDS s)"
  arm "def" VIGIL_CUDA_TIMING_CACHE=$CD
  arm "tma" VIGIL_CUDA_TIMING_CACHE=$CT VIGIL_CUDA_TMA=1 VIGIL_CUDA_PDL_PLAIN_AFTER=
  arm "tma-plain-persistent" VIGIL_CUDA_TIMING_CACHE=$CT VIGIL_CUDA_TMA=1 VIGIL_CUDA_PDL_PLAIN=persistent \
    VIGIL_CUDA_PDL_PLAIN_AFTER=
  arm "tma-plain-after-tma" VIGIL_CUDA_TIMING_CACHE=$CT VIGIL_CUDA_TMA=1 VIGIL_CUDA_PDL_PLAIN_AFTER=tma
  arm "def-plain-persistent" VIGIL_CUDA_TIMING_CACHE=$CD VIGIL_CUDA_PDL_PLAIN=persistent
}
round 1
bench fp16 fp16 "/tmp/onnx/resnet50.onnx:32" VIGIL_CUDA_TIMING_CACHE=$CD
round 2
[ $SECONDS -lt 450 ] && round 3
# The TMA arm's steps (which took TMA and persistent tilings), from a short profile.
[ $SECONDS -lt 540 ] && profile $CT VIGIL_CUDA_TMA=1 && grep -c " tma " $OUT/prof.txt
echo "done ($SECONDS s)"
