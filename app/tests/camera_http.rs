//! The camera HTTP API on a real server (127.0.0.1:0): listing, snapshots, two concurrent MJPEG
//! clients plus one that stops reading, Server-Sent Events, the webhook and metrics.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vigil::camera::config::{CameraConfig, SourceKind, WebhookConfig};
use vigil::camera::pipeline::{start_camera, CameraHub, FrameInfer, FrameTimings, Transform};
use vigil::camera::source::test_pattern::TestPattern;
use vigil::camera::source::FrameSource;
use vigil::config::Limits;
use vigil::http::AppState;
use vigil::registry::Registry;
use vigil_engine::vision::{BBox, Detection, Overrides, Results, VisionSpec};

/// Reports one "person" box in the left half of every frame.
struct OnePerson;

impl FrameInfer for OnePerson {
    fn infer_rgb(
        &mut self,
        img: &image::RgbImage,
        _s: &VisionSpec,
        _o: &Overrides,
        _t: &mut FrameTimings,
    ) -> vigil_engine::Result<Results> {
        let (w, h) = (img.width() as f32, img.height() as f32);
        Ok(Results::Detections(vec![Detection {
            class_id: 0,
            label: "person".into(),
            score: 0.9,
            bbox: BBox {
                x1: w * 0.1,
                y1: h * 0.2,
                x2: w * 0.5,
                y2: h * 0.9,
            },
        }]))
    }
}

fn camera(id: &str, webhook: Option<String>) -> Arc<vigil::camera::CameraHandle> {
    let mut c = CameraConfig::new(id, SourceKind::TestPattern, "stand-in");
    c.width = 160;
    c.height = 120;
    c.stream_fps = 50.0;
    c.webhook = webhook.map(|url| WebhookConfig {
        url,
        classes: vec!["person".into()],
        min_interval_ms: 0,
    });
    let t = Transform {
        infer: Box::new(OnePerson),
        spec: VisionSpec::nanodet_m_416(vec![]),
        max_pixels: 1 << 24,
    };
    let f: vigil::camera::source::SourceFactory =
        Box::new(|| Ok(Box::new(TestPattern::new(160, 120, Some(60.0))) as Box<dyn FrameSource>));
    start_camera(c, f, t).unwrap()
}

struct Server {
    base: String,
    addr: String,
    hub_cams: Vec<Arc<vigil::camera::CameraHandle>>,
}

fn server(webhook: Option<String>) -> Server {
    let mut hub = CameraHub::new();
    let a = camera("a", webhook);
    let b = camera("b", None);
    hub.insert(a.clone());
    hub.insert(b.clone());
    let state = AppState::with_cameras(Registry::new(), Limits::default(), hub);
    let base = common::start(state);
    let addr = base.trim_start_matches("http://").to_string();
    // Wait for the first published frame.
    let deadline = Instant::now() + Duration::from_secs(60);
    while a.latest().is_none() || b.latest().is_none() {
        assert!(Instant::now() < deadline, "no frame published");
        std::thread::sleep(Duration::from_millis(5));
    }
    Server {
        base,
        addr,
        hub_cams: vec![a, b],
    }
}

/// Opens a raw HTTP/1.1 GET and returns the stream (headers not yet read).
fn raw_get(addr: &str, path: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    s
}

fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

/// Reads until `needle` occurs `n` times; returns everything read.
fn read_until(s: &mut TcpStream, needle: &[u8], n: usize) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16384];
    while count(&buf, needle) < n {
        let k = s.read(&mut chunk).unwrap();
        assert!(
            k > 0,
            "stream closed early: {}",
            String::from_utf8_lossy(&buf[..buf.len().min(400)])
        );
        buf.extend_from_slice(&chunk[..k]);
    }
    buf
}

#[test]
fn list_and_snapshot() {
    let srv = server(None);
    let r = common::get(&format!("{}/v1/cameras", srv.base));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let cams = v["cameras"].as_array().unwrap();
    assert_eq!(cams.len(), 2);
    let a = &cams[0];
    assert_eq!(a["id"], "a");
    assert_eq!(a["state"], "running");
    assert!(a["frames_captured"].as_u64().unwrap() >= 1);
    assert!(a["fps_in"].is_number() && a["fps_out"].is_number() && a["frames_dropped"].is_number());
    assert!(a["last_error"].is_null());
    assert_eq!(a["source"]["format"], "rgb24");
    assert_eq!(
        a["last_result"]["results"]["detections"][0]["label"],
        "person"
    );

    let one = common::get(&format!("{}/v1/cameras/b", srv.base));
    assert_eq!(one.json()["id"], "b");
    common::get(&format!("{}/v1/cameras/zzz", srv.base)).assert_json_error(404);
    common::get(&format!("{}/v1/cameras/zzz/snapshot.jpg", srv.base)).assert_json_error(404);
    common::get(&format!(
        "{}/v1/cameras/a/snapshot.jpg?annotate=maybe",
        srv.base
    ))
    .assert_json_error(400);

    let plain = common::get(&format!(
        "{}/v1/cameras/a/snapshot.jpg?annotate=false",
        srv.base
    ));
    assert_eq!(plain.status, 200);
    assert_eq!(plain.header("content-type").as_deref(), Some("image/jpeg"));
    let img = image::load_from_memory(&plain.body).unwrap().to_rgb8();
    assert_eq!(img.dimensions(), (160, 120));
    let ann = common::get(&format!("{}/v1/cameras/a/snapshot.jpg", srv.base));
    let aimg = image::load_from_memory(&ann.body).unwrap().to_rgb8();
    // The box's left edge (x = 16) is drawn in the person colour (red) in the annotated image.
    let p = aimg.get_pixel(16, 60).0;
    assert!(
        p[0] > 200 && p[1] < 110 && p[2] < 110,
        "box edge pixel {p:?}"
    );
    let diff: u64 = img
        .as_raw()
        .iter()
        .zip(aimg.as_raw())
        .map(|(a, b)| u64::from(a.abs_diff(*b)))
        .sum();
    assert!(diff > 10_000, "annotation should change the picture");

    let m = common::get(&format!("{}/metrics", srv.base)).text();
    assert!(
        m.contains("vigil_camera_frames_total{camera=\"a\",outcome=\"captured\"}"),
        "{m}"
    );
    assert!(m.contains("vigil_camera_up{camera=\"a\"} 1"), "{m}");
    assert!(
        m.contains("vigil_camera_stage_seconds_bucket{camera=\"a\",stage=\"inference\""),
        "{m}"
    );
    for c in &srv.hub_cams {
        c.stop();
    }
}

