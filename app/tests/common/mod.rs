//! Shared test helpers: start the real server in-process on 127.0.0.1:0 and talk to it with ureq.

#![allow(dead_code)]

use std::sync::Arc;

use vigil::http::{serve_with, AppState};

/// Starts the server on an ephemeral port in a background runtime; returns its base URL.
pub fn start(state: Arc<AppState>) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.set_nonblocking(true).expect("set_nonblocking");
    let addr = listener.local_addr().expect("local_addr");
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(listener).expect("from_std");
            serve_with(l, state).await.expect("serve");
        });
    });
    format!("http://{addr}")
}

/// A ureq agent that returns non-2xx responses instead of erroring.
pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into()
}

/// A response read fully: status, headers, body.
pub struct Reply {
    pub status: u16,
    pub headers: ureq::http::HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    /// The body parsed as JSON (panics with the body text if it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// A header value as a string.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }

    /// Asserts an error response: the status, a JSON body with a non-empty "error" and the same "code".
    pub fn assert_json_error(&self, status: u16) -> String {
        assert_eq!(self.status, status, "body: {}", self.text());
        let v = self.json();
        let msg = v["error"]
            .as_str()
            .unwrap_or_else(|| panic!("no error field in {v}"))
            .to_string();
        assert!(!msg.is_empty());
        assert_eq!(v["code"].as_u64(), Some(status as u64), "{v}");
        msg
    }
}

fn finish(resp: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Reply {
    let mut resp = resp.unwrap_or_else(|e| panic!("request failed: {e}"));
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp
        .body_mut()
        .with_config()
        .limit(256 * 1024 * 1024)
        .read_to_vec()
        .expect("read body");
    Reply {
        status,
        headers,
        body,
    }
}

/// GET a URL.
pub fn get(url: &str) -> Reply {
    finish(agent().get(url).call())
}

/// POST bytes with a content type and extra headers.
pub fn post(url: &str, content_type: &str, headers: &[(&str, String)], body: &[u8]) -> Reply {
    let mut req = agent().post(url).header("content-type", content_type);
    for (k, v) in headers {
        req = req.header(*k, v.as_str());
    }
    finish(req.send(body))
}

/// Sends a request with any method and no body.
pub fn call(method: &str, url: &str) -> Reply {
    let req = ureq::http::Request::builder()
        .method(method)
        .uri(url)
        .body(())
        .expect("request");
    finish(agent().run(req))
}

/// A multipart/form-data body with one text field and one file field.
pub fn multipart(file: &[u8]) -> (String, Vec<u8>) {
    let boundary = "vigil-test-boundary-7d1f";
    let mut body = Vec::new();
    body.extend_from_slice(
        format!("--{boundary}\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nhello\r\n")
            .as_bytes(),
    );
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"image\"; filename=\"x.png\"\r\n\
             Content-Type: image/png\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(file);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// Builds a KServe binary-extension body: JSON header followed by raw bytes.
pub fn binary_body(header: &serde_json::Value, tail: &[u8]) -> (usize, Vec<u8>) {
    let mut body = serde_json::to_vec(header).expect("json");
    let n = body.len();
    body.extend_from_slice(tail);
    (n, body)
}

/// Little-endian bytes of f32 values.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// f32 values from little-endian bytes.
pub fn f32_from_bytes(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Splits a binary-extension response into (JSON header, binary tail).
pub fn split_binary(r: &Reply) -> (serde_json::Value, Vec<u8>) {
    let n: usize = r
        .header("inference-header-content-length")
        .unwrap_or_else(|| panic!("no Inference-Header-Content-Length; body {}", r.text()))
        .parse()
        .expect("header length");
    let header = serde_json::from_slice(&r.body[..n]).expect("json header");
    (header, r.body[n..].to_vec())
}

/// The value of gauge `name` of memory pool `pool` in a metrics page, with `kind="<kind>"` when
/// given (`vigil_memory_pool_bytes{kind="reserved",pool="host"}`).
pub fn pool_gauge(page: &str, name: &str, pool: &str, kind: Option<&str>) -> Option<f64> {
    page.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(&format!("pool=\"{pool}\"")))
        .find(|l| kind.is_none_or(|k| l.contains(&format!("kind=\"{k}\""))))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}
