//! One pipeline per camera: a capture thread (the source, under the [`supervisor`]) → a
//! latest-frame slot → an inference thread on the camera's own execution context → sinks
//! (a broadcast of results, a watch of the latest annotated frame, metrics, the webhook).
//!
//! Every captured frame is either inferred, dropped (overwritten in the slot before inference
//! took it) or failed (conversion or engine error); the counters add up exactly once a finite
//! source has finished.
//!
//! [`supervisor`]: super::supervisor

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use image::RgbImage;
use serde::Serialize;
use tokio::sync::{broadcast, watch};
use vigil_engine::vision::yuv::YuvCoeffs;
use vigil_engine::vision::{Overrides, Results, VisionSpec, YuvFrame};
use vigil_engine::ExecutionContext;

use super::config::CameraConfig;
use super::convert::Converter;
use super::source::{RawFrame, SourceFactory, SourceInfo};
use super::supervisor;
use super::webhook::Webhook;

/// Stage times of one frame's transform, in milliseconds.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct FrameTimings {
    /// MJPEG decode or YUV → RGB conversion.
    pub convert_ms: f64,
    /// Resizing and normalising the RGB frame into the model's input tensor.
    pub preprocess_ms: f64,
    /// Running the model.
    pub inference_ms: f64,
    /// Turning the model's outputs into classes or boxes.
    pub postprocess_ms: f64,
    /// Capture → results published.
    pub latency_ms: f64,
}

/// Runs a model on an RGB frame: the camera's execution context, or a stand-in.
pub trait FrameInfer: Send {
    /// Preprocess → run → postprocess; fills the three stage times of `t`.
    fn infer_rgb(
        &mut self,
        img: &RgbImage,
        spec: &VisionSpec,
        overrides: &Overrides,
        t: &mut FrameTimings,
    ) -> vigil_engine::Result<Results>;

    /// Converts a YUV frame where the model runs (the GPU for CUDA models); `None` leaves the
    /// conversion to the CPU [`Converter`] (the default, and what CPU models do).
    fn yuv_to_rgb(
        &mut self,
        _frame: &YuvFrame<'_>,
        _k: &YuvCoeffs,
    ) -> Option<vigil_engine::Result<RgbImage>> {
        None
    }
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

impl FrameInfer for ExecutionContext {
    fn infer_rgb(
        &mut self,
        img: &RgbImage,
        spec: &VisionSpec,
        overrides: &Overrides,
        t: &mut FrameTimings,
    ) -> vigil_engine::Result<Results> {
        // The same steps as `vision::infer_image` after its decode (GPU preprocessing for CUDA).
        let s = Instant::now();
        let pre = self.preprocessor().clone();
        let (tensor, transform) = pre.preprocess(img, &spec.preprocess)?;
        t.preprocess_ms = ms(s);
        let s = Instant::now();
        self.run_vision(&[&tensor], spec, overrides)?;
        t.inference_ms = ms(s);
        let s = Instant::now();
        let r = self.postprocess(spec, &transform, overrides);
        t.postprocess_ms = ms(s);
        r
    }

