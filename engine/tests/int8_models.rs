//! INT8 execution of QDQ models against ONNX Runtime running the same QDQ models. The QDQ
//! models are made by ORT's own static quantizer (`scripts/make-qdq-models.py`, written to
//! target/qdq/ and regenerated here when missing); ORT's outputs on the golden model-input PNGs
//! are committed in engine/tests/golden/qdq/golden-qdq.json.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use vigil_engine::vision::{self, Overrides, Results, VisionSpec};
use vigil_engine::{Model, ModelOptions, Tensor};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The QDQ model `name` (generating all of them with ORT when missing), or None with a SKIP line.
fn qdq_model(name: &str) -> Option<PathBuf> {
    let path = repo().join(format!("target/qdq/{name}.qdq.onnx"));
    if !path.exists() {
        let status = Command::new("python3")
            .arg(repo().join("scripts/make-qdq-models.py"))
            .status();
        if !matches!(status, Ok(s) if s.success()) || !path.exists() {
            println!("SKIP: {name} QDQ test because scripts/make-qdq-models.py could not run (needs python3 with onnxruntime, pillow, numpy)");
            return None;
        }
    }
    Some(path)
}

fn golden() -> Value {
    let p = repo().join("engine/tests/golden/qdq/golden-qdq.json");
    let text =
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("missing {}: {e}", p.display()));
    serde_json::from_str(&text).expect("golden-qdq.json parses")
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

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let na: f64 = a.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    dot / (na * nb).max(1e-30)
}

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold(0, |b, (i, &x)| if x > v[b] { i } else { b })
}

#[test]
fn qdq_efficientnet_int8_agrees_with_onnxruntime() {
    let Some(path) = qdq_model("efficientnet-lite0") else {
        return;
    };
    let model = Model::load(&path, &ModelOptions::default()).expect("load");
    let hist = model.graph().op_histogram();
    println!("efficientnet-lite0.qdq ops after folding: {hist:?}");
    let qconvs = hist.iter().find(|(n, _)| *n == "QConv").map_or(0, |h| h.1);
    assert!(
        qconvs >= 45,
        "only {qconvs} convolutions were folded into QConv"
    );
    let mut ctx = model.new_context().expect("context");
    let g = golden();
    let mut worst = 1f64;
    for img in g["images"].as_array().expect("images") {
        let stem = img["stem"].as_str().expect("stem");
        let input = input_from_png(
            &repo().join(format!("engine/tests/golden/{stem}.effnet-input.png")),
            0.5,
            0.5,
        );
        let out = ctx.run(&[input]).expect("run");
        let logits = out[0].as_f32().expect("f32");
        let want = f32s(&img["effnet_logits"]);
        let cos = cosine(logits, &want);
        worst = worst.min(cos);
        assert_eq!(
            argmax(logits),
            argmax(&want),
            "{stem}: top-1 differs from ORT-QDQ"
        );
        assert!(cos >= 0.99, "{stem}: logits cosine {cos} vs ORT-QDQ");
    }
    println!("efficientnet-lite0 INT8 agreement: worst logits cosine vs ORT-QDQ = {worst:.5}");
}

/// Greedy one-to-one matching of same-class boxes at IoU >= 0.5: (matched, got, want).
fn match_detections(
    got: &[vision::Detection],
    want: &[(usize, [f32; 4])],
) -> (usize, usize, usize) {
    let mut used = vec![false; want.len()];
    let mut matched = 0;
    for d in got {
        let best = want
            .iter()
            .enumerate()
            .filter(|(k, w)| !used[*k] && w.0 == d.class_id)
            .map(|(k, w)| {
                let b = vision::BBox {
                    x1: w.1[0],
                    y1: w.1[1],
                    x2: w.1[2],
                    y2: w.1[3],
                };
                (k, vision::iou(&d.bbox, &b))
            })
            .filter(|(_, iou)| *iou >= 0.5)
            .max_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((k, _)) = best {
            used[k] = true;
            matched += 1;
        }
    }
    (matched, got.len(), want.len())
}

