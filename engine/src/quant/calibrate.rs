//! Calibration methods (histogram → clipping threshold `amax`) and weight quantization.
//!
//! * `entropy`: TensorRT's "EntropyCalibration2" KL-divergence search, as NVIDIA publishes it
//!   (GTC 2017 "8-bit Inference with TensorRT", and `_compute_amax_entropy` of NVIDIA's
//!   pytorch-quantization): over an absolute-value histogram, for every candidate bin count `i`
//!   from 128 to all bins, the reference distribution P is the first `i` bins with the outliers
//!   added to bin `i - 1`; the candidate Q merges those `i` bins into 128 levels (bin `j` goes to
//!   level `floor(128 j / i)`) and spreads each level's count uniformly over its non-empty bins.
//!   The chosen `i` minimises KL(P || Q) (the last one on ties), and `amax = i * bin_width`. As in
//!   NVIDIA's implementation, bin 0 is replaced by bin 1 first (the zero spike after ReLU says
//!   nothing about the range).
//! * `percentile`: the upper edge of the bin holding the `p`-th percentile of `|x|` (99.99 by default).
//! * `minmax`: the largest magnitude seen.
//!
//! Scales are symmetric: `scale = amax / 127` (what TensorRT stores in its calibration cache).

use super::histogram::Histogram;
use crate::error::{Error, Result};

/// Quantized levels of the positive half of int8 (the entropy search merges into this many).
pub const QUANT_LEVELS: usize = 128;

/// How activation thresholds are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// TensorRT's KL-divergence search (EntropyCalibration2).
    Entropy,
    /// A high percentile of `|x|` (99.99 unless configured).
    Percentile,
    /// The largest `|x|` seen.
    MinMax,
}

impl Method {
    /// Lower-case name (`entropy`, `percentile`, `minmax`).
    pub fn name(self) -> &'static str {
        match self {
            Method::Entropy => "entropy",
            Method::Percentile => "percentile",
            Method::MinMax => "minmax",
        }
    }
}

impl std::str::FromStr for Method {
    type Err = Error;
    fn from_str(s: &str) -> Result<Method> {
        match s.to_ascii_lowercase().as_str() {
            "entropy" => Ok(Method::Entropy),
            "percentile" => Ok(Method::Percentile),
            "minmax" | "min-max" | "max" => Ok(Method::MinMax),
            other => Err(Error::BadInput(format!(
                "unknown calibration method '{other}' (entropy, percentile or minmax)"
            ))),
        }
    }
}

/// KL divergence `sum p_k ln(p_k / q_k)` of two unnormalised distributions (each normalised to
/// sum 1 first), as `scipy.stats.entropy` computes it: terms with `p_k = 0` count 0, and a
/// `p_k > 0` facing `q_k = 0` makes it infinite.
pub fn kl_divergence(p: &[f64], q: &[f64]) -> f64 {
    let sp: f64 = p.iter().sum();
    let sq: f64 = q.iter().sum();
    if sp <= 0.0 || sq <= 0.0 {
        return f64::INFINITY;
    }
    let mut d = 0.0;
    for (&a, &b) in p.iter().zip(q) {
        let (a, b) = (a / sp, b / sq);
        if a > 0.0 {
            if b > 0.0 {
                d += a * (a / b).ln();
            } else {
                return f64::INFINITY;
            }
        }
    }
    d
}

