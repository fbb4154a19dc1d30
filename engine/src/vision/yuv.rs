//! YUV → RGB description shared by the camera's CPU converter (`vigil::camera::convert`) and the
//! GPU kernels (`backend::cuda::vision`): the BT.601/BT.709 matrices, limited/full range, the
//! 14-bit fixed-point coefficients with their per-pixel formula (the result truncated to 8 bits
//! as ffmpeg's swscale does), and NV12's vertical chroma filter. One definition, so both paths
//! compute the same bytes.

use serde::Deserialize;

/// Fractional bits of the fixed-point coefficients.
const SHIFT: i32 = 14;
/// Fractional bits chroma is carried with inside the per-pixel formula.
pub const CHROMA_FRAC: i32 = 4;

/// NV12 vertical cubic weights (sum 4096, as swscale's 12-bit vertical filter; Keys a = -0.6,
/// swscale's default bicubic B = 0, C = 0.6) for an even luma row `2i` (sited at chroma row
/// `i - 0.25`) on chroma rows `i-2..=i+1`; odd rows use them mirrored on `i-1..=i+2`. The
/// interpolated chroma is rounded to 8 bits before the matrix.
pub const NV12_CUBIC_EVEN: [i32; 4] = [-115, 985, 3572, -346];

/// YUV → RGB matrix (`yuv_matrix = "bt601" | "bt709"`).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum YuvMatrix {
    /// ITU-R BT.601 (SD; what UVC webcams and ffmpeg's default use).
    #[default]
    Bt601,
    /// ITU-R BT.709 (HD).
    Bt709,
}

/// YUV value range (`yuv_range = "limited" | "full"`).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum YuvRange {
    /// Y in 16..=235, chroma in 16..=240 ("TV" range).
    #[default]
    Limited,
    /// Y and chroma in 0..=255 ("PC"/JPEG range).
    Full,
}

/// Fixed-point conversion coefficients for one matrix and range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct YuvCoeffs {
    /// Luma black level (16 limited, 0 full).
    pub y_offset: i32,
    /// Luma gain, 14 fractional bits (rounded up so nominal white reaches 255).
    pub y_mul: i32,
    /// V→R, U→G, V→G, U→B gains, 14 fractional bits (G terms are subtracted).
    pub rv: i32,
    /// U→G gain (subtracted).
    pub gu: i32,
    /// V→G gain (subtracted).
    pub gv: i32,
    /// U→B gain.
    pub bu: i32,
}

impl YuvCoeffs {
    /// Coefficients derived from the matrix's Kr/Kb and the range's scale factors.
    pub fn new(matrix: YuvMatrix, range: YuvRange) -> YuvCoeffs {
        let (kr, kb) = match matrix {
            YuvMatrix::Bt601 => (0.299f64, 0.114f64),
            YuvMatrix::Bt709 => (0.2126, 0.0722),
        };
        let kg = 1.0 - kr - kb;
        let (y_offset, ys, cs) = match range {
            YuvRange::Limited => (16, 255.0 / 219.0, 255.0 / 224.0),
            YuvRange::Full => (0, 1.0, 1.0),
        };
        let one = f64::from(1 << SHIFT);
        let fx = |v: f64| (v * one).round() as i32;
        YuvCoeffs {
            y_offset,
            y_mul: (ys * one - 1e-9).ceil() as i32,
            rv: fx(cs * 2.0 * (1.0 - kr)),
            gu: fx(cs * 2.0 * kb * (1.0 - kb) / kg),
            gv: fx(cs * 2.0 * kr * (1.0 - kr) / kg),
            bu: fx(cs * 2.0 * (1.0 - kb)),
        }
    }

    /// Converts one pixel with 8-bit chroma.
    #[inline(always)]
    pub fn pixel(&self, y: u8, u: u8, v: u8) -> [u8; 3] {
        self.pixel_hp(y, i32::from(u) << CHROMA_FRAC, i32::from(v) << CHROMA_FRAC)
    }

    /// Converts one pixel whose chroma carries [`CHROMA_FRAC`] fractional bits (0..=255·16);
    /// the result is truncated to 8 bits and clamped.
    #[inline(always)]
    pub fn pixel_hp(&self, y: u8, u16: i32, v16: i32) -> [u8; 3] {
        let yy = ((i32::from(y) - self.y_offset) * self.y_mul) << CHROMA_FRAC;
        let u = u16 - (128 << CHROMA_FRAC);
        let v = v16 - (128 << CHROMA_FRAC);
        let c = |x: i32| (x >> (SHIFT + CHROMA_FRAC)).clamp(0, 255) as u8;
        [
            c(yy + self.rv * v),
            c(yy - self.gu * u - self.gv * v),
            c(yy + self.bu * u),
        ]
    }
}