#[test]
fn qdq_nanodet_int8_agrees_with_onnxruntime() {
    let Some(path) = qdq_model("nanodet-m-416") else {
        return;
    };
    let model = Model::load(&path, &ModelOptions::default()).expect("load");
    let hist = model.graph().op_histogram();
    println!("nanodet-m-416.qdq ops after folding: {hist:?}");
    let count = |name: &str| hist.iter().find(|(n, _)| *n == name).map_or(0, |h| h.1);
    assert!(
        count("QConv") >= 30,
        "only {} convolutions folded",
        count("QConv")
    );
    let labels = vision::load_labels(&repo().join("models/coco-labels.txt")).expect("labels");
    let spec = VisionSpec::nanodet_m_416(labels);
    let mut ctx = model.new_context().expect("context");
    let g = golden();
    let thr = g["det_threshold"].as_f64().expect("det_threshold") as f32;
    let (mut matched, mut n_got, mut n_want) = (0, 0, 0);
    let mut worst = 1f64;
    for img in g["images"].as_array().expect("images") {
        let stem = img["stem"].as_str().expect("stem");
        let input = input_from_png(
            &repo().join(format!("engine/tests/golden/{stem}.nanodet-input.png")),
            0.0,
            1.0,
        );
        let outs = ctx.run(&[input]).expect("run");
        for s in img["nanodet_samples"].as_array().expect("samples") {
            let shape: Vec<usize> = s["shape"]
                .as_array()
                .expect("shape")
                .iter()
                .map(|d| d.as_u64().expect("dim") as usize)
                .collect();
            let got = outs
                .iter()
                .find(|t| t.shape == shape)
                .unwrap_or_else(|| panic!("{stem}: no output of shape {shape:?}"))
                .as_f32()
                .expect("f32");
            let idx: Vec<usize> = s["indices"]
                .as_array()
                .expect("indices")
                .iter()
                .map(|i| i.as_u64().expect("index") as usize)
                .collect();
            let picked: Vec<f32> = idx.iter().map(|&i| got[i]).collect();
            let cos = cosine(&picked, &f32s(&s["values"]));
            worst = worst.min(cos);
            assert!(
                cos >= 0.99,
                "{stem}: output {shape:?} cosine {cos} vs ORT-QDQ"
            );
        }
        let transform = vision::ImageTransform {
            scale_x: 1.0,
            scale_y: 1.0,
            offset_x: 0.0,
            offset_y: 0.0,
            orig_width: 416,
            orig_height: 416,
        };
        let overrides = Overrides {
            score_threshold: Some(thr),
            ..Overrides::default()
        };
        let Results::Detections(dets) =
            vision::postprocess(&spec, &outs, &transform, &overrides).expect("post")
        else {
            panic!("not detections")
        };
        let want: Vec<(usize, [f32; 4])> = img["nanodet_detections"]
            .as_array()
            .expect("dets")
            .iter()
            .map(|d| {
                let b = f32s(&d["bbox"]);
                (
                    d["class_id"].as_u64().expect("class") as usize,
                    [b[0], b[1], b[2], b[3]],
                )
            })
            .collect();
        let (m, a, b) = match_detections(&dets, &want);
        matched += m;
        n_got += a;
        n_want += b;
    }
    let f1 = 2.0 * matched as f64 / (n_got + n_want).max(1) as f64;
    println!(
        "nanodet-m-416 INT8 agreement: detections F1 {f1:.3} vs ORT-QDQ ({matched} matched, {n_got} Vigil, {n_want} ORT, score >= {thr}); worst sampled-output cosine {worst:.5}"
    );
    assert!(n_want > 0, "the goldens hold no detections to compare");
    assert!(f1 >= 0.9, "detections F1 {f1} < 0.9 vs ORT-QDQ");
}
