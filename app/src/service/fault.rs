//! Fault injection for the watchdog tests (documented in app/README.md and docs/packaging.md).
//!
//! `VIGIL_FAULT_STALL_ENGINE_MS=N`: once the daemon has reported ready, every inference job
//! (client requests and watchdog probes alike) first sleeps `N` milliseconds on its worker
//! thread, as a hung engine would. The warm-up before `READY=1` is exempt, so the service comes
//! up and the test can watch `WATCHDOG=1` pings stop. Unset or unparsable means no fault.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// The environment variable that enables the engine stall.
pub const STALL_ENGINE_ENV: &str = "VIGIL_FAULT_STALL_ENGINE_MS";

static ARMED: AtomicBool = AtomicBool::new(false);

fn stall() -> Option<Duration> {
    static STALL: OnceLock<Option<Duration>> = OnceLock::new();
    *STALL.get_or_init(|| {
        std::env::var(STALL_ENGINE_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|ms| *ms > 0)
            .map(Duration::from_millis)
    })
}

/// Arms the configured faults (called once the daemon is ready); returns whether any is configured.
pub fn arm() -> bool {
    let configured = stall().is_some();
    if configured {
        ARMED.store(true, Ordering::SeqCst);
        tracing::warn!(
            env = STALL_ENGINE_ENV,
            "fault injection armed: inference workers will stall"
        );
    }
    configured
}

/// Called by an inference worker before each job: sleeps when the stall fault is armed.
pub fn before_job() {
    if ARMED.load(Ordering::Relaxed) {
        if let Some(d) = stall() {
            std::thread::sleep(d);
        }
    }
}
