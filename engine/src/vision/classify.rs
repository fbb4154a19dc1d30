//! Classification post-processing: softmax, top-k, labels.

use super::{label_for, Classification};
use crate::error::{Error, Result};
use crate::ir::Tensor;

/// Numerically stable softmax (subtracts the max); NaN inputs propagate.
pub fn softmax(logits: &[f32]) -> Vec<f32> {
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = logits.iter().map(|&x| (x - m).exp()).collect();
    let total: f32 = exps.iter().sum();
    exps.into_iter().map(|e| e / total).collect()
}

/// Top-`top_k` classes of a `[C]` / `[1, C]` (any shape with at most one non-1 dim) output.
///
/// Applies softmax first when `apply_softmax`; keeps scores `>= score_threshold` only when the
/// threshold is > 0; ties keep the lower class id first; NaN scores rank last.
pub fn classify(
    output: &Tensor,
    labels: &[String],
    apply_softmax: bool,
    top_k: usize,
    score_threshold: f32,
) -> Result<Vec<Classification>> {
    let data = output.as_f32()?;
    if data.is_empty() || output.shape.iter().filter(|&&d| d != 1).count() > 1 {
        return Err(Error::Shape(format!(
            "classification output must be [C] or [1, C] with C >= 1, got {:?}",
            output.shape
        )));
    }
    let scores = if apply_softmax {
        softmax(data)
    } else {
        data.to_vec()
    };
    let mut order: Vec<usize> = (0..scores.len()).collect();
    let key = |i: usize| {
        if scores[i].is_nan() {
            f32::NEG_INFINITY
        } else {
            scores[i]
        }
    };
    order.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
    Ok(order
        .into_iter()
        .filter(|&i| score_threshold <= 0.0 || scores[i] >= score_threshold)
        .take(top_k)
        .map(|i| Classification {
            class_id: i,
            label: label_for(labels, i),
            score: scores[i],
        })
        .collect())
}