    fn yuv_to_rgb(
        &mut self,
        frame: &YuvFrame<'_>,
        k: &YuvCoeffs,
    ) -> Option<vigil_engine::Result<RgbImage>> {
        self.preprocessor().yuv_to_rgb(frame, k)
    }
}

/// Converts a frame to RGB: YUYV/NV12 on the GPU when the model runs there, else on the CPU.
fn convert_frame(
    conv: &mut Converter,
    infer: &mut dyn FrameInfer,
    f: &RawFrame,
) -> Result<RgbImage, String> {
    if let Some((frame, k)) = conv.gpu_frame(f)? {
        if let Some(r) = infer.yuv_to_rgb(&frame, &k) {
            return r.map_err(|e| e.to_string());
        }
    }
    conv.to_rgb(f)
}

/// One frame's results, as broadcast to SSE clients and shown in `/v1/cameras`.
#[derive(Clone, Debug, Serialize)]
pub struct FrameResult {
    /// Id of the camera that captured the frame.
    pub camera: String,
    /// Capture sequence number.
    pub seq: u64,
    /// Frame width in pixels, after conversion to RGB.
    pub width: u32,
    /// Frame height in pixels, after conversion to RGB.
    pub height: u32,
    /// Wall-clock time of capture, milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
    /// Stage times of this frame, in milliseconds.
    pub timings: FrameTimings,
    /// Classes or boxes (boxes in frame pixels).
    pub results: Results,
}

/// The latest inferred frame with its results; JPEG encodings are made once, on first request.
pub struct Published {
    /// The frame's results.
    pub result: Arc<FrameResult>,
    /// The frame as inferred (RGB, without annotations).
    pub image: Arc<RgbImage>,
    jpeg_plain: OnceLock<Result<bytes::Bytes, String>>,
    jpeg_annotated: OnceLock<Result<bytes::Bytes, String>>,
}

impl Published {
    /// A published frame.
    pub fn new(result: Arc<FrameResult>, image: Arc<RgbImage>) -> Published {
        Published {
            result,
            image,
            jpeg_plain: OnceLock::new(),
            jpeg_annotated: OnceLock::new(),
        }
    }

    /// The frame as JPEG, with boxes and labels drawn when `annotated` (cached).
    pub fn jpeg(&self, annotated: bool) -> Result<bytes::Bytes, String> {
        let cell = if annotated {
            &self.jpeg_annotated
        } else {
            &self.jpeg_plain
        };
        cell.get_or_init(|| {
            let img = if annotated {
                let mut img = (*self.image).clone();
                super::annotate::draw_results(&mut img, &self.result.results);
                super::annotate::encode_jpeg(&img, 80)
            } else {
                super::annotate::encode_jpeg(&self.image, 80)
            };
            img.map(bytes::Bytes::from)
        })
        .clone()
    }
}

/// Lifecycle state of a camera.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CameraState {
    /// Opening the source.
    Opening,
    /// Frames are flowing.
    Running,
    /// The source failed; waiting before reopening it.
    Backoff,
    /// A finite source ended.
    Finished,
    /// Stopped by shutdown.
    Stopped,
}

/// State, last error and source details.
#[derive(Clone, Debug, Serialize)]
pub struct Status {
    /// Lifecycle state.
    pub state: CameraState,
    /// Most recent source or frame error, kept after recovery (`None` until one occurs).
    pub last_error: Option<String>,
    /// Reopens after a failure.
    pub reconnects: u64,
    /// What the source delivers (format, size, rate), once open.
    pub source: Option<SourceInfo>,
}

/// Frames per second over about one-second windows.
struct RateMeter {
    window: Mutex<(Instant, u64, f64)>,
}

impl RateMeter {
    fn new() -> RateMeter {
        RateMeter {
            window: Mutex::new((Instant::now(), 0, 0.0)),
        }
    }

    fn tick(&self, total: u64) -> Option<f64> {
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let dt = w.0.elapsed().as_secs_f64();
        if dt >= 1.0 {
            w.2 = (total - w.1) as f64 / dt;
            *w = (Instant::now(), total, w.2);
            return Some(w.2);
        }
        None
    }

    fn rate(&self) -> f64 {
        let w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        // A source that went quiet reads as 0 after two windows.
        if w.0.elapsed().as_secs_f64() > 2.0 {
            0.0
        } else {
            w.2
        }
    }
}

/// Per-camera counters.
#[derive(Default)]
pub struct Counters {
    /// Frames read from the source.
    pub captured: AtomicU64,
    /// Frames run through the model.
    pub inferred: AtomicU64,
    /// Frames replaced in the latest-frame slot before inference took them.
    pub dropped: AtomicU64,
    /// Frames that failed conversion or inference.
    pub failed: AtomicU64,
}

/// The newest captured frame, waiting for the inference thread. Capture never waits on it.
pub struct LatestSlot {
    inner: Mutex<(Option<RawFrame>, bool)>,
    ready: Condvar,
}

