//! `vigil bench`: time raw inference of random inputs through one execution context.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;
use vigil_engine::{DataType, ExecutionContext, ModelOptions, Tensor, TensorData, TensorInfo};

use crate::registry::load_model;

/// Arguments of `vigil bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Model name (from --config or the defaults) or path to an .onnx file.
    pub model: String,
    /// Timed iterations.
    #[arg(long, default_value_t = 100)]
    pub iterations: usize,
    /// Untimed warm-up iterations.
    #[arg(long, default_value_t = 5)]
    pub warmup: usize,
    /// Batch size.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// CPU threads (0 = one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Equal parts of the batch run at once, each on its own CUDA stream (overrides the
    /// config; CUDA only).
    #[arg(long)]
    pub lanes: Option<usize>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Paced mode, for a driver that interleaves Vigil with a peer in one measurement
    /// (`scripts/bench-paired.py`): after the warm-up, each stdin line is a count of timed
    /// iterations to run, answered by one line holding their latencies in ms as a JSON array.
    #[arg(long, conflicts_with = "json")]
    pub paced: bool,
    /// Backend (overrides the config): cpu, cuda or auto.
    #[arg(long, value_enum)]
    pub device: Option<super::DeviceArg>,
    /// Precision (overrides the config): fp32, fp16 or int8.
    #[arg(long, value_enum)]
    pub precision: Option<super::PrecisionArg>,
    /// TOML configuration file to resolve the model name against.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Directory holding the default models.
    #[arg(long)]
    pub models_dir: Option<PathBuf>,
}

/// Latency summary in milliseconds plus throughput.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BenchStats {
    /// Number of timed iterations.
    pub iterations: usize,
    /// Images per iteration.
    pub batch: usize,
    /// Fastest iteration.
    pub min_ms: f64,
    /// Median iteration (nearest rank).
    pub p50_ms: f64,
    /// 90th-percentile iteration (nearest rank).
    pub p90_ms: f64,
    /// 99th-percentile iteration (nearest rank).
    pub p99_ms: f64,
    /// Slowest iteration.
    pub max_ms: f64,
    /// Mean iteration.
    pub mean_ms: f64,
    /// Images (batch elements) per second over the timed iterations.
    pub throughput: f64,
}

/// Nearest-rank percentile of sorted samples (`p` in 0..=100); 0 for no samples.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Summarises per-iteration latencies (ms) of `batch`-sized runs.
pub fn summarize(samples_ms: &[f64], batch: usize) -> BenchStats {
    let mut s = samples_ms.to_vec();
    s.sort_by(f64::total_cmp);
    let total: f64 = s.iter().sum();
    BenchStats {
        iterations: s.len(),
        batch,
        min_ms: s.first().copied().unwrap_or(0.0),
        p50_ms: percentile(&s, 50.0),
        p90_ms: percentile(&s, 90.0),
        p99_ms: percentile(&s, 99.0),
        max_ms: s.last().copied().unwrap_or(0.0),
        mean_ms: if s.is_empty() {
            0.0
        } else {
            total / s.len() as f64
        },
        throughput: if total > 0.0 {
            (s.len() * batch) as f64 / (total / 1e3)
        } else {
            0.0
        },
    }
}

/// Deterministic pseudo-random input for one model input (xorshift; f32 in [-1, 1], integers 0).
pub fn random_input(info: &TensorInfo, seed: u64) -> Tensor {
    let n: usize = info.shape.iter().product();
    match info.dtype {
        DataType::F32 => {
            let mut x = seed | 1;
            let data = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
                })
                .collect();
            Tensor {
                shape: info.shape.clone(),
                data: TensorData::F32(data),
            }
        }
        other => Tensor::zeros(other, info.shape.clone()),
    }
}

