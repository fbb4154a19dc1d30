//! GPU camera-frame conversion and preprocessing (`backend::cuda::vision`) against host
//! references: YUYV/NV12 → RGB on the shared frames against a plain host implementation of the
//! same fixed-point formula (bit-identical expected, max abs diff 0) and against ffmpeg's RGB24
//! (the CPU converter's measured bounds, see docs/camera.md), and RGB → tensor preprocessing on
//! random images of several sizes and every resize mode against `vision::preprocess` on the CPU
//! (bit-identical expected: same integer tap tables and value table, max abs diff 0).
//! Every test skips (with a visible message) without a usable CUDA device.

use std::path::PathBuf;

use image::RgbImage;
use vigil_engine::backend::cuda::vision::{GpuImageConverter, GpuYuvCoeffs, NV12_CUBIC_EVEN};
use vigil_engine::vision::{self, Preprocess, ResizeMode};

const W: usize = 640;
const H: usize = 480;

fn converter() -> Option<GpuImageConverter> {
    if let Err(e) = vigil_engine::backend::cuda::probe(0) {
        println!("SKIP: no CUDA device: {e}");
        return None;
    }
    match GpuImageConverter::new(0) {
        Ok(c) => Some(c),
        Err(e) => panic!("CUDA device present but the vision kernels failed: {e}"),
    }
}

/// `VIGIL_SHARED` overrides ../shared (for runs from a copied binary).
fn shared(rel: &str) -> Vec<u8> {
    let base = std::env::var_os("VIGIL_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"));
    let p = base.join(rel);
    std::fs::read(&p).unwrap_or_else(|e| panic!("shared test data {} is missing: {e}", p.display()))
}

/// BT.601 limited-range coefficients, derived here independently (14 fractional bits, luma gain
/// rounded up).
fn bt601_limited() -> GpuYuvCoeffs {
    let one = 16384.0f64;
    let (kr, kb) = (0.299f64, 0.114f64);
    let kg = 1.0 - kr - kb;
    let cs = 255.0 / 224.0;
    GpuYuvCoeffs {
        y_offset: 16,
        y_mul: (255.0 / 219.0 * one - 1e-9).ceil() as i32,
        rv: (cs * 2.0 * (1.0 - kr) * one).round() as i32,
        gu: (cs * 2.0 * kb * (1.0 - kb) / kg * one).round() as i32,
        gv: (cs * 2.0 * kr * (1.0 - kr) / kg * one).round() as i32,
        bu: (cs * 2.0 * (1.0 - kb) * one).round() as i32,
    }
}

/// One pixel, chroma with 4 fractional bits, truncated.
fn host_px(k: &GpuYuvCoeffs, y: u8, u16: i64, v16: i64) -> [u8; 3] {
    let yy = (i64::from(y) - i64::from(k.y_offset)) * i64::from(k.y_mul) * 16;
    let (u, v) = (u16 - 2048, v16 - 2048);
    let c = |x: i64| (x.div_euclid(1 << 18)).clamp(0, 255) as u8;
    [
        c(yy + i64::from(k.rv) * v),
        c(yy - i64::from(k.gu) * u - i64::from(k.gv) * v),
        c(yy + i64::from(k.bu) * u),
    ]
}

fn host_yuyv(src: &[u8], k: &GpuYuvCoeffs) -> Vec<u8> {
    let mut out = Vec::with_capacity(W * H * 3);
    for p in 0..W * H {
        let pair = &src[(p / 2) * 4..(p / 2) * 4 + 4];
        out.extend(host_px(
            k,
            src[p * 2],
            i64::from(pair[1]) * 16,
            i64::from(pair[3]) * 16,
        ));
    }
    out
}

fn host_nv12(src: &[u8], k: &GpuYuvCoeffs, cubic: bool) -> Vec<u8> {
    let uv = &src[W * H..];
    let ch = (H / 2) as i64;
    let chroma = |y: usize, x: usize, c: usize| -> i64 {
        let col = (x / 2) * 2 + c;
        let at = |r: i64| i64::from(uv[r.clamp(0, ch - 1) as usize * W + col]);
        if !cubic {
            return at((y / 2) as i64) * 16;
        }
        let i = (y / 2) as i64;
        let s: i64 = if y.is_multiple_of(2) {
            (0..4)
                .map(|t| i64::from(NV12_CUBIC_EVEN[t]) * at(i - 2 + t as i64))
                .sum()
        } else {
            (0..4)
                .map(|t| i64::from(NV12_CUBIC_EVEN[3 - t]) * at(i - 1 + t as i64))
                .sum()
        };
        ((s + 32) >> 6).clamp(0, 4080)
    };
    let mut out = Vec::with_capacity(W * H * 3);
    for y in 0..H {
        for x in 0..W {
            out.extend(host_px(k, src[y * W + x], chroma(y, x, 0), chroma(y, x, 1)));
        }
    }
    out
}

fn max_diff(a: &[u8], b: &[u8]) -> i32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (i32::from(x) - i32::from(y)).abs())
        .max()
        .unwrap_or(0)
}