impl Default for LatestSlot {
    fn default() -> Self {
        LatestSlot {
            inner: Mutex::new((None, false)),
            ready: Condvar::new(),
        }
    }
}

impl LatestSlot {
    /// Stores a frame; returns true when it replaced one that was never taken (a drop).
    pub fn put(&self, f: RawFrame) -> bool {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if g.1 {
            // Closed (shutting down): nobody will take it, so it counts as dropped.
            return true;
        }
        let replaced = g.0.replace(f).is_some();
        self.ready.notify_one();
        replaced
    }

    /// Takes the frame, waiting up to `timeout`; `Err(())` once closed and empty.
    #[allow(clippy::result_unit_err)]
    pub fn take(&self, timeout: Duration) -> Result<Option<RawFrame>, ()> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if g.0.is_none() && !g.1 {
            g = self
                .ready
                .wait_timeout(g, timeout)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        match g.0.take() {
            Some(f) => Ok(Some(f)),
            None if g.1 => Err(()),
            None => Ok(None),
        }
    }

    /// No more frames will come.
    pub fn close(&self) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.1 = true;
        self.ready.notify_all();
    }
}

/// A running camera: its config, state, counters and sinks.
pub struct CameraHandle {
    /// The camera's configuration, as validated at start.
    pub config: CameraConfig,
    /// Frame counters (captured, inferred, dropped, failed).
    pub counters: Counters,
    status: Mutex<Status>,
    rate_in: RateMeter,
    rate_out: RateMeter,
    latest: watch::Sender<Option<Arc<Published>>>,
    events: broadcast::Sender<Arc<FrameResult>>,
    stop: AtomicBool,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    pub(crate) slot: LatestSlot,
}

/// A snapshot of a camera for `GET /v1/cameras`.
#[derive(Clone, Debug, Serialize)]
pub struct CameraSummary {
    /// Camera id, as used in `/v1/cameras/{id}`.
    pub id: String,
    /// Name of the model the camera runs.
    pub model: String,
    /// Lifecycle state, last error, reconnects and source details (flattened in the JSON).
    #[serde(flatten)]
    pub status: Status,
    /// Frames captured per second, over about the last second (0 when the source went quiet).
    pub fps_in: f64,
    /// Frames inferred per second, over about the last second (0 when inference went quiet).
    pub fps_out: f64,
    /// Frames read from the source since start.
    pub frames_captured: u64,
    /// Frames run through the model since start.
    pub frames_inferred: u64,
    /// Frames overwritten in the latest-frame slot before inference took them.
    pub frames_dropped: u64,
    /// Frames that failed conversion or inference.
    pub frames_failed: u64,
    /// Results of the latest inferred frame, if any.
    pub last_result: Option<FrameResult>,
}

impl CameraHandle {
    fn new(config: CameraConfig) -> CameraHandle {
        let (latest, _) = watch::channel(None);
        let (events, _) = broadcast::channel(64);
        CameraHandle {
            config,
            counters: Counters::default(),
            status: Mutex::new(Status {
                state: CameraState::Opening,
                last_error: None,
                reconnects: 0,
                source: None,
            }),
            rate_in: RateMeter::new(),
            rate_out: RateMeter::new(),
            latest,
            events,
            stop: AtomicBool::new(false),
            threads: Mutex::new(Vec::new()),
            slot: LatestSlot::default(),
        }
    }

    /// The camera id.
    pub fn id(&self) -> &str {
        &self.config.id
    }

    /// Current state and last error.
    pub fn status(&self) -> Status {
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn update_status(&self, f: impl FnOnce(&mut Status)) {
        let mut s = self.status.lock().unwrap_or_else(|p| p.into_inner());
        let before = s.state;
        f(&mut s);
        if s.state != before {
            metrics::gauge!("vigil_camera_up", "camera" => self.config.id.clone()).set(
                if s.state == CameraState::Running {
                    1.0
                } else {
                    0.0
                },
            );
        }
    }

    /// Whether shutdown was asked for.
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Subscribes to every frame's results.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<FrameResult>> {
        self.events.subscribe()
    }

