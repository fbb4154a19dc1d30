//! The HTTP API: router, shared state, the one error type, request ids and serving.
//!
//! `infer` holds the image API (`/v1`), `kserve` the KServe v2 / Triton tensor API (`/v2`),
//! `metrics` the Prometheus recorder and `/metrics`.

pub mod cameras;
pub mod infer;
pub mod kserve;
pub mod metrics;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use tracing::Instrument;

use crate::config::Limits;
use crate::queue::QueueError;
use crate::registry::Registry;

/// State shared by all handlers.
pub struct AppState {
    /// The served models.
    pub registry: Registry,
    /// Request limits.
    pub limits: Limits,
    /// Renders `/metrics`.
    pub metrics: PrometheusHandle,
    /// Whether `/v2/health/ready` reports ready.
    pub ready: AtomicBool,
    /// The running cameras (`/v1/cameras`).
    pub cameras: crate::camera::CameraHub,
}

impl AppState {
    /// State over a loaded registry; installs the process-wide metrics recorder on first use.
    pub fn new(registry: Registry, limits: Limits) -> Arc<AppState> {
        Arc::new(AppState {
            registry,
            limits,
            metrics: metrics::handle(),
            ready: AtomicBool::new(true),
            cameras: crate::camera::CameraHub::new(),
        })
    }

    /// State over a loaded registry and started cameras.
    pub fn with_cameras(
        registry: Registry,
        limits: Limits,
        cameras: crate::camera::CameraHub,
    ) -> Arc<AppState> {
        Arc::new(AppState {
            registry,
            limits,
            metrics: metrics::handle(),
            ready: AtomicBool::new(true),
            cameras,
        })
    }
}

/// An API error: an HTTP status and a message, rendered as `{"error": "...", "code": status}`.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message.
    pub message: String,
}

impl ApiError {
    /// An error with the given status.
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }

    /// 400 Bad Request.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    /// 404 for an unknown model.
    pub fn unknown_model(name: &str) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, format!("unknown model '{name}'"))
    }

    /// Maps an engine error to a status. `image_request` is true for the image API, where decode
    /// failures are the client's fault; this is the one place engine errors become statuses.
    pub fn from_engine(e: vigil_engine::Error, image_request: bool) -> ApiError {
        use vigil_engine::Error as E;
        let status = match &e {
            E::BadInput(_) | E::Shape(_) | E::Type(_) => StatusCode::BAD_REQUEST,
            E::ImageTooLarge(_) if image_request => StatusCode::PAYLOAD_TOO_LARGE,
            E::UnsupportedImage(_) if image_request => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            E::Image(_) if image_request => StatusCode::BAD_REQUEST,
            E::Image(_)
            | E::ImageTooLarge(_)
            | E::UnsupportedImage(_)
            | E::InvalidModel(_)
            | E::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
            E::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
            E::OutOfMemory(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        ApiError::new(status, e.to_string())
    }
}

impl From<QueueError> for ApiError {
    fn from(e: QueueError) -> ApiError {
        match e {
            QueueError::Full(_) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
            QueueError::Worker(_) => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.message, "code": self.status.as_u16() });
        let mut resp = (self.status, Json(body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp
    }
}

/// The id of the current request (from `X-Request-Id` or generated).
#[derive(Clone, Debug)]
pub struct RequestId(pub String);

/// A new process-unique request id: a random per-process prefix and a counter.
pub fn next_request_id() -> String {
    static PREFIX: OnceLock<String> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(1);
    let prefix = PREFIX.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        format!("{:08x}", h.finish() as u32)
    });
    format!("{prefix}-{:06}", COUNTER.fetch_add(1, Ordering::Relaxed))
}

fn valid_client_id(v: &HeaderValue) -> Option<String> {
    let s = v.to_str().ok()?;
    (!s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_graphic()))
        .then(|| s.to_string())
}

