//! Frame conversions to packed RGB8: MJPEG decoding (zune-jpeg, reusing the output buffer) and
//! YUYV 4:2:2 / NV12 4:2:0 with BT.601 or BT.709 coefficients, limited or full range.
//!
//! The YUV paths are integer fixed point on the CPU, one pass per row, with the engine's shared
//! description (`vigil_engine::vision::yuv`: 14-bit coefficients, the result *truncated* to 8 bits
//! as ffmpeg's swscale does). Chroma is replicated horizontally (swscale's default); NV12's
//! half-height chroma is interpolated vertically with swscale's bicubic filter
//! ([`ChromaUpsampling`]) and rounded to 8 bits. This is within ±2 of ffmpeg converting the same
//! frames (see docs/camera.md); the same math runs on the GPU in
//! `vigil_engine::backend::cuda::vision`, which the camera pipeline uses when the camera's model
//! runs on CUDA ([`Converter::gpu_frame`] hands it the frame and these coefficients).

use image::RgbImage;
use zune_core::bytestream::ZCursor;
use zune_core::colorspace::ColorSpace;
use zune_core::options::DecoderOptions;

use vigil_engine::vision::{YuvFrame, YuvLayout};

use super::source::{PixelFormat, RawFrame};

pub use vigil_engine::vision::yuv::{YuvCoeffs, YuvMatrix, YuvRange, CHROMA_FRAC};

fn check_len(what: &str, got: usize, want: usize) -> Result<(), String> {
    if got < want {
        return Err(format!(
            "{what} frame is {got} bytes, expected at least {want}"
        ));
    }
    Ok(())
}

/// Packed YUYV 4:2:2 (Y0 U Y1 V per pixel pair; `stride` bytes per row) → RGB8 into `out`.
pub fn yuyv_to_rgb(
    src: &[u8],
    width: usize,
    height: usize,
    stride: usize,
    k: &YuvCoeffs,
    out: &mut [u8],
) -> Result<(), String> {
    if !width.is_multiple_of(2) || stride < width * 2 {
        return Err(format!(
            "YUYV needs an even width and stride >= 2*width (width {width}, stride {stride})"
        ));
    }
    check_len(
        "YUYV",
        src.len(),
        stride * height.saturating_sub(1) + width * 2,
    )?;
    check_len("RGB output", out.len(), width * height * 3)?;
    for row in 0..height {
        let s = &src[row * stride..row * stride + width * 2];
        let o = &mut out[row * width * 3..(row + 1) * width * 3];
        for (px, op) in s.chunks_exact(4).zip(o.chunks_exact_mut(6)) {
            let (y0, u, y1, v) = (px[0], px[1], px[2], px[3]);
            op[..3].copy_from_slice(&k.pixel(y0, u, v));
            op[3..].copy_from_slice(&k.pixel(y1, u, v));
        }
    }
    Ok(())
}

/// How NV12's half-height chroma rows are brought to full height. Horizontally both YUYV and NV12
/// replicate each chroma sample over its two pixels, as ffmpeg's swscale does by default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ChromaUpsampling {
    /// Vertical 4-tap cubic (swscale's default bicubic: Keys a = -0.6) with centre siting, the
    /// result rounded to 8 bits: ffmpeg's own conversion of the same NV12 frames.
    #[default]
    Cubic,
    /// Each chroma row used for its two luma rows (the fastest).
    Nearest,
}

/// NV12 vertical cubic weights (sum 4096, Keys a = -0.6) of chroma rows `i-2..=i+1` for
/// the even luma row `2i` (sited at `i - 0.25`); the odd row `2i+1` (at `i + 0.25`) uses them
/// mirrored on rows `i-1..=i+2`. The engine owns the table (its GPU kernels use the same one).
pub use vigil_engine::vision::yuv::NV12_CUBIC_EVEN as CUBIC_EVEN;

/// Fills `row` (interleaved UV, `width` 8-bit values shifted up by [`CHROMA_FRAC`]) with the
/// chroma for luma row `y` of an NV12 frame.
fn nv12_chroma_row(
    uv: &[u8],
    stride: usize,
    width: usize,
    height: usize,
    y: usize,
    row: &mut [i32],
) {
    let ch = height / 2;
    let i = (y / 2) as isize;
    let taps: [isize; 4] = if y.is_multiple_of(2) {
        [i - 2, i - 1, i, i + 1]
    } else {
        [i - 1, i, i + 1, i + 2]
    };
    let w: [i32; 4] = if y.is_multiple_of(2) {
        CUBIC_EVEN
    } else {
        [CUBIC_EVEN[3], CUBIC_EVEN[2], CUBIC_EVEN[1], CUBIC_EVEN[0]]
    };
    let r = |t: isize| {
        let t = t.clamp(0, ch as isize - 1) as usize;
        &uv[t * stride..t * stride + width]
    };
    let (r0, r1, r2, r3) = (r(taps[0]), r(taps[1]), r(taps[2]), r(taps[3]));
    for (x, o) in row[..width].iter_mut().enumerate() {
        let v = w[0] * i32::from(r0[x])
            + w[1] * i32::from(r1[x])
            + w[2] * i32::from(r2[x])
            + w[3] * i32::from(r3[x]);
        // Rounded to 8 bits after the vertical filter, as swscale's vertical scaler does.
        *o = ((v + 2048) >> 12).clamp(0, 255) << CHROMA_FRAC;
    }
}

