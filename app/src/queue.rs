//! Per-model admission control and execution: a bounded number of requests may wait or run;
//! each run borrows an executor (an engine `ExecutionContext`) from a pool and runs on the
//! blocking thread pool, off the async runtime.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use vigil_engine::vision::{self, DecodeLimits, ImageInference, Overrides, VisionSpec};
use vigil_engine::{ExecutionContext, Tensor};

/// Something that runs a model: the engine's `ExecutionContext`, or a stand-in when embedding.
pub trait Executor: Send {
    /// Runs raw tensors (inputs in model-input order, outputs in model-output order).
    fn run(&mut self, inputs: &[Tensor]) -> vigil_engine::Result<Vec<Tensor>>;
    /// Decode → preprocess → run → postprocess one image.
    fn infer_image(
        &mut self,
        spec: &VisionSpec,
        bytes: &[u8],
        limits: &DecodeLimits,
        overrides: &Overrides,
    ) -> vigil_engine::Result<ImageInference>;
}

impl Executor for ExecutionContext {
    fn run(&mut self, inputs: &[Tensor]) -> vigil_engine::Result<Vec<Tensor>> {
        ExecutionContext::run(self, inputs)
    }

    fn infer_image(
        &mut self,
        spec: &VisionSpec,
        bytes: &[u8],
        limits: &DecodeLimits,
        overrides: &Overrides,
    ) -> vigil_engine::Result<ImageInference> {
        vision::infer_image(self, spec, bytes, limits, overrides)
    }
}

/// Why a queued job did not produce a result.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// `queue_depth` requests are already waiting or running.
    #[error("model '{0}' is at capacity; retry later")]
    Full(String),
    /// The job panicked or its thread was lost.
    #[error("inference worker failed: {0}")]
    Worker(String),
}

type Pool = Arc<Mutex<Vec<Box<dyn Executor>>>>;

/// The bounded queue of one model.
pub struct ModelQueue {
    name: String,
    depth: usize,
    admission: Arc<Semaphore>,
    workers: Arc<Semaphore>,
    pool: Pool,
    heartbeat: Heartbeat,
}

/// When a model's workers last finished a job (a request, the warm-up or a watchdog probe), in
/// milliseconds since a process-wide origin; the service watchdog reads its age.
#[derive(Clone, Debug)]
pub struct Heartbeat(Arc<AtomicU64>);

fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

impl Heartbeat {
    fn new() -> Heartbeat {
        Heartbeat(Arc::new(AtomicU64::new(Heartbeat::now_ms())))
    }

    fn now_ms() -> u64 {
        u64::try_from(origin().elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Records that a worker just finished a job.
    pub fn tick(&self) {
        self.0.fetch_max(Heartbeat::now_ms(), Ordering::Relaxed);
    }

    /// Time since the last tick (since creation when there was none).
    pub fn age(&self) -> Duration {
        Duration::from_millis(Heartbeat::now_ms().saturating_sub(self.0.load(Ordering::Relaxed)))
    }
}

/// Holds one admission slot; releasing it updates the queue-depth gauge.
struct Admission {
    permit: Option<OwnedSemaphorePermit>,
    admission: Arc<Semaphore>,
    depth: usize,
    name: String,
}

impl Admission {
    fn publish(&self) {
        let used = self
            .depth
            .saturating_sub(self.admission.available_permits());
        metrics::gauge!("vigil_queue_depth", "model" => self.name.clone()).set(used as f64);
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        drop(self.permit.take());
        self.publish();
    }
}

/// An executor on loan; goes back to the pool (and frees its slots) when dropped, even when the
/// job panics or the waiting request was cancelled.
struct Lease {
    exec: Option<Box<dyn Executor>>,
    pool: Pool,
    _worker: OwnedSemaphorePermit,
    _admission: Option<Admission>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(e) = self.exec.take() {
            let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
            pool.push(e);
        }
    }
}

impl ModelQueue {
    /// A queue admitting at most `depth` requests, running on the given executors (one job each at a time).
    pub fn new(name: &str, depth: usize, executors: Vec<Box<dyn Executor>>) -> ModelQueue {
        let n = executors.len();
        let q = ModelQueue {
            name: name.to_string(),
            depth: depth.max(1),
            admission: Arc::new(Semaphore::new(depth.max(1))),
            workers: Arc::new(Semaphore::new(n)),
            pool: Arc::new(Mutex::new(executors)),
            heartbeat: Heartbeat::new(),
        };
        metrics::gauge!("vigil_queue_depth", "model" => q.name.clone()).set(0.0);
        q
    }

    /// Requests currently waiting or executing.
    pub fn in_use(&self) -> usize {
        self.depth
            .saturating_sub(self.admission.available_permits())
    }

    /// The configured depth.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// The workers' heartbeat: ticked whenever any executor of this model finishes a job.
    pub fn heartbeat(&self) -> &Heartbeat {
        &self.heartbeat
    }

    /// A liveness probe for the service watchdog: runs `job` on an executor that is free right
    /// now, outside admission control (so it never takes a client's slot nor gets a 503).
    /// Returns `Ok(None)` at once when every executor is busy: their jobs tick the heartbeat.
    pub async fn probe<R, F>(&self, job: F) -> Result<Option<R>, QueueError>
    where
        R: Send + 'static,
        F: FnOnce(&mut dyn Executor) -> R + Send + 'static,
    {
        let Ok(worker) = self.workers.clone().try_acquire_owned() else {
            return Ok(None);
        };
        self.run_leased(worker, None, job).await.map(Some)
    }

    /// Admits the job (or fails with [`QueueError::Full`] at once), waits for a free executor and
    /// runs `job` on the blocking pool.
    pub async fn execute<R, F>(&self, job: F) -> Result<R, QueueError>
    where
        R: Send + 'static,
        F: FnOnce(&mut dyn Executor) -> R + Send + 'static,
    {
        let permit = self
            .admission
            .clone()
            .try_acquire_owned()
            .map_err(|_| QueueError::Full(self.name.clone()))?;
        let admission = Admission {
            permit: Some(permit),
            admission: self.admission.clone(),
            depth: self.depth,
            name: self.name.clone(),
        };
        admission.publish();
        let worker = self
            .workers
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| QueueError::Worker("executor pool closed".into()))?;
        self.run_leased(worker, Some(admission), job).await
    }

    /// Borrows an executor under `worker` and runs `job` on the blocking pool, ticking the
    /// heartbeat when the job returns.
    async fn run_leased<R, F>(
        &self,
        worker: OwnedSemaphorePermit,
        admission: Option<Admission>,
        job: F,
    ) -> Result<R, QueueError>
    where
        R: Send + 'static,
        F: FnOnce(&mut dyn Executor) -> R + Send + 'static,
    {
        let exec = {
            let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
            pool.pop()
        }
        .ok_or_else(|| QueueError::Worker("no executor available".into()))?;
        let mut lease = Lease {
            exec: Some(exec),
            pool: self.pool.clone(),
            _worker: worker,
            _admission: admission,
        };
        let heartbeat = self.heartbeat.clone();
        let handle = tokio::task::spawn_blocking(move || match lease.exec.as_deref_mut() {
            Some(e) => {
                crate::service::fault::before_job();
                let r = job(e);
                heartbeat.tick();
                Ok(r)
            }
            None => Err(QueueError::Worker("executor missing from lease".into())),
        });
        match handle.await {
            Ok(r) => r,
            Err(e) => Err(QueueError::Worker(if e.is_panic() {
                "inference panicked".into()
            } else {
                e.to_string()
            })),
        }
    }
}
