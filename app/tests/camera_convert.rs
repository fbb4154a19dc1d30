//! YUYV and NV12 → RGB against ffmpeg's BT.601 limited-range RGB24 of the same frames
//! (../shared/camera/vtest-640x480.{yuyv,nv12,rgb24}, 8 frames each), and every matrix/range
//! combination against an independent floating-point reference.
//!
//! Why the ffmpeg files cannot be met within ±2 everywhere (measured with NumPy): the three files were made separately from the 768x576 original by swscale
//! (scale + convert in one step), so the RGB24 was computed from higher-precision, unclipped
//! intermediates. (1) YUYV: every pixel off by more than 4 has luma clipped to 0 or 255 in the file
//! (the reference kept the overshoot); identical (Y, U, V) triples map to reference values up to 4
//! apart, and even the best-fitting affine map leaves thousands of pixels at 3. (2) NV12: its 240
//! chroma rows lost vertical detail the reference has (from 288 source rows); even a least-squares
//! optimal 4-tap vertical filter fitted to the reference leaves a worst pixel of 23. The tests
//! therefore pin the measured bounds of this implementation, so a regression fails.

use std::path::PathBuf;

use vigil::camera::convert::{ChromaUpsampling, Converter, YuvMatrix, YuvRange};
use vigil::camera::source::{PixelFormat, RawFrame};

const W: usize = 640;
const H: usize = 480;

fn shared(rel: &str) -> Vec<u8> {
    let base = std::env::var_os("VIGIL_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"));
    let p = base.join(rel);
    std::fs::read(&p).unwrap_or_else(|e| {
        panic!(
            "shared test data {} is missing ({e}); expected ../shared beside the repository",
            p.display()
        )
    })
}

/// Error statistics of one format against the ffmpeg RGB24.
struct Stats {
    worst: i32,
    /// Worst error over pixels whose luma sample is neither 0 nor 255.
    worst_unclipped: i32,
    /// Pixels with some channel off by 5 or more.
    over4: usize,
    mean: f64,
}

fn compare(format: PixelFormat, file: &str, chroma: ChromaUpsampling) -> Stats {
    let frame_bytes = match format {
        PixelFormat::Yuyv => W * H * 2,
        _ => W * H * 3 / 2,
    };
    let src = shared(file);
    let rgb = shared("camera/vtest-640x480.rgb24");
    assert_eq!(src.len(), frame_bytes * 8, "{file} should hold 8 frames");
    assert_eq!(rgb.len(), W * H * 3 * 8);
    let mut conv = Converter::new(YuvMatrix::Bt601, YuvRange::Limited, 1 << 24).with_chroma(chroma);
    let mut s = Stats {
        worst: 0,
        worst_unclipped: 0,
        over4: 0,
        mean: 0.0,
    };
    let mut sum = 0u64;
    for i in 0..8 {
        let data = &src[i * frame_bytes..(i + 1) * frame_bytes];
        let f = RawFrame::new(format, W as u32, H as u32, data.to_vec());
        let img = conv.to_rgb(&f).unwrap();
        let want = &rgb[i * W * H * 3..(i + 1) * W * H * 3];
        for (p, (a, b)) in img
            .as_raw()
            .chunks_exact(3)
            .zip(want.chunks_exact(3))
            .enumerate()
        {
            let luma = match format {
                PixelFormat::Yuyv => data[p * 2],
                _ => data[p],
            };
            let d = (0..3)
                .map(|c| {
                    let d = (i32::from(a[c]) - i32::from(b[c])).abs();
                    sum += d as u64;
                    d
                })
                .max()
                .unwrap_or(0);
            s.worst = s.worst.max(d);
            if luma != 0 && luma != 255 {
                s.worst_unclipped = s.worst_unclipped.max(d);
            }
            if d >= 5 {
                s.over4 += 1;
            }
        }
        conv.recycle(img);
    }
    s.mean = sum as f64 / (W * H * 3 * 8) as f64;
    println!(
        "{format:?} {chroma:?}: worst {}, worst where luma is not clipped {}, pixels off by >= 5: {}, mean {:.3}",
        s.worst, s.worst_unclipped, s.over4, s.mean
    );
    s
}