/// NV12 4:2:0 (a Y plane, then an interleaved UV plane at half resolution; both with `stride`
/// bytes per row) → RGB8 into `out`, with cubic vertical chroma interpolation.
pub fn nv12_to_rgb(
    src: &[u8],
    width: usize,
    height: usize,
    stride: usize,
    k: &YuvCoeffs,
    out: &mut [u8],
) -> Result<(), String> {
    nv12_to_rgb_with(src, width, height, stride, k, ChromaUpsampling::Cubic, out)
}

/// NV12 → RGB8 as [`nv12_to_rgb`], with the chroma upsampling chosen.
pub fn nv12_to_rgb_with(
    src: &[u8],
    width: usize,
    height: usize,
    stride: usize,
    k: &YuvCoeffs,
    up: ChromaUpsampling,
    out: &mut [u8],
) -> Result<(), String> {
    if !width.is_multiple_of(2) || !height.is_multiple_of(2) || height == 0 || stride < width {
        return Err(format!(
            "NV12 needs even, non-zero dimensions and stride >= width ({width}x{height}, stride {stride})"
        ));
    }
    let uv_base = stride * height;
    check_len(
        "NV12",
        src.len(),
        uv_base + stride * (height / 2 - 1) + width,
    )?;
    check_len("RGB output", out.len(), width * height * 3)?;
    let uv_plane = &src[uv_base..];
    let mut interp = if up == ChromaUpsampling::Cubic {
        vec![0i32; width]
    } else {
        Vec::new()
    };
    for row in 0..height {
        let ys = &src[row * stride..row * stride + width];
        let o = &mut out[row * width * 3..(row + 1) * width * 3];
        match up {
            ChromaUpsampling::Nearest => {
                let uv = &uv_plane[(row / 2) * stride..(row / 2) * stride + width];
                for ((yp, c), op) in ys
                    .chunks_exact(2)
                    .zip(uv.chunks_exact(2))
                    .zip(o.chunks_exact_mut(6))
                {
                    op[..3].copy_from_slice(&k.pixel(yp[0], c[0], c[1]));
                    op[3..].copy_from_slice(&k.pixel(yp[1], c[0], c[1]));
                }
            }
            ChromaUpsampling::Cubic => {
                nv12_chroma_row(uv_plane, stride, width, height, row, &mut interp);
                for ((yp, c), op) in ys
                    .chunks_exact(2)
                    .zip(interp.chunks_exact(2))
                    .zip(o.chunks_exact_mut(6))
                {
                    op[..3].copy_from_slice(&k.pixel_hp(yp[0], c[0], c[1]));
                    op[3..].copy_from_slice(&k.pixel_hp(yp[1], c[0], c[1]));
                }
            }
        }
    }
    Ok(())
}

/// Turns raw frames of any supported format into RGB images, reusing its buffers.
pub struct Converter {
    coeffs: YuvCoeffs,
    chroma: ChromaUpsampling,
    max_pixels: u64,
    spare: Vec<u8>,
}

impl Converter {
    /// A converter with the YUV matrix/range and a pixel limit for decoded JPEGs.
    pub fn new(matrix: YuvMatrix, range: YuvRange, max_pixels: u64) -> Converter {
        Converter {
            coeffs: YuvCoeffs::new(matrix, range),
            chroma: ChromaUpsampling::default(),
            max_pixels,
            spare: Vec::new(),
        }
    }

    /// Chooses NV12's vertical chroma upsampling (default [`ChromaUpsampling::Cubic`]).
    pub fn with_chroma(mut self, chroma: ChromaUpsampling) -> Converter {
        self.chroma = chroma;
        self
    }

