//! `vigil calibrate`: INT8 post-training calibration of one model. Writes next to the model
//! `<stem>.int8.<hash8>.qdq.onnx` (explicitly quantized ONNX), `<stem>.int8.<hash8>.calib`
//! (TensorRT calibration cache) and `<stem>.int8.<hash8>.report.json`, and prints a summary.

use std::io::IsTerminal;
use std::path::PathBuf;

use vigil_engine::quant::{self, CalibrationOptions, Method, Stage};
use vigil_engine::{Device, Precision};

use crate::registry::{load_model, model_options};

/// `--method` values.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum MethodArg {
    /// TensorRT's KL-divergence search (EntropyCalibration2).
    Entropy,
    /// The 99.99th percentile of |x| (see --percentile).
    Percentile,
    /// The largest |x| seen.
    Minmax,
}

impl From<MethodArg> for Method {
    fn from(m: MethodArg) -> Method {
        match m {
            MethodArg::Entropy => Method::Entropy,
            MethodArg::Percentile => Method::Percentile,
            MethodArg::Minmax => Method::MinMax,
        }
    }
}

/// Arguments of `vigil calibrate`.
#[derive(Debug, clap::Args)]
pub struct CalibrateArgs {
    /// Model name (from --config or the defaults) or path to an .onnx file.
    #[arg(long)]
    pub model: String,
    /// Directory of calibration images (run through the model's own preprocessing).
    #[arg(long)]
    pub images: PathBuf,
    /// Held-out images for the report; default: every 5th image of --images, not calibrated on.
    #[arg(long)]
    pub eval: Option<PathBuf>,
    /// Activation threshold method.
    #[arg(long, value_enum, default_value_t = MethodArg::Entropy)]
    pub method: MethodArg,
    /// Percentile for --method percentile.
    #[arg(long, default_value_t = 99.99)]
    pub percentile: f64,
    /// Per-output-channel weight scales (`--per-channel=false` for one scale per tensor).
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub per_channel: bool,
    /// Layer kept in floating point (repeatable; added to the config's `int8_exclude`).
    #[arg(long)]
    pub exclude: Vec<String>,
    /// TensorRT version in the cache header (NV_TENSORRT_VERSION: 8602 = 8.6.2, 100300 = 10.3.0).
    #[arg(long, default_value = quant::DEFAULT_TRT_VERSION)]
    pub trt_version: String,
    /// CPU threads (0 = one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// TOML configuration file to resolve the model name against.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Directory holding the default models.
    #[arg(long)]
    pub models_dir: Option<PathBuf>,
}

/// Calibrates, writes the artefacts and prints the report's summary.
pub fn run(args: CalibrateArgs) -> Result<(), String> {
    let cfg = super::resolve_model(
        &args.model,
        args.config.as_deref(),
        args.models_dir.as_deref(),
    )?;
    if !args.trt_version.bytes().all(|b| b.is_ascii_digit()) || args.trt_version.is_empty() {
        return Err(format!(
            "--trt-version must be digits (NV_TENSORRT_VERSION), got '{}'",
            args.trt_version
        ));
    }
    // The FP32 CPU model, only to build the vision spec (input size, preprocessing).
    let mut opts = model_options(&cfg);
    opts.device = Device::Cpu;
    opts.precision = Precision::Fp32;
    let (_, spec) = load_model(&cfg, &opts)?;
    let all = quant::list_images(&args.images)
        .map_err(|e| format!("cannot list {}: {e}", args.images.display()))?;
    let (calib, eval) = match &args.eval {
        Some(dir) => (
            all,
            quant::list_images(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?,
        ),
        None => {
            let (e, c): (Vec<_>, Vec<_>) =
                all.into_iter().enumerate().partition(|(i, _)| i % 5 == 4);
            (
                c.into_iter().map(|(_, p)| p).collect(),
                e.into_iter().map(|(_, p)| p).collect(),
            )
        }
    };
    if calib.is_empty() {
        return Err(format!("no images in {}", args.images.display()));
    }
    let bytes =
        std::fs::read(&cfg.path).map_err(|e| format!("cannot read {}: {e}", cfg.path.display()))?;
    let mut exclude = cfg.int8_exclude.clone().unwrap_or_default();
    exclude.extend(args.exclude.iter().cloned());
    let copts = CalibrationOptions {
        method: args.method.into(),
        percentile: args.percentile,
        per_channel: args.per_channel,
        exclude,
        trt_version: args.trt_version.clone(),
        threads: args.threads,
        ..CalibrationOptions::default()
    };
    let total = (calib.len() + eval.len()) as u64;
    let bar = if std::io::stderr().is_terminal() {
        indicatif::ProgressBar::new(total)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg:>10} [{bar:40}] {pos}/{len} images ({eta})")
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    let ncal = calib.len() as u64;
    let (cal, report) = quant::calibrate_images(
        &bytes,
        &spec,
        &calib,
        &eval,
        &copts,
        &mut |stage, done, _| match stage {
            Stage::Calibrate => {
                bar.set_message("calibrate");
                bar.set_position(done as u64);
            }
            Stage::Evaluate => {
                bar.set_message("evaluate");
                bar.set_position(ncal + done as u64);
            }
        },
    )
    .map_err(|e| format!("calibration of '{}' failed: {e}", cfg.name))?;
    bar.finish_and_clear();
    let a = quant::write_artefacts(&cfg.path, &cal, &report)
        .map_err(|e| format!("cannot write the calibration artefacts: {e}"))?;
    print!("{}", report.summary());
    println!("wrote {}", a.qdq_onnx.display());
    println!("wrote {}", a.trt_cache.display());
    println!("wrote {}", a.report.display());
    Ok(())
}
