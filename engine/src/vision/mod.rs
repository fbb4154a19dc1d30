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
    Letterbox {
        /// Pixel value (0–255, every channel) of the padding, normalized like image pixels.
        pad_value: u8,
    },
    /// Resize so the short side is `short_side` (bilinear), then centre-crop to the input size.
    ShortSideCenterCrop {
        /// Short side after resizing, in pixels (at least the input width and height).
        short_side: u32,
    },
}

/// Preprocessing recipe: `value = ((pixel * scale) - mean[c]) / std[c]`, laid out NCHW.
#[derive(Clone, Debug, PartialEq, serde::Deserialize, Serialize)]
pub struct Preprocess {
    /// Model input width in pixels.
    pub width: u32,
    /// Model input height in pixels.
    pub height: u32,
    /// How the image is fitted to `width` x `height`.
    pub resize: ResizeMode,
    /// Multiplier for the 0–255 pixel values, applied first (e.g. 1/255).
    pub scale: f32,
    /// Subtracted per channel after `scale`, in the tensor's channel order.
    pub mean: [f32; 3],
    /// Divisor per channel after subtracting `mean`, in the tensor's channel order.
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
    /// Original-image pixels per model-input pixel along x.
    pub scale_x: f32,
    /// Original-image pixels per model-input pixel along y.
    pub scale_y: f32,
    /// Model-input x where original x = 0 (letterbox padding, or minus the crop origin).
    pub offset_x: f32,
    /// Model-input y where original y = 0 (letterbox padding, or minus the crop origin).
    pub offset_y: f32,
    /// Original image width in pixels (boxes are clamped to it).
    pub orig_width: u32,
    /// Original image height in pixels (boxes are clamped to it).
    pub orig_height: u32,
}

/// The kind of detection head a model has.
#[derive(Clone, Debug, PartialEq, serde::Deserialize, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum DetectionHead {
    /// NanoDet GFL head: per stride, scores [1, N, C] (sigmoided) and boxes [1, N, 4*(reg_max+1)].
    Nanodet {
        /// Highest distance bin: each box side is a softmax over `reg_max + 1` bins.
        reg_max: usize,
        /// Feature-map stride of each output level, in input pixels (e.g. 8, 16, 32).
        strides: Vec<usize>,
    },
    /// YOLOv8 head: [1, 4 + C, N] with cx, cy, w, h then class scores.
    Yolov8,
}

/// What a model does.
#[derive(Clone, Debug, PartialEq, serde::Deserialize, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Task {
    /// Image classification: one scores output, reported as the top-k classes.
    Classification {
        /// Apply softmax to the logits (false when the model already outputs probabilities).
        softmax: bool,
    },
    /// Object detection: boxes decoded per `head`, then per-class NMS.
    Detection {
        /// The detection head, which fixes the output format.
        head: DetectionHead,
    },
}

/// Everything needed to go from an image to results with one model.
#[derive(Clone, Debug, PartialEq)]
pub struct VisionSpec {
    /// What the model does, and so how its outputs are decoded.
    pub task: Task,
    /// How an image becomes the model's input tensor.
    pub preprocess: Preprocess,
    /// Class names by class id (ids past the end are named `class_{id}`).
    pub labels: Vec<String>,
    /// Classification: how many classes to return, best first.
    pub top_k: usize,
    /// Lowest score reported (for classification only applied when > 0).
    pub score_threshold: f32,
    /// Detection: NMS drops a box whose IoU with a kept same-class box is above this.
    pub iou_threshold: f32,
    /// Detection: most boxes returned after NMS.
    pub max_detections: usize,
}

/// A class and its probability.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Classification {
    /// Index in the model's output (and in the label list).
    pub class_id: usize,
    /// Class name (`class_{id}` when the label list has none).
    pub label: String,
    /// Probability (softmax of the logits, or the output itself when `softmax` is off).
    pub score: f32,
}

/// An axis-aligned box in original-image pixels.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct BBox {
    /// Left edge, in original-image pixels.
    pub x1: f32,
    /// Top edge, in original-image pixels.
    pub y1: f32,
    /// Right edge, in original-image pixels.
    pub x2: f32,
    /// Bottom edge, in original-image pixels.
    pub y2: f32,
}

/// One detected object.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Detection {
    /// Class index (into the label list).
    pub class_id: usize,
    /// Class name (`class_{id}` when the label list has none).
    pub label: String,
    /// Score of the box's best class, as output by the model's head.
    pub score: f32,
    /// The box, in original-image pixels.
    pub bbox: BBox,
}

/// Post-processed results.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Results {
    /// Classification results, best first.
    Classes(Vec<Classification>),
    /// Detections after NMS, best first.
    Detections(Vec<Detection>),
}

/// Per-request overrides of the spec's defaults.
#[derive(Clone, Copy, Debug, Default)]
pub struct Overrides {
    /// Replaces [`VisionSpec::top_k`] when set.
    pub top_k: Option<usize>,
    /// Replaces [`VisionSpec::score_threshold`] when set.
    pub score_threshold: Option<f32>,
}

/// Wall time of each stage, in milliseconds.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Timings {
    /// Decoding the image bytes.
    pub decode_ms: f64,
    /// Resizing and normalizing into the input tensor.
    pub preprocess_ms: f64,
    /// Running the model.
    pub inference_ms: f64,
    /// Turning outputs into classes or boxes (NMS included).
    pub postprocess_ms: f64,
}

/// The outcome of running one image through a model.
#[derive(Clone, Debug, Serialize)]
pub struct ImageInference {
    /// Original image width in pixels, after EXIF orientation.
    pub width: u32,
    /// Original image height in pixels, after EXIF orientation.
    pub height: u32,
    /// Wall time of each stage.
    pub timings: Timings,
    /// The classes or detections.
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
