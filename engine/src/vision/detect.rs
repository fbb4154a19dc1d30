//! Detection heads (NanoDet GFL, YOLOv8) → boxes in original-image pixels, plus IoU and NMS.

use std::collections::HashMap;

use super::{label_for, BBox, Detection, ImageTransform, VisionSpec};
use crate::error::{Error, Result};
use crate::ir::Tensor;

/// Intersection over union of two boxes; 0 when the union is empty (degenerate boxes).
pub fn iou(a: &BBox, b: &BBox) -> f32 {
    let iw = (a.x2.min(b.x2) - a.x1.max(b.x1)).max(0.0);
    let ih = (a.y2.min(b.y2) - a.y1.max(b.y1)).max(0.0);
    let inter = iw * ih;
    let area = |r: &BBox| (r.x2 - r.x1).max(0.0) * (r.y2 - r.y1).max(0.0);
    let union = area(a) + area(b) - inter;
    if union > 0.0 {
        inter / union
    } else {
        0.0
    }
}

/// Greedy per-class non-maximum suppression.
///
/// Visits detections by descending score and keeps one unless a kept detection of the same class
/// overlaps it with IoU > `iou_threshold`; returns at most `max_detections`, best first.
pub fn nms(mut dets: Vec<Detection>, iou_threshold: f32, max_detections: usize) -> Vec<Detection> {
    dets.sort_by(|a, b| b.score.total_cmp(&a.score));
    let mut kept: Vec<Detection> = Vec::new();
    let mut by_class: HashMap<usize, Vec<BBox>> = HashMap::new();
    for d in dets {
        if kept.len() >= max_detections {
            break;
        }
        let same = by_class.entry(d.class_id).or_default();
        if same.iter().all(|k| iou(k, &d.bbox) <= iou_threshold) {
            same.push(d.bbox);
            kept.push(d);
        }
    }
    kept
}

/// The two trailing dims of a [1, A, B] or [A, B] tensor.
fn matrix_dims(t: &Tensor) -> Option<(usize, usize)> {
    matrix_dims_of(&t.shape)
}

/// `[1, a, b]` or `[a, b]` as `(a, b)`.
fn matrix_dims_of(shape: &[usize]) -> Option<(usize, usize)> {
    match shape {
        [1, a, b] | [a, b] => Some((*a, *b)),
        _ => None,
    }
}

/// A candidate detection in model-input pixels, before mapping and NMS.
struct Candidate {
    class_id: usize,
    score: f32,
    bbox: BBox,
}

/// Maps candidates to original pixels (clamped), drops empty/non-finite boxes, then runs NMS.
fn finish(spec: &VisionSpec, cands: Vec<Candidate>, transform: &ImageTransform) -> Vec<Detection> {
    let dets = cands
        .into_iter()
        .filter_map(|c| {
            let b = transform.box_to_original(&c.bbox);
            let ok = [b.x1, b.y1, b.x2, b.y2].iter().all(|v| v.is_finite())
                && b.x2 > b.x1
                && b.y2 > b.y1;
            ok.then(|| Detection {
                class_id: c.class_id,
                label: label_for(&spec.labels, c.class_id),
                score: c.score,
                bbox: b,
            })
        })
        .collect();
    nms(dets, spec.iou_threshold, spec.max_detections)
}

/// Index and value of the best score in `scores` (first one on ties); None when empty or all NaN.
fn best_class(scores: &[f32]) -> Option<(usize, f32)> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &s) in scores.iter().enumerate() {
        if s.is_nan() {
            continue;
        }
        match best {
            Some((_, b)) if s <= b => {}
            _ => best = Some((i, s)),
        }
    }
    best
}

/// One NanoDet stride's outputs: the indices of its score and box tensors, its feature-map width
/// and its anchor count.
pub(crate) struct NanodetLevel {
    pub(crate) stride: usize,
    pub(crate) scores: usize,
    pub(crate) boxes: usize,
    pub(crate) fw: usize,
    pub(crate) n: usize,
}

/// Matches the NanoDet outputs (given by their shapes, wherever they live) to strides by shape
/// (see [`decode_nanodet`]); returns the levels in stride order and the class count.
pub(crate) fn nanodet_levels(
    spec: &VisionSpec,
    outputs: &[&[usize]],
    reg_max: usize,
    strides: &[usize],
) -> Result<(Vec<NanodetLevel>, usize)> {
    let (iw, ih) = (
        spec.preprocess.width as usize,
        spec.preprocess.height as usize,
    );
    let box_dim = 4 * (reg_max + 1);
    if strides.is_empty() || strides.contains(&0) || iw == 0 || ih == 0 {
        return Err(Error::BadInput(format!(
            "NanoDet strides {strides:?} must be non-empty and non-zero (input {iw}x{ih})"
        )));
    }
    let mut used = vec![false; outputs.len()];
    let mut num_classes: Option<usize> = None;
    let mut levels = Vec::with_capacity(strides.len());
    for &s in strides {
        let (fw, fh) = (iw.div_ceil(s), ih.div_ceil(s));
        let n = fw * fh;
        let mut score_idx = None;
        let mut box_idx = None;
        for (k, t) in outputs.iter().enumerate() {
            if used[k] {
                continue;
            }
            match matrix_dims_of(t) {
                Some((rows, cols)) if rows == n && cols == box_dim && box_idx.is_none() => {
                    box_idx = Some(k)
                }
                Some((rows, cols))
                    if rows == n && cols != box_dim && cols > 0 && score_idx.is_none() =>
                {
                    score_idx = Some(k)
                }
                _ => {}
            }
        }
        let (Some(si), Some(bi)) = (score_idx, box_idx) else {
            let shapes: Vec<_> = outputs.to_vec();
            return Err(Error::Shape(format!(
                "NanoDet stride {s}: expected outputs [1, {n}, C] (scores) and [1, {n}, {box_dim}] (boxes) \
                 for a {iw}x{ih} input; got {shapes:?}"
            )));
        };
        used[si] = true;
        used[bi] = true;
        let numel = |k: usize| outputs[k].iter().product::<usize>();
        let c = numel(si) / n;
        if numel(bi) != n * box_dim {
            return Err(Error::Shape(format!(
                "NanoDet stride {s}: box tensor size mismatch"
            )));
        }
        if *num_classes.get_or_insert(c) != c {
            return Err(Error::Shape(format!(
                "NanoDet stride {s}: {c} classes, but another stride has {}",
                num_classes.unwrap_or(0)
            )));
        }
        levels.push(NanodetLevel {
            stride: s,
            scores: si,
            boxes: bi,
            fw,
            n,
        });
    }
    Ok((levels, num_classes.unwrap_or(0)))
}

