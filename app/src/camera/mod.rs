//! Camera ingestion: sources → transforms → sinks, in Vector's vocabulary.
//!
//! A *source* ([`source::FrameSource`]: V4L2, an MJPEG file or stream, a directory of images, a
//! test pattern) yields raw frames on a capture thread. The newest frame waits in a one-slot
//! *latest-frame* buffer ([`pipeline::LatestSlot`]); older ones are dropped and counted, so
//! inference never blocks capture and nothing queues without bound. The *transform* stage runs on
//! the camera's own execution context: decode/convert ([`convert`]), the engine's preprocess, run
//! and postprocess. *Sinks* receive each result: a Tokio broadcast (SSE events), a watch of the
//! latest annotated frame (snapshots, MJPEG streams), metrics and an optional [`webhook`].
//! [`supervisor`] reopens a source that fails (ENODEV, stall, format error) with backoff.

pub mod annotate;
pub mod config;
pub mod convert;
pub mod negotiate;
pub mod pipeline;
pub mod source;
pub mod supervisor;
pub mod webhook;

pub use config::{CameraConfig, SourceKind};
pub use pipeline::{CameraHandle, CameraHub, FrameInfer, FrameResult, Published};
pub use source::{FrameSource, PixelFormat, RawFrame, SourceError, SourceErrorKind};

/// Registers the camera metrics' descriptions with the installed recorder.
pub fn describe_metrics() {
    metrics::describe_counter!(
        "vigil_camera_frames_total",
        "Camera frames by outcome: captured, inferred, dropped (replaced before inference), failed."
    );
    metrics::describe_gauge!(
        "vigil_camera_fps",
        "Camera frame rate in (captured) and out (inferred)."
    );
    metrics::describe_gauge!(
        "vigil_camera_up",
        "1 while the camera's source delivers frames."
    );
    metrics::describe_counter!(
        "vigil_camera_reconnects_total",
        "Camera source failures followed by a reopen."
    );
    metrics::describe_histogram!(
        "vigil_camera_stage_seconds",
        metrics::Unit::Seconds,
        "Per-frame camera stage times: convert, preprocess, inference, postprocess, latency."
    );
    metrics::describe_gauge!(
        "vigil_camera_stream_clients",
        "Connected stream.mjpeg clients."
    );
    metrics::describe_counter!("vigil_camera_webhooks_total", "Webhook calls by outcome.");
}
