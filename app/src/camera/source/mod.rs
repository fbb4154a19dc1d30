//! Frame sources: the one interface every camera input implements, and the sources themselves.

pub mod image_dir;
pub mod mjpeg_file;
pub mod test_pattern;
#[cfg(target_os = "linux")]
pub mod v4l2;

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::config::{CameraConfig, SourceKind};

/// Pixel formats Vigil can convert (`"mjpeg" | "yuyv" | "nv12" | "rgb24"`).
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum PixelFormat {
    /// Motion JPEG: one JPEG per frame.
    Mjpeg,
    /// Packed YUV 4:2:2 (Y0 U Y1 V).
    Yuyv,
    /// Y plane + interleaved UV plane, 4:2:0.
    Nv12,
    /// Packed RGB, 8 bits per channel.
    Rgb24,
}

impl PixelFormat {
    /// The V4L2 FourCC code.
    pub fn fourcc(self) -> [u8; 4] {
        match self {
            PixelFormat::Mjpeg => *b"MJPG",
            PixelFormat::Yuyv => *b"YUYV",
            PixelFormat::Nv12 => *b"NV12",
            PixelFormat::Rgb24 => *b"RGB3",
        }
    }

    /// The format for a V4L2 FourCC (JPEG is treated as MJPEG).
    pub fn from_fourcc(code: [u8; 4]) -> Option<PixelFormat> {
        match &code {
            b"MJPG" | b"JPEG" => Some(PixelFormat::Mjpeg),
            b"YUYV" => Some(PixelFormat::Yuyv),
            b"NV12" => Some(PixelFormat::Nv12),
            b"RGB3" => Some(PixelFormat::Rgb24),
            _ => None,
        }
    }

    /// Lower-case name as used in the config.
    pub fn name(self) -> &'static str {
        match self {
            PixelFormat::Mjpeg => "mjpeg",
            PixelFormat::Yuyv => "yuyv",
            PixelFormat::Nv12 => "nv12",
            PixelFormat::Rgb24 => "rgb24",
        }
    }
}

/// One captured frame, before conversion.
#[derive(Clone, Debug)]
pub struct RawFrame {
    /// Layout of `data`.
    pub format: PixelFormat,
    /// Width in pixels (for MJPEG: as negotiated; the JPEG header decides).
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Bytes per row of the (first) plane; 0 means tightly packed.
    pub stride: usize,
    /// Frame bytes.
    pub data: Vec<u8>,
    /// Capture sequence number, assigned by the pipeline (0, 1, 2, ... per open).
    pub seq: u64,
    /// When the frame was read.
    pub captured: Instant,
}

impl RawFrame {
    /// A tightly packed frame captured now.
    pub fn new(format: PixelFormat, width: u32, height: u32, data: Vec<u8>) -> RawFrame {
        RawFrame {
            format,
            width,
            height,
            stride: 0,
            data,
            seq: 0,
            captured: Instant::now(),
        }
    }
}

/// Why a source stopped producing frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceErrorKind {
    /// The device went away (ENODEV, unplugged).
    Disconnected,
    /// No frame arrived within the stall timeout.
    Stalled,
    /// The device cannot deliver a usable format, or a frame is malformed.
    Format,
    /// Any other I/O error (open failed, permission, EIO).
    Io,
    /// A finite source (non-looping file) is exhausted.
    EndOfStream,
}

/// A source failure with its kind and a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceError {
    /// What went wrong.
    pub kind: SourceErrorKind,
    /// Details for the API and logs.
    pub message: String,
}

impl SourceError {
    /// An error of `kind`.
    pub fn new(kind: SourceErrorKind, message: impl Into<String>) -> SourceError {
        SourceError {
            kind,
            message: message.into(),
        }
    }

    /// Maps an I/O error: ENODEV/ENXIO/ENOENT → disconnected, timeouts → stalled, else I/O.
    pub fn from_io(context: &str, e: &std::io::Error) -> SourceError {
        let kind = match e.raw_os_error() {
            Some(19) | Some(6) | Some(2) => SourceErrorKind::Disconnected, // ENODEV, ENXIO, ENOENT
            _ if e.kind() == std::io::ErrorKind::TimedOut => SourceErrorKind::Stalled,
            _ if e.kind() == std::io::ErrorKind::NotFound => SourceErrorKind::Disconnected,
            _ => SourceErrorKind::Io,
        };
        SourceError::new(kind, format!("{context}: {e}"))
    }
}

