//! Image decoding, preprocessing and post-processing: bytes in, input tensor out; output
//! tensors in, classes or boxes (in original-image pixels) out.
//!
//! API surface used by the app (the implementation lives in the submodules).

use serde::Serialize;

mod accel;
mod classify;
mod decode;
pub(crate) mod detect;
mod pipeline;
pub(crate) mod preprocess;
#[cfg(test)]
mod tests;
pub mod yuv;

#[cfg(feature = "cuda")]
pub use accel::GpuVision;
pub use accel::{Preprocessor, YuvFrame, YuvLayout};
pub use classify::{classify, softmax};
pub use decode::{decode_image, probe_image, sniff_format};
pub use detect::{decode_nanodet, decode_yolov8, iou, nms};
pub use pipeline::{infer_image, load_labels, parse_labels, postprocess};
pub use preprocess::{preprocess, resize_bilinear};

/// Limits applied while decoding untrusted images.
#[derive(Clone, Copy, Debug)]
pub struct DecodeLimits {
    /// Largest accepted width*height (decompression-bomb guard), checked before decoding pixels.
    pub max_pixels: u64,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits {
            max_pixels: 40_000_000,
        }
    }
}

/// How an image is fitted to the model's input size.
#[derive(Clone, Debug, PartialEq, serde::Deserialize, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum ResizeMode {
    /// Scale x and y independently to the input size.
    Stretch,
    /// Keep aspect ratio, pad the rest with `pad_value`.
    Letterbox { pad_value: u8 },
    /// Resize so the short side is `short_side` (bilinear), then centre-crop to the input size.
    ShortSideCenterCrop { short_side: u32 },
}

/// Preprocessing recipe: value = ((pixel * scale) - mean[c]) / std[c], laid out NCHW.
#[derive(Clone, Debug, PartialEq, serde::Deserialize, Serialize)]
pub struct Preprocess {
    pub width: u32,
    pub height: u32,
    pub resize: ResizeMode,
    pub scale: f32,
    pub mean: [f32; 3],
    pub std: [f32; 3],
    /// Feed channels as BGR instead of RGB.
    pub bgr: bool,
}

/// Maps model-input pixel coordinates back to original-image pixels.
///
/// Per axis: `original_x = (input_x - offset_x) * scale_x` (same for y). Stretch: offset 0,
/// scale = orig/input. Letterbox: offset = padding before the image, scale = orig/resized.
/// Centre crop: offset = -(crop origin in the resized image), scale = orig/resized. Boxes are
/// clamped to `[0, orig_width] x [0, orig_height]` after mapping.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ImageTransform {
    pub scale_x: f32,
    pub scale_y: f32,
    pub offset_x: f32,
    pub offset_y: f32,
    pub orig_width: u32,
    pub orig_height: u32,
}

/// The kind of detection head a model has.
#[derive(Clone, Debug, PartialEq, serde::Deserialize, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum DetectionHead {
    /// NanoDet GFL head: per stride, scores [1, N, C] (sigmoided) and boxes [1, N, 4*(reg_max+1)].
    Nanodet { reg_max: usize, strides: Vec<usize> },
    /// YOLOv8 head: [1, 4 + C, N] with cx, cy, w, h then class scores.
    Yolov8,
}

/// What a model does.
#[derive(Clone, Debug, PartialEq, serde::Deserialize, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Task {
    Classification {
        /// Apply softmax to the logits (false when the model already outputs probabilities).
        softmax: bool,
    },
    Detection {
        head: DetectionHead,
    },
}

/// Everything needed to go from an image to results with one model.
#[derive(Clone, Debug, PartialEq)]
pub struct VisionSpec {
    pub task: Task,
    pub preprocess: Preprocess,
    pub labels: Vec<String>,
    pub top_k: usize,
    pub score_threshold: f32,
    pub iou_threshold: f32,
    pub max_detections: usize,
}

/// A class and its probability.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Classification {
    pub class_id: usize,
    pub label: String,
    pub score: f32,
}

/// An axis-aligned box in original-image pixels.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct BBox {
    pub x1: f32,
    pub y1: f32,
    pub x2: f32,
    pub y2: f32,
}

/// One detected object.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Detection {
    pub class_id: usize,
    pub label: String,
    pub score: f32,
    pub bbox: BBox,
}

/// Post-processed results.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Results {
    Classes(Vec<Classification>),
    Detections(Vec<Detection>),
}

/// Per-request overrides of the spec's defaults.
#[derive(Clone, Copy, Debug, Default)]
pub struct Overrides {
    pub top_k: Option<usize>,
    pub score_threshold: Option<f32>,
}

/// Wall time of each stage, in milliseconds.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Timings {
    pub decode_ms: f64,
    pub preprocess_ms: f64,
    pub inference_ms: f64,
    pub postprocess_ms: f64,
}

/// The outcome of running one image through a model.
#[derive(Clone, Debug, Serialize)]
pub struct ImageInference {
    pub width: u32,
    pub height: u32,
    pub timings: Timings,
    pub results: Results,
}

/// Class label `i`, or `class_{i}` when the label list is too short.
pub(crate) fn label_for(labels: &[String], i: usize) -> String {
    labels
        .get(i)
        .cloned()
        .unwrap_or_else(|| format!("class_{i}"))
}

impl VisionSpec {
    /// Defaults for EfficientNet-Lite0 (../shared/models/MODELS.md).
    pub fn efficientnet_lite0(labels: Vec<String>) -> VisionSpec {
        VisionSpec {
            task: Task::Classification { softmax: true },
            preprocess: Preprocess {
                width: 224,
                height: 224,
                resize: ResizeMode::ShortSideCenterCrop { short_side: 256 },
                scale: 1.0 / 255.0,
                mean: [0.5; 3],
                std: [0.5; 3],
                bgr: false,
            },
            labels,
            top_k: 5,
            score_threshold: 0.0,
            iou_threshold: 0.5,
            max_detections: 100,
        }
    }

    /// Defaults for NanoDet-m 416 (../shared/models/MODELS.md).
    pub fn nanodet_m_416(labels: Vec<String>) -> VisionSpec {
        VisionSpec {
            task: Task::Detection {
                head: DetectionHead::Nanodet {
                    reg_max: 10,
                    strides: vec![8, 16, 32],
                },
            },
            preprocess: Preprocess {
                width: 416,
                height: 416,
                resize: ResizeMode::Stretch,
                scale: 1.0 / 255.0,
                mean: [0.0; 3],
                std: [1.0; 3],
                bgr: false,
            },
            labels,
            top_k: 5,
            score_threshold: 0.35,
            iou_threshold: 0.5,
            max_detections: 100,
        }
    }
}
