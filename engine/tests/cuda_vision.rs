//! GPU camera-frame conversion and preprocessing (`backend::cuda::vision`) against host
//! references: YUYV/NV12 → RGB on the shared frames against a plain host implementation of the
//! same fixed-point formula (bit-identical expected, max abs diff 0) and against ffmpeg's RGB24
//! (the CPU converter's measured bounds, see docs/camera.md), and RGB → tensor preprocessing on
//! random images of several sizes and every resize mode against `vision::preprocess` on the CPU
//! (bit-identical expected: same integer tap tables and value table, max abs diff 0).
//! NanoDet decoding + NMS on the GPU (`backend::cuda::detect`) against the CPU post-processing
//! (`vision::decode_nanodet`, `vision::nms`) on the eval photos' real NanoDet outputs, on random
//! synthetic outputs and on random boxes (same classes and order, boxes within 1e-3), and the
//! model facade's GPU path (a CUDA model's `Preprocessor`) against the CPU path on the eval photos.
//! Every test skips (with a visible message) without a usable CUDA device.
#![cfg(feature = "cuda")]

use std::path::PathBuf;
use std::time::Instant;

use image::RgbImage;
use vigil_engine::backend::cuda::detect::GpuDetector;
use vigil_engine::backend::cuda::vision::{GpuImageConverter, YuvCoeffs, NV12_CUBIC_EVEN};
use vigil_engine::vision::{
    self, BBox, DecodeLimits, Detection, DetectionHead, Overrides, Preprocess, Preprocessor,
    ResizeMode, Results, Task, VisionSpec, YuvFrame, YuvLayout,
};
use vigil_engine::{Device, Model, ModelOptions, Tensor};

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
fn bt601_limited() -> YuvCoeffs {
    let one = 16384.0f64;
    let (kr, kb) = (0.299f64, 0.114f64);
    let kg = 1.0 - kr - kb;
    let cs = 255.0 / 224.0;
    YuvCoeffs {
        y_offset: 16,
        y_mul: (255.0 / 219.0 * one - 1e-9).ceil() as i32,
        rv: (cs * 2.0 * (1.0 - kr) * one).round() as i32,
        gu: (cs * 2.0 * kb * (1.0 - kb) / kg * one).round() as i32,
        gv: (cs * 2.0 * kr * (1.0 - kr) / kg * one).round() as i32,
        bu: (cs * 2.0 * (1.0 - kb) * one).round() as i32,
    }
}

/// One pixel, chroma with 4 fractional bits, truncated.
fn host_px(k: &YuvCoeffs, y: u8, u16: i64, v16: i64) -> [u8; 3] {
    let yy = (i64::from(y) - i64::from(k.y_offset)) * i64::from(k.y_mul) * 16;
    let (u, v) = (u16 - 2048, v16 - 2048);
    let c = |x: i64| (x.div_euclid(1 << 18)).clamp(0, 255) as u8;
    [
        c(yy + i64::from(k.rv) * v),
        c(yy - i64::from(k.gu) * u - i64::from(k.gv) * v),
        c(yy + i64::from(k.bu) * u),
    ]
}

fn host_yuyv(src: &[u8], k: &YuvCoeffs) -> Vec<u8> {
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

fn host_nv12(src: &[u8], k: &YuvCoeffs, cubic: bool) -> Vec<u8> {
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
        // 12-bit weights; chroma rounded to 8 bits, then carried with 4 fractional bits.
        ((s + 2048) >> 12).clamp(0, 255) * 16
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

fn detector() -> Option<GpuDetector> {
    if let Err(e) = vigil_engine::backend::cuda::probe(0) {
        println!("SKIP: no CUDA device: {e}");
        return None;
    }
    match GpuDetector::new(0) {
        Ok(d) => Some(d),
        Err(e) => panic!("CUDA device present but the detection kernels failed: {e}"),
    }
}

/// xorshift64 in [0, 1).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// Same detections: count, classes, labels and order exactly; scores within `score_tol`; boxes
/// within 1e-3.
fn assert_same(what: &str, got: &[Detection], want: &[Detection], score_tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: detection count");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            (g.class_id, &g.label),
            (w.class_id, &w.label),
            "{what}: detection {i} class"
        );
        assert!(
            (g.score - w.score).abs() <= score_tol,
            "{what}: detection {i} score {} vs {}",
            g.score,
            w.score
        );
        let d = [
            g.bbox.x1 - w.bbox.x1,
            g.bbox.y1 - w.bbox.y1,
            g.bbox.x2 - w.bbox.x2,
            g.bbox.y2 - w.bbox.y2,
        ]
        .iter()
        .fold(0f32, |m, v| m.max(v.abs()));
        assert!(d <= 1e-3, "{what}: detection {i} box differs by {d}");
    }
}

