//! The image API (`/v1`): list models, and image in → classes or boxes out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{FromRequest, Multipart, Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::{Deserialize, Serialize};
use vigil_engine::vision::{DecodeLimits, ImageInference, Overrides, Results};
use vigil_engine::TensorInfo;

use super::metrics::{record_request, record_stage, record_timings};
use super::{json_ok, ApiError, AppState, RequestId};
use crate::registry::LoadedModel;

/// Query parameters of `POST /v1/models/{name}/infer`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InferQuery {
    /// Number of classes to return (classification).
    pub top_k: Option<usize>,
    /// Minimum score.
    pub threshold: Option<f32>,
}

/// Stage timings plus the end-to-end time, in milliseconds.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct TimingsMs {
    /// Decoding the image into RGB pixels.
    pub decode_ms: f64,
    /// Resizing and normalising the image into the model's input tensor.
    pub preprocess_ms: f64,
    /// Running the model (queue wait excluded).
    pub inference_ms: f64,
    /// Turning the model's outputs into classes or boxes.
    pub postprocess_ms: f64,
    /// Request received to results ready, including reading the body and waiting in the queue.
    pub total_ms: f64,
}

/// The JSON answer for one image (shared by the HTTP API and `vigil infer`).
#[derive(Clone, Debug, Serialize)]
pub struct InferResponse {
    /// Name of the model that ran.
    pub model: String,
    /// The model's task: "classification" or "detection".
    pub task: &'static str,
    /// Width in pixels of the decoded image.
    pub width: u32,
    /// Height in pixels of the decoded image.
    pub height: u32,
    /// Time taken per stage, in milliseconds.
    pub timings: TimingsMs,
    /// Top classes with scores, or boxes in the image's pixels with labels and scores.
    pub results: Results,
    /// Request id, from `X-Request-Id` or generated; also sent back in that header.
    pub request_id: String,
}

impl InferResponse {
    /// Assembles the answer from an engine result.
    pub fn new(
        model: &str,
        task: &'static str,
        inf: ImageInference,
        total_ms: f64,
        request_id: String,
    ) -> InferResponse {
        let t = inf.timings;
        InferResponse {
            model: model.to_string(),
            task,
            width: inf.width,
            height: inf.height,
            timings: TimingsMs {
                decode_ms: t.decode_ms,
                preprocess_ms: t.preprocess_ms,
                inference_ms: t.inference_ms,
                postprocess_ms: t.postprocess_ms,
                total_ms,
            },
            results: inf.results,
            request_id,
        }
    }
}

/// One entry of `GET /v1/models`.
#[derive(Debug, Serialize)]
struct ModelSummary<'a> {
    name: &'a str,
    task: &'static str,
    inputs: &'a [TensorInfo],
    outputs: &'a [TensorInfo],
    labels: usize,
}

/// `GET /v1/models`: every model with its task and tensor signature.
pub async fn list_models(State(state): State<Arc<AppState>>) -> Response {
    let models: Vec<ModelSummary> = state
        .registry
        .iter()
        .map(|m| ModelSummary {
            name: &m.name,
            task: m.task_name(),
            inputs: &m.inputs,
            outputs: &m.outputs,
            labels: m.spec.labels.len(),
        })
        .collect();
    json_ok(&serde_json::json!({ "models": models }))
}

/// Checks an image before it is queued: non-empty, a supported format (else 415), a readable
/// header, and within the pixel limit (else 413). Decoding proper happens in the engine.
pub fn check_image(bytes: &[u8], max_pixels: u64) -> Result<(), ApiError> {
    vigil_engine::vision::probe_image(bytes, &DecodeLimits { max_pixels })
        .map(|_| ())
        .map_err(|e| ApiError::from_engine(e, true))
}

