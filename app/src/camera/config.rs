//! Per-camera configuration (`[[cameras]]` in the daemon's TOML).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::convert::{YuvMatrix, YuvRange};
use super::source::PixelFormat;

/// Where a camera's frames come from (`kind = "v4l2" | "mjpeg_file" | "image_dir" | "test_pattern"`).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    /// A V4L2 capture device (`device`).
    #[default]
    V4l2,
    /// A file or FIFO of concatenated JPEGs (`path`), as a UVC camera sends them.
    MjpegFile,
    /// Every image in a directory (`path`), in name order.
    ImageDir,
    /// A generated moving test pattern.
    TestPattern,
}

/// An optional webhook fired when configured classes are detected (`[cameras.webhook]`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// `http://host:port/path` (plain HTTP; TLS terminates at a local relay).
    pub url: String,
    /// Class labels that fire it; empty means any detection.
    #[serde(default)]
    pub classes: Vec<String>,
    /// Least time between two calls, in milliseconds.
    #[serde(default = "default_webhook_interval")]
    pub min_interval_ms: u64,
}

fn default_webhook_interval() -> u64 {
    1000
}

/// One `[[cameras]]` entry.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CameraConfig {
    /// Name used in URLs (`/v1/cameras/{id}`).
    pub id: String,
    /// Source kind.
    #[serde(default)]
    pub kind: SourceKind,
    /// V4L2 device, e.g. `/dev/video0` or a stable `/dev/v4l/by-id/...` path.
    pub device: Option<PathBuf>,
    /// File or directory for `mjpeg_file` / `image_dir` (relative to the config file).
    pub path: Option<PathBuf>,
    /// Pixel formats in order of preference; the device's offer decides when none fits.
    #[serde(default = "default_formats")]
    pub formats: Vec<PixelFormat>,
    /// Wanted width in pixels.
    #[serde(default = "default_width")]
    pub width: u32,
    /// Wanted height in pixels.
    #[serde(default = "default_height")]
    pub height: u32,
    /// Wanted frame rate (also the playback rate of file sources when `realtime`).
    #[serde(default = "default_fps")]
    pub fps: f64,
    /// File sources: play at `fps` (true) or as fast as possible (false).
    #[serde(default = "default_true")]
    pub realtime: bool,
    /// File sources: start again at the end instead of finishing.
    #[serde(default = "default_true")]
    pub looping: bool,
    /// Model name (from `[[models]]` or the defaults).
    pub model: String,
    /// Minimum score (overrides the model's).
    pub threshold: Option<f32>,
    /// Least time between two inferences in milliseconds (0 = as often as possible).
    #[serde(default)]
    pub interval_ms: u64,
    /// No frame for this long counts as a stall: the source is closed and reopened.
    #[serde(default = "default_stall")]
    pub stall_timeout_ms: u64,
    /// First reopen delay; doubles up to `backoff_max_ms`.
    #[serde(default = "default_backoff_initial")]
    pub backoff_initial_ms: u64,
    /// Longest reopen delay.
    #[serde(default = "default_backoff_max")]
    pub backoff_max_ms: u64,
    /// YUV matrix of YUYV/NV12 frames.
    #[serde(default)]
    pub yuv_matrix: YuvMatrix,
    /// YUV range of YUYV/NV12 frames.
    #[serde(default)]
    pub yuv_range: YuvRange,
    /// Most frames per second sent to one `stream.mjpeg` client.
    #[serde(default = "default_stream_fps")]
    pub stream_fps: f64,
    /// Optional webhook.
    pub webhook: Option<WebhookConfig>,
}

fn default_formats() -> Vec<PixelFormat> {
    vec![PixelFormat::Mjpeg, PixelFormat::Yuyv, PixelFormat::Nv12]
}
fn default_width() -> u32 {
    640
}
fn default_height() -> u32 {
    480
}
fn default_fps() -> f64 {
    30.0
}
fn default_true() -> bool {
    true
}
fn default_stall() -> u64 {
    5000
}
fn default_backoff_initial() -> u64 {
    500
}
fn default_backoff_max() -> u64 {
    30_000
}
fn default_stream_fps() -> f64 {
    10.0
}