#[test]
fn gpu_nms_matches_cpu_nms_on_random_boxes() {
    let Some(mut g) = detector() else { return };
    let mut r = Rng(0x1234_5678_9ABC_DEF1);
    let mut cases = 0;
    for &n in &[0usize, 1, 7, 64, 65, 300, 2000, 5000] {
        for &classes in &[1usize, 4] {
            let dets: Vec<Detection> = (0..n)
                .map(|i| {
                    let (x, y) = (r.next() * 600.0, r.next() * 400.0);
                    let (w, h) = (5.0 + r.next() * 150.0, 5.0 + r.next() * 150.0);
                    // Scores quantized to 1/64 so there are many ties (order must stay stable).
                    let score = (r.next() * 64.0).floor() / 64.0;
                    let class_id = (r.next() * classes as f32) as usize % classes;
                    Detection {
                        class_id,
                        label: format!("c{class_id}-{i}"),
                        score,
                        bbox: BBox {
                            x1: x,
                            y1: y,
                            x2: x + w,
                            y2: y + h,
                        },
                    }
                })
                .collect();
            for &iou in &[0.3f32, 0.5, 0.7] {
                for &max in &[1usize, 10, 100, usize::MAX] {
                    let want = vision::nms(dets.clone(), iou, max);
                    let got = g.nms(&dets, iou, max).expect("gpu nms");
                    assert_eq!(got, want, "n {n} classes {classes} iou {iou} max {max}");
                    cases += 1;
                }
            }
            println!("random boxes: n {n}, {classes} class(es): GPU NMS == CPU NMS");
        }
    }
    assert_eq!(cases, 8 * 2 * 3 * 4);
}

/// The models directory (`VIGIL_MODELS` overrides; else the repo's, else ../shared/models).
fn models() -> PathBuf {
    if let Some(p) = std::env::var_os("VIGIL_MODELS") {
        return PathBuf::from(p);
    }
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models");
    if repo.join("nanodet-m-416.onnx").exists() {
        repo
    } else {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/models")
    }
}

/// The shared eval photos (`VIGIL_EVAL_IMAGES` overrides, for runs from a copied binary).
fn eval_photos() -> Vec<(String, Vec<u8>)> {
    let dir = std::env::var_os("VIGIL_EVAL_IMAGES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/images/eval")
        });
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("eval photos at {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    files.sort();
    assert!(
        files.len() >= 10,
        "expected the eval photos in {}",
        dir.display()
    );
    files
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).expect("photo");
            (
                p.file_name()
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                bytes,
            )
        })
        .collect()
}

