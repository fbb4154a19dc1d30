//! Prometheus metrics: the process-wide recorder, `/metrics`, and the recording helpers.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use vigil_engine::memory::PoolStats;
use vigil_engine::vision::Timings;

use super::AppState;

/// Histogram buckets in seconds: 0.5 ms to 10 s, dense around typical CPU inference latencies.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// The recorder handle; installs the global recorder on first call. If another recorder is already
/// installed (an embedding application), metrics go there and this handle renders an empty page.
pub fn handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new();
            let builder = match builder.set_buckets_for_metric(
                Matcher::Full("vigil_request_duration_seconds".into()),
                LATENCY_BUCKETS,
            ) {
                Ok(b) => b,
                Err(_) => PrometheusBuilder::new(),
            };
            let builder = match builder.set_buckets_for_metric(
                Matcher::Full("vigil_camera_stage_seconds".into()),
                LATENCY_BUCKETS,
            ) {
                Ok(b) => b,
                Err(_) => PrometheusBuilder::new(),
            };
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder is already installed; /metrics will be empty");
            }
            describe();
            handle
        })
        .clone()
}

fn describe() {
    metrics::describe_counter!(
        "vigil_requests_total",
        "Inference requests by model and HTTP status."
    );
    metrics::describe_histogram!(
        "vigil_request_duration_seconds",
        metrics::Unit::Seconds,
        "Inference request latency by model and stage."
    );
    metrics::describe_gauge!("vigil_requests_in_flight", "HTTP requests being handled.");
    metrics::describe_gauge!(
        "vigil_queue_depth",
        "Requests waiting or executing per model."
    );
    metrics::describe_gauge!(
        "vigil_memory_pool_bytes",
        metrics::Unit::Bytes,
        "Memory pool occupancy by pool and kind (reserved, committed, in_use, peak_in_use, free, largest_free, pending)."
    );
    metrics::describe_gauge!("vigil_memory_pool_blocks", "Live blocks in a memory pool.");
    metrics::describe_gauge!(
        "vigil_memory_pool_remaps",
        "Times a memory pool over remappable memory moved physical pages to place a block."
    );
    metrics::describe_gauge!(
        "vigil_memory_pool_fragmentation",
        "1 - largest free span / free bytes of a memory pool."
    );
    crate::camera::describe_metrics();
}

/// Runs histogram upkeep periodically so unscraped samples do not accumulate.
pub fn spawn_upkeep(handle: PrometheusHandle) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            handle.run_upkeep();
        }
    })
}

/// Publishes the occupancy of the host pool and of each GPU's activation pool (`pool="host"`,
/// `pool="cuda0"`, ...) as gauges, read at scrape time.
fn record_pools(state: &AppState) {
    if let Some(pool) = state.registry.host_pool() {
        record_pool("host".to_string(), &pool.stats());
    }
    for (device, stats) in vigil_engine::backend::cuda::device_pool_stats() {
        record_pool(format!("cuda{device}"), &stats);
    }
}

/// One pool's gauges under the label `pool`.
fn record_pool(pool: String, s: &PoolStats) {
    for (kind, v) in [
        ("reserved", s.reserved),
        ("committed", s.committed),
        ("in_use", s.in_use),
        ("peak_in_use", s.peak_in_use),
        ("free", s.free_bytes),
        ("largest_free", s.largest_free),
        ("pending", s.pending_bytes),
    ] {
        metrics::gauge!("vigil_memory_pool_bytes", "pool" => pool.clone(), "kind" => kind)
            .set(v as f64);
    }
    metrics::gauge!("vigil_memory_pool_blocks", "pool" => pool.clone()).set(s.blocks as f64);
    metrics::gauge!("vigil_memory_pool_remaps", "pool" => pool.clone()).set(s.remaps as f64);
    metrics::gauge!("vigil_memory_pool_fragmentation", "pool" => pool).set(s.fragmentation);
}

/// `GET /metrics`: Prometheus text exposition.
pub async fn render(State(state): State<Arc<AppState>>) -> Response {
    record_pools(&state);
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

/// Counts one inference request with its final status.
pub fn record_request(model: &str, status: u16) {
    metrics::counter!("vigil_requests_total", "model" => model.to_string(), "status" => status.to_string()).increment(1);
}

/// Records one stage duration in seconds.
pub fn record_stage(model: &str, stage: &'static str, ms: f64) {
    metrics::histogram!("vigil_request_duration_seconds", "model" => model.to_string(), "stage" => stage)
        .record(ms / 1e3);
}

/// Records the engine's stage timings of an image request.
pub fn record_timings(model: &str, t: &Timings) {
    record_stage(model, "decode", t.decode_ms);
    record_stage(model, "preprocess", t.preprocess_ms);
    record_stage(model, "inference", t.inference_ms);
    record_stage(model, "postprocess", t.postprocess_ms);
}
