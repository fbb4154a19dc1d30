//! The calibration report: per-layer SQNR, sensitivity ranking, FP32-vs-INT8 agreement.

use serde::Serialize;

use crate::vision::{iou, Detection};

/// SQNR values are capped here (an exact match would be infinite, which JSON cannot hold).
pub const MAX_SQNR_DB: f64 = 200.0;

/// Signal-to-quantization-noise ratio in dB from accumulated energies (`sum y^2`, `sum (y - y_q)^2`).
pub fn sqnr_db(signal: f64, noise: f64) -> f64 {
    if noise <= 0.0 {
        return MAX_SQNR_DB;
    }
    if signal <= 0.0 {
        return -MAX_SQNR_DB;
    }
    (10.0 * (signal / noise).log10()).clamp(-MAX_SQNR_DB, MAX_SQNR_DB)
}

/// Accumulates `sum y^2` and `sum (y - y_q)^2` over runs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sqnr {
    /// Energy of the reference.
    pub signal: f64,
    /// Energy of the difference.
    pub noise: f64,
}

impl Sqnr {
    /// Adds one reference/quantized pair (lengths must match; extra elements are ignored).
    pub fn add(&mut self, reference: &[f32], quantized: &[f32]) {
        for (&a, &b) in reference.iter().zip(quantized) {
            self.signal += (a as f64) * (a as f64);
            self.noise += ((a - b) as f64) * ((a - b) as f64);
        }
    }

    /// The SQNR so far, in dB.
    pub fn db(&self) -> f64 {
        sqnr_db(self.signal, self.noise)
    }
}

/// Cosine similarity of two vectors (1 when both are zero, 0 when only one is).
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        ab += x as f64 * y as f64;
        aa += x as f64 * x as f64;
        bb += y as f64 * y as f64;
    }
    match (aa > 0.0, bb > 0.0) {
        (true, true) => ab / (aa.sqrt() * bb.sqrt()),
        (false, false) => 1.0,
        _ => 0.0,
    }
}

/// Index of the largest value (the first on ties; None for an empty or all-NaN slice).
pub fn argmax(v: &[f32]) -> Option<usize> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &x) in v.iter().enumerate() {
        if !x.is_nan() && best.is_none_or(|(_, b)| x > b) {
            best = Some((i, x));
        }
    }
    best.map(|(i, _)| i)
}

/// Counts candidate detections that match a reference detection: same class, IoU at least
/// `iou_threshold`, each reference used once; candidates are taken by descending score and each
/// takes its best-overlapping free reference.
pub fn match_detections(
    reference: &[Detection],
    candidate: &[Detection],
    iou_threshold: f32,
) -> usize {
    let mut order: Vec<usize> = (0..candidate.len()).collect();
    order.sort_by(|&a, &b| candidate[b].score.total_cmp(&candidate[a].score));
    let mut used = vec![false; reference.len()];
    let mut matched = 0;
    for c in order {
        let cand = &candidate[c];
        let mut best: Option<(usize, f32)> = None;
        for (r, refd) in reference.iter().enumerate() {
            if used[r] || refd.class_id != cand.class_id {
                continue;
            }
            let o = iou(&refd.bbox, &cand.bbox);
            if o >= iou_threshold && best.is_none_or(|(_, b)| o > b) {
                best = Some((r, o));
            }
        }
        if let Some((r, _)) = best {
            used[r] = true;
            matched += 1;
        }
    }
    matched
}

