//! Real-inference tests: the default models from `models/` and photos from the shared data.
//! They need the wired engine (model loading, execution, vision); the HTTP-only behaviour is
//! covered by `http_api.rs`.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::*;
use serde_json::json;
use vigil::config::{default_models, Limits};
use vigil::http::AppState;
use vigil::registry::Registry;
use vigil_engine::{Model, ModelOptions, Tensor};

fn models_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models"))
}

fn shared() -> PathBuf {
    let p = std::env::var_os("VIGIL_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared")));
    assert!(
        p.join("images/eval").is_dir(),
        "shared data not found at {} (set VIGIL_SHARED to the shared/ directory)",
        p.display()
    );
    p
}

fn read(p: PathBuf) -> Vec<u8> {
    std::fs::read(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

fn real_server(limits: Limits) -> String {
    let registry = Registry::load_all(&default_models(&models_dir()), &limits)
        .unwrap_or_else(|e| panic!("{e}"));
    start(AppState::new(registry, limits))
}

#[test]
fn espresso_photo_is_espresso() {
    let base = real_server(Limits::default());
    let bytes = read(shared().join("images/eval/coffee.png"));
    let dims = image::load_from_memory(&bytes).unwrap();
    let r = post(
        &format!("{base}/v1/models/efficientnet-lite0/infer?top_k=3"),
        "image/png",
        &[],
        &bytes,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["task"], "classification");
    assert_eq!(
        (v["width"].as_u64(), v["height"].as_u64()),
        (Some(dims.width() as u64), Some(dims.height() as u64))
    );
    let classes = v["results"]["classes"].as_array().unwrap();
    assert_eq!(classes.len(), 3);
    assert_eq!(classes[0]["label"], "espresso", "{v}");
    let scores: Vec<f64> = classes
        .iter()
        .map(|c| c["score"].as_f64().unwrap())
        .collect();
    assert!(
        scores.windows(2).all(|w| w[0] >= w[1]) && scores[0] <= 1.0,
        "{scores:?}"
    );

    // Same answer through multipart.
    let (ct, body) = multipart(&bytes);
    let r = post(
        &format!("{base}/v1/models/efficientnet-lite0/infer"),
        &ct,
        &[],
        &body,
    );
    assert_eq!(r.json()["results"]["classes"][0]["label"], "espresso");
}

#[test]
fn street_scene_has_people() {
    let base = real_server(Limits::default());
    let bytes = read(shared().join("images/calib/vtest-frame-200.jpg"));
    let img = image::load_from_memory(&bytes).unwrap();
    let r = post(
        &format!("{base}/v1/models/nanodet-m-416/infer"),
        "image/jpeg",
        &[],
        &bytes,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["task"], "detection");
    let dets = v["results"]["detections"].as_array().unwrap();
    let people: Vec<_> = dets.iter().filter(|d| d["label"] == "person").collect();
    assert!(people.len() >= 2, "{v}");
    for d in dets {
        let b = &d["bbox"];
        let (x1, y1, x2, y2) = (
            b["x1"].as_f64().unwrap(),
            b["y1"].as_f64().unwrap(),
            b["x2"].as_f64().unwrap(),
            b["y2"].as_f64().unwrap(),
        );
        assert!(x1 < x2 && y1 < y2, "{d}");
        assert!(
            x1 >= -1.0
                && y1 >= -1.0
                && x2 <= img.width() as f64 + 1.0
                && y2 <= img.height() as f64 + 1.0,
            "{d}"
        );
        assert!(d["score"].as_f64().unwrap() >= 0.35);
    }
}

#[test]
fn corrupt_images_400_and_server_survives() {
    let base = real_server(Limits::default());
    let url = format!("{base}/v1/models/efficientnet-lite0/infer");
    let bytes = read(shared().join("images/eval/coffee.png"));
    post(&url, "image/png", &[], &bytes[..bytes.len() / 2]).assert_json_error(400);
    let jpg = read(shared().join("images/eval/apple.jpg"));
    post(&url, "image/jpeg", &[], &jpg[..jpg.len() / 3]).assert_json_error(400);
    let mut garbled = bytes.clone();
    for b in garbled.iter_mut().skip(100).step_by(7) {
        *b ^= 0x5a;
    }
    post(&url, "image/png", &[], &garbled).assert_json_error(400);
    assert_eq!(post(&url, "image/png", &[], &bytes).status, 200);
}

/// The KServe JSON and binary paths give the same logits as running the engine directly.
#[test]
fn kserve_tensor_round_trip_matches_engine() {
    let base = real_server(Limits::default());
    let n = 3 * 224 * 224;
    let mut x = 12345u32;
    let data: Vec<f32> = (0..n)
        .map(|_| {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            (x >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
        })
        .collect();
    let model = Model::load(
        &models_dir().join("efficientnet-lite0.onnx"),
        &ModelOptions::default(),
    )
    .unwrap();
    let mut ctx = model.new_context().unwrap();
    let reference = ctx
        .run(&[Tensor::from_f32(vec![1, 3, 224, 224], data.clone()).unwrap()])
        .unwrap();
    let reference = reference[0].as_f32().unwrap().to_vec();
    assert_eq!(reference.len(), 1000);

    let url = format!("{base}/v2/models/efficientnet-lite0/infer");
    let req = json!({ "inputs": [{ "name": "input", "shape": [1, 3, 224, 224], "datatype": "FP32", "data": data }] });
    let r = post(&url, "application/json", &[], req.to_string().as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["outputs"][0]["name"], "logits");
    assert_eq!(v["outputs"][0]["shape"], json!([1, 1000]));
    let from_json: Vec<f32> = v["outputs"][0]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    for (a, b) in from_json.iter().zip(&reference) {
        assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
    }

    let header = json!({
        "inputs": [{ "name": "input", "shape": [1, 3, 224, 224], "datatype": "FP32",
                     "parameters": { "binary_data_size": n * 4 } }],
        "outputs": [{ "name": "logits", "parameters": { "binary_data": true } }]
    });
    let (hl, body) = binary_body(&header, &f32_bytes(&data));
    let r = post(
        &url,
        "application/octet-stream",
        &[("Inference-Header-Content-Length", hl.to_string())],
        &body,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let (h, tail) = split_binary(&r);
    assert_eq!(h["outputs"][0]["parameters"]["binary_data_size"], 4000);
    assert_eq!(f32_from_bytes(&tail), reference);

    // Wrong shape for the real model.
    let bad = json!({ "inputs": [{ "name": "input", "shape": [1, 3, 223, 224], "datatype": "FP32", "data": [0.0] }] });
    post(&url, "application/json", &[], bad.to_string().as_bytes()).assert_json_error(400);
}

/// A burst at a queue of depth 1: at least one request is refused with 503, at least one served.
#[test]
fn burst_overflows_small_queue() {
    let limits = Limits {
        queue_depth: 1,
        workers: 1,
        ..Limits::default()
    };
    let base = real_server(limits);
    let bytes = Arc::new(read(shared().join("images/eval/coffee.png")));
    let barrier = Arc::new(std::sync::Barrier::new(16));
    let handles: Vec<_> = (0..16)
        .map(|_| {
            let (url, bytes, barrier) = (
                format!("{base}/v1/models/efficientnet-lite0/infer"),
                bytes.clone(),
                barrier.clone(),
            );
            std::thread::spawn(move || {
                barrier.wait();
                let r = post(&url, "image/png", &[], &bytes);
                if r.status == 503 {
                    assert_eq!(r.header("retry-after").as_deref(), Some("1"));
                    r.assert_json_error(503);
                }
                r.status
            })
        })
        .collect();
    let statuses: Vec<u16> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(statuses.contains(&200), "{statuses:?}");
    assert!(statuses.contains(&503), "{statuses:?}");
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 503),
        "{statuses:?}"
    );
}

#[test]
fn cli_infer_prints_espresso() {
    let img = shared().join("images/eval/coffee.png");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["infer", "--models-dir"])
        .arg(models_dir())
        .args(["--model", "efficientnet-lite0"])
        .arg(&img)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["results"]["classes"][0]["label"], "espresso");
    // Two images → an array.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vigil"))
        .arg("infer")
        .arg("--model")
        .arg(models_dir().join("efficientnet-lite0.onnx"))
        .arg(&img)
        .arg(&img)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v.as_array().map(Vec::len), Some(2));
    assert_eq!(v[1]["results"]["classes"][0]["label"], "espresso");
}
