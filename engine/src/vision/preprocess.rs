//! RGB image → normalized NCHW f32 tensor, plus the [`ImageTransform`] back to image pixels.
//!
//! Resizing is a bit-exact port of Pillow's `Image.resize(..., BILINEAR)` (Resample.c): a
//! separable triangle filter whose support widens with the downscale factor (so downscaling is
//! antialiased / area-aware), 22-bit fixed-point weights, horizontal pass first with a rounded
//! 8-bit intermediate, then the vertical pass. This is what torchvision's `Resize` does on PIL
//! images, so preprocessing matches the usual Python reference pipelines exactly.

use image::RgbImage;
use rayon::prelude::*;

use super::{BBox, ImageTransform, Preprocess, ResizeMode};
use crate::error::{Error, Result};
use crate::ir::Tensor;

/// Pillow's fixed-point precision for 8-bit resampling (`32 - 8 - 2`).
pub(crate) const PRECISION_BITS: u32 = 22;

/// Filter weights for one axis: for each output index, the first source index, the number of
/// taps, and `ksize` fixed-point weights (unused taps are zero).
pub(crate) struct Coeffs {
    pub(crate) bounds: Vec<(usize, usize)>,
    pub(crate) weights: Vec<i32>,
    pub(crate) ksize: usize,
}

/// Pillow's `precompute_coeffs` for the bilinear (triangle) filter, restricted to output indices
/// `first..first + count` of a full `in_size → out_size` resize (used to resize-and-crop in one go).
pub(crate) fn precompute_coeffs(
    in_size: usize,
    out_size: usize,
    first: usize,
    count: usize,
) -> Coeffs {
    let scale = in_size as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = filterscale; // bilinear support is 1.0
    let ksize = (support.ceil() as usize) * 2 + 1;
    let mut bounds = Vec::with_capacity(count);
    let mut weights = vec![0i32; count * ksize];
    let mut tmp = vec![0f64; ksize];
    for (row, xx) in (first..first + count).enumerate() {
        let center = (xx as f64 + 0.5) * scale;
        let ss = 1.0 / filterscale;
        // C's (int) cast truncates toward zero; then clamp into the image.
        let xmin = ((center - support + 0.5).trunc().max(0.0)) as usize;
        let xmax = ((center + support + 0.5).trunc() as usize).min(in_size);
        let n = xmax.saturating_sub(xmin).min(ksize);
        let mut total = 0.0;
        for (x, t) in tmp.iter_mut().enumerate().take(n) {
            let d = ((x + xmin) as f64 - center + 0.5) * ss;
            let w = (1.0 - d.abs()).max(0.0);
            *t = w;
            total += w;
        }
        let k = &mut weights[row * ksize..row * ksize + ksize];
        for x in 0..n {
            let w = if total != 0.0 { tmp[x] / total } else { 0.0 };
            // normalize_coeffs_8bpc: round half away from zero.
            let f = w * f64::from(1u32 << PRECISION_BITS);
            k[x] = if f < 0.0 {
                (f - 0.5).trunc() as i32
            } else {
                (f + 0.5).trunc() as i32
            };
        }
        bounds.push((xmin, n));
    }
    Coeffs {
        bounds,
        weights,
        ksize,
    }
}

