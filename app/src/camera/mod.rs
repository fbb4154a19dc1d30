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
pub use pipeline::{CameraHub, CameraHandle, FrameInfer, FrameResult, Published};
pub use source::{FrameSource, PixelFormat, RawFrame, SourceError, SourceErrorKind};
