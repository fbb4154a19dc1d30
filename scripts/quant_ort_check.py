#!/usr/bin/env python3
"""Runs a (QDQ) ONNX model in ONNX Runtime over raw inputs, for engine/tests/quant_calibration.rs.

usage: quant_ort_check.py MODEL.onnx IN_DIR OUT_DIR
Each IN_DIR/<name>.bin holds one little-endian f32 input tensor of the model's (batch-1) input
shape; OUT_DIR/<name>.bin.out<k> receives output k as little-endian f32.
"""
import os
import sys

import numpy as np
import onnxruntime as ort


def main():
    model, indir, outdir = sys.argv[1:4]
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    # Run the QDQ graph as written (DequantizeLinear, float op, QuantizeLinear): its ONNX
    # meaning. ORT's fused u8s8 integer kernels saturate on x86 CPUs with AVX2 but no VNNI
    # (ORT's quantization docs), which made them a wrong oracle on such machines.
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    shape = [d if isinstance(d, int) else 1 for d in inp.shape]
    for f in sorted(os.listdir(indir)):
        x = np.fromfile(os.path.join(indir, f), dtype="<f4").reshape(shape)
        for k, o in enumerate(sess.run(None, {inp.name: x})):
            np.asarray(o, dtype="<f4").tofile(os.path.join(outdir, f"{f}.out{k}"))
    print(f"onnxruntime {ort.__version__}: ran {len(os.listdir(indir))} inputs")


if __name__ == "__main__":
    main()
