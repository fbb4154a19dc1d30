#!/usr/bin/env python3
"""Median batch-1 latency of a model under ONNX Runtime's CPU provider, as JSON on stdout.

Usage: bench_ort.py MODEL.onnx THREADS ITERATIONS   (same random-input method as `vigil bench`)
ORT_AS_WRITTEN=1 turns ORT's graph optimizations off, so QDQ models run as written
(DequantizeLinear, float op, QuantizeLinear) instead of through its fused u8s8 kernels,
which saturate on x86 CPUs without VNNI.
"""
import os
import json
import sys
import time

import numpy as np
import onnxruntime as ort

path, threads, iters = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
opts = ort.SessionOptions()
opts.intra_op_num_threads = threads
opts.inter_op_num_threads = 1
if os.environ.get("ORT_AS_WRITTEN") == "1":
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
inp = sess.get_inputs()[0]
x = np.random.default_rng(0).random([d if isinstance(d, int) else 1 for d in inp.shape], dtype=np.float32)
for _ in range(5):
    sess.run(None, {inp.name: x})
samples = []
for _ in range(iters):
    t = time.perf_counter()
    sess.run(None, {inp.name: x})
    samples.append((time.perf_counter() - t) * 1e3)
samples.sort()
print(json.dumps({"onnxruntime": ort.__version__, "p50_ms": samples[len(samples) // 2], "min_ms": samples[0]}))
