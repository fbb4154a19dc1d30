//! `vigil infer`: run images through one model and print the HTTP API's JSON.

use std::path::PathBuf;
use std::time::Instant;

use vigil_engine::vision::{self, DecodeLimits, Overrides};

use crate::config::Limits;
use crate::http::infer::{check_image, InferResponse};
use crate::http::next_request_id;
use crate::registry::{load_model, model_options, task_name};

/// Arguments of `vigil infer`.
#[derive(Debug, clap::Args)]
pub struct InferArgs {
    /// Model name (from --config or the defaults) or path to an .onnx file.
    #[arg(long)]
    pub model: String,
    /// TOML configuration file to resolve the model name against.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Directory holding the default models.
    #[arg(long)]
    pub models_dir: Option<PathBuf>,
    /// Number of classes to return.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Minimum score.
    #[arg(long)]
    pub threshold: Option<f32>,
    /// Backend (overrides the config): cpu, cuda or auto.
    #[arg(long, value_enum)]
    pub device: Option<super::DeviceArg>,
    /// Precision (overrides the config): fp32, fp16 or int8.
    #[arg(long, value_enum)]
    pub precision: Option<super::PrecisionArg>,
    /// Image files.
    #[arg(required = true)]
    pub images: Vec<PathBuf>,
}

/// Runs every image; prints one JSON object (or an array for several images). Fails if any image failed.
pub fn run(args: InferArgs) -> Result<(), String> {
    let mut cfg = super::resolve_model(
        &args.model,
        args.config.as_deref(),
        args.models_dir.as_deref(),
    )?;
    if let Some(d) = args.device {
        cfg.device = Some(d.into());
    }
    if let Some(p) = args.precision {
        cfg.precision = Some(p.into());
    }
    let max_pixels = match &args.config {
        Some(p) => {
            crate::config::Config::load(p)
                .map_err(|e| e.to_string())?
                .limits
                .max_pixels
        }
        None => Limits::default().max_pixels,
    };
    let (model, spec) = load_model(&cfg, &model_options(&cfg))?;
    let mut ctx = model
        .new_context()
        .map_err(|e| format!("cannot create an execution context: {e}"))?;
    let limits = DecodeLimits { max_pixels };
    let overrides = Overrides {
        top_k: args.top_k,
        score_threshold: args.threshold,
    };
    let mut results = Vec::new();
    let mut failures = 0usize;
    for path in &args.images {
        let started = Instant::now();
        let outcome = std::fs::read(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))
            .and_then(|bytes| {
                check_image(&bytes, max_pixels)
                    .map_err(|e| format!("{}: {}", path.display(), e.message))?;
                vision::infer_image(&mut ctx, &spec, &bytes, &limits, &overrides)
                    .map_err(|e| format!("{}: {e}", path.display()))
            });
        match outcome {
            Ok(inf) => {
                let total = started.elapsed().as_secs_f64() * 1e3;
                results.push(InferResponse::new(
                    &cfg.name,
                    task_name(&spec),
                    inf,
                    total,
                    next_request_id(),
                ));
            }
            Err(e) => {
                eprintln!("error: {e}");
                failures += 1;
            }
        }
    }
    let text = if args.images.len() == 1 {
        results
            .first()
            .map(serde_json::to_string_pretty)
            .transpose()
    } else {
        serde_json::to_string_pretty(&results).map(Some)
    }
    .map_err(|e| format!("cannot encode JSON: {e}"))?;
    if let Some(t) = text {
        println!("{t}");
    }
    if failures > 0 {
        return Err(format!("{failures} of {} images failed", args.images.len()));
    }
    Ok(())
}