/// The entropy search over raw bin counts: returns the chosen bin count `i` (the threshold is
/// `i * bin_width`). `None` when the histogram has fewer than [`QUANT_LEVELS`] bins or is empty.
pub fn entropy_threshold_bin(counts: &[u64]) -> Option<usize> {
    let n = counts.len();
    if n < QUANT_LEVELS || counts.iter().all(|&c| c == 0) {
        return None;
    }
    let mut bins: Vec<f64> = counts.iter().map(|&c| c as f64).collect();
    bins[0] = bins[1];
    // suffix[i] = sum of bins[i..]
    let mut suffix = vec![0.0f64; n + 1];
    for i in (0..n).rev() {
        suffix[i] = suffix[i + 1] + bins[i];
    }
    let mut best: Option<(f64, usize)> = None;
    let mut p = Vec::with_capacity(n);
    let mut q = Vec::with_capacity(n);
    let mut level_sum = [0.0f64; QUANT_LEVELS];
    let mut level_nonzero = [0usize; QUANT_LEVELS];
    for i in QUANT_LEVELS..=n {
        level_sum.fill(0.0);
        level_nonzero.fill(0);
        for (j, &b) in bins[..i].iter().enumerate() {
            if b != 0.0 {
                let k = j * QUANT_LEVELS / i;
                level_sum[k] += b;
                level_nonzero[k] += 1;
            }
        }
        p.clear();
        p.extend_from_slice(&bins[..i]);
        p[i - 1] += suffix[i];
        q.clear();
        q.extend(bins[..i].iter().enumerate().map(|(j, &b)| {
            if b == 0.0 {
                0.0
            } else {
                let k = j * QUANT_LEVELS / i;
                level_sum[k] / level_nonzero[k] as f64
            }
        }));
        let d = kl_divergence(&p, &q);
        // `<=`: the last minimum wins, as in NVIDIA's implementation.
        if best.is_none_or(|(bd, _)| d <= bd) {
            best = Some((d, i));
        }
    }
    best.map(|(_, i)| i)
}

/// Entropy-calibrated `amax` of a histogram (0 for an empty or all-zero one).
pub fn amax_entropy(h: &Histogram) -> f32 {
    match entropy_threshold_bin(h.bins()) {
        Some(i) => (i as f64 * h.bin_width()) as f32,
        None => h.abs_max(),
    }
}

/// `amax` at percentile `p` (0 < p <= 100) of `|x|`: the upper edge of the first bin whose
/// cumulative count reaches `p / 100` of all values.
pub fn amax_percentile(h: &Histogram, p: f64) -> Result<f32> {
    if !(p > 0.0 && p <= 100.0) {
        return Err(Error::BadInput(format!(
            "percentile must be in (0, 100], got {p}"
        )));
    }
    let total = h.count();
    if total == 0 || h.range() == 0.0 {
        return Ok(0.0);
    }
    let want = p / 100.0 * total as f64;
    let mut cum = 0u64;
    for (i, &c) in h.bins().iter().enumerate() {
        cum += c;
        if cum as f64 >= want {
            return Ok(((i + 1) as f64 * h.bin_width()) as f32);
        }
    }
    Ok(h.range())
}

/// The largest magnitude seen.
pub fn amax_minmax(h: &Histogram) -> f32 {
    h.abs_max()
}

/// `amax` of a histogram by `method` (`percentile` is used only by [`Method::Percentile`]).
pub fn compute_amax(h: &Histogram, method: Method, percentile: f64) -> Result<f32> {
    Ok(match method {
        Method::Entropy => amax_entropy(h),
        Method::Percentile => amax_percentile(h, percentile)?,
        Method::MinMax => amax_minmax(h),
    })
}

/// The symmetric int8 scale for `amax` (`amax / 127`); 1 for a zero or non-finite `amax`, so
/// that the scale is always a usable positive number.
pub fn scale_for(amax: f32) -> f32 {
    if amax > 0.0 && amax.is_finite() {
        amax / 127.0
    } else {
        1.0
    }
}

/// Quantizes `x` to int8 at `scale` as ONNX `QuantizeLinear` does (zero point 0): divide, round
/// half to even, saturate to [-128, 127].
#[inline]
pub fn quantize(x: f32, scale: f32) -> i8 {
    (x / scale).round_ties_even().clamp(-128.0, 127.0) as i8
}

/// Weights quantized symmetrically to int8 (narrow range [-127, 127], zero point 0).
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizedWeights {
    /// The int8 values, in the weight tensor's layout.
    pub values: Vec<i8>,
    /// One scale per slice along `axis` (per-channel), or a single scale (per-tensor).
    pub scales: Vec<f32>,
    /// The channel axis (meaningful when `scales.len() > 1`).
    pub axis: usize,
    /// The weight tensor's shape.
    pub shape: Vec<usize>,
}