/// Extracts the image bytes: the first file part of a multipart form, or the raw body
/// (`image/*`, `application/octet-stream`, curl's default form type, or no content type).
async fn read_image_body(req: Request) -> Result<Bytes, ApiError> {
    let ctype = req
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or("").trim().to_ascii_lowercase());
    match ctype.as_deref() {
        Some(c) if c.starts_with("multipart/form-data") => {
            let mut form = Multipart::from_request(req, &())
                .await
                .map_err(|e| ApiError::new(e.status(), e.body_text()))?;
            let mut first_field = None;
            while let Some(field) = form
                .next_field()
                .await
                .map_err(|e| ApiError::new(e.status(), e.body_text()))?
            {
                let is_file = field.file_name().is_some();
                if is_file || first_field.is_none() {
                    let data = field
                        .bytes()
                        .await
                        .map_err(|e| ApiError::new(e.status(), e.body_text()))?;
                    if is_file {
                        return Ok(data);
                    }
                    first_field = Some(data);
                }
            }
            first_field.ok_or_else(|| {
                ApiError::bad_request("multipart body has no parts; send the image as a file field")
            })
        }
        // `curl --data-binary @photo.jpg` labels the body x-www-form-urlencoded: the bytes are
        // sniffed anyway, so accept it like octet-stream.
        Some(c)
            if !(c.is_empty()
                || c.starts_with("image/")
                || c.starts_with("application/octet-stream")
                || c.starts_with("application/x-www-form-urlencoded")) =>
        {
            Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("unsupported content type '{c}': send image bytes or multipart/form-data"),
            ))
        }
        _ => Bytes::from_request(req, &())
            .await
            .map_err(|e| ApiError::new(e.status(), e.body_text())),
    }
}

/// `POST /v1/models/{name}/infer`.
pub async fn infer(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    Extension(rid): Extension<RequestId>,
    query: Result<Query<InferQuery>, axum::extract::rejection::QueryRejection>,
    req: Request,
) -> Response {
    let started = Instant::now();
    let Some(model) = state.registry.get(&name) else {
        return ApiError::unknown_model(&name).into_response();
    };
    let resp = match infer_image_request(&state, model, query, rid.0, req, started).await {
        Ok(r) => json_ok(&r),
        Err(e) => {
            tracing::warn!(model = %name, status = e.status.as_u16(), error = %e.message, "request failed");
            e.into_response()
        }
    };
    record_request(&name, resp.status().as_u16());
    resp
}

async fn infer_image_request(
    state: &AppState,
    model: Arc<LoadedModel>,
    query: Result<Query<InferQuery>, axum::extract::rejection::QueryRejection>,
    request_id: String,
    req: Request,
    started: Instant,
) -> Result<InferResponse, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    if q.top_k == Some(0) {
        return Err(ApiError::bad_request("top_k must be at least 1"));
    }
    if let Some(t) = q.threshold {
        if !(0.0..=1.0).contains(&t) {
            return Err(ApiError::bad_request("threshold must be between 0 and 1"));
        }
    }
    let bytes = read_image_body(req).await?;
    check_image(&bytes, state.limits.max_pixels)?;
    let overrides = Overrides {
        top_k: q.top_k,
        score_threshold: q.threshold,
    };
    let limits = DecodeLimits {
        max_pixels: state.limits.max_pixels,
    };
    let m = model.clone();
    let job = model
        .queue
        .execute(move |exec| exec.infer_image(&m.spec, &bytes, &limits, &overrides));
    let inf = tokio::time::timeout(Duration::from_millis(state.limits.request_timeout_ms), job)
        .await
        .map_err(|_| ApiError::new(StatusCode::GATEWAY_TIMEOUT, "request timed out"))??
        .map_err(|e| ApiError::from_engine(e, true))?;
    let total_ms = started.elapsed().as_secs_f64() * 1e3;
    record_timings(&model.name, &inf.timings);
    record_stage(&model.name, "total", total_ms);
    Ok(InferResponse::new(
        &model.name,
        model.task_name(),
        inf,
        total_ms,
        request_id,
    ))
}
