//! HTTP API tests that need no real inference: the server is real, the models are stand-in
//! executors with known arithmetic (so every protocol path is checked against a hand-computed
//! answer).

mod common;

use std::sync::{Arc, Condvar, Mutex};

use common::*;
use serde_json::json;
use vigil::config::Limits;
use vigil::http::AppState;
use vigil::queue::Executor;
use vigil::registry::{LoadedModel, Registry};
use vigil_engine::vision::{
    Classification, DecodeLimits, ImageInference, Overrides, Results, Timings, VisionSpec,
};
use vigil_engine::{DataType, Tensor, TensorInfo};

/// A gate the slow executor waits on; counts how many jobs have entered.
#[derive(Default)]
struct Gate {
    state: Mutex<(bool, usize)>,
    cv: Condvar,
}

impl Gate {
    fn wait_open(&self) {
        let mut s = self.state.lock().unwrap();
        s.1 += 1;
        self.cv.notify_all();
        while !s.0 {
            s = self.cv.wait(s).unwrap();
        }
    }
    fn wait_entered(&self, n: usize) {
        let mut s = self.state.lock().unwrap();
        while s.1 < n {
            s = self.cv.wait(s).unwrap();
        }
    }
    fn open(&self) {
        self.state.lock().unwrap().0 = true;
        self.cv.notify_all();
    }
}

/// Stand-in model: `y = 2 * x` (FP32 [2, 3]) and `n = [sum of x as integer]` (INT64 [1]);
/// images are decoded with the `image` crate only for their size, and the answer is the first
/// `top_k` labels with score 1/(rank+1).
struct FakeExec {
    gate: Option<Arc<Gate>>,
}

impl Executor for FakeExec {
    fn run(&mut self, inputs: &[Tensor]) -> vigil_engine::Result<Vec<Tensor>> {
        let x = inputs[0].as_f32()?;
        let y: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
        let n = x.iter().sum::<f32>() as i64;
        Ok(vec![
            Tensor::from_f32(vec![2, 3], y)?,
            Tensor::from_i64(vec![1], vec![n])?,
        ])
    }

    fn infer_image(
        &mut self,
        spec: &VisionSpec,
        bytes: &[u8],
        _limits: &DecodeLimits,
        overrides: &Overrides,
    ) -> vigil_engine::Result<ImageInference> {
        if let Some(g) = &self.gate {
            g.wait_open();
        }
        let img = image::load_from_memory(bytes)
            .map_err(|e| vigil_engine::Error::Image(e.to_string()))?;
        let k = overrides.top_k.unwrap_or(spec.top_k).min(spec.labels.len());
        let classes = (0..k)
            .map(|i| Classification {
                class_id: i,
                label: spec.labels[i].clone(),
                score: 1.0 / (i as f32 + 1.0),
            })
            .collect();
        Ok(ImageInference {
            width: img.width(),
            height: img.height(),
            timings: Timings {
                decode_ms: 1.0,
                preprocess_ms: 2.0,
                inference_ms: 3.0,
                postprocess_ms: 4.0,
            },
            results: Results::Classes(classes),
        })
    }
}

fn labels() -> Vec<String> {
    ["zero", "one", "two", "three", "four", "five", "six"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

fn fake_model(name: &str, gate: Option<Arc<Gate>>, queue_depth: usize) -> LoadedModel {
    LoadedModel::from_executors(
        name,
        VisionSpec::efficientnet_lite0(labels()),
        vec![TensorInfo {
            name: "x".into(),
            dtype: DataType::F32,
            shape: vec![2, 3],
        }],
        vec![
            TensorInfo {
                name: "y".into(),
                dtype: DataType::F32,
                shape: vec![2, 3],
            },
            TensorInfo {
                name: "n".into(),
                dtype: DataType::I64,
                shape: vec![1],
            },
        ],
        vec![Box::new(FakeExec { gate })],
        queue_depth,
    )
}

fn server_with(limits: Limits, models: Vec<LoadedModel>) -> String {
    let mut r = Registry::new();
    for m in models {
        r.insert(m);
    }
    start(AppState::new(r, limits))
}

fn server() -> String {
    server_with(Limits::default(), vec![fake_model("fake", None, 8)])
}

fn png(w: u32, h: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8, y as u8, 7]));
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