impl QuantizedWeights {
    /// The dequantized weights (`q * scale` of the element's channel), as f32.
    pub fn dequantize(&self) -> Vec<f32> {
        let (outer, chans, inner) = split_axis(&self.shape, self.axis);
        let mut out = Vec::with_capacity(self.values.len());
        for o in 0..outer {
            for c in 0..chans {
                let s = if self.scales.len() == 1 {
                    self.scales[0]
                } else {
                    self.scales[c]
                };
                let base = (o * chans + c) * inner;
                out.extend(
                    self.values[base..base + inner]
                        .iter()
                        .map(|&q| q as f32 * s),
                );
            }
        }
        out
    }
}

/// (product of dims before `axis`, dim at `axis`, product of dims after `axis`).
fn split_axis(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = shape[..axis.min(shape.len())].iter().product();
    let chans = shape.get(axis).copied().unwrap_or(1);
    let inner = shape.get(axis + 1..).map_or(1, |s| s.iter().product());
    (outer, chans, inner)
}

/// Quantizes weights `w` of `shape` symmetrically: one scale per slice along `axis` when
/// `per_channel`, else one for the whole tensor; `scale = max|w| / 127`.
pub fn quantize_weights(
    w: &[f32],
    shape: &[usize],
    axis: usize,
    per_channel: bool,
) -> Result<QuantizedWeights> {
    if axis >= shape.len() || shape.iter().product::<usize>() != w.len() {
        return Err(Error::Shape(format!(
            "cannot quantize weights of shape {shape:?} ({} values) along axis {axis}",
            w.len()
        )));
    }
    let (outer, chans, inner) = split_axis(shape, axis);
    let mut amax = vec![0.0f32; if per_channel { chans } else { 1 }];
    for o in 0..outer {
        for c in 0..chans {
            let base = (o * chans + c) * inner;
            let m = w[base..base + inner]
                .iter()
                .filter(|x| x.is_finite())
                .fold(0.0f32, |m, &x| m.max(x.abs()));
            let k = if per_channel { c } else { 0 };
            amax[k] = amax[k].max(m);
        }
    }
    let scales: Vec<f32> = amax.iter().map(|&a| scale_for(a)).collect();
    let mut values = Vec::with_capacity(w.len());
    for o in 0..outer {
        for c in 0..chans {
            let s = scales[if per_channel { c } else { 0 }];
            let base = (o * chans + c) * inner;
            values.extend(
                w[base..base + inner]
                    .iter()
                    .map(|&x| (x / s).round_ties_even().clamp(-127.0, 127.0) as i8),
            );
        }
    }
    Ok(QuantizedWeights {
        values,
        scales,
        axis,
        shape: shape.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_per_channel_round_trip_within_half_a_step() {
        let w = [0.5f32, -1.0, 0.25, 2.0, -0.1, 0.3];
        let q = quantize_weights(&w, &[2, 3], 0, true).unwrap();
        assert_eq!(q.scales, vec![1.0 / 127.0, 2.0 / 127.0]);
        assert_eq!(&q.values[..3], &[64, -127, 32]);
        for (a, b) in w.iter().zip(q.dequantize()) {
            assert!((a - b).abs() <= 1.0 / 127.0 + 1e-7);
        }
        let t = quantize_weights(&w, &[2, 3], 1, false).unwrap();
        assert_eq!(t.scales, vec![2.0 / 127.0]);
        assert!(quantize_weights(&w, &[4, 3], 0, true).is_err());
    }

    #[test]
    fn quantize_saturates_and_rounds_to_even() {
        assert_eq!(quantize(2.5, 1.0), 2);
        assert_eq!(quantize(-3.5, 1.0), -4);
        assert_eq!(quantize(1000.0, 1.0), 127);
        assert_eq!(quantize(-1000.0, 1.0), -128);
    }
}
