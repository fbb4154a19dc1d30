//! `vigil`: command-line dispatch.

use clap::{Parser, Subcommand};
use vigil::cli;

#[derive(Parser)]
#[command(
    name = "vigil",
    version,
    about = "Edge inference appliance: HTTP/KServe daemon and tools"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API.
    Serve(cli::serve::ServeArgs),
    /// Run images through a model and print JSON results.
    Infer(cli::infer::InferArgs),
    /// Time inference on random input.
    Bench(cli::bench::BenchArgs),
    /// Print a model's graph as loaded and after optimization (ops, parameters, FLOPs).
    Inspect(cli::inspect::InspectArgs),
    /// Calibrate a model for INT8: QDQ ONNX model, TensorRT calibration cache and report.
    Calibrate(cli::calibrate::CalibrateArgs),
    /// List V4L2 capture devices with their formats, sizes and frame rates.
    Cameras(cli::cameras::CamerasArgs),
    /// Measure the camera pipeline on an MJPEG recording (stage overhead, sustained fps).
    CameraBench(cli::cameras::CameraBenchArgs),
}

fn main() {
    // The journal when systemd connected stderr to it, else human-readable stderr.
    vigil::service::logging::init();
    let result = match Cli::parse().command {
        Command::Serve(a) => cli::serve::run(a),
        Command::Infer(a) => cli::infer::run(a),
        Command::Bench(a) => cli::bench::run(a),
        Command::Inspect(a) => cli::inspect::run(a),
        Command::Calibrate(a) => cli::calibrate::run(a),
        Command::Cameras(a) => cli::cameras::run(a),
        Command::CameraBench(a) => cli::cameras::bench(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
