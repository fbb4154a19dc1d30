//! TensorRT calibration caches in TensorRT's text format.
//!
//! ```text
//! TRT-8602-EntropyCalibration2
//! input: 3c010a14
//! conv1: 3c88edfc
//! ```
//!
//! The first line is `TRT-<version>-<algorithm>` (`<version>` is TensorRT's `NV_TENSORRT_VERSION`,
//! e.g. 8602 for 8.6.2 and 100300 for 10.3.0). Each following line is `<tensor name>: <hex>`,
//! where `<hex>` is the bit pattern of the f32 scale (`amax / 127`) as lower-case hex without
//! leading zeros, as TensorRT prints it (`0` for a zero scale, `3c000000` for 0.0078125). Every
//! line ends with `\n`. TensorRT ignores a cache whose version line differs from its own.

use crate::error::{Error, Result};

/// TensorRT 10.3 (JetPack 6.1/6.2), the newest release line that still calibrates implicitly.
pub const DEFAULT_TRT_VERSION: &str = "100300";

/// The algorithm name TensorRT writes for its default entropy calibrator.
pub const ENTROPY_CALIBRATION_2: &str = "EntropyCalibration2";

/// A parsed or generated calibration cache: a header plus `(tensor name, scale)` in file order.
#[derive(Clone, Debug, PartialEq)]
pub struct TrtCache {
    /// `NV_TENSORRT_VERSION` as written in the header (digits).
    pub version: String,
    /// Calibrator name, e.g. `EntropyCalibration2`.
    pub algorithm: String,
    /// Per-tensor scales (`amax / 127`), in file order.
    pub scales: Vec<(String, f32)>,
}

impl TrtCache {
    /// A cache for `version` with the EntropyCalibration2 header.
    pub fn new(version: &str, scales: Vec<(String, f32)>) -> TrtCache {
        TrtCache {
            version: version.to_string(),
            algorithm: ENTROPY_CALIBRATION_2.to_string(),
            scales,
        }
    }

    /// The file contents, byte for byte as TensorRT writes them.
    pub fn to_text(&self) -> String {
        let mut s = format!("TRT-{}-{}\n", self.version, self.algorithm);
        for (name, scale) in &self.scales {
            s.push_str(&format!("{name}: {:x}\n", scale.to_bits()));
        }
        s
    }

    /// Parses a cache; errors name the offending line.
    pub fn parse(text: &str) -> Result<TrtCache> {
        let mut lines = text.lines();
        let header = lines
            .next()
            .ok_or_else(|| Error::InvalidModel("empty TensorRT calibration cache".into()))?;
        let bad_header = || {
            Error::InvalidModel(format!(
                "calibration cache header '{header}' is not TRT-<version>-<algorithm>"
            ))
        };
        let rest = header.strip_prefix("TRT-").ok_or_else(bad_header)?;
        let (version, algorithm) = rest.split_once('-').ok_or_else(bad_header)?;
        if version.is_empty()
            || !version.bytes().all(|b| b.is_ascii_digit())
            || algorithm.is_empty()
        {
            return Err(bad_header());
        }
        let mut scales = Vec::new();
        for (i, line) in lines.enumerate() {
            if line.is_empty() {
                continue;
            }
            // Tensor names may contain ": " themselves; the value follows the last one.
            let (name, hex) = line.rsplit_once(": ").ok_or_else(|| {
                Error::InvalidModel(format!(
                    "calibration cache line {}: '{line}' is not '<tensor>: <hex>'",
                    i + 2
                ))
            })?;
            let bits = u32::from_str_radix(hex.trim(), 16)
                .ok()
                .filter(|_| !hex.trim().is_empty() && hex.trim().len() <= 8)
                .ok_or_else(|| {
                    Error::InvalidModel(format!(
                        "calibration cache line {}: '{hex}' is not an f32 bit pattern in hex",
                        i + 2
                    ))
                })?;
            scales.push((name.to_string(), f32::from_bits(bits)));
        }
        Ok(TrtCache {
            version: version.to_string(),
            algorithm: algorithm.to_string(),
            scales,
        })
    }

    /// The scale of a tensor, if listed.
    pub fn scale(&self, name: &str) -> Option<f32> {
        self.scales.iter().find(|(n, _)| n == name).map(|(_, s)| *s)
    }
}
