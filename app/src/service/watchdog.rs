//! Warm-up and the systemd watchdog, driven by the inference workers themselves.
//!
//! Every model's workers tick a [`crate::queue::Heartbeat`] whenever they finish a job (a client
//! request, the warm-up or a probe). The watchdog task runs on the serving runtime: every
//! `WatchdogSec/4` it sends an idle probe (one inference on zeros) to each model whose heartbeat
//! is older than that interval and has a free executor, and it sends `WATCHDOG=1` only when every
//! model's heartbeat is younger than `WatchdogSec/2`. A hung engine stops ticking, the pings
//! stop, and systemd restarts the service (`Restart=on-failure`); a stalled async runtime stops
//! the pings too. Busy workers need no probe: their requests tick the heartbeat.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vigil_engine::Tensor;

use super::notify::Notifier;
use crate::http::AppState;
use crate::queue::Executor;
use crate::registry::{LoadedModel, Registry};

/// One inference on zero-filled inputs of the model's input signature.
fn probe_job(m: &LoadedModel) -> impl FnOnce(&mut dyn Executor) -> vigil_engine::Result<()> {
    let inputs: Vec<Tensor> = m
        .inputs
        .iter()
        .map(|i| Tensor::zeros(i.dtype, i.shape.clone()))
        .collect();
    move |e: &mut dyn Executor| e.run(&inputs).map(|_| ())
}

/// Runs one inference per model (on zeros) so that caches and arenas are warm before `READY=1`.
pub async fn warm_up(registry: &Registry) -> Result<(), String> {
    for m in registry.iter() {
        let started = Instant::now();
        m.queue
            .execute(probe_job(m))
            .await
            .map_err(|e| format!("model '{}': warm-up failed: {e}", m.name))?
            .map_err(|e| format!("model '{}': warm-up inference failed: {e}", m.name))?;
        tracing::info!(model = %m.name, ms = started.elapsed().as_secs_f64() * 1e3, "model warmed up");
    }
    Ok(())
}

/// The ping interval and the heartbeat age limit for a `WatchdogSec` period.
pub fn timings(period: Duration) -> (Duration, Duration) {
    let interval = (period / 4).max(Duration::from_millis(10));
    let stale = (period / 2).max(interval * 2);
    (interval, stale)
}

/// Pings `WATCHDOG=1` while every model's workers are responsive; never returns.
pub async fn run(state: Arc<AppState>, notifier: Arc<Notifier>, period: Duration) {
    let (interval, stale) = timings(period);
    tracing::info!(
        watchdog_ms = period.as_millis() as u64,
        stale_ms = stale.as_millis() as u64,
        "watchdog enabled"
    );
    let probing: BTreeMap<String, Arc<AtomicBool>> = state
        .registry
        .iter()
        .map(|m| (m.name.clone(), Arc::new(AtomicBool::new(false))))
        .collect();
    let mut withheld = false;
    let mut cameras_up = cameras_running(&state);
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let mut unresponsive: Option<(String, Duration)> = None;
        for m in state.registry.iter() {
            let age = m.queue.heartbeat().age();
            if age > stale && unresponsive.as_ref().is_none_or(|(_, a)| age > *a) {
                unresponsive = Some((m.name.clone(), age));
            }
            let Some(flag) = probing.get(&m.name) else {
                continue;
            };
            if age >= interval && !flag.swap(true, Ordering::SeqCst) {
                let (m, flag) = (m.clone(), flag.clone());
                tokio::spawn(async move {
                    let job = probe_job(&m);
                    match m.queue.probe(job).await {
                        Ok(Some(Err(e))) => {
                            tracing::warn!(model = %m.name, error = %e, "watchdog probe inference failed")
                        }
                        Err(e) => {
                            tracing::warn!(model = %m.name, error = %e, "watchdog probe failed")
                        }
                        Ok(Some(Ok(()))) | Ok(None) => {}
                    }
                    flag.store(false, Ordering::SeqCst);
                });
            }
        }
        let up = cameras_running(&state);
        if up != cameras_up && !withheld {
            cameras_up = up;
            notifier.status(&status_line(&state));
        }
        match unresponsive {
            None => {
                notifier.watchdog();
                if withheld {
                    withheld = false;
                    tracing::info!("inference workers responsive again; watchdog pings resumed");
                    notifier.status("serving; watchdog pings resumed");
                }
            }
            Some((name, age)) if !withheld => {
                withheld = true;
                let ms = age.as_millis() as u64;
                tracing::error!(model = %name, heartbeat_age_ms = ms,
                    "inference workers unresponsive; withholding watchdog pings");
                notifier.status(&format!(
                    "watchdog withheld: model '{name}' inference workers unresponsive for {ms} ms"
                ));
            }
            Some(_) => {}
        }
    }
}

