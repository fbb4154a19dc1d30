#!/usr/bin/env python3
"""Replays the allocator benchmark's window workload (engine/benches/common/workload.rs: same
seed, sizes and victims; 64 live blocks, sizes log-uniform in 256 B..64 MiB, 256 B aligned) over
a fixed region that never moves pages, for several placement policies, and says for each region
size (a multiple of the workload's peak live bytes) whether the run fits or at which step it
first runs out of room. It asks whether any non-moving placement could meet issue 3's
reserved / live <= 1.10 (docs/benchmarks.md, thirty-fifth session).

Usage: scripts/window-placement-replay.py [STEPS] (default 200000; about a minute per policy)
"""
import bisect
import sys

MASK = (1 << 64) - 1
TABLE = 1 << 16
WINDOW = 64
ALIGN = 256
SMALL = 1 << 20  # blocks under this go to the top of their hole in the "two-ended" policies


class Rng:
    """The bench's xorshift."""

    def __init__(self, seed):
        self.x = seed

    def next(self):
        x = self.x
        x ^= (x << 13) & MASK
        x ^= x >> 7
        x ^= (x << 17) & MASK
        self.x = x
        return x


def workload():
    r = Rng(0x9E3779B97F4A7C15)
    [r.next() for _ in range(TABLE)]  # the pair sizes, drawn first
    sizes = [int(256.0 * (262144.0 ** ((r.next() % 1_000_000) / 1e6))) for _ in range(TABLE)]
    victims = [r.next() % WINDOW for _ in range(TABLE)]
    return sizes, victims


def peak_live(sizes, victims, steps):
    live = sizes[:WINDOW]
    total = peak = sum(live)
    for i in range(steps):
        v = victims[i % TABLE]
        total += sizes[(i + WINDOW) % TABLE] - live[v]
        live[v] = sizes[(i + WINDOW) % TABLE]
        peak = max(peak, total)
    return peak


def place(policy, holes, size):
    """Offset for `size` among `holes` ((offset, length), address order, each fitting)."""
    if policy == "first-fit":
        return holes[0][0]
    if policy == "best-fit":
        return min(holes, key=lambda h: (h[1], h[0]))[0]
    small = size < SMALL
    if policy == "two-ended best-fit":
        if small:
            h = min(holes, key=lambda h: (h[1], -h[0]))
            return h[0] + h[1] - size
        return min(holes, key=lambda h: (h[1], h[0]))[0]
    if policy == "two-ended first-fit":
        return holes[-1][0] + holes[-1][1] - size if small else holes[0][0]
    if policy == "small best-fit from the top, large first-fit":
        if small:
            h = min(holes, key=lambda h: (h[1], -h[0]))
            return h[0] + h[1] - size
        return holes[0][0]
    raise ValueError(policy)


def run(policy, region, sizes, victims, steps):
    """True if the run fits in `region` bytes, else the step that first found no room."""
    spans = []  # live (offset, end), address order
    live = [None] * WINDOW

    def alloc(size):
        size = (size + ALIGN - 1) // ALIGN * ALIGN
        holes, prev = [], 0
        for off, end in spans:
            if off - prev >= size:
                holes.append((prev, off - prev))
            prev = end
        if region - prev >= size:
            holes.append((prev, region - prev))
        if not holes:
            return None
        off = place(policy, holes, size)
        bisect.insort(spans, (off, off + size))
        return (off, off + size)

    for i in range(WINDOW):
        live[i] = alloc(sizes[i])
        if live[i] is None:
            return -1
    for i in range(steps):
        v = victims[i % TABLE]
        spans.remove(live[v])
        live[v] = alloc(sizes[(i + WINDOW) % TABLE])
        if live[v] is None:
            return i
    return True


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    sizes, victims = workload()
    peak = peak_live(sizes, victims, steps)
    print(f"window workload, {steps} steps: peak live {peak / 2**20:.1f} MiB")
    policies = ["first-fit", "best-fit", "two-ended best-fit", "two-ended first-fit",
                "small best-fit from the top, large first-fit"]
    factors = [1.10, 1.15, 1.20, 1.25]
    for p in policies:
        cells = []
        for f in factors:
            r = run(p, int(peak * f), sizes, victims, steps)
            cells.append(f"{f:.2f}: " + ("fits" if r is True else f"full at step {r}"))
        print(f"{p}: " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
