//! The two shared models against ONNX Runtime's outputs (engine/tests/golden, made by
//! scripts/make-goldens.py). The model-level checks feed the identical input pixels that ORT saw;
//! the end-to-end checks go from the original photo through Vigil's own decode and preprocessing.

use std::path::{Path, PathBuf};

use serde_json::Value;
use vigil_engine::vision::{self, BBox, DecodeLimits, Overrides, Results, VisionSpec};
use vigil_engine::{Model, ModelOptions, Tensor};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn golden() -> Value {
    let p = repo().join("engine/tests/golden/golden.json");
    let text =
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("missing {}: {e}", p.display()));
    serde_json::from_str(&text).expect("golden.json parses")
}

fn shared() -> PathBuf {
    std::env::var_os("VIGIL_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("../shared"))
}

fn labels(name: &str) -> Vec<String> {
    vision::load_labels(&repo().join("models").join(name)).expect("labels load")
}

/// Loads a saved model-input PNG and applies `(x/255 - mean)/std` into a [1,3,H,W] tensor.
fn input_from_png(path: &Path, mean: f32, std: f32) -> Tensor {
    let img = image::open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .to_rgb8();
    let (w, h) = (img.width() as usize, img.height() as usize);
    let mut data = vec![0f32; 3 * w * h];
    for (x, y, p) in img.enumerate_pixels() {
        for c in 0..3 {
            data[c * w * h + y as usize * w + x as usize] = (p[c] as f32 / 255.0 - mean) / std;
        }
    }
    Tensor::from_f32(vec![1, 3, h, w], data).expect("tensor")
}

fn stem(file: &str) -> &str {
    file.rsplit_once('.').map(|(s, _)| s).unwrap_or(file)
}

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

fn bbox(v: &Value) -> BBox {
    let b = f32s(v);
    BBox {
        x1: b[0],
        y1: b[1],
        x2: b[2],
        y2: b[3],
    }
}

/// The activation arena must be within 5% of the peak-live lower bound.
fn assert_plan_is_tight(model: &Model) {
    let (arena, bound) = (model.arena_bytes(), model.arena_lower_bound());
    println!(
        "arena {arena} bytes, lower bound {bound} bytes, ratio {:.3}",
        arena as f64 / bound as f64
    );
    assert!(
        arena as f64 <= 1.05 * bound as f64,
        "plan {arena} > 1.05 x lower bound {bound}"
    );
}

#[test]
fn efficientnet_logits_match_onnxruntime() {
    let g = golden();
    let model = Model::load(
        &repo().join("models/efficientnet-lite0.onnx"),
        &ModelOptions::default(),
    )
    .expect("load");
    assert_plan_is_tight(&model);
    let mut ctx = model.new_context().expect("context");
    let mut worst = 0f32;
    for img in g["images"].as_array().expect("images") {
        let file = img["file"].as_str().expect("file");
        let input = input_from_png(
            &repo().join(format!(
                "engine/tests/golden/{}.effnet-input.png",
                stem(file)
            )),
            0.5,
            0.5,
        );
        let out = ctx.run(&[input]).expect("run");
        let logits = out[0].as_f32().expect("f32");
        let want = f32s(&img["effnet"]["logits"]);
        assert_eq!(logits.len(), want.len());
        let scale = want.iter().fold(1f32, |m, x| m.max(x.abs()));
        let diff = logits
            .iter()
            .zip(&want)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
            / scale;
        worst = worst.max(diff);
        assert!(
            diff <= 1e-3,
            "{file}: logits differ from ORT by {diff} (relative to max |logit| {scale})"
        );
        let top1 = logits
            .iter()
            .enumerate()
            .fold(0, |b, (i, &x)| if x > logits[b] { i } else { b });
        assert_eq!(
            top1 as u64,
            img["effnet"]["top5"][0].as_u64().expect("top1"),
            "{file}: top-1 differs"
        );
    }
    println!("efficientnet-lite0: worst relative logit difference vs ORT = {worst:.2e}");
}

#[test]
fn nanodet_outputs_and_detections_match_onnxruntime() {
    let g = golden();
    let model = Model::load(
        &repo().join("models/nanodet-m-416.onnx"),
        &ModelOptions::default(),
    )
    .expect("load");
    assert_plan_is_tight(&model);
    let spec = VisionSpec::nanodet_m_416(labels("coco-labels.txt"));
    let mut ctx = model.new_context().expect("context");
    for img in g["images"].as_array().expect("images") {
        let file = img["file"].as_str().expect("file");
        let input = input_from_png(
            &repo().join(format!(
                "engine/tests/golden/{}.nanodet-input.png",
                stem(file)
            )),
            0.0,
            1.0,
        );
        let outs = ctx.run(&[input]).expect("run");
        // Outputs are identified by shape, as the model card says.
        for want in img["nanodet"]["outputs"].as_array().expect("outputs") {
            let shape: Vec<usize> = want["shape"]
                .as_array()
                .expect("shape")
                .iter()
                .map(|d| d.as_u64().expect("dim") as usize)
                .collect();
            let got = outs
                .iter()
                .find(|t| t.shape == shape)
                .unwrap_or_else(|| panic!("{file}: no output of shape {shape:?}"));
            let got = got.as_f32().expect("f32");
            for (i, w) in want["indices"]
                .as_array()
                .expect("idx")
                .iter()
                .zip(f32s(&want["values"]))
            {
                let a = got[i.as_u64().expect("index") as usize];
                assert!(
                    (a - w).abs() <= 1e-3 * (1.0 + w.abs()),
                    "{file}: output {shape:?} differs: {a} vs {w}"
                );
            }
            let sum: f64 = got.iter().map(|&x| x as f64).sum();
            let want_sum = want["sum"].as_f64().expect("sum");
            assert!(
                (sum - want_sum).abs() <= 1e-3 * (1.0 + want_sum.abs()),
                "{file}: sum {sum} vs {want_sum}"
            );
        }
        // Detections decoded by Vigil from its own outputs, against ORT's decoded by the script.
        let (w, h) = (
            img["width"].as_f64().expect("w") as f32,
            img["height"].as_f64().expect("h") as f32,
        );
        let transform = vision::ImageTransform {
            scale_x: w / 416.0,
            scale_y: h / 416.0,
            offset_x: 0.0,
            offset_y: 0.0,
            orig_width: w as u32,
            orig_height: h as u32,
        };
        let Results::Detections(dets) =
            vision::postprocess(&spec, &outs, &transform, &Overrides::default()).expect("post")
        else {
            panic!("nanodet gives detections");
        };
        let want = img["nanodet"]["detections"].as_array().expect("dets");
        assert_eq!(dets.len(), want.len(), "{file}: detection count");
        for wd in want {
            let wb = bbox(&wd["bbox"]);
            let class = wd["class_id"].as_u64().expect("class") as usize;
            let best = dets
                .iter()
                .filter(|d| d.class_id == class)
                .map(|d| vision::iou(&d.bbox, &wb))
                .fold(0f32, f32::max);
            assert!(
                best >= 0.9,
                "{file}: ORT detection {wd} unmatched (best IoU {best})"
            );
        }
    }
}

#[test]
fn photos_end_to_end_agree_with_onnxruntime_top1() {
    let g = golden();
    let dir = shared().join("images/eval");
    assert!(
        dir.is_dir(),
        "shared eval photos not found at {} (set VIGIL_SHARED)",
        dir.display()
    );
    let model = Model::load(
        &repo().join("models/efficientnet-lite0.onnx"),
        &ModelOptions::default(),
    )
    .expect("load");
    let spec = VisionSpec::efficientnet_lite0(labels("imagenet-labels.txt"));
    let mut ctx = model.new_context().expect("context");
    let mut agree = 0;
    let images = g["images"].as_array().expect("images");
    for img in images {
        let file = img["file"].as_str().expect("file");
        let bytes = std::fs::read(dir.join(file)).expect("photo");
        let r = vision::infer_image(
            &mut ctx,
            &spec,
            &bytes,
            &DecodeLimits::default(),
            &Overrides::default(),
        )
        .expect("infer");
        let Results::Classes(classes) = r.results else {
            panic!("classification")
        };
        if classes[0].class_id as u64 == img["effnet"]["top5"][0].as_u64().expect("top1") {
            agree += 1;
        } else {
            println!(
                "{file}: Vigil says {}, ORT (PIL preprocessing) says {}",
                classes[0].label, img["effnet"]["top1_label"]
            );
        }
        if file == "coffee.png" {
            assert_eq!(classes[0].label, "espresso");
        }
    }
    println!(
        "end-to-end top-1 agreement with ORT: {agree}/{}",
        images.len()
    );
    assert!(
        agree + 1 >= images.len(),
        "only {agree}/{} photos agree on top-1",
        images.len()
    );
}