/// Cameras whose pipeline is running (capturing) now.
fn cameras_running(state: &AppState) -> usize {
    state
        .cameras
        .iter()
        .filter(|c| c.status().state == crate::camera::pipeline::CameraState::Running)
        .count()
}

/// The STATUS= line while serving: the models loaded and the cameras up.
pub fn status_line(state: &AppState) -> String {
    let names: Vec<&str> = state.registry.iter().map(|m| m.name.as_str()).collect();
    format!(
        "serving {} models ({}); cameras up: {}/{}",
        names.len(),
        names.join(", "),
        cameras_running(state),
        state.cameras.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    use crate::queue::ModelQueue;
    use vigil_engine::vision::{DecodeLimits, ImageInference, Overrides, VisionSpec};

    /// Reports each run on `started`, then blocks until `release` delivers; returns one tensor
    /// holding the number of runs so far.
    struct Gate {
        started: mpsc::Sender<()>,
        release: mpsc::Receiver<()>,
        runs: f32,
    }

    impl Executor for Gate {
        fn run(&mut self, _inputs: &[Tensor]) -> vigil_engine::Result<Vec<Tensor>> {
            let _ = self.started.send(());
            let _ = self.release.recv();
            self.runs += 1.0;
            Ok(vec![Tensor::from_f32(vec![1], vec![self.runs])?])
        }

        fn infer_image(
            &mut self,
            _spec: &VisionSpec,
            _bytes: &[u8],
            _limits: &DecodeLimits,
            _overrides: &Overrides,
        ) -> vigil_engine::Result<ImageInference> {
            Err(vigil_engine::Error::Unsupported("no images".into()))
        }
    }

    fn runs(out: vigil_engine::Result<Vec<Tensor>>) -> Option<f32> {
        match out.ok()?.first()?.data {
            vigil_engine::TensorData::F32(ref v) => v.first().copied(),
            _ => None,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn probes_run_only_on_free_executors_and_leave_client_slots_alone() {
        let (started_tx, started_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel();
        let gate = Gate {
            started: started_tx,
            release: release_rx,
            runs: 0.0,
        };
        let q = Arc::new(ModelQueue::new("m", 1, vec![Box::new(gate)]));

        // A free executor: the probe runs on it, outside admission (no slot used).
        release_tx.send(()).expect("release");
        let probed = q.probe(|e| runs(e.run(&[]))).await.expect("probe");
        assert_eq!(probed, Some(Some(1.0)));
        assert_eq!(q.in_use(), 0);
        started_rx.recv().expect("probe started");

        // A client job holds the only executor: the probe returns at once without running.
        let q2 = q.clone();
        let busy = tokio::spawn(async move { q2.execute(|e| runs(e.run(&[]))).await });
        tokio::task::spawn_blocking(move || started_rx.recv())
            .await
            .expect("join")
            .expect("client job started");
        let probed = q.probe(|e| runs(e.run(&[]))).await.expect("probe");
        assert_eq!(probed, None);
        assert_eq!(q.in_use(), 1);
        release_tx.send(()).expect("release");
        assert_eq!(busy.await.expect("join").expect("job"), Some(2.0));
        assert_eq!(q.in_use(), 0);
    }

    #[test]
    fn timings_are_a_quarter_and_a_half_of_the_period() {
        let (i, s) = timings(Duration::from_secs(30));
        assert_eq!(i, Duration::from_millis(7500));
        assert_eq!(s, Duration::from_secs(15));
        let (i, s) = timings(Duration::from_millis(8));
        assert_eq!(i, Duration::from_millis(10));
        assert_eq!(s, Duration::from_millis(20));
    }
}