    /// Watches the latest published frame (slow readers just see fewer frames).
    pub fn watch_latest(&self) -> watch::Receiver<Option<Arc<Published>>> {
        self.latest.subscribe()
    }

    /// The latest published frame.
    pub fn latest(&self) -> Option<Arc<Published>> {
        self.latest.borrow().clone()
    }

    /// The summary served by `GET /v1/cameras`.
    pub fn summary(&self) -> CameraSummary {
        let c = &self.counters;
        CameraSummary {
            id: self.config.id.clone(),
            model: self.config.model.clone(),
            status: self.status(),
            fps_in: self.rate_in.rate(),
            fps_out: self.rate_out.rate(),
            frames_captured: c.captured.load(Ordering::Relaxed),
            frames_inferred: c.inferred.load(Ordering::Relaxed),
            frames_dropped: c.dropped.load(Ordering::Relaxed),
            frames_failed: c.failed.load(Ordering::Relaxed),
            last_result: self.latest().map(|p| (*p.result).clone()),
        }
    }

    /// Asks both threads to stop and waits for them.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        self.slot.close();
        let threads: Vec<_> =
            std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }

    /// Counts a captured frame (capture thread).
    pub(crate) fn on_captured(&self, frame: RawFrame) {
        let n = self.counters.captured.fetch_add(1, Ordering::Relaxed) + 1;
        let id = self.config.id.clone();
        metrics::counter!("vigil_camera_frames_total", "camera" => id.clone(), "outcome" => "captured").increment(1);
        if let Some(r) = self.rate_in.tick(n) {
            metrics::gauge!("vigil_camera_fps", "camera" => id.clone(), "direction" => "in").set(r);
        }
        if self.slot.put(frame) {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("vigil_camera_frames_total", "camera" => id, "outcome" => "dropped")
                .increment(1);
        }
    }
}

/// Everything the inference thread needs.
pub struct Transform {
    /// The model runner (the camera's own execution context).
    pub infer: Box<dyn FrameInfer>,
    /// The model's pre/post-processing recipe.
    pub spec: VisionSpec,
    /// Largest accepted frame (width*height).
    pub max_pixels: u64,
}

fn inference_loop(cam: Arc<CameraHandle>, mut t: Transform, webhook: Option<Webhook>) {
    let cfg = &cam.config;
    let mut conv = Converter::new(cfg.yuv_matrix, cfg.yuv_range, t.max_pixels);
    let overrides = Overrides {
        top_k: None,
        score_threshold: cfg.threshold,
    };
    let interval = Duration::from_millis(cfg.interval_ms);
    let mut last_start: Option<Instant> = None;
    let id = cfg.id.clone();
    loop {
        if let Some(s) = last_start {
            // Rate limit: wait out the interval (the slot keeps only the newest frame meanwhile).
            while s.elapsed() < interval && !cam.stopping() {
                std::thread::sleep((interval - s.elapsed()).min(Duration::from_millis(50)));
            }
        }
        let frame = match cam.slot.take(Duration::from_millis(200)) {
            Ok(Some(f)) => f,
            Ok(None) => continue,
            Err(()) => break,
        };
        last_start = Some(Instant::now());
        let mut timings = FrameTimings::default();
        let s = Instant::now();
        let outcome = convert_frame(&mut conv, &mut *t.infer, &frame).and_then(|img| {
            timings.convert_ms = ms(s);
            t.infer
                .infer_rgb(&img, &t.spec, &overrides, &mut timings)
                .map(|r| (img, r))
                .map_err(|e| e.to_string())
        });
        match outcome {
            Ok((img, results)) => {
                timings.latency_ms = ms(frame.captured);
                let age = frame.captured.elapsed();
                let timestamp_ms = SystemTime::now()
                    .checked_sub(age)
                    .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_millis() as u64);
                let result = Arc::new(FrameResult {
                    camera: id.clone(),
                    seq: frame.seq,
                    width: img.width(),
                    height: img.height(),
                    timestamp_ms,
                    timings,
                    results,
                });
                record_stages(&id, &timings);
                let n = cam.counters.inferred.fetch_add(1, Ordering::Relaxed) + 1;
                metrics::counter!("vigil_camera_frames_total", "camera" => id.clone(), "outcome" => "inferred").increment(1);
                if let Some(r) = cam.rate_out.tick(n) {
                    metrics::gauge!("vigil_camera_fps", "camera" => id.clone(), "direction" => "out").set(r);
                }
                if let Some(w) = &webhook {
                    w.offer(&result);
                }
                let _ = cam.events.send(result.clone());
                let old = cam
                    .latest
                    .send_replace(Some(Arc::new(Published::new(result, Arc::new(img)))));
                // Reuse the previous frame's pixels when no client still holds them.
                if let Some(img) = old
                    .and_then(Arc::into_inner)
                    .and_then(|p| Arc::into_inner(p.image))
                {
                    conv.recycle(img);
                }
            }
            Err(e) => {
                cam.counters.failed.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("vigil_camera_frames_total", "camera" => id.clone(), "outcome" => "failed").increment(1);
                tracing::warn!(camera = %id, seq = frame.seq, error = %e, "frame failed");
                cam.update_status(|s| s.last_error = Some(format!("frame {}: {e}", frame.seq)));
            }
        }
    }
}