impl std::fmt::Display for SourceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

impl std::error::Error for SourceError {}

/// What an opened source delivers (after negotiation).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SourceInfo {
    /// Human-readable description (device card name, file path, ...).
    pub description: String,
    /// Pixel format of the frames.
    pub format: PixelFormat,
    /// Frame width.
    pub width: u32,
    /// Frame height.
    pub height: u32,
    /// Nominal frame rate (0 when unpaced).
    pub fps: f64,
}

/// A source of frames. `next_frame` blocks for at most about `timeout`; a source that has no
/// frame by then returns [`SourceErrorKind::Stalled`].
pub trait FrameSource: Send {
    /// What the source delivers.
    fn info(&self) -> SourceInfo;
    /// The next frame.
    fn next_frame(&mut self, timeout: Duration) -> Result<RawFrame, SourceError>;
}

/// Opens a source as configured (used by the supervisor at every (re)open).
pub type SourceFactory = Box<dyn FnMut() -> Result<Box<dyn FrameSource>, SourceError> + Send>;

/// The factory for a camera's configured source.
pub fn factory_for(cfg: &CameraConfig, max_pixels: u64) -> SourceFactory {
    let cfg = cfg.clone();
    Box::new(move || -> Result<Box<dyn FrameSource>, SourceError> {
        match cfg.kind {
            SourceKind::MjpegFile => {
                let path = cfg.path.clone().unwrap_or_default();
                let fps = cfg.realtime.then_some(cfg.fps);
                Ok(Box::new(mjpeg_file::MjpegFileSource::open(
                    &path,
                    fps,
                    cfg.looping,
                )?))
            }
            SourceKind::ImageDir => {
                let path = cfg.path.clone().unwrap_or_default();
                let fps = cfg.realtime.then_some(cfg.fps);
                Ok(Box::new(image_dir::ImageDirSource::open(
                    &path,
                    fps,
                    cfg.looping,
                    max_pixels,
                )?))
            }
            SourceKind::TestPattern => Ok(Box::new(test_pattern::TestPattern::new(
                cfg.width,
                cfg.height,
                cfg.realtime.then_some(cfg.fps),
            ))),
            SourceKind::V4l2 => open_v4l2(&cfg),
        }
    })
}

#[cfg(target_os = "linux")]
fn open_v4l2(cfg: &CameraConfig) -> Result<Box<dyn FrameSource>, SourceError> {
    let device = cfg.device.clone().unwrap_or_default();
    let want = super::negotiate::Request {
        formats: cfg.formats.clone(),
        width: cfg.width,
        height: cfg.height,
        fps: cfg.fps,
    };
    Ok(Box::new(v4l2::V4l2Source::open_path(&device, &want)?))
}

#[cfg(not(target_os = "linux"))]
fn open_v4l2(_cfg: &CameraConfig) -> Result<Box<dyn FrameSource>, SourceError> {
    Err(SourceError::new(
        SourceErrorKind::Io,
        "V4L2 capture is only available on Linux",
    ))
}

/// Paces a source at `fps`: sleeps until frame `n`'s due time (no catch-up bursts after a stall).
#[derive(Debug)]
pub struct Pacer {
    period: Option<Duration>,
    next_due: Option<Instant>,
}

impl Pacer {
    /// A pacer for `fps` (None or non-positive: unpaced).
    pub fn new(fps: Option<f64>) -> Pacer {
        let period = fps
            .filter(|f| *f > 0.0 && f.is_finite())
            .map(|f| Duration::from_secs_f64(1.0 / f));
        Pacer {
            period,
            next_due: None,
        }
    }

    /// Waits for the next frame slot.
    pub fn wait(&mut self) {
        let Some(period) = self.period else { return };
        let now = Instant::now();
        let due = self.next_due.unwrap_or(now);
        if due > now {
            std::thread::sleep(due - now);
        }
        let base = if due + period < now { now } else { due };
        self.next_due = Some(base + period);
    }
}
