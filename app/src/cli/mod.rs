//! Command implementations behind `main.rs`: `serve` runs the daemon, `infer` runs images through
//! a model, `bench` times raw inference.; `inspect` prints the graph before and after optimization.

pub mod bench;
pub mod calibrate;
pub mod cameras;
pub mod infer;
pub mod inspect;
pub mod serve;

use std::path::{Path, PathBuf};

use crate::config::{find_models_dir, Config, ModelConfig};

/// Loads `--config` if given, else the default configuration over the found models directory.
pub fn load_config(config: Option<&Path>, models_dir: Option<&Path>) -> Result<Config, String> {
    match config {
        Some(p) => Config::load(p).map_err(|e| e.to_string()),
        None => {
            let dir = find_models_dir(models_dir).map_err(|e| e.to_string())?;
            Ok(Config::defaults(&dir))
        }
    }
}

/// Resolves a model argument: a path to an `.onnx` file (defaults by file name), else a model
/// name from `--config` or the default models.
pub fn resolve_model(
    arg: &str,
    config: Option<&Path>,
    models_dir: Option<&Path>,
) -> Result<ModelConfig, String> {
    let as_path = PathBuf::from(arg);
    if as_path.is_file() || arg.to_ascii_lowercase().ends_with(".onnx") {
        if !as_path.is_file() {
            return Err(format!("model file {arg} does not exist"));
        }
        return Ok(ModelConfig::from_path(&as_path));
    }
    let cfg = load_config(config, models_dir)?;
    cfg.models
        .iter()
        .find(|m| m.name == arg)
        .cloned()
        .ok_or_else(|| {
            format!(
                "unknown model '{arg}'; known models: {} (or pass a path to an .onnx file)",
                cfg.models
                    .iter()
                    .map(|m| m.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
}

/// `--device` values.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum DeviceArg {
    /// The CPU backend.
    Cpu,
    /// CUDA device 0 (fails if unusable).
    Cuda,
    /// CUDA if usable, else CPU.
    Auto,
}

impl From<DeviceArg> for vigil_engine::Device {
    fn from(d: DeviceArg) -> Self {
        match d {
            DeviceArg::Cpu => vigil_engine::Device::Cpu,
            DeviceArg::Cuda => vigil_engine::Device::Cuda,
            DeviceArg::Auto => vigil_engine::Device::Auto,
        }
    }
}

/// `--precision` values.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum PrecisionArg {
    /// 32-bit float.
    Fp32,
    /// 16-bit float.
    Fp16,
    /// 8-bit integer.
    Int8,
}

impl From<PrecisionArg> for vigil_engine::Precision {
    fn from(p: PrecisionArg) -> Self {
        match p {
            PrecisionArg::Fp32 => vigil_engine::Precision::Fp32,
            PrecisionArg::Fp16 => vigil_engine::Precision::Fp16,
            PrecisionArg::Int8 => vigil_engine::Precision::Int8,
        }
    }
}