#[test]
fn yuyv_matches_ffmpeg_within_its_measured_bounds() {
    let s = compare(
        PixelFormat::Yuyv,
        "camera/vtest-640x480.yuyv",
        ChromaUpsampling::Cubic,
    );
    // Errors above 4 occur only where the file's luma is clipped (see the module comment).
    assert!(
        s.worst_unclipped <= 4,
        "worst unclipped {}",
        s.worst_unclipped
    );
    assert!(s.worst <= 11, "worst {}", s.worst);
    assert!(s.mean <= 1.25, "mean {}", s.mean);
}

#[test]
fn nv12_matches_ffmpeg_within_its_measured_bounds_and_beats_nearest() {
    let file = "camera/vtest-640x480.nv12";
    let cubic = compare(PixelFormat::Nv12, file, ChromaUpsampling::Cubic);
    let nearest = compare(PixelFormat::Nv12, file, ChromaUpsampling::Nearest);
    assert!(cubic.worst <= 25, "worst {}", cubic.worst);
    assert!(cubic.mean <= 1.52, "mean {}", cubic.mean);
    assert!(cubic.worst < nearest.worst);
    assert!(
        cubic.over4 * 3 < nearest.over4,
        "{} vs {}",
        cubic.over4,
        nearest.over4
    );
    assert!(cubic.mean < nearest.mean);
}

/// Independent float conversion of one pixel (Kr/Kb definition of the matrices).
fn reference_pixel(y: f64, u: f64, v: f64, m: YuvMatrix, r: YuvRange) -> [f64; 3] {
    let (kr, kb) = match m {
        YuvMatrix::Bt601 => (0.299, 0.114),
        YuvMatrix::Bt709 => (0.2126, 0.0722),
    };
    let (yf, uf, vf) = match r {
        YuvRange::Limited => ((y - 16.0) / 219.0, (u - 128.0) / 224.0, (v - 128.0) / 224.0),
        YuvRange::Full => (y / 255.0, (u - 128.0) / 255.0, (v - 128.0) / 255.0),
    };
    let rr = yf + 2.0 * (1.0 - kr) * vf;
    let bb = yf + 2.0 * (1.0 - kb) * uf;
    let gg = (yf - kr * rr - kb * bb) / (1.0 - kr - kb);
    [rr, gg, bb].map(|c| (c * 255.0).clamp(0.0, 255.0))
}

/// Keys cubic kernel, a = -0.75.
fn keys(x: f64) -> f64 {
    let (a, x) = (-0.75, x.abs());
    if x < 1.0 {
        (a + 2.0) * x * x * x - (a + 3.0) * x * x + 1.0
    } else if x < 2.0 {
        a * x * x * x - 5.0 * a * x * x + 8.0 * a * x - 4.0 * a
    } else {
        0.0
    }
}

struct Lcg(u64);
impl Lcg {
    fn byte(&mut self) -> u8 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 56) as u8
    }
}

