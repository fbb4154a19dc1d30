#!/usr/bin/env python3
"""Make INT8 QDQ versions of the shared models with ONNX Runtime's own static quantizer, and the
ORT outputs of those QDQ models that engine/tests/int8_models.rs compares Vigil's INT8 path with.

  - models: ORT's `quant_pre_process` (shape inference, constant folding, Pad/BN fusion), then
    `quantize_static` with QuantFormat.QDQ, per-channel int8 weights, uint8 activations (or int8
    with --s8), MinMax calibration over the first CALIB photos of ../shared/images/calib using each
    model's own preprocessing (MODELS.md). Written to OUT_DIR (default target/qdq/).
  - goldens (--goldens): ORT's outputs of the QDQ models on the saved model-input PNGs of
    engine/tests/golden (the exact tensors the FP32 goldens used): EfficientNet logits, NanoDet
    decoded detections (score >= 0.2, per-class NMS at IoU 0.5, in 416x416 input pixels), to
    engine/tests/golden/qdq/golden-qdq.json.
Run: python3 scripts/make-qdq-models.py [--goldens] [--s8] [OUT_DIR]   (needs onnxruntime, pillow, numpy)
"""
import glob
import json
import os
import sys
import tempfile

import numpy as np
import onnxruntime as ort
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                      quantize_static)
from onnxruntime.quantization.shape_inference import quant_pre_process
from PIL import Image, ImageOps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("VIGIL_SHARED") or next(
    (d for d in (os.path.join(ROOT, "..", "shared"), os.path.join(ROOT, "..", "..", "shared"))
     if os.path.isdir(d)), os.path.join(ROOT, "..", "shared"))
GOLDEN = os.path.join(ROOT, "engine", "tests", "golden")
CALIB = int(os.environ.get("CALIB", "12"))
# The QDQ NanoDet's sigmoided scores sit lower than FP32's: detections are compared at 0.2.
DET_THR = 0.2


def load_rgb(path):
    return ImageOps.exif_transpose(Image.open(path)).convert("RGB")


def effnet_crop(im):
    w, h = im.size
    if w <= h:
        nw, nh = 256, int(256 * h / w)
    else:
        nw, nh = int(256 * w / h), 256
    im = im.resize((nw, nh), Image.BILINEAR)
    left, top = int(round((nw - 224) / 2.0)), int(round((nh - 224) / 2.0))
    return im.crop((left, top, left + 224, top + 224))


def to_nchw(im):
    return np.asarray(im, dtype=np.float32).transpose(2, 0, 1)[None] / np.float32(255.0)


def effnet_input(im):
    return (to_nchw(im) - 0.5) / 0.5


def nanodet_input(im):
    return to_nchw(im)


MODELS = {
    "efficientnet-lite0": ("input", lambda im: effnet_input(effnet_crop(im))),
    "nanodet-m-416": ("input_1:0", lambda im: nanodet_input(im.resize((416, 416), Image.BILINEAR))),
}


class Reader(CalibrationDataReader):
    def __init__(self, name, prep, paths):
        self.items = iter([{name: prep(load_rgb(p))} for p in paths])

    def get_next(self):
        return next(self.items, None)


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def iou(a, b):
    x1, y1 = max(a[0], b[0]), max(a[1], b[1])
    x2, y2 = min(a[2], b[2]), min(a[3], b[3])
    inter = max(0.0, x2 - x1) * max(0.0, y2 - y1)
    ua = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / ua if ua > 0 else 0.0


