//! The capture thread: opens the source, reads frames into the latest-frame slot, and when the
//! source fails (unplugged/ENODEV, stalled, format error, I/O) closes it, backs off and reopens
//! it. State changes are logged and visible in `GET /v1/cameras`.

use std::sync::Arc;
use std::time::Duration;

use super::pipeline::{CameraHandle, CameraState};
use super::source::{SourceErrorKind, SourceFactory};

/// Exponential backoff: `initial`, doubling up to `max`; reset after a good frame.
#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// A backoff starting at `initial`, capped at `max`.
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max: max.max(initial),
            next: initial,
        }
    }

    /// The delay to wait now; doubles the following one.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    /// Back to the initial delay.
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

/// Sleeps `d` in short steps; returns false if the camera is stopping.
fn sleep_unless_stopped(cam: &CameraHandle, d: Duration) -> bool {
    let step = Duration::from_millis(20);
    let deadline = std::time::Instant::now() + d;
    while !cam.stopping() {
        let now = std::time::Instant::now();
        if now >= deadline {
            return true;
        }
        std::thread::sleep(step.min(deadline - now));
    }
    false
}

/// Runs the capture loop until the camera stops or a finite source ends.
pub fn run(cam: Arc<CameraHandle>, mut open: SourceFactory) {
    let cfg = cam.config.clone();
    let id = cfg.id.clone();
    let stall = Duration::from_millis(cfg.stall_timeout_ms);
    let mut backoff = Backoff::new(
        Duration::from_millis(cfg.backoff_initial_ms),
        Duration::from_millis(cfg.backoff_max_ms),
    );
    let mut seq = 0u64;
    let mut failed_before = false;
    while !cam.stopping() {
        cam.update_status(|s| {
            s.state = CameraState::Opening;
            if failed_before {
                s.reconnects += 1;
            }
        });
        let err = match open() {
            Ok(mut src) => {
                let info = src.info();
                tracing::info!(camera = %id, source = %info.description, format = info.format.name(),
                    width = info.width, height = info.height, fps = info.fps, "camera source open");
                cam.update_status(|s| {
                    s.state = CameraState::Running;
                    s.source = Some(info);
                });
                loop {
                    if cam.stopping() {
                        break None;
                    }
                    match src.next_frame(stall) {
                        Ok(mut f) => {
                            backoff.reset();
                            f.seq = seq;
                            seq += 1;
                            cam.on_captured(f);
                        }
                        Err(e) => break Some(e),
                    }
                }
                // `src` drops here: the device is closed before any backoff.
            }
            Err(e) => Some(e),
        };
        let Some(err) = err else { break };
        if err.kind == SourceErrorKind::EndOfStream {
            tracing::info!(camera = %id, "camera source ended");
            cam.update_status(|s| s.state = CameraState::Finished);
            cam.slot.close();
            return;
        }
        failed_before = true;
        let delay = backoff.next_delay();
        tracing::warn!(camera = %id, kind = ?err.kind, error = %err.message,
            retry_ms = delay.as_millis() as u64, "camera source failed; reopening after backoff");
        metrics::counter!("vigil_camera_reconnects_total", "camera" => id.clone()).increment(1);
        cam.update_status(|s| {
            s.state = CameraState::Backoff;
            s.last_error = Some(err.to_string());
        });
        if !sleep_unless_stopped(&cam, delay) {
            break;
        }
    }
    cam.update_status(|s| s.state = CameraState::Stopped);
    cam.slot.close();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_caps_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let got: Vec<u128> = (0..4).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(got, vec![100, 200, 350, 350]);
        b.reset();
        assert_eq!(b.next_delay().as_millis(), 100);
    }
}
