# Sourced by the device scripts: CUDA's libraries from PyTorch's wheels (cuDNN, cuBLAS, NVRTC)
# on LD_LIBRARY_PATH, and $OUT (the folder whose files the device tool brings back).
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for l in /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib /usr/local/nvidia/lib64 /usr/local/cuda/lib64; do
  [ -d "$l" ] && LD_LIBRARY_PATH="$l:$LD_LIBRARY_PATH"
done
export LD_LIBRARY_PATH OUT
