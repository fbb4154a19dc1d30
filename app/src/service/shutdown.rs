//! Graceful shutdown: the signal that starts it and the drain deadline that ends it.

use std::future::Future;
use std::time::Duration;

/// How long in-flight requests may take after SIGTERM before the daemon exits anyway
/// (the unit's `TimeoutStopSec` must be longer).
pub const DEFAULT_DRAIN_DEADLINE: Duration = Duration::from_secs(10);

/// Resolves on SIGINT (Ctrl-C) or SIGTERM with the signal's name.
pub async fn signal() -> &'static str {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => "SIGINT",
        _ = term => "SIGTERM",
    }
}

/// Runs `server` (which stops accepting and drains once its shutdown future fires) until it
/// finishes, or until `deadline` after `started` resolves; returns the server's result, or
/// `None` when the deadline cut in-flight requests off.
pub async fn drain_with_deadline<T>(
    server: impl Future<Output = T>,
    started: impl Future<Output = ()>,
    deadline: Duration,
) -> Option<T> {
    tokio::pin!(server);
    let cutoff = async {
        started.await;
        tokio::time::sleep(deadline).await;
    };
    tokio::select! {
        r = &mut server => Some(r),
        _ = cutoff => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_server_that_finishes_before_the_deadline_returns_its_result() {
        let server = async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            7
        };
        let r = drain_with_deadline(server, async {}, Duration::from_secs(600)).await;
        assert_eq!(r, Some(7));
    }

    #[tokio::test]
    async fn a_server_that_never_drains_is_cut_off_at_the_deadline() {
        let server = std::future::pending::<i32>();
        let r = drain_with_deadline(server, async {}, Duration::from_millis(5)).await;
        assert_eq!(r, None);
    }

    #[tokio::test]
    async fn the_deadline_only_runs_once_shutdown_has_started() {
        let server = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            7
        };
        let never = std::future::pending::<()>();
        let r = drain_with_deadline(server, never, Duration::from_millis(1)).await;
        assert_eq!(r, Some(7));
    }
}
