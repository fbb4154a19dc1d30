//! `sd_notify(3)` messages to the service manager, through the `sd-notify` crate.
//!
//! Every call is a no-op when `NOTIFY_SOCKET` is unset (not started by systemd with
//! `Type=notify`). Send failures are logged once per kind and never stop the daemon.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sd_notify::NotifyState;

/// Sends readiness, status, watchdog and stopping notifications.
#[derive(Debug, Default)]
pub struct Notifier {
    warned: AtomicBool,
}

impl Notifier {
    /// A notifier for this process (reads `NOTIFY_SOCKET` on each send).
    pub fn new() -> Notifier {
        Notifier::default()
    }

    /// True when a service manager listens (`NOTIFY_SOCKET` is set).
    pub fn enabled(&self) -> bool {
        std::env::var_os("NOTIFY_SOCKET").is_some()
    }

    fn send(&self, states: &[NotifyState]) {
        if let Err(e) = sd_notify::notify(states) {
            if !self.warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(error = %e, "cannot notify the service manager");
            }
        }
    }

    /// `READY=1` with a final `STATUS=` line.
    pub fn ready(&self, status: &str) {
        self.send(&[NotifyState::Ready, NotifyState::Status(status)]);
    }

    /// `STATUS=...` (free text shown by `systemctl status`).
    pub fn status(&self, status: &str) {
        self.send(&[NotifyState::Status(status)]);
    }

    /// `WATCHDOG=1`: the service is alive.
    pub fn watchdog(&self) {
        self.send(&[NotifyState::Watchdog]);
    }

    /// `STOPPING=1` with a status line.
    pub fn stopping(&self, status: &str) {
        self.send(&[NotifyState::Stopping, NotifyState::Status(status)]);
    }
}

/// The watchdog period systemd expects (`WATCHDOG_USEC`, honouring `WATCHDOG_PID`), if enabled.
pub fn watchdog_period() -> Option<Duration> {
    sd_notify::watchdog_enabled().filter(|d| !d.is_zero())
}