/// A BMP header claiming `w` x `h` pixels with no pixel data.
fn bmp_header(w: i32, h: i32) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"BM");
    b.extend_from_slice(&(54u32 + 16).to_le_bytes()); // file size (lies)
    b.extend_from_slice(&[0; 4]);
    b.extend_from_slice(&54u32.to_le_bytes()); // pixel data offset
    b.extend_from_slice(&40u32.to_le_bytes()); // BITMAPINFOHEADER
    b.extend_from_slice(&w.to_le_bytes());
    b.extend_from_slice(&h.to_le_bytes());
    b.extend_from_slice(&1u16.to_le_bytes()); // planes
    b.extend_from_slice(&24u16.to_le_bytes()); // bpp
    b.extend_from_slice(&[0; 24]); // compression, sizes, resolution, colours
    b.extend_from_slice(&[0; 16]);
    b
}

#[test]
fn health_and_server_metadata() {
    let base = server();
    let live = get(&format!("{base}/v2/health/live"));
    assert_eq!(live.status, 200);
    assert!(live.header("x-request-id").is_some_and(|id| !id.is_empty()));
    assert_eq!(get(&format!("{base}/v2/health/ready")).status, 200);
    let meta = get(&format!("{base}/v2"));
    assert_eq!(meta.status, 200);
    let v = meta.json();
    assert_eq!(v["name"], "vigil");
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert!(v["extensions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e == "binary_tensor_data"));
}

#[test]
fn request_ids_are_unique_or_echoed() {
    let base = server();
    let a = get(&format!("{base}/v2")).header("x-request-id").unwrap();
    let b = get(&format!("{base}/v2")).header("x-request-id").unwrap();
    assert_ne!(a, b);
    let r = finish_with_id(&format!("{base}/v1/models/fake/infer"), "client-id-42");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-request-id").as_deref(), Some("client-id-42"));
    assert_eq!(r.json()["request_id"], "client-id-42");
}

fn finish_with_id(url: &str, id: &str) -> Reply {
    post(
        url,
        "image/png",
        &[("x-request-id", id.to_string())],
        &png(5, 4),
    )
}

#[test]
fn model_metadata_and_listing() {
    let base = server();
    let r = get(&format!("{base}/v2/models/fake"));
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["name"], "fake");
    assert_eq!(v["platform"], "onnx");
    assert_eq!(
        v["inputs"],
        json!([{ "name": "x", "datatype": "FP32", "shape": [2, 3] }])
    );
    assert_eq!(
        v["outputs"][1],
        json!({ "name": "n", "datatype": "INT64", "shape": [1] })
    );
    assert_eq!(get(&format!("{base}/v2/models/fake/ready")).status, 200);
    assert_eq!(
        get(&format!("{base}/v2/models/fake/versions/1")).json()["name"],
        "fake"
    );
    get(&format!("{base}/v2/models/fake/versions/7")).assert_json_error(404);
    let list = get(&format!("{base}/v1/models")).json();
    let models = list["models"].as_array().unwrap();
    assert_eq!(models.len(), 1);
    assert_eq!(models[0]["name"], "fake");
    assert_eq!(models[0]["task"], "classification");
    assert_eq!(models[0]["inputs"][0]["shape"], json!([2, 3]));
    assert_eq!(models[0]["labels"], 7);
}

#[test]
fn unknown_model_and_route_404() {
    let base = server();
    let m = get(&format!("{base}/v2/models/nope")).assert_json_error(404);
    assert!(m.contains("nope"), "{m}");
    get(&format!("{base}/v2/models/nope/ready")).assert_json_error(404);
    post(
        &format!("{base}/v1/models/nope/infer"),
        "image/png",
        &[],
        &png(2, 2),
    )
    .assert_json_error(404);
    post(
        &format!("{base}/v2/models/nope/infer"),
        "application/json",
        &[],
        b"{}",
    )
    .assert_json_error(404);
    get(&format!("{base}/no/such/route")).assert_json_error(404);
}

#[test]
fn wrong_method_405() {
    let base = server();
    get(&format!("{base}/v1/models/fake/infer")).assert_json_error(405);
    call("DELETE", &format!("{base}/v2")).assert_json_error(405);
    post(&format!("{base}/v2/health/live"), "text/plain", &[], b"x").assert_json_error(405);
}

#[test]
fn oversize_body_413_json() {
    let limits = Limits {
        max_body_bytes: 1024,
        ..Limits::default()
    };
    let base = server_with(limits, vec![fake_model("fake", None, 8)]);
    let big = vec![0u8; 4096];
    let msg = post(
        &format!("{base}/v1/models/fake/infer"),
        "application/octet-stream",
        &[],
        &big,
    )
    .assert_json_error(413);
    assert!(!msg.is_empty());
    post(
        &format!("{base}/v2/models/fake/infer"),
        "application/json",
        &[],
        &big,
    )
    .assert_json_error(413);
    let (ct, body) = multipart(&big);
    post(&format!("{base}/v1/models/fake/infer"), &ct, &[], &body).assert_json_error(413);
    // Still serving afterwards.
    assert_eq!(
        post(
            &format!("{base}/v1/models/fake/infer"),
            "image/png",
            &[],
            &png(3, 3)
        )
        .status,
        200
    );
}

#[test]
fn bad_images_are_rejected_with_json() {
    let base = server();
    let url = format!("{base}/v1/models/fake/infer");
    let m = post(&url, "image/jpeg", &[], b"").assert_json_error(400);
    assert!(m.contains("empty"), "{m}");
    post(
        &url,
        "application/octet-stream",
        &[],
        b"definitely not an image",
    )
    .assert_json_error(415);
    post(&url, "text/plain", &[], &png(2, 2)).assert_json_error(415);
    // curl --data-binary's default content type carries raw image bytes.
    assert_eq!(
        post(&url, "application/x-www-form-urlencoded", &[], &png(3, 3)).status,
        200
    );
    // GIF magic: a real format, but not one we decode.
    post(
        &url,
        "image/gif",
        &[],
        b"GIF89a\x01\x00\x01\x00\x00\x00\x00;",
    )
    .assert_json_error(415);
    // A PNG cut inside its header.
    let p = png(8, 8);
    post(&url, "image/png", &[], &p[..20]).assert_json_error(400);
    // Query validation.
    post(&format!("{url}?top_k=abc"), "image/png", &[], &p).assert_json_error(400);
    post(&format!("{url}?threshold=1.5"), "image/png", &[], &p).assert_json_error(400);
    post(&format!("{url}?top_k=0"), "image/png", &[], &p).assert_json_error(400);
}

#[test]
fn pixel_limit_413_before_decoding() {
    let limits = Limits {
        max_pixels: 1_000_000,
        ..Limits::default()
    };
    let base = server_with(limits, vec![fake_model("fake", None, 8)]);
    let m = post(
        &format!("{base}/v1/models/fake/infer"),
        "image/bmp",
        &[],
        &bmp_header(20_000, 20_000),
    )
    .assert_json_error(413);
    assert!(m.contains("400000000") && m.contains("1000000"), "{m}");
}

#[test]
fn image_infer_raw_and_multipart() {
    let base = server();
    let url = format!("{base}/v1/models/fake/infer?top_k=3");
    let r = post(&url, "image/png", &[], &png(6, 5));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["model"], "fake");
    assert_eq!(v["task"], "classification");
    assert_eq!(
        (v["width"].as_u64(), v["height"].as_u64()),
        (Some(6), Some(5))
    );
    assert_eq!(v["timings"]["inference_ms"], 3.0);
    assert!(v["timings"]["total_ms"].as_f64().unwrap() >= 0.0);
    let classes = v["results"]["classes"].as_array().unwrap();
    assert_eq!(classes.len(), 3);
    assert_eq!(
        classes[1],
        json!({ "class_id": 1, "label": "one", "score": 0.5 })
    );
    assert_eq!(
        v["request_id"].as_str(),
        r.header("x-request-id").as_deref()
    );

    let (ct, body) = multipart(&png(9, 2));
    let r = post(&format!("{base}/v1/models/fake/infer"), &ct, &[], &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(
        (v["width"].as_u64(), v["height"].as_u64()),
        (Some(9), Some(2))
    );
    assert_eq!(v["results"]["classes"].as_array().unwrap().len(), 5);
}

fn x_values() -> Vec<f32> {
    vec![1.0, -2.5, 3.25, 0.0, 10.0, -0.125]
}

#[test]
fn kserve_json_round_trip() {
    let base = server();
    let req = json!({
        "id": "abc",
        "inputs": [{ "name": "x", "shape": [2, 3], "datatype": "FP32", "data": [[1.0, -2.5, 3.25], [0, 10, -0.125]] }]
    });
    let r = post(
        &format!("{base}/v2/models/fake/infer"),
        "application/json",
        &[],
        req.to_string().as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["model_name"], "fake");
    assert_eq!(v["id"], "abc");
    let expect: Vec<f32> = x_values().iter().map(|x| x * 2.0).collect();
    assert_eq!(v["outputs"][0]["name"], "y");
    assert_eq!(v["outputs"][0]["datatype"], "FP32");
    assert_eq!(v["outputs"][0]["shape"], json!([2, 3]));
    let got: Vec<f32> = v["outputs"][0]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(got, expect);
    // sum = 11.625 -> 11
    assert_eq!(v["outputs"][1]["data"], json!([11]));
}

#[test]
fn kserve_binary_round_trip() {
    let base = server();
    let x = x_values();
    let header = json!({
        "inputs": [{ "name": "x", "shape": [2, 3], "datatype": "FP32", "parameters": { "binary_data_size": 24 } }],
        "outputs": [{ "name": "n" }, { "name": "y", "parameters": { "binary_data": true } }]
    });
    let (n, body) = binary_body(&header, &f32_bytes(&x));
    let r = post(
        &format!("{base}/v2/models/fake/infer"),
        "application/octet-stream",
        &[("Inference-Header-Content-Length", n.to_string())],
        &body,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let (h, tail) = split_binary(&r);
    // Requested order: n (JSON), then y (binary).
    assert_eq!(h["outputs"][0]["name"], "n");
    assert_eq!(h["outputs"][0]["data"], json!([11]));
    assert_eq!(h["outputs"][1]["name"], "y");
    assert_eq!(h["outputs"][1]["parameters"]["binary_data_size"], 24);
    assert!(h["outputs"][1].get("data").is_none());
    let expect: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
    assert_eq!(f32_from_bytes(&tail), expect);

    // Request-level binary_data_output: every output binary, in model order.
    let header = json!({
        "inputs": [{ "name": "x", "shape": [2, 3], "datatype": "FP32", "parameters": { "binary_data_size": 24 } }],
        "parameters": { "binary_data_output": true }
    });
    let (n, body) = binary_body(&header, &f32_bytes(&x));
    let r = post(
        &format!("{base}/v2/models/fake/infer"),
        "application/octet-stream",
        &[("Inference-Header-Content-Length", n.to_string())],
        &body,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let (h, tail) = split_binary(&r);
    assert_eq!(h["outputs"][1]["parameters"]["binary_data_size"], 8);
    assert_eq!(tail.len(), 32);
    assert_eq!(f32_from_bytes(&tail[..24]), expect);
    assert_eq!(i64::from_le_bytes(tail[24..].try_into().unwrap()), 11);
}

#[test]
fn kserve_bad_tensors_400() {
    let base = server();
    let url = format!("{base}/v2/models/fake/infer");
    let send = |v: serde_json::Value| post(&url, "application/json", &[], v.to_string().as_bytes());
    let m = send(json!({ "inputs": [{ "name": "x", "shape": [3, 2], "datatype": "FP32", "data": [1,2,3,4,5,6] }]}))
        .assert_json_error(400);
    assert!(m.contains("shape"), "{m}");
    let m = send(json!({ "inputs": [{ "name": "x", "shape": [2, 3], "datatype": "INT32", "data": [1,2,3,4,5,6] }]}))
        .assert_json_error(400);
    assert!(m.contains("datatype"), "{m}");
    let m = send(json!({ "inputs": [{ "name": "z", "shape": [2, 3], "datatype": "FP32", "data": [1,2,3,4,5,6] }]}))
        .assert_json_error(400);
    assert!(m.contains("unknown input"), "{m}");
    send(json!({ "inputs": [{ "name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1,2,3,4,5] }]}))
        .assert_json_error(400);
    send(json!({ "inputs": [{ "name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1,2,3,4,5,"a"] }]}))
        .assert_json_error(400);
    send(json!({ "inputs": [] })).assert_json_error(400);
    send(json!({ "inputs": [{ "name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1,2,3,4,5,6] }],
                 "outputs": [{ "name": "nope" }] }))
    .assert_json_error(400);
    post(&url, "application/json", &[], b"{not json").assert_json_error(400);
    // Binary size that does not fit the shape, and a header length beyond the body.
    let header = json!({ "inputs": [{ "name": "x", "shape": [2, 3], "datatype": "FP32", "parameters": { "binary_data_size": 20 } }] });
    let (n, body) = binary_body(&header, &[0u8; 20]);
    let m = post(
        &url,
        "application/octet-stream",
        &[("Inference-Header-Content-Length", n.to_string())],
        &body,
    )
    .assert_json_error(400);
    assert!(m.contains("binary_data_size"), "{m}");
    let header = json!({ "inputs": [{ "name": "x", "shape": [2, 3], "datatype": "FP32", "parameters": { "binary_data_size": 24 } }] });
    let (n, body) = binary_body(&header, &[0u8; 16]);
    post(
        &url,
        "application/octet-stream",
        &[("Inference-Header-Content-Length", n.to_string())],
        &body,
    )
    .assert_json_error(400);
    post(
        &url,
        "application/octet-stream",
        &[("Inference-Header-Content-Length", "999999".into())],
        b"{}",
    )
    .assert_json_error(400);
}

#[test]
fn metrics_after_requests() {
    let base = server_with(Limits::default(), vec![fake_model("metered", None, 8)]);
    assert_eq!(
        post(
            &format!("{base}/v1/models/metered/infer"),
            "image/png",
            &[],
            &png(3, 3)
        )
        .status,
        200
    );
    post(
        &format!("{base}/v1/models/metered/infer"),
        "image/png",
        &[],
        b"",
    )
    .assert_json_error(400);
    let m = get(&format!("{base}/metrics"));
    assert_eq!(m.status, 200);
    let text = m.text();
    for needle in [
        "vigil_requests_total{model=\"metered\",status=\"200\"}",
        "vigil_requests_total{model=\"metered\",status=\"400\"}",
        "vigil_request_duration_seconds_bucket{model=\"metered\",stage=\"inference\"",
        "vigil_request_duration_seconds_bucket{model=\"metered\",stage=\"total\"",
        "vigil_request_duration_seconds_bucket{model=\"metered\",stage=\"decode\",le=\"0.001\"}",
        "vigil_requests_in_flight",
        "vigil_queue_depth{model=\"metered\"}",
    ] {
        assert!(text.contains(needle), "missing {needle} in\n{text}");
    }
}

#[test]
fn queue_full_503_with_retry_after() {
    let gate = Arc::new(Gate::default());
    let base = server_with(
        Limits::default(),
        vec![fake_model("slow", Some(gate.clone()), 1)],
    );
    let url = format!("{base}/v1/models/slow/infer");
    let first = {
        let url = url.clone();
        std::thread::spawn(move || post(&url, "image/png", &[], &png(4, 4)))
    };
    // Wait until the first request is executing (holding the only queue slot).
    gate.wait_entered(1);
    let busy = post(&url, "image/png", &[], &png(4, 4));
    let msg = busy.assert_json_error(503);
    assert!(msg.contains("capacity"), "{msg}");
    assert_eq!(busy.header("retry-after").as_deref(), Some("1"));
    // A burst while full: every one is refused, none waits.
    let burst: Vec<_> = (0..8)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || post(&url, "image/png", &[], &png(2, 2)).status)
        })
        .collect();
    for b in burst {
        assert_eq!(b.join().unwrap(), 503);
    }
    let metrics = get(&format!("{base}/metrics")).text();
    assert!(
        metrics.contains("vigil_queue_depth{model=\"slow\"} 1"),
        "{metrics}"
    );
    gate.open();
    let r = first.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    // The slot is free again.
    assert_eq!(post(&url, "image/png", &[], &png(2, 2)).status, 200);
    let metrics = get(&format!("{base}/metrics")).text();
    assert!(
        metrics.contains("vigil_queue_depth{model=\"slow\"} 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("vigil_requests_total{model=\"slow\",status=\"503\"} 9"),
        "{metrics}"
    );
}

#[test]
fn tensor_data_kinds_accepted() {
    // INT64 output data and a flat FP32 input with integer literals both work.
    let base = server();
    let req = json!({ "inputs": [{ "name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6] }] });
    let r = post(
        &format!("{base}/v2/models/fake/infer"),
        "application/json",
        &[],
        req.to_string().as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["outputs"][1]["data"], json!([21]));
}
