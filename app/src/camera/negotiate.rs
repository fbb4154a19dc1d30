//! Format negotiation as pure logic over a description of what a device offers, so it is
//! testable without hardware.
//!
//! Order: the first preferred format offered at exactly the wanted size; else the first
//! preferred format offered, at its nearest size; else any format Vigil can convert (MJPEG,
//! YUYV, NV12, RGB24 in that order) at its nearest size. The frame rate is the offered rate
//! nearest the wanted one. The driver may still adjust the result; the source reports what
//! it finally got.

use serde::Serialize;

use super::source::PixelFormat;

/// Frame sizes a device offers for one format.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum FrameSizes {
    /// A list of sizes, each with its frame rates (fps).
    Discrete(Vec<DiscreteSize>),
    /// Any size in a range, in steps (continuous when steps are 1).
    Stepwise {
        /// Smallest width offered, in pixels.
        min_width: u32,
        /// Largest width offered, in pixels.
        max_width: u32,
        /// Width increment between offered sizes, in pixels.
        step_width: u32,
        /// Smallest height offered, in pixels.
        min_height: u32,
        /// Largest height offered, in pixels.
        max_height: u32,
        /// Height increment between offered sizes, in pixels.
        step_height: u32,
        /// Frame rates offered (empty: unknown).
        fps: Vec<f64>,
    },
}

/// One discrete size and its frame rates.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DiscreteSize {
    /// Frame width in pixels.
    pub width: u32,
    /// Frame height in pixels.
    pub height: u32,
    /// Frame rates offered at this size (empty: unknown).
    pub fps: Vec<f64>,
}

/// One format a device offers.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OfferedFormat {
    /// FourCC as text, e.g. "MJPG".
    pub fourcc: String,
    /// Driver's description.
    pub description: String,
    /// The format, when Vigil can convert it.
    pub format: Option<PixelFormat>,
    /// Sizes offered.
    pub sizes: FrameSizes,
}

/// What the camera config asks for.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// Formats in order of preference.
    pub formats: Vec<PixelFormat>,
    /// Wanted frame width in pixels.
    pub width: u32,
    /// Wanted frame height in pixels.
    pub height: u32,
    /// Wanted frame rate (fps); the nearest offered rate is chosen.
    pub fps: f64,
}

/// The negotiated choice.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Choice {
    /// Pixel format to set on the device.
    pub format: PixelFormat,
    /// Frame width to set, in pixels (nearest offered to the request).
    pub width: u32,
    /// Frame height to set, in pixels (nearest offered to the request).
    pub height: u32,
    /// Chosen rate (0 when the device lists none).
    pub fps: f64,
    /// True when format, size and rate are exactly what was asked.
    pub exact: bool,
}

/// Formats Vigil converts, in fallback order.
const FALLBACK: [PixelFormat; 4] = [
    PixelFormat::Mjpeg,
    PixelFormat::Yuyv,
    PixelFormat::Nv12,
    PixelFormat::Rgb24,
];

fn size_distance(w: u32, h: u32, want_w: u32, want_h: u32) -> u64 {
    let area = |a: u32, b: u32| u64::from(a) * u64::from(b);
    area(w, h).abs_diff(area(want_w, want_h)) + u64::from(w.abs_diff(want_w) + h.abs_diff(want_h))
}

fn snap(v: u32, min: u32, max: u32, step: u32) -> u32 {
    let v = v.clamp(min, max.max(min));
    let step = step.max(1);
    let k = (v - min + step / 2) / step;
    (min + k * step).min(max.max(min))
}

fn nearest_fps(offered: &[f64], want: f64) -> f64 {
    offered
        .iter()
        .copied()
        .filter(|f| f.is_finite() && *f > 0.0)
        .min_by(|a, b| (a - want).abs().total_cmp(&(b - want).abs()))
        .unwrap_or(0.0)
}

/// The best (width, height, fps) a format offers for the request.
fn best_size(sizes: &FrameSizes, req: &Request) -> Option<(u32, u32, f64)> {
    match sizes {
        FrameSizes::Discrete(list) => list
            .iter()
            .min_by_key(|s| size_distance(s.width, s.height, req.width, req.height))
            .map(|s| (s.width, s.height, nearest_fps(&s.fps, req.fps))),
        FrameSizes::Stepwise {
            min_width,
            max_width,
            step_width,
            min_height,
            max_height,
            step_height,
            fps,
        } => Some((
            snap(req.width, *min_width, *max_width, *step_width),
            snap(req.height, *min_height, *max_height, *step_height),
            nearest_fps(fps, req.fps),
        )),
    }
}