impl CameraConfig {
    /// A config with defaults for `id`, `kind` and `model` (embedding and tests).
    pub fn new(id: &str, kind: SourceKind, model: &str) -> CameraConfig {
        CameraConfig {
            id: id.to_string(),
            kind,
            device: None,
            path: None,
            formats: default_formats(),
            width: default_width(),
            height: default_height(),
            fps: default_fps(),
            realtime: true,
            looping: true,
            model: model.to_string(),
            threshold: None,
            interval_ms: 0,
            stall_timeout_ms: default_stall(),
            backoff_initial_ms: default_backoff_initial(),
            backoff_max_ms: default_backoff_max(),
            yuv_matrix: YuvMatrix::default(),
            yuv_range: YuvRange::default(),
            stream_fps: default_stream_fps(),
            webhook: None,
        }
    }

    /// Resolves relative `path`/`device` against the config file's directory.
    pub fn resolve_paths(&mut self, base_dir: &Path) {
        if let Some(p) = &mut self.path {
            if p.is_relative() {
                *p = base_dir.join(&*p);
            }
        }
    }

    /// Checks ranges and required fields.
    pub fn validate(&self) -> Result<(), String> {
        let id = &self.id;
        if id.is_empty()
            || !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(format!(
                "camera id '{id}' must be non-empty and use only letters, digits, '-', '_' or '.'"
            ));
        }
        match self.kind {
            SourceKind::V4l2 if self.device.is_none() => {
                return Err(format!("camera '{id}': kind = \"v4l2\" needs `device`"))
            }
            SourceKind::MjpegFile | SourceKind::ImageDir if self.path.is_none() => {
                return Err(format!("camera '{id}': this kind needs `path`"))
            }
            _ => {}
        }
        if self.width == 0 || self.height == 0 || self.width > 16384 || self.height > 16384 {
            return Err(format!("camera '{id}': width and height must be 1..=16384"));
        }
        let fps_ok = self.fps > 0.0 && self.fps <= 1000.0;
        let stream_ok = self.stream_fps > 0.0 && self.stream_fps.is_finite();
        if !fps_ok || !stream_ok {
            return Err(format!(
                "camera '{id}': fps and stream_fps must be positive (fps at most 1000)"
            ));
        }
        if let Some(t) = self.threshold {
            if !(0.0..=1.0).contains(&t) {
                return Err(format!("camera '{id}': threshold must be between 0 and 1"));
            }
        }
        if self.stall_timeout_ms == 0 || self.backoff_initial_ms == 0 {
            return Err(format!(
                "camera '{id}': stall_timeout_ms and backoff_initial_ms must be at least 1"
            ));
        }
        if self.formats.is_empty() {
            return Err(format!("camera '{id}': formats must not be empty"));
        }
        if let Some(w) = &self.webhook {
            super::webhook::parse_http_url(&w.url)
                .map_err(|e| format!("camera '{id}': webhook: {e}"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_with_defaults_and_rejects_unknown_keys() {
        let c: CameraConfig = toml::from_str(
            "id = \"front\"\ndevice = \"/dev/video0\"\nmodel = \"nanodet-m-416\"\nformats = [\"yuyv\", \"mjpeg\"]\n",
        )
        .unwrap();
        assert_eq!(c.kind, SourceKind::V4l2);
        assert_eq!(c.formats, vec![PixelFormat::Yuyv, PixelFormat::Mjpeg]);
        assert_eq!((c.width, c.height, c.stall_timeout_ms), (640, 480, 5000));
        assert!(c.validate().is_ok());
        let e = toml::from_str::<CameraConfig>("id = \"a\"\nmodel = \"m\"\nfsp = 3\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("fsp"), "{e}");
    }

    #[test]
    fn validation_catches_bad_values() {
        let mut c = CameraConfig::new("a b", SourceKind::TestPattern, "m");
        assert!(c.validate().is_err());
        c.id = "a".into();
        assert!(c.validate().is_ok());
        c.kind = SourceKind::MjpegFile;
        assert!(c.validate().unwrap_err().contains("path"));
        c.kind = SourceKind::TestPattern;
        c.threshold = Some(1.5);
        assert!(c.validate().is_err());
        c.threshold = None;
        c.webhook = Some(WebhookConfig {
            url: "https://x/".into(),
            classes: vec![],
            min_interval_ms: 0,
        });
        assert!(c.validate().is_err());
    }
}