/// Assigns the request id, opens the tracing span, tracks in-flight requests and echoes `x-request-id`.
async fn request_context(mut req: Request, next: Next) -> Response {
    let id = req
        .headers()
        .get("x-request-id")
        .and_then(valid_client_id)
        .unwrap_or_else(next_request_id);
    req.extensions_mut().insert(RequestId(id.clone()));
    let span =
        tracing::info_span!("request", id = %id, method = %req.method(), path = %req.uri().path());
    let in_flight = InFlight::enter();
    let mut resp = async move {
        let started = std::time::Instant::now();
        let resp = next.run(req).await;
        tracing::info!(
            status = resp.status().as_u16(),
            ms = started.elapsed().as_secs_f64() * 1e3,
            "done"
        );
        resp
    }
    .instrument(span)
    .await;
    drop(in_flight);
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
}

struct InFlight;

impl InFlight {
    fn enter() -> InFlight {
        ::metrics::gauge!("vigil_requests_in_flight").increment(1.0);
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        ::metrics::gauge!("vigil_requests_in_flight").decrement(1.0);
    }
}

/// Turns any non-JSON error response (extractor rejections, body-limit 413s, 405s) into the
/// `{"error", "code"}` JSON shape.
async fn json_errors(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 64 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string());
    let message = match text {
        Ok(t) if !t.is_empty() => t,
        _ => status
            .canonical_reason()
            .unwrap_or("error")
            .to_ascii_lowercase(),
    };
    let mut out = ApiError::new(status, message).into_response();
    for (k, v) in parts.headers.iter() {
        if k != header::CONTENT_TYPE && k != header::CONTENT_LENGTH {
            out.headers_mut().insert(k.clone(), v.clone());
        }
    }
    out
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
}

/// Builds the router over shared state.
pub fn router(state: Arc<AppState>) -> Router {
    let max_body = state.limits.max_body_bytes;
    Router::new()
        .route("/v1/models", get(infer::list_models))
        .route("/v1/models/{name}/infer", post(infer::infer))
        .route("/v2", get(kserve::server_metadata))
        .route("/v2/health/live", get(kserve::live))
        .route("/v2/health/ready", get(kserve::ready))
        .route("/v2/models/{name}", get(kserve::model_metadata))
        .route("/v2/models/{name}/ready", get(kserve::model_ready))
        .route("/v2/models/{name}/infer", post(kserve::infer))
        .route(
            "/v2/models/{name}/versions/{version}",
            get(kserve::model_metadata_versioned),
        )
        .route(
            "/v2/models/{name}/versions/{version}/ready",
            get(kserve::model_ready_versioned),
        )
        .route(
            "/v2/models/{name}/versions/{version}/infer",
            post(kserve::infer_versioned),
        )
        .route("/v1/cameras", get(cameras::list))
        .route("/v1/cameras/{id}", get(cameras::get_one))
        .route("/v1/cameras/{id}/snapshot.jpg", get(cameras::snapshot))
        .route("/v1/cameras/{id}/stream.mjpeg", get(cameras::stream))
        .route("/v1/cameras/{id}/events", get(cameras::events))
        .route("/metrics", get(metrics::render))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body))
        .layer(middleware::from_fn(json_errors))
        .layer(middleware::from_fn(request_context))
        .with_state(state)
}

/// Serves the API on `listener` until the process ends.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
) -> std::io::Result<()> {
    serve_with_shutdown(listener, state, std::future::pending()).await
}

/// Serves the API until `shutdown` resolves, then drains in-flight requests.
pub async fn serve_with_shutdown(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let upkeep = metrics::spawn_upkeep(state.metrics.clone());
    let app = router(state);
    let r = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await;
    upkeep.abort();
    r
}

/// A response with a JSON body and status 200.
pub(crate) fn json_ok<T: serde::Serialize>(v: &T) -> Response {
    Json(v).into_response()
}

/// An empty-bodied response with a status (for health probes).
pub(crate) fn status_only(status: StatusCode) -> Response {
    (status, Body::empty()).into_response()
}