/// FP32-vs-INT8 agreement on the held-out images.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "task", rename_all = "snake_case")]
pub enum Agreement {
    /// Classifiers: top-1 agreement and logit cosine similarity.
    Classification {
        /// Images compared.
        images: usize,
        /// Images whose FP32 and INT8 top-1 classes are the same.
        top1_agree: usize,
        /// `top1_agree / images` (1 with no images).
        top1_agreement: f64,
        /// Mean cosine similarity of the FP32 and INT8 logits (0 with no images).
        mean_cosine: f64,
        /// Smallest per-image cosine similarity.
        min_cosine: f64,
    },
    /// Detectors: INT8 detections scored against the FP32 detections (IoU 0.5, same class).
    Detection {
        /// Images compared.
        images: usize,
        /// FP32 detections over all images (the reference).
        fp32_detections: usize,
        /// INT8 detections over all images.
        int8_detections: usize,
        /// INT8 detections matched to an FP32 one (same class, IoU >= 0.5).
        matched: usize,
        /// `matched / int8_detections` (1 when there are none).
        precision: f64,
        /// `matched / fp32_detections` (1 when there are none).
        recall: f64,
        /// Harmonic mean of precision and recall (0 when both are 0).
        f1: f64,
    },
}

/// Accumulates agreement over images.
#[derive(Clone, Debug, Default)]
pub struct AgreementAcc {
    images: usize,
    top1_agree: usize,
    cos_sum: f64,
    cos_min: f64,
    fp32: usize,
    int8: usize,
    matched: usize,
    detection: bool,
}

impl AgreementAcc {
    /// Adds one classifier image: FP32 and INT8 logits.
    pub fn add_classification(&mut self, fp32: &[f32], int8: &[f32]) {
        let c = cosine(fp32, int8);
        self.cos_min = if self.images == 0 {
            c
        } else {
            self.cos_min.min(c)
        };
        self.images += 1;
        self.cos_sum += c;
        if argmax(fp32).is_some() && argmax(fp32) == argmax(int8) {
            self.top1_agree += 1;
        }
    }

    /// Adds one detector image: FP32 and INT8 detections.
    pub fn add_detections(&mut self, fp32: &[Detection], int8: &[Detection]) {
        self.detection = true;
        self.images += 1;
        self.fp32 += fp32.len();
        self.int8 += int8.len();
        self.matched += match_detections(fp32, int8, 0.5);
    }

    /// The totals.
    pub fn finish(&self) -> Agreement {
        let ratio = |a: usize, b: usize| if b == 0 { 1.0 } else { a as f64 / b as f64 };
        if self.detection {
            let precision = ratio(self.matched, self.int8);
            let recall = ratio(self.matched, self.fp32);
            let f1 = if precision + recall > 0.0 {
                2.0 * precision * recall / (precision + recall)
            } else {
                0.0
            };
            Agreement::Detection {
                images: self.images,
                fp32_detections: self.fp32,
                int8_detections: self.int8,
                matched: self.matched,
                precision,
                recall,
                f1,
            }
        } else {
            Agreement::Classification {
                images: self.images,
                top1_agree: self.top1_agree,
                top1_agreement: ratio(self.top1_agree, self.images),
                mean_cosine: if self.images == 0 {
                    0.0
                } else {
                    self.cos_sum / self.images as f64
                },
                min_cosine: self.cos_min,
            }
        }
    }
}

/// One quantizable layer in the report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayerReport {
    /// Node name.
    pub name: String,
    /// `Conv`, `Gemm` or `MatMul`.
    pub op: String,
    /// Activation input tensor.
    pub input: String,
    /// Output tensor.
    pub output: String,
    /// Calibrated `amax` of the input (the largest magnitude its int8 range covers).
    pub input_amax: f32,
    /// The input's quantization scale, `input_amax / 127`.
    pub input_scale: f32,
    /// Number of weight scales (output channels when per-channel).
    pub weight_scales: usize,
    /// SQNR (dB) of this layer's output with its input and weights quantized and FP32 upstream.
    pub sqnr_db: f64,
    /// Whether the mixed-precision list keeps this layer in floating point.
    pub excluded: bool,
}

/// SQNR of one model output, INT8 (all non-excluded layers quantized) against FP32.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OutputSqnr {
    /// Model output name.
    pub name: String,
    /// SQNR in dB, capped at ±[`MAX_SQNR_DB`].
    pub sqnr_db: f64,
}