fn record_stages(id: &str, t: &FrameTimings) {
    for (stage, v) in [
        ("convert", t.convert_ms),
        ("preprocess", t.preprocess_ms),
        ("inference", t.inference_ms),
        ("postprocess", t.postprocess_ms),
        ("latency", t.latency_ms),
    ] {
        metrics::histogram!("vigil_camera_stage_seconds", "camera" => id.to_string(), "stage" => stage)
            .record(v / 1e3);
    }
}

/// Starts a camera: the capture thread (source under the supervisor) and the inference thread.
pub fn start_camera(
    config: CameraConfig,
    factory: SourceFactory,
    transform: Transform,
) -> Result<Arc<CameraHandle>, String> {
    config.validate()?;
    // Install the metrics recorder before the first camera metric is recorded.
    let _ = crate::http::metrics::handle();
    let webhook = config
        .webhook
        .as_ref()
        .map(|w| Webhook::start(&config.id, w));
    let cam = Arc::new(CameraHandle::new(config));
    metrics::gauge!("vigil_camera_up", "camera" => cam.config.id.clone()).set(0.0);
    let c1 = cam.clone();
    let capture = std::thread::Builder::new()
        .name(format!("cam-{}-capture", cam.config.id))
        .spawn(move || supervisor::run(c1, factory))
        .map_err(|e| format!("cannot start the capture thread: {e}"))?;
    let c2 = cam.clone();
    let infer = std::thread::Builder::new()
        .name(format!("cam-{}-infer", cam.config.id))
        .spawn(move || inference_loop(c2, transform, webhook))
        .map_err(|e| format!("cannot start the inference thread: {e}"))?;
    cam.threads
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .extend([capture, infer]);
    Ok(cam)
}

/// All cameras by id; stops them when dropped.
#[derive(Default)]
pub struct CameraHub {
    cameras: BTreeMap<String, Arc<CameraHandle>>,
}

impl CameraHub {
    /// No cameras.
    pub fn new() -> CameraHub {
        CameraHub::default()
    }

    /// Adds a started camera.
    pub fn insert(&mut self, cam: Arc<CameraHandle>) {
        self.cameras.insert(cam.id().to_string(), cam);
    }

    /// A camera by id.
    pub fn get(&self, id: &str) -> Option<Arc<CameraHandle>> {
        self.cameras.get(id).cloned()
    }