#[test]
fn two_mjpeg_clients_and_one_that_stops_reading() {
    let srv = server(None);
    // A client that sends its request and then never reads.
    let stalled = raw_get(&srv.addr, "/v1/cameras/a/stream.mjpeg?fps=50");
    let mut c1 = raw_get(&srv.addr, "/v1/cameras/a/stream.mjpeg?fps=50");
    let mut c2 = raw_get(
        &srv.addr,
        "/v1/cameras/a/stream.mjpeg?fps=50&annotate=false",
    );
    let b1 = read_until(&mut c1, b"Content-Type: image/jpeg", 5);
    let b2 = read_until(&mut c2, b"Content-Type: image/jpeg", 5);
    for b in [&b1, &b2] {
        let head = String::from_utf8_lossy(&b[..200.min(b.len())]).to_string();
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(
            head.contains("multipart/x-mixed-replace; boundary=vigilframe"),
            "{head}"
        );
        assert!(count(b, b"--vigilframe\r\n") >= 5);
        // Each part is a whole JPEG of the frame size.
        let start = b.windows(2).position(|w| w == [0xFF, 0xD8]).unwrap();
        let end = start
            + b[start..]
                .windows(2)
                .position(|w| w == [0xFF, 0xD9])
                .unwrap()
            + 2;
        let img = image::load_from_memory(&b[start..end]).unwrap();
        assert_eq!((img.width(), img.height()), (160, 120));
    }
    // The pipeline and the readers keep going while the stalled client holds its connection.
    let cam = &srv.hub_cams[0];
    let before = cam.summary().frames_inferred;
    let more = read_until(&mut c1, b"Content-Type: image/jpeg", 40);
    assert!(count(&more, b"--vigilframe\r\n") >= 40);
    let after = cam.summary().frames_inferred;
    assert!(
        after > before + 10,
        "pipeline advanced from {before} to {after} while a client stalled"
    );
    let s = cam.summary();
    assert!(s.frames_captured >= s.frames_inferred);
    drop(stalled);
    for c in &srv.hub_cams {
        c.stop();
    }
}

#[test]
fn server_sent_events_and_webhook() {
    // A loopback receiver for the webhook.
    let hook = TcpListener::bind("127.0.0.1:0").unwrap();
    let hook_url = format!("http://{}/hook", hook.local_addr().unwrap());
    let srv = server(Some(hook_url));
    let mut s = raw_get(&srv.addr, "/v1/cameras/a/events");
    let buf = read_until(&mut s, b"event: detections", 4);
    let text = String::from_utf8_lossy(&buf).to_string();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("content-type: text/event-stream"), "{text}");
    let frames: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    assert!(frames.len() >= 3, "{text}");
    let seqs: Vec<u64> = frames.iter().map(|f| f["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    assert_eq!(frames[0]["camera"], "a");
    assert_eq!(frames[0]["results"]["detections"][0]["label"], "person");
    common::get(&format!("{}/v1/cameras/nope/events", srv.base)).assert_json_error(404);

    // The webhook POSTs a frame with a person in it.
    hook.set_nonblocking(false).unwrap();
    let (mut conn, _) = hook.accept().unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut req = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = conn.read(&mut chunk).unwrap();
        req.extend_from_slice(&chunk[..n]);
        let t = String::from_utf8_lossy(&req).to_string();
        if let Some(i) = t.find("\r\n\r\n") {
            let len: usize = t
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            if req.len() >= i + 4 + len {
                let body: serde_json::Value =
                    serde_json::from_slice(&req[i + 4..i + 4 + len]).unwrap();
                assert!(t.starts_with("POST /hook HTTP/1.1"), "{t}");
                assert_eq!(body["camera"], "a");
                assert_eq!(body["results"]["detections"][0]["label"], "person");
                break;
            }
        }
        assert!(n > 0, "webhook connection closed early");
    }
    conn.write_all(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
        .unwrap();
    for c in &srv.hub_cams {
        c.stop();
    }
}
