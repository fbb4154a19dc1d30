#!/bin/bash
# Concurrent-contexts diagnosis: the 4-context test in a loop under several switches, then memcheck.
D=${D:-.gpu/s5}  # holds cuda_backend.gz: the stripped, gzipped engine/tests/cuda_backend.rs binary
. "$(dirname "$0")/device-env.sh"
export VIGIL_CUDA_POOL_MB=3072 VIGIL_MODELS=$PWD/models
uname -r; nvidia-smi --query-gpu=driver_version --format=csv,noheader
gunzip -c $D/cuda_backend.gz > /tmp/cuda_backend && chmod +x /tmp/cuda_backend
T0=$SECONDS
loop() { # name n env...
  local name=$1 n=$2; shift 2; local ok=0 t=$SECONDS
  for i in $(seq $n); do env "$@" timeout 40 /tmp/cuda_backend contexts_share > $OUT/$name-$i.txt 2>&1 && ok=$((ok+1)); done
  echo "$name: $ok/$n passed ($((SECONDS-t)) s)"
  grep -h "panicked\|Error\|error" $OUT/$name-*.txt | sort | uniq -c | head -5
}
loop default 10 X=1
loop eager 8 CUDA_MODULE_LOADING=EAGER
loop nograph 8 VIGIL_CUDA_GRAPH=0
loop lt0 6 VIGIL_CUDA_LT=0
loop im2col0 6 VIGIL_CUDA_IM2COL=0
echo "elapsed $((SECONDS-T0))"
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
echo "sanitizer: $CS"
[ -n "$CS" ] && timeout 200 $CS --tool memcheck --print-limit 20 /tmp/cuda_backend contexts_share > $OUT/memcheck.txt 2>&1; echo "memcheck rc $?"; tail -40 $OUT/memcheck.txt
