//! Resize tap tables (source indices and weights per output row or column), shared by the CPU
//! and CUDA backends so both map coordinates with the same arithmetic, bit for bit.

use crate::ir::{CoordMode, NearestMode, ResizeAttrs, ResizeMode};

/// Maps an output coordinate to the input coordinate (ONNX `coordinate_transformation_mode`).
fn source_coord(coord: CoordMode, x: usize, scale: f32, in_len: usize, out_len: usize) -> f32 {
    let x = x as f32;
    match coord {
        CoordMode::HalfPixel => (x + 0.5) / scale - 0.5,
        CoordMode::PytorchHalfPixel => {
            if out_len > 1 {
                (x + 0.5) / scale - 0.5
            } else {
                0.0
            }
        }
        CoordMode::AlignCorners => {
            if out_len > 1 {
                x * (in_len as f32 - 1.0) / (out_len as f32 - 1.0)
            } else {
                0.0
            }
        }
        CoordMode::Asymmetric => x / scale,
        CoordMode::TfHalfPixelForNn => (x + 0.5) / scale,
    }
}

/// Rounds a source coordinate to an input index (ONNX `nearest_mode`), clamped into range.
fn nearest_index(mode: NearestMode, x: f32, in_len: usize) -> usize {
    let f = x.floor();
    let r = match mode {
        NearestMode::RoundPreferFloor => {
            if x - f == 0.5 {
                f
            } else {
                x.round()
            }
        }
        NearestMode::RoundPreferCeil => {
            if x - f == 0.5 {
                f + 1.0
            } else {
                x.round()
            }
        }
        NearestMode::Floor => f,
        NearestMode::Ceil => x.ceil(),
    };
    (r.max(0.0) as usize).min(in_len.saturating_sub(1))
}

/// Two source indices and their weights for one output row or column.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tap {
    pub i0: usize,
    pub i1: usize,
    pub w0: f32,
    pub w1: f32,
}

/// The taps of every output position along one axis.
pub fn taps(a: &ResizeAttrs, scale: f32, in_len: usize, out_len: usize) -> Vec<Tap> {
    (0..out_len)
        .map(|o| {
            let x = source_coord(a.coord, o, scale, in_len, out_len);
            match a.mode {
                ResizeMode::Nearest => {
                    let i = nearest_index(a.nearest, x, in_len);
                    Tap {
                        i0: i,
                        i1: i,
                        w0: 1.0,
                        w1: 0.0,
                    }
                }
                ResizeMode::Linear => {
                    let x = x.clamp(0.0, in_len.saturating_sub(1) as f32);
                    let i0 = (x.floor() as usize).min(in_len.saturating_sub(1));
                    let i1 = (i0 + 1).min(in_len.saturating_sub(1));
                    let w1 = x - i0 as f32;
                    Tap {
                        i0,
                        i1,
                        w0: 1.0 - w1,
                        w1,
                    }
                }
            }
        })
        .collect()
}