def nanodet_decode(outs, size=416, strides=(8, 16, 32), reg_max=10, thr=0.35, iou_thr=0.5):
    by_shape = {o.shape: o for o in outs}
    dets = []
    for s in strides:
        n = (size // s) ** 2
        scores = by_shape[(1, n, 80)][0]
        boxes = by_shape[(1, n, 4 * (reg_max + 1))][0].reshape(n, 4, reg_max + 1)
        dist = (softmax(boxes, -1) * np.arange(reg_max + 1)).sum(-1) * s
        cols = size // s
        for i in range(n):
            c = int(scores[i].argmax())
            sc = float(scores[i, c])
            if sc < thr:
                continue
            cx, cy = (i % cols + 0.5) * s, (i // cols + 0.5) * s
            l, t, r, b = dist[i]
            dets.append((c, sc, [float(cx - l), float(cy - t), float(cx + r), float(cy + b)]))
    dets.sort(key=lambda d: -d[1])
    keep = []
    for d in dets:
        if all(k[0] != d[0] or iou(k[2], d[2]) <= iou_thr for k in keep):
            keep.append(d)
    return keep


def make_models(out_dir, s8):
    os.makedirs(out_dir, exist_ok=True)
    calib = sorted(glob.glob(os.path.join(SHARED, "images", "calib", "*")))[:CALIB]
    if not calib:
        sys.exit(f"no calibration images under {SHARED}/images/calib (set VIGIL_SHARED)")
    act = QuantType.QInt8 if s8 else QuantType.QUInt8
    suffix = ".qdq-s8.onnx" if s8 else ".qdq.onnx"
    for model, (inp, prep) in MODELS.items():
        dst = os.path.join(out_dir, model + suffix)
        if os.path.exists(dst):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            pre = os.path.join(tmp, "pre.onnx")
            quant_pre_process(os.path.join(ROOT, "models", model + ".onnx"), pre)
            # NanoDet's MaxPool pads with -inf (tf2onnx PadV2): a quantized Pad would get an
            # infinite range, so Pad nodes stay in float.
            import onnx
            pads = [n.name for n in onnx.load(pre).graph.node if n.op_type == "Pad"]
            quantize_static(pre, dst + ".tmp", Reader(inp, prep, calib), quant_format=QuantFormat.QDQ,
                            per_channel=True, activation_type=act, weight_type=QuantType.QInt8,
                            nodes_to_exclude=pads)
        os.replace(dst + ".tmp", dst)
        print(f"wrote {dst} ({os.path.getsize(dst)} bytes)")


def make_goldens(out_dir):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    eff = ort.InferenceSession(os.path.join(out_dir, "efficientnet-lite0.qdq.onnx"), opts)
    nano = ort.InferenceSession(os.path.join(out_dir, "nanodet-m-416.qdq.onnx"), opts)
    images = []
    rng = np.random.default_rng(0)
    for png in sorted(glob.glob(os.path.join(GOLDEN, "*.effnet-input.png"))):
        stem = os.path.basename(png)[: -len(".effnet-input.png")]
        logits = eff.run(None, {"input": effnet_input(Image.open(png).convert("RGB"))})[0][0]
        nim = Image.open(os.path.join(GOLDEN, stem + ".nanodet-input.png")).convert("RGB")
        outs = nano.run(None, {"input_1:0": nanodet_input(nim)})
        dets = [{"class_id": c, "score": sc, "bbox": b} for c, sc, b in nanodet_decode(outs, thr=DET_THR)]
        samples = []
        for o in outs:
            flat = o.reshape(-1)
            idx = np.sort(rng.choice(flat.size, 512, replace=False))
            samples.append({"shape": list(o.shape), "indices": idx.tolist(),
                            "values": [round(float(flat[i]), 6) for i in idx]})
        images.append({"stem": stem, "effnet_logits": [round(float(x), 5) for x in logits],
                       "nanodet_detections": dets, "nanodet_samples": samples})
        print(f"{stem}: top1 {int(np.argmax(logits))}, {len(dets)} detections")
    os.makedirs(os.path.join(GOLDEN, "qdq"), exist_ok=True)
    with open(os.path.join(GOLDEN, "qdq", "golden-qdq.json"), "w") as f:
        json.dump({"onnxruntime": ort.__version__, "det_threshold": DET_THR, "images": images}, f)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    out_dir = args[0] if args else os.path.join(ROOT, "target", "qdq")
    make_models(out_dir, "--s8" in sys.argv)
    if "--goldens" in sys.argv:
        make_goldens(out_dir)


if __name__ == "__main__":
    main()
