//! YUYV and NV12 → RGB against ffmpeg, and every matrix/range combination against an
//! independent floating-point reference.
//!
//! Two ffmpeg references:
//! - ffmpeg converting the SAME shared YUYV/NV12 frames Vigil converts (golden crops made by
//!   scripts/make-camera-goldens.sh): within ±2 on every value, for both formats.
//! - the shared ../shared/camera/vtest-640x480.rgb24. ±2 on every pixel is out of reach from
//!   that one (see docs/camera.md): all three shared files were cut directly from the 768x576
//!   `vtest.avi` (OpenCV samples) by ffmpeg 5.1 in one scale + convert step each (`ffmpeg -ss 10
//!   -i vtest.avi -frames:v 8 -s 640x480 -pix_fmt X`, reproduced byte for byte), so the RGB24
//!   never passed through the 8-bit YUYV/NV12 samples (different rounding, luma not yet clipped,
//!   NV12's chroma from 288 source rows instead of 240). ffmpeg's own conversion of the YUYV file
//!   differs from the RGB24 by up to 13, and [`no_per_pixel_function_meets_2_on_yuyv`] proves
//!   that no conversion of a pixel's (Y, U, V) can be within ±2 everywhere. Against it the tests
//!   assert ±2 on at least 99% (YUYV) / 80% (NV12) of the pixels and pin the measured worst cases.

use std::path::PathBuf;

use vigil::camera::convert::{ChromaUpsampling, Converter, YuvMatrix, YuvRange, CUBIC_EVEN};
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
    /// Max abs diff over every channel of every pixel of the 8 frames.
    worst: i32,
    /// Worst error over pixels whose luma sample is neither 0 nor 255.
    worst_unclipped: i32,
    /// Fraction of pixels with every channel within ±2.
    within2: f64,
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
    let (mut worst, mut worst_unclipped, mut ok2, mut sum) = (0i32, 0i32, 0usize, 0u64);
    let mut hist = [0usize; 6];
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
            worst = worst.max(d);
            if luma != 0 && luma != 255 {
                worst_unclipped = worst_unclipped.max(d);
            }
            if d <= 2 {
                ok2 += 1;
            }
            hist[(d as usize).min(5)] += 1;
        }
        conv.recycle(img);
    }
    let s = Stats {
        worst,
        worst_unclipped,
        within2: ok2 as f64 / (W * H * 8) as f64,
        mean: sum as f64 / (W * H * 3 * 8) as f64,
    };
    println!(
        "{format:?} {chroma:?} vs ffmpeg rgb24: max abs diff {} (luma not clipped: {}), within ±2: {:.3}%, mean {:.3}, pixels by max diff 0,1,2,3,4,>=5: {hist:?}",
        s.worst,
        s.worst_unclipped,
        100.0 * s.within2,
        s.mean
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
    assert!(s.within2 >= 0.99, "within ±2: {}", s.within2);
    // Errors above 3 occur only where the file's luma is clipped to 0 or 255.
    assert!(
        s.worst_unclipped <= 3,
        "worst unclipped {}",
        s.worst_unclipped
    );
    assert!(s.worst <= 12, "worst {}", s.worst);
    assert!(s.mean <= 0.9, "mean {}", s.mean);
}

#[test]
fn nv12_matches_ffmpeg_within_its_measured_bounds_and_beats_nearest() {
    let file = "camera/vtest-640x480.nv12";
    let cubic = compare(PixelFormat::Nv12, file, ChromaUpsampling::Cubic);
    let nearest = compare(PixelFormat::Nv12, file, ChromaUpsampling::Nearest);
    assert!(cubic.within2 >= 0.80, "within ±2: {}", cubic.within2);
    assert!(cubic.worst <= 24, "worst {}", cubic.worst);
    assert!(cubic.mean <= 1.15, "mean {}", cubic.mean);
    assert!(cubic.worst < nearest.worst);
    assert!(cubic.within2 > nearest.within2);
    assert!(cubic.mean < nearest.mean);
}

/// ffmpeg's own conversion (swscale, default flags, BT.601 limited) of the SAME shared YUYV and
/// NV12 frames, frames 0 and 7 cropped to 256x192 at (192, 144) after converting whole frames
/// (app/tests/golden/camera-*.png, made by scripts/make-camera-goldens.sh).
fn golden_crop(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    image::open(&p)
        .unwrap_or_else(|e| panic!("golden {}: {e}", p.display()))
        .to_rgb8()
        .into_raw()
}

/// Max abs diff and fraction of channel values within ±2, Vigil vs ffmpeg on the golden crops.
fn against_ffmpeg_of_same_input(format: PixelFormat, file: &str, ext: &str) -> (i32, f64) {
    let frame_bytes = match format {
        PixelFormat::Yuyv => W * H * 2,
        _ => W * H * 3 / 2,
    };
    let src = shared(file);
    let mut conv = Converter::new(YuvMatrix::Bt601, YuvRange::Limited, 1 << 24);
    let (mut worst, mut ok, mut n) = (0i32, 0usize, 0usize);
    for frame in [0usize, 7] {
        let data = src[frame * frame_bytes..(frame + 1) * frame_bytes].to_vec();
        let img = conv
            .to_rgb(&RawFrame::new(format, W as u32, H as u32, data))
            .unwrap();
        let want = golden_crop(&format!("camera-{ext}-frame{frame}.png"));
        assert_eq!(want.len(), 256 * 192 * 3);
        for y in 0..192 {
            for x in 0..256 {
                let got = img.get_pixel(192 + x as u32, 144 + y as u32).0;
                for c in 0..3 {
                    let d = (i32::from(got[c]) - i32::from(want[(y * 256 + x) * 3 + c])).abs();
                    worst = worst.max(d);
                    ok += usize::from(d <= 2);
                    n += 1;
                }
            }
        }
    }
    let frac = ok as f64 / n as f64;
    println!(
        "{format:?} vs ffmpeg's conversion of the same frames: max abs diff {worst}, within ±2: {:.4}%",
        100.0 * frac
    );
    (worst, frac)
}