#[inline]
fn clip8(acc: i32) -> u8 {
    (acc >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Resizes `img` (w x h) to `out_w x out_h` with Pillow-exact bilinear filtering and returns the
/// window `x0..x0+win_w, y0..y0+win_h` of the result as packed RGB8.
fn resize_window(
    img: &RgbImage,
    out_w: usize,
    out_h: usize,
    (x0, y0, win_w, win_h): (usize, usize, usize, usize),
) -> Vec<u8> {
    let (in_w, in_h) = (img.width() as usize, img.height() as usize);
    let src = img.as_raw();
    let half = 1i32 << (PRECISION_BITS - 1);

    // Vertical coefficients tell which source rows the horizontal pass must produce.
    let vert = (out_h != in_h).then(|| precompute_coeffs(in_h, out_h, y0, win_h));
    let (row_first, row_last) = match &vert {
        Some(v) => {
            let first = v.bounds.iter().map(|b| b.0).min().unwrap_or(0);
            let last = v.bounds.iter().map(|b| b.0 + b.1).max().unwrap_or(0);
            (first, last)
        }
        None => (y0, y0 + win_h),
    };
    let rows = row_last.saturating_sub(row_first);

    // Horizontal pass: rows row_first..row_last of the source → win_w columns.
    let mut tmp = vec![0u8; rows * win_w * 3];
    if out_w != in_w {
        let hc = precompute_coeffs(in_w, out_w, x0, win_w);
        tmp.par_chunks_mut(win_w * 3)
            .enumerate()
            .for_each(|(r, out_row)| {
                let src_row = &src[(row_first + r) * in_w * 3..(row_first + r + 1) * in_w * 3];
                for (xx, px) in out_row.chunks_exact_mut(3).enumerate() {
                    let (xmin, n) = hc.bounds[xx];
                    let k = &hc.weights[xx * hc.ksize..xx * hc.ksize + n];
                    let taps = &src_row[xmin * 3..(xmin + n) * 3];
                    let (mut a0, mut a1, mut a2) = (half, half, half);
                    for (&w, p) in k.iter().zip(taps.chunks_exact(3)) {
                        a0 += i32::from(p[0]) * w;
                        a1 += i32::from(p[1]) * w;
                        a2 += i32::from(p[2]) * w;
                    }
                    px[0] = clip8(a0);
                    px[1] = clip8(a1);
                    px[2] = clip8(a2);
                }
            });
    } else {
        for r in 0..rows {
            let s = (row_first + r) * in_w * 3 + x0 * 3;
            tmp[r * win_w * 3..(r + 1) * win_w * 3].copy_from_slice(&src[s..s + win_w * 3]);
        }
    }

    // Vertical pass over the intermediate rows.
    let Some(vc) = vert else {
        return tmp;
    };
    let stride = win_w * 3;
    let mut out = vec![0u8; win_h * stride];
    out.par_chunks_mut(stride).enumerate().for_each_init(
        || vec![0i32; stride],
        |acc, (yy, out_row)| {
            let (ymin, n) = vc.bounds[yy];
            let k = &vc.weights[yy * vc.ksize..yy * vc.ksize + n];
            let base = ymin - row_first;
            acc.fill(half);
            // Tap-major so each intermediate row is read contiguously (vectorizes).
            for (i, &w) in k.iter().enumerate() {
                let row = &tmp[(base + i) * stride..(base + i + 1) * stride];
                for (a, &v) in acc.iter_mut().zip(row) {
                    *a += i32::from(v) * w;
                }
            }
            for (o, &a) in out_row.iter_mut().zip(acc.iter()) {
                *o = clip8(a);
            }
        },
    );
    out
}

/// Resizes a whole image to `out_w x out_h` with Pillow-exact bilinear filtering.
pub fn resize_bilinear(img: &RgbImage, out_w: u32, out_h: u32) -> Result<RgbImage> {
    if img.width() == 0 || img.height() == 0 || out_w == 0 || out_h == 0 {
        return Err(Error::Image(format!(
            "cannot resize {}x{} to {out_w}x{out_h}: zero size",
            img.width(),
            img.height()
        )));
    }
    let (w, h) = (out_w as usize, out_h as usize);
    let data = resize_window(img, w, h, (0, 0, w, h));
    RgbImage::from_raw(out_w, out_h, data)
        .ok_or_else(|| Error::Image("resize produced a buffer of the wrong size".into()))
}

impl ImageTransform {
    /// Maps a point in model-input pixels to original-image pixels (unclamped):
    /// `orig = (input - offset) * scale`, per axis.
    pub fn to_original(&self, x: f32, y: f32) -> (f32, f32) {
        (
            (x - self.offset_x) * self.scale_x,
            (y - self.offset_y) * self.scale_y,
        )
    }

    /// Maps a point in original-image pixels to model-input pixels: `input = orig / scale + offset`.
    pub fn to_input(&self, x: f32, y: f32) -> (f32, f32) {
        (
            x / self.scale_x + self.offset_x,
            y / self.scale_y + self.offset_y,
        )
    }

    /// Maps a box in model-input pixels to original-image pixels, clamped to the image bounds.
    pub fn box_to_original(&self, b: &BBox) -> BBox {
        let (x1, y1) = self.to_original(b.x1, b.y1);
        let (x2, y2) = self.to_original(b.x2, b.y2);
        let (w, h) = (self.orig_width as f32, self.orig_height as f32);
        BBox {
            x1: x1.min(x2).clamp(0.0, w),
            y1: y1.min(y2).clamp(0.0, h),
            x2: x2.max(x1).clamp(0.0, w),
            y2: y2.max(y1).clamp(0.0, h),
        }
    }
}

/// Where the resized image lands inside the model input.
pub(crate) struct Placement {
    /// Full resized size.
    pub(crate) resized_w: usize,
    pub(crate) resized_h: usize,
    /// Window of the resized image that is used (crop), as (x0, y0, w, h).
    pub(crate) window: (usize, usize, usize, usize),
    /// Top-left of the window inside the model input (letterbox padding).
    pub(crate) dst_x: usize,
    pub(crate) dst_y: usize,
}

pub(crate) fn placement(w: usize, h: usize, p: &Preprocess) -> Result<(Placement, ImageTransform)> {
    let (tw, th) = (p.width as usize, p.height as usize);
    let (orig_width, orig_height) = (w as u32, h as u32);
    Ok(match p.resize {
        ResizeMode::Stretch => (
            Placement {
                resized_w: tw,
                resized_h: th,
                window: (0, 0, tw, th),
                dst_x: 0,
                dst_y: 0,
            },
            ImageTransform {
                scale_x: w as f32 / tw as f32,
                scale_y: h as f32 / th as f32,
                offset_x: 0.0,
                offset_y: 0.0,
                orig_width,
                orig_height,
            },
        ),
        ResizeMode::Letterbox { .. } => {
            let s = (tw as f64 / w as f64).min(th as f64 / h as f64);
            let nw = ((w as f64 * s).round() as usize).clamp(1, tw);
            let nh = ((h as f64 * s).round() as usize).clamp(1, th);
            let (dx, dy) = ((tw - nw) / 2, (th - nh) / 2);
            (
                Placement {
                    resized_w: nw,
                    resized_h: nh,
                    window: (0, 0, nw, nh),
                    dst_x: dx,
                    dst_y: dy,
                },
                ImageTransform {
                    scale_x: w as f32 / nw as f32,
                    scale_y: h as f32 / nh as f32,
                    offset_x: dx as f32,
                    offset_y: dy as f32,
                    orig_width,
                    orig_height,
                },
            )
        }
        ResizeMode::ShortSideCenterCrop { short_side } => {
            let s = short_side as usize;
            if s < tw || s < th {
                return Err(Error::BadInput(format!(
                    "short_side {s} is smaller than the {tw}x{th} centre crop"
                )));
            }
            // torchvision Resize(int): short side = s, long side = int(s * long / short).
            let (rw, rh) = if w <= h {
                (s, (s as u64 * h as u64 / w as u64) as usize)
            } else {
                ((s as u64 * w as u64 / h as u64) as usize, s)
            };
            // torchvision CenterCrop: int(round((size - crop) / 2)) with Python's round-half-even.
            let cx = ((rw - tw) as f64 / 2.0).round_ties_even() as usize;
            let cy = ((rh - th) as f64 / 2.0).round_ties_even() as usize;
            (
                Placement {
                    resized_w: rw,
                    resized_h: rh,
                    window: (cx, cy, tw, th),
                    dst_x: 0,
                    dst_y: 0,
                },
                ImageTransform {
                    scale_x: w as f32 / rw as f32,
                    scale_y: h as f32 / rh as f32,
                    offset_x: -(cx as f32),
                    offset_y: -(cy as f32),
                    orig_width,
                    orig_height,
                },
            )
        }
    })
}

/// Turns an RGB image into a [1, 3, H, W] f32 tensor and the transform back to image pixels.
///
/// Value of tensor channel `c` = `(pixel * scale - mean[c]) / std[c]`, where the pixel channel is
/// R,G,B (or B,G,R when `bgr`): `mean`/`std` are in the tensor's channel order.
pub fn preprocess(img: &RgbImage, p: &Preprocess) -> Result<(Tensor, ImageTransform)> {
    let (w, h) = (img.width() as usize, img.height() as usize);
    if w == 0 || h == 0 {
        return Err(Error::Image(format!(
            "cannot preprocess an empty {w}x{h} image"
        )));
    }
    if p.width == 0 || p.height == 0 {
        return Err(Error::BadInput(format!(
            "model input size {}x{} is empty",
            p.width, p.height
        )));
    }
    if p.std.iter().any(|&s| s == 0.0 || !s.is_finite()) {
        return Err(Error::BadInput(format!(
            "preprocess std {:?} must be finite and non-zero",
            p.std
        )));
    }
    let (pl, transform) = placement(w, h, p)?;
    let pixels = resize_window(img, pl.resized_w, pl.resized_h, pl.window);

    // Per-channel lookup table: u8 → normalized value, in tensor channel order.
    let mut lut = [[0f32; 256]; 3];
    for (c, table) in lut.iter_mut().enumerate() {
        for (v, out) in table.iter_mut().enumerate() {
            *out = (v as f32 * p.scale - p.mean[c]) / p.std[c];
        }
    }
    let src_channel = |c: usize| if p.bgr { 2 - c } else { c };

    let (tw, th) = (p.width as usize, p.height as usize);
    let plane = tw * th;
    let mut data = vec![0f32; 3 * plane];
    let pad = match p.resize {
        ResizeMode::Letterbox { pad_value } => pad_value,
        _ => 0,
    };
    let (win_w, win_h) = (pl.window.2, pl.window.3);
    for (c, out_plane) in data.chunks_exact_mut(plane).enumerate() {
        let table = &lut[c];
        let sc = src_channel(c);
        if win_w != tw || win_h != th {
            out_plane.fill(table[usize::from(pad)]);
        }
        for y in 0..win_h {
            let dst = &mut out_plane[(pl.dst_y + y) * tw + pl.dst_x..][..win_w];
            let src = &pixels[y * win_w * 3..(y + 1) * win_w * 3];
            for (d, px) in dst.iter_mut().zip(src.chunks_exact(3)) {
                *d = table[usize::from(px[sc])];
            }
        }
    }
    let tensor = Tensor::from_f32(vec![1, 3, th, tw], data)?;
    Ok((tensor, transform))
}
