#!/usr/bin/env python3
"""Each convolution step of a VIGIL_CUDA_PROFILE=1 run (PSTEP lines) against its floor on the
device: the larger of its DRAM time (bytes moved at the peak bandwidth) and its tensor time
(multiply-adds at the dense int8 peak). Bytes: the input pixels it needs (m·k / taps), the
output (m·n) and, with a folded Add, the residual (m·n); weights ignored. Steps of one
convolution (an unfold or requantization next to its GEMM) are added up.

  python3 scripts/gpu/roofline.py prof.txt [GBps=4800] [int8 TOPS=1979]
"""
import re
import sys

path = sys.argv[1]
bw = float(sys.argv[2]) * 1e9 if len(sys.argv) > 2 else 4800e9
macs = (float(sys.argv[3]) if len(sys.argv) > 3 else 1979) * 1e12 / 2
steps = {}
for line in open(path):
    m = re.match(r"PSTEP\s+\d+\s+([\d.]+) us\s+QConv '([^']+)'.* m(\d+) n(\d+) k(\d+)", line)
    if not m:
        continue
    us, name, mm, n, k = float(m[1]), m[2], int(m[3]), int(m[4]), int(m[5])
    s = steps.setdefault(name, [0.0, mm, n, k])
    s[0] += us
total_us = total_floor = 0.0
print(f"{'convolution':60} {'us':>7} {'floor':>7} {'x':>5}")
for name, (us, mm, n, k) in steps.items():
    taps = 9 if "conv2" in name else (49 if name == "/conv1/Conv" else 1)
    moved = mm * k / taps + mm * n * (2 if "Add" in name else 1)
    floor = max(moved / bw, mm * n * k / macs) * 1e6
    total_us += us
    total_floor += floor
    print(f"{name[:60]:60} {us:7.1f} {floor:7.1f} {us / floor:5.1f}")
print(f"{'all convolutions':60} {total_us:7.1f} {total_floor:7.1f} {total_us / total_floor:5.1f}")