#[test]
fn yuyv_is_within_2_of_ffmpeg_converting_the_same_frames() {
    let (worst, _) =
        against_ffmpeg_of_same_input(PixelFormat::Yuyv, "camera/vtest-640x480.yuyv", "yuyv");
    assert!(worst <= 2, "worst {worst}");
}

#[test]
fn nv12_is_within_2_of_ffmpeg_converting_the_same_frames() {
    // Same vertical filter as swscale (bicubic C = 0.6 in 12 bits, chroma rounded to 8 bits).
    // swscale's exact coefficient rounding is not reproduced: over all 8 whole frames (a
    // full-frame ffmpeg conversion, too large to commit) 104 of 7.4 M values are off by 3 or 4;
    // none in these crops.
    let (worst, within2) =
        against_ffmpeg_of_same_input(PixelFormat::Nv12, "camera/vtest-640x480.nv12", "nv12");
    assert!(worst <= 2, "worst {worst}");
    assert!(within2 >= 1.0, "within ±2: {within2}");
}

/// Pixels of the YUYV file with the same (Y, U, V) triple (chroma of the pair) have reference RGB
/// values more than 4 apart, so any conversion that maps a pixel's (Y, U, V) to RGB is off by
/// at least 3 somewhere: ±2 on every pixel is impossible from this file.
#[test]
fn no_per_pixel_function_meets_2_on_yuyv() {
    let src = shared("camera/vtest-640x480.yuyv");
    let rgb = shared("camera/vtest-640x480.rgb24");
    let mut keyed: Vec<(u32, [u8; 3])> = Vec::with_capacity(W * H * 8);
    for (p, px) in rgb.chunks_exact(3).enumerate() {
        let pair = &src[(p / 2) * 4..(p / 2) * 4 + 4];
        let y = src[p * 2];
        let key = (u32::from(y) << 16) | (u32::from(pair[1]) << 8) | u32::from(pair[3]);
        keyed.push((key, [px[0], px[1], px[2]]));
    }
    keyed.sort_unstable_by_key(|k| k.0);
    let (mut spread, mut spread_unclipped) = (0i32, 0i32);
    for group in keyed.chunk_by(|a, b| a.0 == b.0) {
        for c in 0..3 {
            let lo = group.iter().map(|g| i32::from(g.1[c])).min().unwrap_or(0);
            let hi = group.iter().map(|g| i32::from(g.1[c])).max().unwrap_or(0);
            spread = spread.max(hi - lo);
            let y = group[0].0 >> 16;
            if y != 0 && y != 255 {
                spread_unclipped = spread_unclipped.max(hi - lo);
            }
        }
    }
    println!(
        "largest spread of ffmpeg rgb24 over identical YUYV triples: {spread} (luma not clipped: {spread_unclipped}); best possible worst error {}",
        (spread + 1) / 2
    );
    assert!(spread > 4, "spread {spread}");
    assert!(spread_unclipped <= 4, "spread unclipped {spread_unclipped}");
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

/// Keys cubic kernel with swscale's default bicubic parameter (a = -C = -0.6).
fn keys(x: f64) -> f64 {
    let (a, x) = (-0.6, x.abs());
    if x < 1.0 {
        (a + 2.0) * x * x * x - (a + 3.0) * x * x + 1.0
    } else if x < 2.0 {
        a * x * x * x - 5.0 * a * x * x + 8.0 * a * x - 4.0 * a
    } else {
        0.0
    }
}

#[test]
fn nv12_table_is_the_sited_cubic_in_12_bits() {
    // Even luma row 2i sits at chroma row i - 0.25: taps i-2..=i+1 at distances 1.75, 0.75,
    // 0.25, 1.25. The table must be those weights in 1/4096 (swscale's vertical precision),
    // each within one unit, summing to exactly 4096.
    let ideal = [1.75, 0.75, 0.25, 1.25].map(|d: f64| keys(d) * 4096.0);
    assert_eq!(CUBIC_EVEN.iter().sum::<i32>(), 4096);
    for (w, want) in CUBIC_EVEN.iter().zip(ideal) {
        assert!(
            (f64::from(*w) - want).abs() <= 1.0,
            "{CUBIC_EVEN:?} vs {ideal:?}"
        );
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
            // Truncation to 8 bits: up to 1 below the float value (+ coefficient rounding).
            assert!(worst <= 1.05, "YUYV {m:?} {r:?}: worst {worst}");
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
                            // The table's filter (checked against the cubic above), evaluated in
                            // floats, rounded to 8 bits as the conversion specifies.
                            let i = (y / 2) as i64;
                            let (first, w) = if y.is_multiple_of(2) {
                                (i - 2, CUBIC_EVEN)
                            } else {
                                let e = CUBIC_EVEN;
                                (i - 1, [e[3], e[2], e[1], e[0]])
                            };
                            let v: f64 = (0..4)
                                .map(|k| f64::from(w[k]) / 4096.0 * at(first + k as i64))
                                .sum();
                            (v + 0.5).floor().clamp(0.0, 255.0)
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
                // Truncation to 8 bits: up to 1 below the float value (+ coefficient rounding).
                assert!(worst <= 1.05, "NV12 {chroma:?} {m:?} {r:?}: worst {worst}");
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