    /// All cameras, by id.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<CameraHandle>> {
        self.cameras.values()
    }

    /// Number of cameras.
    pub fn len(&self) -> usize {
        self.cameras.len()
    }

    /// True without cameras.
    pub fn is_empty(&self) -> bool {
        self.cameras.is_empty()
    }

    /// Starts every configured camera on its model from `registry` (one new execution context
    /// each). A camera whose model is unknown is an error; a source that fails to open is not
    /// (the supervisor keeps retrying).
    pub fn start_all(
        configs: &[CameraConfig],
        registry: &crate::registry::Registry,
        max_pixels: u64,
    ) -> Result<CameraHub, String> {
        let mut hub = CameraHub::new();
        for cfg in configs {
            let m = registry
                .get(&cfg.model)
                .ok_or_else(|| format!("camera '{}': unknown model '{}'", cfg.id, cfg.model))?;
            let model = m.model.as_ref().ok_or_else(|| {
                format!(
                    "camera '{}': model '{}' has no engine model",
                    cfg.id, cfg.model
                )
            })?;
            let ctx = model
                .new_context()
                .map_err(|e| format!("camera '{}': cannot create a context: {e}", cfg.id))?;
            let transform = Transform {
                infer: Box::new(ctx),
                spec: m.spec.clone(),
                max_pixels,
            };
            let factory = super::source::factory_for(cfg, max_pixels);
            let cam = start_camera(cfg.clone(), factory, transform)?;
            tracing::info!(camera = %cfg.id, model = %cfg.model, kind = ?cfg.kind, "camera started");
            hub.insert(cam);
        }
        Ok(hub)
    }

    /// Stops every camera.
    pub fn stop_all(&self) {
        for c in self.cameras.values() {
            c.stop();
        }
    }
}

impl Drop for CameraHub {
    fn drop(&mut self) {
        self.stop_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::camera::convert::{YuvMatrix, YuvRange};
    use crate::camera::source::PixelFormat;

    /// A stand-in model that converts YUV frames itself (as a CUDA context does) into a constant
    /// image, and counts the requests.
    struct GpuLike {
        asked: usize,
        answer: bool,
    }

    impl FrameInfer for GpuLike {
        fn infer_rgb(
            &mut self,
            _img: &RgbImage,
            _spec: &VisionSpec,
            _overrides: &Overrides,
            _t: &mut FrameTimings,
        ) -> vigil_engine::Result<Results> {
            Ok(Results::Classes(Vec::new()))
        }

        fn yuv_to_rgb(
            &mut self,
            frame: &YuvFrame<'_>,
            _k: &YuvCoeffs,
        ) -> Option<vigil_engine::Result<RgbImage>> {
            self.asked += 1;
            self.answer.then(|| {
                Ok(RgbImage::from_pixel(
                    frame.width as u32,
                    frame.height as u32,
                    image::Rgb([1, 2, 3]),
                ))
            })
        }
    }

    #[test]
    fn yuv_frames_go_to_the_model_side_converter_when_it_offers_one() {
        let mut conv = Converter::new(YuvMatrix::Bt601, YuvRange::Limited, 1 << 20);
        // Limited-range black (Y 16, neutral chroma) converts to 0 on the CPU.
        let f = RawFrame::new(PixelFormat::Yuyv, 4, 2, [16, 128, 16, 128].repeat(4));
        let mut gpu = GpuLike {
            asked: 0,
            answer: true,
        };
        let img = convert_frame(&mut conv, &mut gpu, &f).unwrap();
        assert_eq!((gpu.asked, img.get_pixel(3, 1).0), (1, [1, 2, 3]));
        let mut cpu = GpuLike {
            asked: 0,
            answer: false,
        };
        let img = convert_frame(&mut conv, &mut cpu, &f).unwrap();
        assert_eq!((cpu.asked, img.get_pixel(3, 1).0), (1, [0, 0, 0]));
        let f = RawFrame::new(PixelFormat::Rgb24, 1, 1, vec![9, 8, 7]);
        let img = convert_frame(&mut conv, &mut gpu, &f).unwrap();
        assert_eq!((gpu.asked, img.get_pixel(0, 0).0), (1, [9, 8, 7]));
    }
}
