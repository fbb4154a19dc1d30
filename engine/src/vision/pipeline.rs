//! The end-to-end image path: postprocess dispatch, `infer_image`, label files.

use std::path::Path;
use std::time::Instant;

use super::classify::classify;
use super::decode::decode_image;
use super::detect::{decode_nanodet, decode_yolov8};
use super::{
    DecodeLimits, DetectionHead, ImageInference, ImageTransform, Overrides, Results, Task, Timings,
    VisionSpec,
};
use crate::error::{Error, Result};
use crate::ir::Tensor;
use crate::model::ExecutionContext;

/// Turns the model's outputs into classes or boxes (mapped back through `transform`).
///
/// `overrides` replace the spec's `top_k` / `score_threshold` for this request.
pub fn postprocess(
    spec: &VisionSpec,
    outputs: &[Tensor],
    transform: &ImageTransform,
    overrides: &Overrides,
) -> Result<Results> {
    let threshold = overrides.score_threshold.unwrap_or(spec.score_threshold);
    if threshold.is_nan() {
        return Err(Error::BadInput("score threshold is NaN".into()));
    }
    match &spec.task {
        Task::Classification { softmax } => {
            let out = outputs.first().ok_or_else(|| {
                Error::BadInput("classification model produced no outputs".into())
            })?;
            let k = overrides.top_k.unwrap_or(spec.top_k);
            Ok(Results::Classes(classify(
                out,
                &spec.labels,
                *softmax,
                k,
                threshold,
            )?))
        }
        Task::Detection {
            head: DetectionHead::Nanodet { reg_max, strides },
        } => Ok(Results::Detections(decode_nanodet(
            spec, outputs, *reg_max, strides, threshold, transform,
        )?)),
        Task::Detection {
            head: DetectionHead::Yolov8,
        } => Ok(Results::Detections(decode_yolov8(
            spec, outputs, threshold, transform,
        )?)),
    }
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Decode → preprocess → run → postprocess, timing each stage.
///
/// `width`/`height` in the result are the original image's, after EXIF orientation.
pub fn infer_image(
    ctx: &mut ExecutionContext,
    spec: &VisionSpec,
    bytes: &[u8],
    limits: &DecodeLimits,
    overrides: &Overrides,
) -> Result<ImageInference> {
    let mut timings = Timings::default();
    let t = Instant::now();
    let img = decode_image(bytes, limits)?;
    timings.decode_ms = ms_since(t);

    let t = Instant::now();
    // On the GPU for CUDA models (bit-identical to the CPU's `preprocess`).
    let pre = ctx.preprocessor().clone();
    let (tensor, transform) = pre.preprocess(&img, &spec.preprocess)?;
    timings.preprocess_ms = ms_since(t);

    let t = Instant::now();
    // The context's own output buffers (no copy of the raw outputs); NanoDet outputs of CUDA
    // models stay on the GPU.
    ctx.run_vision(&[&tensor], spec, overrides)?;
    timings.inference_ms = ms_since(t);

    let t = Instant::now();
    // NanoDet decode + NMS on the GPU for CUDA models, else `postprocess`.
    let results = ctx.postprocess(spec, &transform, overrides)?;
    timings.postprocess_ms = ms_since(t);

    Ok(ImageInference {
        width: img.width(),
        height: img.height(),
        timings,
        results,
    })
}

/// Parses label text: one label per line, trimmed (CRLF and a UTF-8 BOM tolerated); trailing
/// empty lines are dropped, inner empty lines are kept so indices stay aligned.
pub fn parse_labels(text: &str) -> Vec<String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut labels: Vec<String> = text.lines().map(|l| l.trim().to_string()).collect();
    while labels.last().is_some_and(|l| l.is_empty()) {
        labels.pop();
    }
    labels
}

/// Reads a label file (see [`parse_labels`]).
pub fn load_labels(path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path)?;
    Ok(parse_labels(&text))
}