#[test]
fn all_matrices_and_ranges_match_a_float_reference() {
    let (w, h) = (64usize, 48usize);
    let mut rng = Lcg(7);
    // Smooth-ish content plus noise so interpolation matters but stays in range.
    let mut yuyv = vec![0u8; w * h * 2];
    for b in yuyv.iter_mut() {
        *b = rng.byte();
    }
    let mut nv12 = vec![0u8; w * h * 3 / 2];
    for b in nv12.iter_mut() {
        *b = rng.byte();
    }
    for m in [YuvMatrix::Bt601, YuvMatrix::Bt709] {
        for r in [YuvRange::Limited, YuvRange::Full] {
            let mut conv = Converter::new(m, r, 1 << 20);
            // YUYV: chroma of the pixel pair, replicated.
            let img = conv
                .to_rgb(&RawFrame::new(
                    PixelFormat::Yuyv,
                    w as u32,
                    h as u32,
                    yuyv.clone(),
                ))
                .unwrap();
            let mut worst = 0.0f64;
            for y in 0..h {
                for x in 0..w {
                    let s = &yuyv[y * w * 2 + (x / 2) * 4..];
                    let want = reference_pixel(
                        f64::from(yuyv[y * w * 2 + x * 2]),
                        f64::from(s[1]),
                        f64::from(s[3]),
                        m,
                        r,
                    );
                    let got = img.get_pixel(x as u32, y as u32).0;
                    for c in 0..3 {
                        worst = worst.max((f64::from(got[c]) - want[c]).abs());
                    }
                }
            }
            assert!(worst <= 1.0, "YUYV {m:?} {r:?}: worst {worst}");
            // NV12: chroma interpolated vertically (rows sited at i -/+ 0.25, edges clamped).
            for chroma in [ChromaUpsampling::Cubic, ChromaUpsampling::Nearest] {
                let mut conv = Converter::new(m, r, 1 << 20).with_chroma(chroma);
                let img = conv
                    .to_rgb(&RawFrame::new(
                        PixelFormat::Nv12,
                        w as u32,
                        h as u32,
                        nv12.clone(),
                    ))
                    .unwrap();
                let uv = &nv12[w * h..];
                let chroma_at = |y: usize, x: usize, c: usize| -> f64 {
                    let col = (x / 2) * 2 + c;
                    let at =
                        |row: i64| f64::from(uv[row.clamp(0, h as i64 / 2 - 1) as usize * w + col]);
                    match chroma {
                        ChromaUpsampling::Nearest => at((y / 2) as i64),
                        ChromaUpsampling::Cubic => {
                            let pos = (y as f64 + 0.5) / 2.0 - 0.5;
                            let base = pos.floor() as i64;
                            (base - 1..=base + 2)
                                .map(|t| keys(pos - t as f64) * at(t))
                                .sum::<f64>()
                                .clamp(0.0, 255.0)
                        }
                    }
                };
                let mut worst = 0.0f64;
                for y in 0..h {
                    for x in 0..w {
                        let want = reference_pixel(
                            f64::from(nv12[y * w + x]),
                            chroma_at(y, x, 0),
                            chroma_at(y, x, 1),
                            m,
                            r,
                        );
                        let got = img.get_pixel(x as u32, y as u32).0;
                        for c in 0..3 {
                            worst = worst.max((f64::from(got[c]) - want[c]).abs());
                        }
                    }
                }
                // Cubic rounds the interpolated chroma to 8 bits (+-0.5), worth < 2 in RGB.
                let bound = if chroma == ChromaUpsampling::Nearest {
                    1.0
                } else {
                    2.0
                };
                assert!(worst <= bound, "NV12 {chroma:?} {m:?} {r:?}: worst {worst}");
            }
        }
    }
}

#[test]
fn bt709_and_full_range_differ_from_bt601_limited_as_expected() {
    // A saturated red in BT.601 limited range (Y=81, U=90, V=240) decodes to about (255, 0, 0);
    // read as BT.709 the red channel stays high but green moves up, and full range darkens it.
    let frame = |m, r| {
        let mut c = Converter::new(m, r, 1 << 20);
        let f = RawFrame::new(PixelFormat::Yuyv, 2, 1, vec![81, 90, 81, 240]);
        c.to_rgb(&f).unwrap().get_pixel(0, 0).0
    };
    let a = frame(YuvMatrix::Bt601, YuvRange::Limited);
    assert!(a[0] >= 253 && a[1] <= 2 && a[2] <= 2, "{a:?}");
    let b = frame(YuvMatrix::Bt709, YuvRange::Limited);
    assert!(b[1] > a[1] + 20, "{b:?} vs {a:?}");
    let c = frame(YuvMatrix::Bt601, YuvRange::Full);
    assert!(c[0] < a[0] && c[0] > 200, "{c:?}");
}
