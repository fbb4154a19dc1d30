//! `vigil serve`: load the configured models and serve the HTTP API until SIGINT/SIGTERM.

use std::path::PathBuf;

use crate::http::{serve_with_shutdown, AppState};
use crate::registry::Registry;

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
}

/// Runs the daemon; returns when shut down by a signal.
pub fn run(args: ServeArgs) -> Result<(), String> {
    let mut cfg = super::load_config(args.config.as_deref(), args.models_dir.as_deref())?;
    if let Some(device) = args.device {
        for m in &mut cfg.models {
            m.device = Some(device.into());
        }
    }
    let listen = args.listen.unwrap_or_else(|| cfg.listen.clone());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&listen)
            .await
            .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
        let registry = Registry::load_all(&cfg.models, &cfg.limits)?;
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
        tracing::info!(%addr, models = state.registry.len(), cameras = state.cameras.len(), "vigil listening");
        serve_with_shutdown(listener, state, shutdown_signal())
            .await
            .map_err(|e| format!("server error: {e}"))?;
        tracing::info!("shut down");
        Ok(())
    })
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
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
        _ = ctrl_c => tracing::info!("SIGINT received, shutting down"),
        _ = term => tracing::info!("SIGTERM received, shutting down"),
    }
}