#[test]
fn yuv_frames_match_the_host_formula_and_ffmpeg_bounds() {
    let Some(mut g) = converter() else { return };
    let k = bt601_limited();
    let yuyv = shared("camera/vtest-640x480.yuyv");
    let nv12 = shared("camera/vtest-640x480.nv12");
    let rgb = shared("camera/vtest-640x480.rgb24");
    let (mut worst_yuyv, mut worst_nv12, mut worst_near) = (0, 0, 0);
    for i in 0..8 {
        let want_ff = &rgb[i * W * H * 3..(i + 1) * W * H * 3];
        let f = &yuyv[i * W * H * 2..(i + 1) * W * H * 2];
        let got = g.yuyv_to_rgb(f, W, H, 0, &k).expect("yuyv");
        let d = max_diff(&got, &host_yuyv(f, &k));
        println!("frame {i} YUYV GPU vs host formula: max abs diff {d}");
        assert_eq!(d, 0, "frame {i}: GPU YUYV differs from the host formula");
        worst_yuyv = worst_yuyv.max(max_diff(&got, want_ff));

        let f = &nv12[i * W * H * 3 / 2..(i + 1) * W * H * 3 / 2];
        for cubic in [true, false] {
            let got = g.nv12_to_rgb(f, W, H, 0, &k, cubic).expect("nv12");
            let d = max_diff(&got, &host_nv12(f, &k, cubic));
            println!("frame {i} NV12 (cubic {cubic}) GPU vs host formula: max abs diff {d}");
            assert_eq!(d, 0, "frame {i}: GPU NV12 differs from the host formula");
            if cubic {
                worst_nv12 = worst_nv12.max(max_diff(&got, want_ff));
            } else {
                worst_near = worst_near.max(max_diff(&got, want_ff));
            }
        }
    }
    println!(
        "GPU vs ffmpeg rgb24: YUYV max abs diff {worst_yuyv}, NV12 cubic {worst_nv12}, NV12 nearest {worst_near}"
    );
    // The CPU converter's measured bounds on these files (app/tests/camera_convert.rs).
    assert!(worst_yuyv <= 12 && worst_nv12 <= 24 && worst_nv12 < worst_near);
}

#[test]
fn bad_frames_are_errors() {
    let Some(mut g) = converter() else { return };
    let k = bt601_limited();
    assert!(g.yuyv_to_rgb(&[0; 10], 4, 2, 0, &k).is_err());
    assert!(g.yuyv_to_rgb(&[0; 16], 3, 2, 0, &k).is_err());
    assert!(g.nv12_to_rgb(&[0; 11], 4, 2, 0, &k, true).is_err());
    assert!(g.nv12_to_rgb(&[0; 12], 4, 2, 0, &k, true).is_ok());
    let p = Preprocess {
        width: 8,
        height: 8,
        resize: ResizeMode::Stretch,
        scale: 1.0,
        mean: [0.0; 3],
        std: [1.0; 3],
        bgr: false,
    };
    assert!(g.preprocess(&[0; 11], 2, 2, &p).is_err());
}

#[test]
fn preprocess_matches_cpu_bit_for_bit() {
    let Some(mut g) = converter() else { return };
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    let mut byte = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 56) as u8
    };
    let modes = [
        ResizeMode::Stretch,
        ResizeMode::Letterbox { pad_value: 114 },
        ResizeMode::ShortSideCenterCrop { short_side: 256 },
    ];
    let sizes = [
        (640usize, 480usize),
        (300, 500),
        (224, 224),
        (1000, 257),
        (97, 61),
    ];
    let mut cases = 0;
    for &(w, h) in &sizes {
        let data: Vec<u8> = (0..w * h * 3).map(|_| byte()).collect();
        let img = RgbImage::from_raw(w as u32, h as u32, data.clone()).expect("image");
        for (m, mode) in modes.iter().enumerate() {
            for (tw, th) in [(224u32, 224u32), (416, 320)] {
                if matches!(mode, ResizeMode::ShortSideCenterCrop { .. }) && (tw > 256 || th > 256)
                {
                    continue;
                }
                let p = Preprocess {
                    width: tw,
                    height: th,
                    resize: mode.clone(),
                    scale: 1.0 / 255.0,
                    mean: [0.485, 0.456, 0.406],
                    std: [0.229, 0.224, 0.225],
                    bgr: m == 1,
                };
                let (want, wt) = vision::preprocess(&img, &p).expect("cpu preprocess");
                let (got, gt) = g.preprocess(&data, w, h, &p).expect("gpu preprocess");
                assert_eq!(got.shape, want.shape);
                assert_eq!(gt, wt);
                let (a, b) = (got.as_f32().expect("f32"), want.as_f32().expect("f32"));
                let d = a
                    .iter()
                    .zip(b)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0f32, f32::max);
                println!("{w}x{h} -> {tw}x{th} {mode:?}: GPU vs CPU max abs diff {d}");
                assert_eq!(d, 0.0, "{w}x{h} -> {tw}x{th} {mode:?}");
                cases += 1;
            }
        }
    }
    assert!(cases >= 20);
}
