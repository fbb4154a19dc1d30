#!/usr/bin/env python3
"""Sums two per-step profiles (`VIGIL_CUDA_PROFILE=1` output: PSTEP lines) of ResNet-50 by stage
(stem, layer1..layer4, tail) and prints each stage's µs in both and their ratio, to show where
the second profile's precision gains least over the first's.

Usage: scripts/gpu/layer-ratios.py INT8_PROF FP16_PROF
"""
import re
import sys

STAGES = ["stem", "layer1", "layer2", "layer3", "layer4", "tail"]
STEP = re.compile(r"^PSTEP\s+\d+\s+([\d.]+) us\s+\S+ '([^']*)'")


def stages(path):
    """µs per stage of the profile at `path`; steps before layer1 are the stem, after layer4 the tail."""
    sums = dict.fromkeys(STAGES, 0.0)
    seen_layer4 = False
    with open(path) as f:
        for line in f:
            m = STEP.match(line)
            if not m:
                continue
            us, name = float(m.group(1)), m.group(2)
            layer = re.search(r"/(layer[1-4])/", name)
            if layer:
                stage = layer.group(1)
                seen_layer4 |= stage == "layer4"
            else:
                stage = "tail" if seen_layer4 else "stem"
            sums[stage] += us
    return sums


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a, b = stages(sys.argv[1]), stages(sys.argv[2])
    print(f"{'stage':8} {'first µs':>10} {'second µs':>10} {'second/first':>13}")
    for s in STAGES + ["total"]:
        x = sum(a.values()) if s == "total" else a[s]
        y = sum(b.values()) if s == "total" else b[s]
        ratio = f"{y / x:13.2f}" if x else f"{'-':>13}"
        print(f"{s:8} {x:10.1f} {y:10.1f} {ratio}")


if __name__ == "__main__":
    main()
