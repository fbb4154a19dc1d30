//! Streaming histograms of absolute activation values, plus the exact min and max.
//!
//! The histogram has a fixed number of equal-width bins over `[0, range]`. The range starts at the
//! first non-zero batch's largest magnitude and doubles (adjacent bins merged pairwise, which is
//! exact: no count is ever redistributed) whenever a later batch exceeds it. Bin `i` holds
//! magnitudes in `[i * w, (i + 1) * w)` with `w = range / bins`; the range itself lands in the last
//! bin. Non-finite values are counted apart and never binned.

use crate::error::{Error, Result};

/// Default bin count (TensorRT's entropy calibrator histograms use 2048 bins).
pub const DEFAULT_BINS: usize = 2048;

/// A streaming histogram of `|x|` with range-doubling re-binning, plus min/max of `x`.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    bins: Vec<u64>,
    range: f32,
    min: f32,
    max: f32,
    nonfinite: u64,
}

impl Histogram {
    /// An empty histogram of `bins` bins; `bins` must be even and at least 2.
    pub fn new(bins: usize) -> Result<Histogram> {
        if bins < 2 || !bins.is_multiple_of(2) {
            return Err(Error::BadInput(format!(
                "histogram bin count must be even and at least 2, got {bins}"
            )));
        }
        Ok(Histogram {
            bins: vec![0; bins],
            range: 0.0,
            min: f32::INFINITY,
            max: f32::NEG_INFINITY,
            nonfinite: 0,
        })
    }

    /// The bin counts.
    pub fn bins(&self) -> &[u64] {
        &self.bins
    }

    /// The upper end of the histogram's range (0 while only zeros have been seen).
    pub fn range(&self) -> f32 {
        self.range
    }

    /// Width of one bin.
    pub fn bin_width(&self) -> f64 {
        self.range as f64 / self.bins.len() as f64
    }

    /// Smallest finite value seen (+inf when none).
    pub fn min(&self) -> f32 {
        self.min
    }

    /// Largest finite value seen (-inf when none).
    pub fn max(&self) -> f32 {
        self.max
    }

    /// Largest finite magnitude seen (0 when none).
    pub fn abs_max(&self) -> f32 {
        if self.min > self.max {
            0.0
        } else {
            self.min.abs().max(self.max.abs())
        }
    }

    /// Number of finite values binned.
    pub fn count(&self) -> u64 {
        self.bins.iter().sum()
    }

    /// Number of NaN or infinite values skipped.
    pub fn nonfinite(&self) -> u64 {
        self.nonfinite
    }

    /// Index of the bin holding magnitude `a` (which must be at most the range).
    #[inline]
    fn index(&self, a: f32, per_unit: f64) -> usize {
        ((a as f64 * per_unit) as usize).min(self.bins.len() - 1)
    }

    /// Doubles the range, merging bins pairwise.
    fn double(&mut self) {
        let n = self.bins.len();
        for i in 0..n / 2 {
            self.bins[i] = self.bins[2 * i] + self.bins[2 * i + 1];
        }
        for b in &mut self.bins[n / 2..] {
            *b = 0;
        }
        self.range *= 2.0;
    }

    /// Adds a batch of values.
    pub fn add(&mut self, data: &[f32]) {
        let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
        for &x in data {
            if x.is_finite() {
                lo = lo.min(x);
                hi = hi.max(x);
            } else {
                self.nonfinite += 1;
            }
        }
        if lo > hi {
            return;
        }
        self.min = self.min.min(lo);
        self.max = self.max.max(hi);
        let amax = lo.abs().max(hi.abs());
        if self.range == 0.0 {
            self.range = amax;
        }
        while amax > self.range {
            self.double();
        }
        if self.range == 0.0 {
            // Only zeros so far: they belong to bin 0 whatever the range becomes.
            self.bins[0] += data.iter().filter(|x| x.is_finite()).count() as u64;
            return;
        }
        let per_unit = self.bins.len() as f64 / self.range as f64;
        for &x in data {
            if x.is_finite() {
                let i = self.index(x.abs(), per_unit);
                self.bins[i] += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_and_doubling_match_direct_binning() {
        let mut h = Histogram::new(8).unwrap();
        h.add(&[0.0, 1.0, -0.5]);
        assert_eq!(h.range(), 1.0);
        h.add(&[3.9, f32::NAN]);
        assert_eq!(h.range(), 4.0);
        // Direct binning at range 4, width 0.5: 0 -> 0, 0.5 -> 1, 1.0 (the first batch's max,
        // clamped into bin 7 at range 1, merged down to bin 1) -> 1, 3.9 -> 7.
        assert_eq!(h.bins(), &[1, 2, 0, 0, 0, 0, 0, 1]);
        assert_eq!(h.nonfinite(), 1);
        assert_eq!((h.min(), h.max(), h.abs_max()), (-0.5, 3.9, 3.9));
    }

    #[test]
    fn zeros_before_range() {
        let mut a = Histogram::new(4).unwrap();
        a.add(&[0.0, 0.0]);
        assert_eq!(a.range(), 0.0);
        a.add(&[2.0, 0.6]);
        assert_eq!(a.bins(), &[2, 1, 0, 1]);
        assert_eq!(a.count(), 4);
        assert!(Histogram::new(3).is_err());
    }
}
