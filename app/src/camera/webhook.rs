//! The webhook sink: POSTs a frame's detections as JSON to a configured `http://` URL when one of
//! the configured classes is seen, at most once per `min_interval_ms`. Calls run on their own
//! thread behind a small bounded queue, so a slow receiver never slows the pipeline (excess
//! events are dropped and counted).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vigil_engine::vision::Results;

use super::config::WebhookConfig;
use super::pipeline::FrameResult;

/// A parsed `http://host[:port]/path` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpUrl {
    /// Host name or IP address (IPv6 without brackets).
    pub host: String,
    /// TCP port (80 when the URL gives none).
    pub port: u16,
    /// Request path with any query string; "/" when the URL gives none.
    pub path: String,
}

/// Parses a plain-HTTP URL (no TLS, no credentials).
pub fn parse_http_url(url: &str) -> Result<HttpUrl, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("'{url}' is not an http:// URL"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() || authority.contains('@') {
        return Err(format!("'{url}' has no usable host"));
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => (
            h,
            p.parse::<u16>()
                .map_err(|_| format!("'{url}' has a bad port"))?,
        ),
        _ => (authority, 80),
    };
    Ok(HttpUrl {
        host: host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
        port,
        path: path.to_string(),
    })
}

/// The webhook of one camera.
pub struct Webhook {
    classes: Vec<String>,
    min_interval: Duration,
    last: std::sync::Mutex<Option<Instant>>,
    tx: SyncSender<Arc<FrameResult>>,
    camera: String,
}

/// Sends one JSON POST and reads the status line; returns the HTTP status.
pub fn post_json(url: &HttpUrl, body: &[u8], timeout: Duration) -> std::io::Result<u16> {
    let addr = (url.host.as_str(), url.port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::other("host did not resolve"))?;
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\nUser-Agent: vigil\r\n\r\n",
        url.path, url.host, url.port, body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf)?;
    let line = String::from_utf8_lossy(&buf[..n]);
    line.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("no HTTP status line"))
}

impl Webhook {
    /// Starts the sender thread.
    pub fn start(camera: &str, cfg: &WebhookConfig) -> Webhook {
        let (tx, rx) = sync_channel::<Arc<FrameResult>>(4);
        let url = parse_http_url(&cfg.url);
        let cam = camera.to_string();
        let spawned = std::thread::Builder::new()
            .name(format!("cam-{camera}-webhook"))
            .spawn(move || {
                let Ok(url) = url else { return };
                while let Ok(r) = rx.recv() {
                    let body = serde_json::to_vec(&*r).unwrap_or_default();
                    match post_json(&url, &body, Duration::from_secs(5)) {
                        Ok(status) if (200..300).contains(&status) => {
                            metrics::counter!("vigil_camera_webhooks_total", "camera" => cam.clone(), "outcome" => "sent").increment(1);
                        }
                        Ok(status) => {
                            tracing::warn!(camera = %cam, status, "webhook answered with an error");
                            metrics::counter!("vigil_camera_webhooks_total", "camera" => cam.clone(), "outcome" => "error").increment(1);
                        }
                        Err(e) => {
                            tracing::warn!(camera = %cam, error = %e, "webhook failed");
                            metrics::counter!("vigil_camera_webhooks_total", "camera" => cam.clone(), "outcome" => "error").increment(1);
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(camera, error = %e, "cannot start the webhook thread");
        }
        Webhook {
            classes: cfg.classes.clone(),
            min_interval: Duration::from_millis(cfg.min_interval_ms),
            last: std::sync::Mutex::new(None),
            tx,
            camera: camera.to_string(),
        }
    }

    /// Whether the results contain a configured class (any detection when none is configured).
    pub fn matches(&self, results: &Results) -> bool {
        match results {
            Results::Detections(d) => d
                .iter()
                .any(|d| self.classes.is_empty() || self.classes.contains(&d.label)),
            Results::Classes(c) => c
                .first()
                .is_some_and(|c| self.classes.is_empty() || self.classes.contains(&c.label)),
        }
    }

    /// Queues a call for this frame if it matches and the interval has passed; never blocks.
    pub fn offer(&self, r: &Arc<FrameResult>) {
        if !self.matches(&r.results) {
            return;
        }
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| t.elapsed() < self.min_interval) {
            return;
        }
        match self.tx.try_send(r.clone()) {
            Ok(()) => *last = Some(Instant::now()),
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                metrics::counter!("vigil_camera_webhooks_total", "camera" => self.camera.clone(), "outcome" => "dropped").increment(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_parsing() {
        assert_eq!(
            parse_http_url("http://127.0.0.1:9000/hook?x=1").unwrap(),
            HttpUrl {
                host: "127.0.0.1".into(),
                port: 9000,
                path: "/hook?x=1".into()
            }
        );
        assert_eq!(parse_http_url("http://example").unwrap().port, 80);
        assert_eq!(parse_http_url("http://example").unwrap().path, "/");
        assert!(parse_http_url("https://x/").is_err());
        assert!(parse_http_url("http://u:p@x/").is_err());
        assert!(parse_http_url("http://x:99999/").is_err());
    }
}
