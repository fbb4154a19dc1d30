//! `vigil serve`: load the configured models and serve the HTTP API until SIGINT/SIGTERM.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::http::{serve_with_shutdown, AppState};
use crate::registry::Registry;
use crate::service::{fault, notify, shutdown, watchdog};

/// Arguments of `vigil serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// TOML configuration file.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Listen address (overrides the config), e.g. 0.0.0.0:8080.
    #[arg(long)]
    pub listen: Option<String>,
    /// Directory holding the default models (without --config).
    #[arg(long)]
    pub models_dir: Option<PathBuf>,
    /// Backend for every model (overrides the config): cpu, cuda or auto.
    #[arg(long, value_enum)]
    pub device: Option<super::DeviceArg>,
    /// Seconds in-flight requests may take after SIGTERM/SIGINT before the daemon exits anyway.
    #[arg(long, default_value_t = shutdown::DEFAULT_DRAIN_DEADLINE.as_secs())]
    pub shutdown_timeout: u64,
}

/// The `STATUS=` line once serving: models loaded and cameras up.
fn serving_status(state: &AppState, addr: &str) -> String {
    format!("{} on {addr}", crate::service::watchdog::status_line(state))
}

/// Runs the daemon; returns when shut down by a signal. Under systemd (`Type=notify`) it reports
/// status while loading, `READY=1` once every model is loaded and warmed up, `WATCHDOG=1` from
/// the workers' heartbeats, and `STOPPING=1` on SIGTERM.
pub fn run(args: ServeArgs) -> Result<(), String> {
    let mut cfg = super::load_config(args.config.as_deref(), args.models_dir.as_deref())?;
    if let Some(device) = args.device {
        for m in &mut cfg.models {
            m.device = Some(device.into());
        }
    }
    let listen = args.listen.unwrap_or_else(|| cfg.listen.clone());
    let drain_deadline = Duration::from_secs(args.shutdown_timeout);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let result = runtime.block_on(async move {
        let notifier = Arc::new(notify::Notifier::new());
        notifier.status(&format!("loading {} models", cfg.models.len()));
        let listener = tokio::net::TcpListener::bind(&listen)
            .await
            .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
        let host_pool = cfg.memory.host_pool_size().map_err(|e| e.to_string())?;
        if let Some(size) = cfg.memory.cuda_pool_size().map_err(|e| e.to_string())? {
            vigil_engine::backend::cuda::set_device_pool_size(size)
                .map_err(|e| format!("memory.cuda_pool: {e}"))?;
        }
        let registry = Registry::load_all_in(&cfg.models, &cfg.limits, host_pool)?;
        notifier.status(&format!("warming up {} models", registry.len()));
        watchdog::warm_up(&registry).await?;
        let cameras = crate::camera::CameraHub::start_all(
            &cfg.cameras,
            &registry,
            cfg.limits.max_pixels,
        )?;
        let state = AppState::with_cameras(registry, cfg.limits.clone(), cameras);
        let addr = listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or(listen);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let on_signal = {
            let (state, notifier) = (state.clone(), notifier.clone());
            async move {
                let sig = shutdown::signal().await;
                tracing::info!(signal = sig, "shutting down: draining in-flight requests");
                state.ready.store(false, Ordering::SeqCst);
                notifier.stopping(&format!("{sig}: draining in-flight requests"));
                let _ = stop_tx.send(());
            }
        };
        let server = serve_with_shutdown(listener, state.clone(), on_signal);
        tracing::info!(%addr, models = state.registry.len(), cameras = state.cameras.len(), "vigil listening");
        notifier.ready(&serving_status(&state, &addr));
        // Pings start after READY=1: spawned earlier, the pinger's first tick could reach
        // systemd first on another runtime thread.
        if let Some(period) = notify::watchdog_period() {
            tokio::spawn(watchdog::run(state.clone(), notifier.clone(), period));
        }
        fault::arm();
        let started = async {
            if stop_rx.await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        match shutdown::drain_with_deadline(server, started, drain_deadline).await {
            Some(r) => r.map_err(|e| format!("server error: {e}"))?,
            None => tracing::warn!(
                deadline_s = drain_deadline.as_secs(),
                "drain deadline passed; abandoning in-flight requests"
            ),
        }
        tracing::info!("shut down");
        Ok(())
    });
    // Engine jobs still running (a hung worker) must not keep the process alive.
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}