/// Decodes NanoDet GFL outputs (identified by shape) into detections in original pixels.
///
/// Per stride `s`, the feature map is `ceil(W/s) x ceil(H/s)` (W, H = model input size); anchor `i`
/// has centre `((i % fw + 0.5) * s, (i / fw + 0.5) * s)` (the model card's convention). Each side's
/// distance is the expectation of a softmax over `reg_max + 1` bins, times `s`. The best class per
/// anchor is kept when its score is `>= score_threshold`.
pub fn decode_nanodet(
    spec: &VisionSpec,
    outputs: &[Tensor],
    reg_max: usize,
    strides: &[usize],
    score_threshold: f32,
    transform: &ImageTransform,
) -> Result<Vec<Detection>> {
    let shapes: Vec<&[usize]> = outputs.iter().map(|t| t.shape.as_slice()).collect();
    let (levels, c) = nanodet_levels(spec, &shapes, reg_max, strides)?;
    let nb = reg_max + 1;
    let box_dim = 4 * nb;
    let mut cands = Vec::new();
    for lv in &levels {
        let (s, fw, n) = (lv.stride, lv.fw, lv.n);
        let scores = outputs[lv.scores].as_f32()?;
        let boxes = outputs[lv.boxes].as_f32()?;
        let sf = s as f32;
        let mut probs = vec![0f32; nb];
        for i in 0..n {
            let Some((cls, score)) = best_class(&scores[i * c..(i + 1) * c]) else {
                continue;
            };
            if score < score_threshold {
                continue;
            }
            let cx = ((i % fw) as f32 + 0.5) * sf;
            let cy = ((i / fw) as f32 + 0.5) * sf;
            let mut dist = [0f32; 4];
            for (side, d) in dist.iter_mut().enumerate() {
                let bins = &boxes[i * box_dim + side * nb..i * box_dim + (side + 1) * nb];
                *d = softmax_expectation(bins, &mut probs) * sf;
            }
            cands.push(Candidate {
                class_id: cls,
                score,
                bbox: BBox {
                    x1: cx - dist[0],
                    y1: cy - dist[1],
                    x2: cx + dist[2],
                    y2: cy + dist[3],
                },
            });
        }
    }
    Ok(finish(spec, cands, transform))
}

/// Softmax over `bins` then `sum(p_k * k)`; `probs` is scratch of the same length.
fn softmax_expectation(bins: &[f32], probs: &mut [f32]) -> f32 {
    let m = bins.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut total = 0.0;
    for (p, &b) in probs.iter_mut().zip(bins) {
        *p = (b - m).exp();
        total += *p;
    }
    probs
        .iter()
        .enumerate()
        .map(|(k, p)| k as f32 * p)
        .sum::<f32>()
        / total
}

/// Decodes a YOLOv8 head `[1, 4 + C, N]` (cx, cy, w, h in input pixels, then C sigmoided class
/// scores) into detections in original pixels; best class per anchor, `>= score_threshold`.
pub fn decode_yolov8(
    spec: &VisionSpec,
    outputs: &[Tensor],
    score_threshold: f32,
    transform: &ImageTransform,
) -> Result<Vec<Detection>> {
    let t = outputs
        .first()
        .ok_or_else(|| Error::BadInput("YOLOv8: the model produced no outputs".into()))?;
    let (rows, n) = match matrix_dims(t) {
        Some((rows, n)) if rows > 4 => (rows, n),
        _ => {
            return Err(Error::Shape(format!(
                "YOLOv8: expected output [1, 4 + C, N] with C >= 1, got {:?}",
                t.shape
            )))
        }
    };
    let data = t.as_f32()?;
    let c = rows - 4;
    let mut cands = Vec::new();
    let mut scores = vec![0f32; c];
    for i in 0..n {
        for (k, s) in scores.iter_mut().enumerate() {
            *s = data[(4 + k) * n + i];
        }
        let Some((cls, score)) = best_class(&scores) else {
            continue;
        };
        if score < score_threshold {
            continue;
        }
        let (cx, cy, w, h) = (data[i], data[n + i], data[2 * n + i], data[3 * n + i]);
        cands.push(Candidate {
            class_id: cls,
            score,
            bbox: BBox {
                x1: cx - w / 2.0,
                y1: cy - h / 2.0,
                x2: cx + w / 2.0,
                y2: cy + h / 2.0,
            },
        });
    }
    Ok(finish(spec, cands, transform))
}