/// Runs the benchmark and prints the summary.
pub fn run(args: BenchArgs) -> Result<(), String> {
    if args.iterations == 0 || args.batch == 0 {
        return Err("--iterations and --batch must be at least 1".into());
    }
    let cfg = super::resolve_model(
        &args.model,
        args.config.as_deref(),
        args.models_dir.as_deref(),
    )?;
    let opts = ModelOptions {
        batch: args.batch,
        threads: args.threads,
        optimize: true,
        device: args
            .device
            .map(Into::into)
            .or(cfg.device)
            .unwrap_or_default(),
        precision: args
            .precision
            .map(Into::into)
            .or(cfg.precision)
            .unwrap_or_default(),
        lanes: args.lanes.or(cfg.lanes).unwrap_or(1),
    };
    let (model, _spec) = load_model(&cfg, &opts)?;
    let mut ctx = model
        .new_context()
        .map_err(|e| format!("cannot create an execution context: {e}"))?;
    let inputs: Vec<Tensor> = model
        .inputs()
        .iter()
        .enumerate()
        .map(|(i, t)| random_input(t, 0x9E37 + i as u64))
        .collect();
    for _ in 0..args.warmup {
        ctx.run(&inputs)
            .map_err(|e| format!("inference failed: {e}"))?;
    }
    if args.paced {
        return paced(
            &mut ctx,
            &inputs,
            std::io::stdin().lock(),
            std::io::stdout().lock(),
        );
    }
    let bar = if args.iterations >= 50 && std::io::stderr().is_terminal() {
        indicatif::ProgressBar::new(args.iterations as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut samples = Vec::with_capacity(args.iterations);
    // CUDA: device time of each run (CUDA events around the compute, like framework benchmarks).
    let mut device_ms = Vec::new();
    for _ in 0..args.iterations {
        samples.push(timed_run(&mut ctx, &inputs)?);
        if model.backend() == "cuda" {
            device_ms.extend(vigil_engine::backend::cuda::last_device_ms());
        }
        bar.inc(1);
    }
    let device = (!device_ms.is_empty()).then(|| summarize(&device_ms, args.batch));
    bar.finish_and_clear();
    let stats = summarize(&samples, args.batch);
    if args.json {
        let v = serde_json::json!({ "model": cfg.name, "threads": args.threads, "warmup": args.warmup, "stats": stats, "device_stats": device });
        println!("{v}");
    } else {
        println!(
            "model:      {} (batch {}, threads {})",
            cfg.name, args.batch, args.threads
        );
        println!(
            "iterations: {} (+{} warm-up)",
            stats.iterations, args.warmup
        );
        println!(
            "latency ms: min {:.3}  p50 {:.3}  p90 {:.3}  p99 {:.3}  max {:.3}  mean {:.3}",
            stats.min_ms, stats.p50_ms, stats.p90_ms, stats.p99_ms, stats.max_ms, stats.mean_ms
        );
        println!("throughput: {:.1} inferences/s", stats.throughput);
        if let Some(d) = device {
            println!(
                "device ms:  min {:.3}  p50 {:.3}  p90 {:.3}  (CUDA events around the compute)",
                d.min_ms, d.p50_ms, d.p90_ms
            );
        }
    }
    Ok(())
}

/// One timed inference: its wall time in ms.
fn timed_run(ctx: &mut ExecutionContext, inputs: &[Tensor]) -> Result<f64, String> {
    let t = Instant::now();
    ctx.run(inputs)
        .map_err(|e| format!("inference failed: {e}"))?;
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

/// The paced loop: each line of `requests` is a count of timed iterations, answered on `out`
/// by one line with their latencies in ms as a JSON array; blank lines are skipped and the loop
/// ends at end of input. A line that is not a count is an error naming it.
fn paced(
    ctx: &mut ExecutionContext,
    inputs: &[Tensor],
    requests: impl BufRead,
    mut out: impl Write,
) -> Result<(), String> {
    for (i, line) in requests.lines().enumerate() {
        let line = line.map_err(|e| format!("--paced: cannot read stdin: {e}"))?;
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        let n: usize = text.parse().map_err(|_| {
            format!(
                "--paced: line {}: expected a count of iterations, got '{text}'",
                i + 1
            )
        })?;
        let samples = (0..n)
            .map(|_| timed_run(ctx, inputs))
            .collect::<Result<Vec<f64>, String>>()?;
        let reply = serde_json::to_string(&samples).map_err(|e| e.to_string())?;
        writeln!(out, "{reply}")
            .and_then(|()| out.flush())
            .map_err(|e| format!("--paced: cannot write stdout: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_match_naive_nearest_rank() {
        let samples: Vec<f64> = (1..=200).rev().map(|x| x as f64 * 0.5).collect();
        let s = summarize(&samples, 2);
        // Naive: sort ascending, take the k-th smallest with k = ceil(p * n).
        let mut sorted = samples.clone();
        sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
        assert_eq!(s.min_ms, 0.5);
        assert_eq!(s.max_ms, 100.0);
        assert_eq!(s.p50_ms, sorted[99]);
        assert_eq!(s.p90_ms, sorted[179]);
        assert_eq!(s.p99_ms, sorted[197]);
        let total: f64 = samples.iter().sum();
        assert!((s.mean_ms - total / 200.0).abs() < 1e-9);
        assert!((s.throughput - 400.0 / (total / 1000.0)).abs() < 1e-9);
        assert_eq!(percentile(&[], 50.0), 0.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
    }

    #[test]
    fn random_input_has_model_shape_and_range() {
        let info = TensorInfo {
            name: "x".into(),
            dtype: DataType::F32,
            shape: vec![2, 3, 4],
        };
        let t = random_input(&info, 1);
        assert_eq!(t.shape, vec![2, 3, 4]);
        let v = t.as_f32().unwrap();
        assert_eq!(v.len(), 24);
        assert!(v.iter().all(|x| (-1.0..=1.0).contains(x)));
        assert!(v.windows(2).any(|w| w[0] != w[1]));
        let i = TensorInfo {
            name: "i".into(),
            dtype: DataType::I64,
            shape: vec![3],
        };
        assert_eq!(random_input(&i, 1).to_i64_vec().unwrap(), vec![0, 0, 0]);
    }
}