fn load(file: &str, device: Device) -> Model {
    Model::load(
        &models().join(file),
        &ModelOptions {
            device,
            ..ModelOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("{file} on {device:?}: {e}"))
}

fn nanodet_spec() -> VisionSpec {
    let labels = vision::load_labels(&models().join("coco-labels.txt")).expect("labels");
    VisionSpec::nanodet_m_416(labels)
}

fn head(spec: &VisionSpec) -> (usize, Vec<usize>) {
    match &spec.task {
        Task::Detection {
            head: DetectionHead::Nanodet { reg_max, strides },
        } => (*reg_max, strides.clone()),
        other => panic!("not a NanoDet spec: {other:?}"),
    }
}

#[test]
fn gpu_nanodet_decode_matches_cpu_on_eval_photos_and_random_outputs() {
    let Some(mut g) = detector() else { return };
    let spec = nanodet_spec();
    let (reg_max, strides) = head(&spec);
    let model = load("nanodet-m-416.onnx", Device::Cpu);
    let mut ctx = model.new_context().expect("ctx");
    let (mut total, mut cpu_ms, mut gpu_ms) = (0usize, 0f64, 0f64);
    for (name, bytes) in eval_photos() {
        let img = vision::decode_image(&bytes, &DecodeLimits::default()).expect("decode");
        let (x, tr) = vision::preprocess(&img, &spec.preprocess).expect("preprocess");
        let outputs = ctx.run(&[x]).expect("run");
        for thr in [spec.score_threshold, 0.05, 0.0] {
            let t = Instant::now();
            let want = vision::decode_nanodet(&spec, &outputs, reg_max, &strides, thr, &tr)
                .expect("cpu decode");
            cpu_ms += t.elapsed().as_secs_f64() * 1e3;
            let t = Instant::now();
            let got = g
                .nanodet(&spec, &outputs, reg_max, &strides, thr, &tr)
                .expect("gpu decode");
            gpu_ms += t.elapsed().as_secs_f64() * 1e3;
            assert_same(&format!("{name} threshold {thr}"), &got, &want, 0.0);
            println!(
                "{name} threshold {thr}: {} detections, GPU == CPU",
                want.len()
            );
            total += want.len();
        }
    }
    println!("eval photos: {total} detections in all; decode+NMS time CPU {cpu_ms:.2} ms, GPU (incl. upload) {gpu_ms:.2} ms");
    assert!(total > 0, "the eval photos should yield detections");

    // Random outputs: sigmoid-range scores, wide logits; every anchor a candidate at threshold 0.
    let mut r = Rng(0xDEAD_BEEF_F00D_1234);
    for (k, thr) in [(0u32, 0.0f32), (1, 0.5), (2, 0.9)] {
        let outputs: Vec<Tensor> = model
            .outputs()
            .iter()
            .map(|o| {
                let n: usize = o.shape.iter().product();
                let boxes = o.shape.last() == Some(&(4 * (reg_max + 1)));
                let data = (0..n)
                    .map(|_| {
                        if boxes {
                            r.next() * 16.0 - 8.0
                        } else {
                            r.next()
                        }
                    })
                    .collect();
                Tensor::from_f32(o.shape.clone(), data).expect("tensor")
            })
            .collect();
        let tr = vision::ImageTransform {
            scale_x: 1.5 + k as f32 * 0.25,
            scale_y: 1.2,
            offset_x: 3.0 * k as f32,
            offset_y: 0.0,
            orig_width: 640,
            orig_height: 480,
        };
        let want = vision::decode_nanodet(&spec, &outputs, reg_max, &strides, thr, &tr)
            .expect("cpu decode");
        let got = g
            .nanodet(&spec, &outputs, reg_max, &strides, thr, &tr)
            .expect("gpu decode");
        assert_same(
            &format!("random outputs {k} threshold {thr}"),
            &got,
            &want,
            0.0,
        );
        println!(
            "random outputs {k} threshold {thr}: {} detections, GPU == CPU",
            want.len()
        );
    }
}

fn results_match(what: &str, got: &Results, want: &Results) {
    match (got, want) {
        // Two GPU runs of the same tensor: allow for non-deterministic device reductions.
        (Results::Detections(g), Results::Detections(w)) => assert_same(what, g, w, 1e-5),
        (Results::Classes(g), Results::Classes(w)) => {
            assert_eq!(g.len(), w.len(), "{what}: class count");
            for (a, b) in g.iter().zip(w) {
                assert_eq!(a.class_id, b.class_id, "{what}: class");
                assert!((a.score - b.score).abs() <= 1e-5, "{what}: score");
            }
        }
        _ => panic!("{what}: result kinds differ"),
    }
}

#[test]
fn facade_gpu_path_matches_the_cpu_path_on_eval_photos() {
    if converter().is_none() {
        return;
    }
    let photos = eval_photos();
    let imagenet = vision::load_labels(&models().join("imagenet-labels.txt")).expect("labels");
    for (file, spec) in [
        ("nanodet-m-416.onnx", nanodet_spec()),
        (
            "efficientnet-lite0.onnx",
            VisionSpec::efficientnet_lite0(imagenet),
        ),
    ] {
        let model = load(file, Device::Cuda);
        let mut gpu = model.new_context().expect("ctx");
        assert!(
            gpu.preprocessor().is_gpu(),
            "{file}: a CUDA model preprocesses on the GPU"
        );
        let mut cpu = model.new_context().expect("ctx");
        cpu.set_preprocessor(Preprocessor::Cpu);
        for (name, bytes) in &photos {
            let lim = DecodeLimits::default();
            let ov = Overrides::default();
            let got = vision::infer_image(&mut gpu, &spec, bytes, &lim, &ov).expect("gpu path");
            let want = vision::infer_image(&mut cpu, &spec, bytes, &lim, &ov).expect("cpu path");
            // NanoDet's raw outputs stay on the GPU (only detections come back); the CPU
            // preprocessor's context downloads them and decodes on the host.
            let detector = file.starts_with("nanodet");
            assert_eq!(
                gpu.outputs_on_device(),
                detector,
                "{file}: outputs left on the device"
            );
            assert!(!cpu.outputs_on_device(), "{file}: host path downloads");
            if detector {
                // The raw outputs left on the device download to what a host run gives.
                let kept: Vec<Tensor> = gpu.host_outputs().expect("download").to_vec();
                let host = cpu.host_outputs().expect("host outputs");
                assert_eq!(kept.len(), host.len());
                for (k, h) in kept.iter().zip(host) {
                    let d = k
                        .as_f32()
                        .expect("f32")
                        .iter()
                        .zip(h.as_f32().expect("f32"))
                        .map(|(a, b)| (a - b).abs())
                        .fold(0f32, f32::max);
                    assert!(d <= 1e-4, "{file} {name}: downloaded outputs differ by {d}");
                }
            }
            // The GPU preprocessing is bit-identical, so both contexts run the same tensor.
            let img = vision::decode_image(bytes, &lim).expect("decode");
            let (a, ta) = gpu
                .preprocessor()
                .preprocess(&img, &spec.preprocess)
                .expect("gpu");
            let (b, tb) = vision::preprocess(&img, &spec.preprocess).expect("cpu");
            assert_eq!(ta, tb);
            assert_eq!(
                a.as_f32().expect("f32"),
                b.as_f32().expect("f32"),
                "{file} {name}"
            );
            results_match(&format!("{file} {name}"), &got.results, &want.results);
            println!(
                "{file} {name}: GPU path == CPU path (preprocess {:.2} vs {:.2} ms, postprocess {:.2} vs {:.2} ms)",
                got.timings.preprocess_ms,
                want.timings.preprocess_ms,
                got.timings.postprocess_ms,
                want.timings.postprocess_ms
            );
        }
    }
}

#[test]
fn preprocessor_converts_camera_frames_like_the_host_formula() {
    if converter().is_none() {
        return;
    }
    let p = Preprocessor::gpu(0).expect("gpu preprocessor");
    let k = bt601_limited();
    let yuyv = shared("camera/vtest-640x480.yuyv");
    let f = &yuyv[..W * H * 2];
    let frame = YuvFrame {
        layout: YuvLayout::Yuyv,
        data: f,
        width: W,
        height: H,
        stride: 0,
    };
    let img = p
        .yuv_to_rgb(&frame, &k)
        .expect("gpu side")
        .expect("convert");
    assert_eq!(max_diff(img.as_raw(), &host_yuyv(f, &k)), 0);
    let nv12 = shared("camera/vtest-640x480.nv12");
    let f = &nv12[..W * H * 3 / 2];
    for cubic in [true, false] {
        let frame = YuvFrame {
            layout: YuvLayout::Nv12 { cubic },
            data: f,
            width: W,
            height: H,
            stride: 0,
        };
        let img = p
            .yuv_to_rgb(&frame, &k)
            .expect("gpu side")
            .expect("convert");
        assert_eq!(
            max_diff(img.as_raw(), &host_nv12(f, &k, cubic)),
            0,
            "cubic {cubic}"
        );
    }
    println!("Preprocessor::yuv_to_rgb: YUYV and NV12 equal the host formula");
}