/// Layers below this SQNR are suggested for floating point.
pub const SENSITIVE_DB: f64 = 25.0;
/// At most this many layers are suggested.
pub const MAX_SUGGESTED: usize = 5;

/// The calibration report written next to the model (`<stem>.int8.<hash8>.report.json`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// sha256 of the model file, hex.
    pub model_sha256: String,
    /// Activation calibration method: `entropy`, `percentile` or `minmax`.
    pub method: String,
    /// Whether weights got one scale per output channel (else one per tensor).
    pub per_channel: bool,
    /// Images the activation ranges were calibrated on.
    pub calibration_images: usize,
    /// Held-out images SQNR and agreement were measured on.
    pub evaluation_images: usize,
    /// How the INT8 numbers were computed.
    pub int8_path: String,
    /// FP32-vs-INT8 agreement on the held-out images.
    pub agreement: Agreement,
    /// SQNR of each model output, in model order.
    pub outputs: Vec<OutputSqnr>,
    /// Layers in execution order.
    pub layers: Vec<LayerReport>,
    /// Layer names by ascending SQNR (most sensitive first).
    pub sensitivity: Vec<String>,
    /// The most sensitive layers (below [`SENSITIVE_DB`], at most [`MAX_SUGGESTED`]): candidates
    /// for the config's `int8_exclude` list.
    pub suggested_exclude: Vec<String>,
    /// Layers the mixed-precision list kept in floating point.
    pub excluded: Vec<String>,
}

impl Report {
    /// Fills the sensitivity ranking and suggestions from `layers`.
    pub fn rank(&mut self) {
        let mut order: Vec<&LayerReport> = self.layers.iter().collect();
        order.sort_by(|a, b| a.sqnr_db.total_cmp(&b.sqnr_db));
        self.sensitivity = order.iter().map(|l| l.name.clone()).collect();
        self.suggested_exclude = order
            .iter()
            .filter(|l| l.sqnr_db < SENSITIVE_DB)
            .take(MAX_SUGGESTED)
            .map(|l| l.name.clone())
            .collect();
        self.excluded = self
            .layers
            .iter()
            .filter(|l| l.excluded)
            .map(|l| l.name.clone())
            .collect();
    }

    /// A short human-readable summary.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "INT8 calibration ({}, {} weights): {} calibration images, {} evaluation images\n",
            self.method,
            if self.per_channel {
                "per-channel"
            } else {
                "per-tensor"
            },
            self.calibration_images,
            self.evaluation_images
        );
        match &self.agreement {
            Agreement::Classification {
                images,
                top1_agree,
                mean_cosine,
                min_cosine,
                ..
            } => s.push_str(&format!(
                "top-1 agreement with FP32: {top1_agree}/{images}; logit cosine mean {mean_cosine:.4}, min {min_cosine:.4}\n"
            )),
            Agreement::Detection {
                fp32_detections,
                int8_detections,
                matched,
                precision,
                recall,
                f1,
                ..
            } => s.push_str(&format!(
                "detections vs FP32 (IoU 0.5): {matched} matched of {int8_detections} INT8 / {fp32_detections} FP32; precision {precision:.3}, recall {recall:.3}, F1 {f1:.3}\n"
            )),
        }
        for o in &self.outputs {
            s.push_str(&format!("output {}: SQNR {:.1} dB\n", o.name, o.sqnr_db));
        }
        s.push_str("most sensitive layers (SQNR dB):");
        for name in self.sensitivity.iter().take(5) {
            if let Some(l) = self.layers.iter().find(|l| &l.name == name) {
                s.push_str(&format!(" {} {:.1};", l.name, l.sqnr_db));
            }
        }
        s.push('\n');
        if !self.suggested_exclude.is_empty() {
            s.push_str(&format!(
                "suggested int8_exclude: {:?}\n",
                self.suggested_exclude
            ));
        }
        s
    }
}
