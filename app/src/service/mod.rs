//! Running as a systemd service: readiness and status notifications ([`notify`]), the watchdog
//! driven by the inference workers' heartbeats ([`watchdog`]), journald or stderr logging
//! ([`logging`]), graceful shutdown ([`shutdown`]) and the documented fault-injection hook
//! ([`fault`]) that the watchdog tests use.
//!
//! Outside systemd (no `NOTIFY_SOCKET`, no `WATCHDOG_USEC`, no `JOURNAL_STREAM`) everything here is
//! a no-op and Vigil logs to stderr in human-readable form.

pub mod fault;
pub mod logging;
pub mod notify;
pub mod shutdown;
pub mod watchdog;
