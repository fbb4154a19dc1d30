#!/usr/bin/env python3
"""Make the golden outputs that Vigil's model tests compare against, with ONNX Runtime as oracle.

For every photo in ../shared/images/eval it writes, per shared model:
  - the model input exactly as fed to ONNX Runtime, saved losslessly as an 8-bit PNG (the
    resized/cropped RGB pixels; the models' normalisation is applied on top in both ORT and Vigil),
    so the model-level test compares the engine on the identical tensor;
  - ONNX Runtime's outputs: EfficientNet's 1000 logits; for NanoDet, per output, its shape,
    sum, sum of squares and 256 sampled values, plus the decoded detections (score >= 0.35,
    per-class NMS at IoU 0.5) in original-image pixels.
Run: python3 scripts/make-goldens.py   (needs onnxruntime==1.32.*, pillow, numpy)
"""
import glob
import json
import os

import numpy as np
import onnxruntime as ort
from PIL import Image, ImageOps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("VIGIL_SHARED", os.path.join(ROOT, "..", "shared"))
OUT = os.path.join(ROOT, "engine", "tests", "golden")


def load_rgb(path):
    im = Image.open(path)
    im = ImageOps.exif_transpose(im)
    return im.convert("RGB")


def effnet_crop(im):
    # torchvision: Resize(256) (short side, bilinear) then CenterCrop(224)
    w, h = im.size
    if w <= h:
        nw, nh = 256, int(256 * h / w)
    else:
        nw, nh = int(256 * w / h), 256
    im = im.resize((nw, nh), Image.BILINEAR)
    left = int(round((nw - 224) / 2.0))
    top = int(round((nh - 224) / 2.0))
    return im.crop((left, top, left + 224, top + 224))


def to_nchw(im):
    return np.asarray(im, dtype=np.float32).transpose(2, 0, 1)[None] / np.float32(255.0)


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
            dets.append((c, sc, [cx - l, cy - t, cx + r, cy + b]))
    dets.sort(key=lambda d: -d[1])
    keep = []
    for d in dets:
        if all(k[0] != d[0] or iou(k[2], d[2]) <= iou_thr for k in keep):
            keep.append(d)
    return keep


def main():
    os.makedirs(OUT, exist_ok=True)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    eff = ort.InferenceSession(os.path.join(ROOT, "models", "efficientnet-lite0.onnx"), opts)
    nano = ort.InferenceSession(os.path.join(ROOT, "models", "nanodet-m-416.onnx"), opts)
    labels = [l.strip() for l in open(os.path.join(ROOT, "models", "imagenet-labels.txt"))]
    coco = [l.strip() for l in open(os.path.join(ROOT, "models", "coco-labels.txt"))]
    rng = np.random.default_rng(0)
    golden = {"onnxruntime": ort.__version__, "images": []}
    for path in sorted(glob.glob(os.path.join(SHARED, "images", "eval", "*"))):
        name = os.path.basename(path)
        stem = os.path.splitext(name)[0]
        im = load_rgb(path)
        crop = effnet_crop(im)
        crop.save(os.path.join(OUT, f"{stem}.effnet-input.png"))
        logits = eff.run(None, {"input": (to_nchw(crop) - 0.5) / 0.5})[0][0]
        top5 = np.argsort(-logits)[:5]
        stretched = im.resize((416, 416), Image.BILINEAR)
        stretched.save(os.path.join(OUT, f"{stem}.nanodet-input.png"))
        outs = nano.run(None, {"input_1:0": to_nchw(stretched)})
        stats = []
        for o, info in zip(outs, nano.get_outputs()):
            flat = o.reshape(-1).astype(np.float64)
            idx = np.sort(rng.choice(flat.size, 256, replace=False))
            stats.append({
                "name": info.name, "shape": list(o.shape), "sum": float(flat.sum()),
                "sum_sq": float((flat * flat).sum()),
                "indices": idx.tolist(), "values": [float(flat[i]) for i in idx],
            })
        sx, sy = im.size[0] / 416.0, im.size[1] / 416.0
        dets = [
            {"class_id": c, "label": coco[c], "score": sc,
             "bbox": [max(0.0, b[0] * sx), max(0.0, b[1] * sy), min(im.size[0], b[2] * sx), min(im.size[1], b[3] * sy)]}
            for c, sc, b in nanodet_decode(outs)
        ]
        golden["images"].append({
            "file": name, "width": im.size[0], "height": im.size[1],
            "effnet": {"logits": [float(x) for x in logits], "top5": [int(i) for i in top5],
                       "top1_label": labels[int(top5[0])]},
            "nanodet": {"outputs": stats, "detections": dets},
        })
        print(f"{name}: {labels[int(top5[0])]}; {len(dets)} detections "
              f"({', '.join(sorted(set(d['label'] for d in dets)))})")
    with open(os.path.join(OUT, "golden.json"), "w") as f:
        json.dump(golden, f, indent=0)


if __name__ == "__main__":
    main()