    /// A YUYV/NV12 frame as the engine's GPU conversion takes it, with this converter's
    /// coefficients and chroma upsampling; `Ok(None)` for other formats (MJPEG, RGB24), an error
    /// for frames outside the pixel limit. The GPU result equals [`Converter::to_rgb`]'s.
    pub fn gpu_frame<'a>(
        &self,
        f: &'a RawFrame,
    ) -> Result<Option<(YuvFrame<'a>, YuvCoeffs)>, String> {
        let layout = match f.format {
            PixelFormat::Yuyv => YuvLayout::Yuyv,
            PixelFormat::Nv12 => YuvLayout::Nv12 {
                cubic: self.chroma == ChromaUpsampling::Cubic,
            },
            PixelFormat::Mjpeg | PixelFormat::Rgb24 => return Ok(None),
        };
        let pixels = u64::from(f.width) * u64::from(f.height);
        if pixels == 0 || pixels > self.max_pixels {
            return Err(format!(
                "frame size {}x{} is out of range",
                f.width, f.height
            ));
        }
        let frame = YuvFrame {
            layout,
            data: &f.data,
            width: f.width as usize,
            height: f.height as usize,
            stride: f.stride,
        };
        Ok(Some((frame, self.coeffs)))
    }

    /// Hands a finished image's buffer back for reuse by the next conversion.
    pub fn recycle(&mut self, img: RgbImage) {
        self.spare = img.into_raw();
    }

    fn take_buffer(&mut self, len: usize) -> Vec<u8> {
        let mut buf = std::mem::take(&mut self.spare);
        buf.resize(len, 0);
        buf
    }

    /// Converts a frame to RGB8; errors describe corrupt or inconsistent frames.
    pub fn to_rgb(&mut self, f: &RawFrame) -> Result<RgbImage, String> {
        let (w, h) = (f.width as usize, f.height as usize);
        let pixels = u64::from(f.width) * u64::from(f.height);
        if f.format != PixelFormat::Mjpeg && (pixels == 0 || pixels > self.max_pixels) {
            return Err(format!("frame size {w}x{h} is out of range"));
        }
        let mut buf;
        let (ow, oh) = match f.format {
            PixelFormat::Mjpeg => {
                let (dw, dh, b) = self.decode_jpeg(&f.data)?;
                buf = b;
                (dw, dh)
            }
            PixelFormat::Yuyv => {
                buf = self.take_buffer(w * h * 3);
                let stride = if f.stride == 0 { w * 2 } else { f.stride };
                yuyv_to_rgb(&f.data, w, h, stride, &self.coeffs, &mut buf)?;
                (w, h)
            }
            PixelFormat::Nv12 => {
                buf = self.take_buffer(w * h * 3);
                let stride = if f.stride == 0 { w } else { f.stride };
                nv12_to_rgb_with(&f.data, w, h, stride, &self.coeffs, self.chroma, &mut buf)?;
                (w, h)
            }
            PixelFormat::Rgb24 => {
                check_len("RGB24", f.data.len(), w * h * 3)?;
                buf = self.take_buffer(w * h * 3);
                buf.copy_from_slice(&f.data[..w * h * 3]);
                (w, h)
            }
        };
        RgbImage::from_raw(ow as u32, oh as u32, buf)
            .ok_or_else(|| "converted buffer has the wrong size".to_string())
    }

    fn decode_jpeg(&mut self, data: &[u8]) -> Result<(usize, usize, Vec<u8>), String> {
        // Same decoder and options as the `image` crate (what `vigil infer` uses), so pixels match.
        let opts = DecoderOptions::default()
            .set_strict_mode(false)
            .set_max_width(16384)
            .set_max_height(16384)
            .jpeg_set_out_colorspace(ColorSpace::RGB);
        let mut dec = zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(data), opts);
        dec.decode_headers()
            .map_err(|e| format!("corrupt JPEG frame: {e:?}"))?;
        let (w, h) = dec
            .dimensions()
            .ok_or_else(|| "JPEG frame has no dimensions".to_string())?;
        if w == 0 || h == 0 || (w as u64) * (h as u64) > self.max_pixels {
            return Err(format!("JPEG frame size {w}x{h} is out of range"));
        }
        let mut buf = self.take_buffer(w * h * 3);
        let decoded =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| dec.decode_into(&mut buf)));
        match decoded {
            Ok(Ok(())) => Ok((w, h, buf)),
            Ok(Err(e)) => Err(format!("corrupt JPEG frame: {e:?}")),
            Err(_) => Err("the JPEG decoder failed on malformed data".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Straight floating-point reference of the same formulas.
    fn reference(y: u8, u: u8, v: u8, m: YuvMatrix, r: YuvRange) -> [f64; 3] {
        let (kr, kb) = match m {
            YuvMatrix::Bt601 => (0.299, 0.114),
            YuvMatrix::Bt709 => (0.2126, 0.0722),
        };
        let (yf, uf, vf) = match r {
            YuvRange::Limited => (
                (f64::from(y) - 16.0) / 219.0,
                (f64::from(u) - 128.0) / 224.0,
                (f64::from(v) - 128.0) / 224.0,
            ),
            YuvRange::Full => (
                f64::from(y) / 255.0,
                (f64::from(u) - 128.0) / 255.0,
                (f64::from(v) - 128.0) / 255.0,
            ),
        };
        let rr = yf + 2.0 * (1.0 - kr) * vf;
        let bb = yf + 2.0 * (1.0 - kb) * uf;
        let gg = (yf - kr * rr - kb * bb) / (1.0 - kr - kb);
        [rr, gg, bb].map(|c| (c * 255.0).clamp(0.0, 255.0))
    }

    #[test]
    fn fixed_point_matches_float_reference_everywhere() {
        for m in [YuvMatrix::Bt601, YuvMatrix::Bt709] {
            for r in [YuvRange::Limited, YuvRange::Full] {
                let k = YuvCoeffs::new(m, r);
                let mut worst = 0.0f64;
                for y in (0..=255u8).step_by(3) {
                    for u in (0..=255u8).step_by(5) {
                        for v in (0..=255u8).step_by(5) {
                            let got = k.pixel(y, u, v);
                            let want = reference(y, u, v, m, r);
                            for c in 0..3 {
                                worst = worst.max((f64::from(got[c]) - want[c]).abs());
                            }
                        }
                    }
                }
                // Truncating: at most 1 below the float value, plus coefficient rounding.
                assert!(worst <= 1.05, "{m:?} {r:?}: worst error {worst}");
            }
        }
        // Known anchors: limited-range white and black, full-range grey.
        let k = YuvCoeffs::new(YuvMatrix::Bt601, YuvRange::Limited);
        assert_eq!(k.pixel(235, 128, 128), [255, 255, 255]);
        assert_eq!(k.pixel(16, 128, 128), [0, 0, 0]);
        let k = YuvCoeffs::new(YuvMatrix::Bt709, YuvRange::Full);
        assert_eq!(k.pixel(100, 128, 128), [100, 100, 100]);
    }

    #[test]
    fn bad_sizes_are_errors() {
        let k = YuvCoeffs::new(YuvMatrix::Bt601, YuvRange::Limited);
        let mut out = vec![0u8; 4 * 2 * 3];
        assert!(yuyv_to_rgb(&[0; 10], 4, 2, 8, &k, &mut out).is_err());
        assert!(yuyv_to_rgb(&[0; 16], 3, 2, 8, &k, &mut out).is_err());
        assert!(nv12_to_rgb(&[0; 11], 4, 2, 4, &k, &mut out).is_err());
        assert!(nv12_to_rgb(&[0; 12], 4, 2, 4, &k, &mut out).is_ok());
        let mut c = Converter::new(YuvMatrix::Bt601, YuvRange::Limited, 1 << 20);
        let f = RawFrame::new(PixelFormat::Mjpeg, 4, 4, vec![0xFF, 0xD8, 0x00]);
        assert!(c.to_rgb(&f).is_err());
    }

    #[test]
    fn gpu_frame_hands_over_yuv_frames_with_the_converter_coefficients() {
        let c = Converter::new(YuvMatrix::Bt709, YuvRange::Full, 1 << 20);
        let k = YuvCoeffs::new(YuvMatrix::Bt709, YuvRange::Full);
        let f = RawFrame::new(PixelFormat::Yuyv, 4, 2, vec![7; 16]);
        let (frame, gk) = c.gpu_frame(&f).unwrap().unwrap();
        assert_eq!(frame.layout, YuvLayout::Yuyv);
        assert_eq!((frame.width, frame.height, frame.data.len()), (4, 2, 16));
        assert_eq!(
            [gk.y_offset, gk.y_mul, gk.rv, gk.gu, gk.gv, gk.bu],
            [k.y_offset, k.y_mul, k.rv, k.gu, k.gv, k.bu]
        );
        let f = RawFrame::new(PixelFormat::Nv12, 4, 2, vec![7; 12]);
        let (frame, _) = c.gpu_frame(&f).unwrap().unwrap();
        assert_eq!(frame.layout, YuvLayout::Nv12 { cubic: true });
        let near = Converter::new(YuvMatrix::Bt601, YuvRange::Limited, 1 << 20)
            .with_chroma(ChromaUpsampling::Nearest);
        let (frame, _) = near.gpu_frame(&f).unwrap().unwrap();
        assert_eq!(frame.layout, YuvLayout::Nv12 { cubic: false });
        let f = RawFrame::new(PixelFormat::Mjpeg, 4, 2, vec![0xFF, 0xD8]);
        assert!(c.gpu_frame(&f).unwrap().is_none());
        let f = RawFrame::new(PixelFormat::Yuyv, 4096, 4096, Vec::new());
        assert!(c.gpu_frame(&f).is_err());
    }
}
