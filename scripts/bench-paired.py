#!/usr/bin/env python3
"""Paired latency benchmark: several arms measured in one run, interleaved in short rounds.

On a shared VM whose clock moves by 1.5x within minutes, two benchmarks run one after the other
can disagree by more than the difference being measured. Here every arm stays loaded and warm
for the whole run, and each round runs PER inferences of every arm in turn (the starting arm
rotating from round to round), so a drift moves all arms of a round alike. The figure to quote
is the median over rounds of each round's ratio, with a bootstrap 95% interval over rounds.
Before each arm the driver pauses (--gap-ms, 100 by default): after a run, ONNX Runtime's
intra-op workers spin on a core for about 60 ms, and an arm started inside that window finds
one of its threads queued behind the spinner (measured on a 2-vCPU VM with schedstat).

Arms (batch 1, random inputs, THREADS intra-op threads each):
  vigil:MODEL            `vigil bench MODEL --paced` (target/release/vigil, or VIGIL=path)
  vigil@BINARY:MODEL     the same with another vigil binary (an A/B of two builds)
  ort:MODEL              ONNX Runtime's CPU provider, in this process (as scripts/bench_ort.py)
  ort-written:MODEL      the same with ORT's graph optimizations off, so a QDQ model runs as
                         written (DequantizeLinear, float op, QuantizeLinear)

Usage: bench-paired.py --threads T [--rounds R] [--per-round PER] [--gap-ms G] [--json] ARM ARM...
Ratios are arm k's round median over the first arm's: above 1.0 means the first arm is faster.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

import numpy as np


class VigilArm:
    """A `vigil bench --paced` process: one stdin count, one JSON line of latencies."""

    def __init__(self, binary, model, threads, warmup):
        cmd = [binary, "bench", model, "--threads", str(threads), "--warmup", str(warmup), "--paced"]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(self, n):
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            sys.exit(f"vigil bench --paced exited (status {self.proc.wait()})")
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


class OrtArm:
    """An ONNX Runtime session in this process, configured as scripts/bench_ort.py does."""

    def __init__(self, model, threads, warmup, as_written=False):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        if as_written:
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        self.sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        inp = self.sess.get_inputs()[0]
        shape = [d if isinstance(d, int) else 1 for d in inp.shape]
        self.feed = {inp.name: np.random.default_rng(0).random(shape, dtype=np.float32)}
        self.run(warmup)

    def run(self, n):
        out = []
        for _ in range(n):
            t = time.perf_counter()
            self.sess.run(None, self.feed)
            out.append((time.perf_counter() - t) * 1e3)
        return out

    def close(self):
        pass


def make_arm(spec, threads, warmup):
    kind, sep, model = spec.partition(":")
    if not sep or not model:
        sys.exit(f"bad arm '{spec}': expected vigil:MODEL, vigil@BINARY:MODEL, ort:MODEL or ort-written:MODEL")
    if not os.path.exists(model):
        sys.exit(f"arm '{spec}': {model} does not exist")
    if kind in ("ort", "ort-written"):
        return OrtArm(model, threads, warmup, as_written=kind == "ort-written")
    if kind == "vigil" or kind.startswith("vigil@"):
        binary = kind[len("vigil@"):] if "@" in kind else os.environ.get("VIGIL", "target/release/vigil")
        if not os.access(binary, os.X_OK):
            sys.exit(f"arm '{spec}': {binary} is not an executable (cargo build --release -p vigil)")
        return VigilArm(binary, model, threads, warmup)
    sys.exit(f"bad arm '{spec}': unknown kind '{kind}'")


def bootstrap_median(values, reps=2000, seed=1):
    """95% percentile-bootstrap interval of the median of `values`."""
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(reps))
    return meds[int(0.025 * reps)], meds[int(0.975 * reps) - 1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--per-round", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--gap-ms", type=float, default=100.0,
                    help="pause before each arm's inferences: ONNX Runtime's workers spin on a core "
                         "for about 60 ms after a run, which would slow the next arm")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("arms", nargs="+")
    a = ap.parse_args()
    if len(a.arms) < 2 or a.rounds < 1 or a.per_round < 1:
        sys.exit("need two or more arms, --rounds >= 1 and --per-round >= 1")
    arms = [make_arm(s, a.threads, a.warmup) for s in a.arms]
    samples = [[] for _ in arms]
    round_medians = [[] for _ in arms]
    for r in range(a.rounds):
        for k in range(len(arms)):
            i = (r + k) % len(arms)
            time.sleep(a.gap_ms / 1e3)
            got = arms[i].run(a.per_round)
            samples[i].extend(got)
            round_medians[i].append(statistics.median(got))
    for arm in arms:
        arm.close()
    result = {"threads": a.threads, "rounds": a.rounds, "per_round": a.per_round, "arms": []}
    for spec, s, m in zip(a.arms, samples, round_medians):
        result["arms"].append({"arm": spec, "p50_ms": statistics.median(s), "min_ms": min(s)})
    for k in range(1, len(arms)):
        ratios = [x / y for x, y in zip(round_medians[k], round_medians[0])]
        lo, hi = bootstrap_median(ratios)
        result["arms"][k]["ratio_to_first"] = {
            "median": statistics.median(ratios),
            "ci95": [lo, hi],
            "rounds_first_faster": sum(q > 1.0 for q in ratios),
        }
    if a.json:
        print(json.dumps(result))
        return
    print(f"{a.rounds} rounds x {a.per_round} inferences per arm, {a.threads} thread(s)")
    for k, row in enumerate(result["arms"]):
        line = f"  {row['arm']}: p50 {row['p50_ms']:.3f} ms, min {row['min_ms']:.3f} ms"
        if k:
            q = row["ratio_to_first"]
            line += (f"; / first arm: median of rounds {q['median']:.3f} (95% CI {q['ci95'][0]:.3f}-"
                     f"{q['ci95'][1]:.3f}), first arm faster in {q['rounds_first_faster']}/{a.rounds} rounds")
        print(line)


if __name__ == "__main__":
    main()
