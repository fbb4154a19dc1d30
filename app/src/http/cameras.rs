//! The camera API: `/v1/cameras` (state, rates, drops, last error, last results), snapshots,
//! annotated MJPEG streams and Server-Sent Events of each frame's detections.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tokio::sync::broadcast::error::RecvError;

use super::{json_ok, ApiError, AppState};
use crate::camera::pipeline::{CameraHandle, Published};

/// Boundary of `stream.mjpeg` parts.
pub const BOUNDARY: &str = "vigilframe";

fn camera(state: &AppState, id: &str) -> Result<Arc<CameraHandle>, ApiError> {
    state
        .cameras
        .get(id)
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, format!("unknown camera '{id}'")))
}

/// `GET /v1/cameras`: every camera with its state, fps in and out, counters, last error and
/// last results.
pub async fn list(State(state): State<Arc<AppState>>) -> Response {
    let cams: Vec<_> = state.cameras.iter().map(|c| c.summary()).collect();
    json_ok(&serde_json::json!({ "cameras": cams }))
}

/// `GET /v1/cameras/{id}`: one camera's summary.
pub async fn get_one(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match camera(&state, &id) {
        Ok(c) => json_ok(&c.summary()),
        Err(e) => e.into_response(),
    }
}

/// Query of the image endpoints.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageQuery {
    /// Draw boxes and labels (default true).
    pub annotate: Option<bool>,
    /// `stream.mjpeg`: most frames per second for this client (capped by the camera's `stream_fps`).
    pub fps: Option<f64>,
}

async fn encode(p: Arc<Published>, annotated: bool) -> Result<Bytes, ApiError> {
    tokio::task::spawn_blocking(move || p.jpeg(annotated))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e))
}

fn parse_query(
    q: Result<Query<ImageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<ImageQuery, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    if let Some(f) = q.fps {
        if !(f > 0.0 && f.is_finite()) {
            return Err(ApiError::bad_request("fps must be positive"));
        }
    }
    Ok(q)
}

/// `GET /v1/cameras/{id}/snapshot.jpg[?annotate=false]`: the latest inferred frame.
pub async fn snapshot(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    q: Result<Query<ImageQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let run = async {
        let q = parse_query(q)?;
        let cam = camera(&state, &id)?;
        let p = cam.latest().ok_or_else(|| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("camera '{id}' has no frame yet"),
            )
        })?;
        let seq = p.result.seq;
        let jpeg = encode(p, q.annotate.unwrap_or(true)).await?;
        Ok::<_, ApiError>(
            (
                [
                    (header::CONTENT_TYPE, "image/jpeg".to_string()),
                    (header::CACHE_CONTROL, "no-store".to_string()),
                    (
                        header::HeaderName::from_static("x-frame-seq"),
                        seq.to_string(),
                    ),
                ],
                jpeg,
            )
                .into_response(),
        )
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// `GET /v1/cameras/{id}/stream.mjpeg[?fps=5&annotate=false]`: multipart/x-mixed-replace of the
/// latest frames. Each client waits on a watch of the latest frame, so a slow client only sees
/// fewer frames; the pipeline never waits for it. JPEGs are encoded once per frame for all clients.
pub async fn stream(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    q: Result<Query<ImageQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let (cam, q) = match parse_query(q).and_then(|q| Ok((camera(&state, &id)?, q))) {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let fps = q
        .fps
        .unwrap_or(cam.config.stream_fps)
        .min(cam.config.stream_fps);
    let period = Duration::from_secs_f64(1.0 / fps);
    let annotated = q.annotate.unwrap_or(true);
    let mut rx = cam.watch_latest();
    // Send the current frame at once, if there is one.
    rx.mark_changed();
    let camera_id = id.clone();
    metrics::gauge!("vigil_camera_stream_clients", "camera" => camera_id.clone()).increment(1.0);
    let guard = ClientGuard(camera_id);
    let s = futures_util::stream::unfold(
        (rx, None::<Instant>, guard),
        move |(mut rx, last, guard)| async move {
            loop {
                if let Some(t) = last {
                    let due = t + period;
                    tokio::time::sleep_until(due.into()).await;
                }
                rx.changed().await.ok()?;
                let Some(p) = rx.borrow_and_update().clone() else {
                    continue;
                };
                let Ok(jpeg) = encode(p, annotated).await else {
                    continue;
                };
                let mut part = Vec::with_capacity(jpeg.len() + 128);
                part.extend_from_slice(
                    format!(
                        "--{BOUNDARY}\r\nContent-Type: image/jpeg\r\nContent-Length: {}\r\n\r\n",
                        jpeg.len()
                    )
                    .as_bytes(),
                );
                part.extend_from_slice(&jpeg);
                part.extend_from_slice(b"\r\n");
                return Some((
                    Ok::<_, Infallible>(Bytes::from(part)),
                    (rx, Some(Instant::now()), guard),
                ));
            }
        },
    );
    (
        [
            (
                header::CONTENT_TYPE,
                format!("multipart/x-mixed-replace; boundary={BOUNDARY}"),
            ),
            (header::CACHE_CONTROL, "no-store".to_string()),
        ],
        Body::from_stream(s),
    )
        .into_response()
}

/// Decrements the stream-client gauge when a client's stream is dropped.
struct ClientGuard(String);

impl Drop for ClientGuard {
    fn drop(&mut self) {
        metrics::gauge!("vigil_camera_stream_clients", "camera" => self.0.clone()).decrement(1.0);
    }
}

/// `GET /v1/cameras/{id}/events`: Server-Sent Events, one `detections` event per inferred frame
/// (the frame's JSON); a `lagged` event tells a client that could not keep up how many it missed.
pub async fn events(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    let cam = match camera(&state, &id) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let rx = cam.subscribe();
    let s = futures_util::stream::unfold(rx, |mut rx| async move {
        let ev = match rx.recv().await {
            Ok(r) => Event::default()
                .event("detections")
                .id(r.seq.to_string())
                .json_data(&*r)
                .unwrap_or_else(|_| Event::default().comment("unserialisable frame")),
            Err(RecvError::Lagged(n)) => Event::default().event("lagged").data(n.to_string()),
            Err(RecvError::Closed) => return None,
        };
        Some((Ok::<_, Infallible>(ev), rx))
    });
    Sse::new(s)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}