/// Picks format, size and rate from what the device offers; errors when nothing is usable.
pub fn negotiate(offered: &[OfferedFormat], req: &Request) -> Result<Choice, String> {
    let find = |pf: PixelFormat| offered.iter().find(|o| o.format == Some(pf));
    let make = |pf: PixelFormat, (w, h, fps): (u32, u32, f64)| Choice {
        format: pf,
        width: w,
        height: h,
        fps,
        exact: w == req.width
            && h == req.height
            && (fps == 0.0 || (fps - req.fps).abs() < 0.01)
            && req.formats.first() == Some(&pf),
    };
    // 1. A preferred format at exactly the wanted size.
    for &pf in &req.formats {
        if let Some(best) = find(pf).and_then(|o| best_size(&o.sizes, req)) {
            if (best.0, best.1) == (req.width, req.height) {
                return Ok(make(pf, best));
            }
        }
    }
    // 2. The first preferred format offered, at its nearest size; 3. any convertible format.
    for &pf in req.formats.iter().chain(FALLBACK.iter()) {
        if let Some(best) = find(pf).and_then(|o| best_size(&o.sizes, req)) {
            return Ok(make(pf, best));
        }
    }
    let listed: Vec<&str> = offered.iter().map(|o| o.fourcc.as_str()).collect();
    Err(format!(
        "device offers no format Vigil can convert (offers: {}; supported: MJPG, YUYV, NV12, RGB3)",
        if listed.is_empty() {
            "none".to_string()
        } else {
            listed.join(", ")
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn discrete(fourcc: &str, sizes: &[(u32, u32, &[f64])]) -> OfferedFormat {
        let code: [u8; 4] = fourcc.as_bytes().try_into().unwrap();
        OfferedFormat {
            fourcc: fourcc.into(),
            description: fourcc.into(),
            format: PixelFormat::from_fourcc(code),
            sizes: FrameSizes::Discrete(
                sizes
                    .iter()
                    .map(|&(width, height, fps)| DiscreteSize {
                        width,
                        height,
                        fps: fps.to_vec(),
                    })
                    .collect(),
            ),
        }
    }

    fn req(formats: &[PixelFormat], w: u32, h: u32, fps: f64) -> Request {
        Request {
            formats: formats.to_vec(),
            width: w,
            height: h,
            fps,
        }
    }

    /// A typical UVC webcam: MJPEG up to 1080p at 30, YUYV 640x480 at 30 and 1280x720 at 10.
    fn webcam() -> Vec<OfferedFormat> {
        vec![
            discrete(
                "YUYV",
                &[(640, 480, &[30.0, 15.0]), (1280, 720, &[10.0, 5.0])],
            ),
            discrete(
                "MJPG",
                &[
                    (640, 480, &[30.0]),
                    (1280, 720, &[30.0]),
                    (1920, 1080, &[30.0]),
                ],
            ),
            discrete("H264", &[(1920, 1080, &[30.0])]),
        ]
    }

    use PixelFormat::*;

    #[test]
    fn exact_match_in_preference_order() {
        let c = negotiate(&webcam(), &req(&[Mjpeg, Yuyv], 1280, 720, 30.0)).unwrap();
        assert_eq!(
            (c.format, c.width, c.height, c.fps, c.exact),
            (Mjpeg, 1280, 720, 30.0, true)
        );
        let c = negotiate(&webcam(), &req(&[Yuyv, Mjpeg], 1280, 720, 30.0)).unwrap();
        assert_eq!((c.format, c.fps, c.exact), (Yuyv, 10.0, false));
    }

    #[test]
    fn exact_size_in_a_later_preference_beats_a_wrong_size() {
        let c = negotiate(&webcam(), &req(&[Yuyv, Mjpeg], 1920, 1080, 30.0)).unwrap();
        assert_eq!((c.format, c.width, c.height), (Mjpeg, 1920, 1080));
    }

    #[test]
    fn nearest_size_and_fallback_format() {
        let c = negotiate(&webcam(), &req(&[Nv12], 800, 600, 25.0)).unwrap();
        // NV12 is not offered: falls back to MJPEG (first convertible), nearest size 640x480.
        assert_eq!(
            (c.format, c.width, c.height, c.fps),
            (Mjpeg, 640, 480, 30.0)
        );
        assert!(!c.exact);
    }

    #[test]
    fn stepwise_sizes_snap_to_steps() {
        let offered = vec![OfferedFormat {
            fourcc: "NV12".into(),
            description: "Y/CbCr 4:2:0".into(),
            format: Some(Nv12),
            sizes: FrameSizes::Stepwise {
                min_width: 32,
                max_width: 1920,
                step_width: 16,
                min_height: 32,
                max_height: 1080,
                step_height: 8,
                fps: vec![60.0, 30.0],
            },
        }];
        let c = negotiate(&offered, &req(&[Mjpeg, Nv12], 641, 2000, 29.0)).unwrap();
        assert_eq!(
            (c.format, c.width, c.height, c.fps),
            (Nv12, 640, 1080, 30.0)
        );
    }

    #[test]
    fn nothing_convertible_is_an_error() {
        let e = negotiate(
            &[discrete("H264", &[(640, 480, &[30.0])])],
            &req(&[Mjpeg], 640, 480, 30.0),
        )
        .unwrap_err();
        assert!(e.contains("H264"), "{e}");
        assert!(negotiate(&[], &req(&[Mjpeg], 640, 480, 30.0)).is_err());
    }
}
