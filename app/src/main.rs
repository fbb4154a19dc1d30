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
}

fn main() {
    // The journal when systemd connected stderr to it, else human-readable stderr.
    vigil::service::logging::init();
    let result = match Cli::parse().command {
        Command::Serve(a) => cli::serve::run(a),
        Command::Infer(a) => cli::infer::run(a),
        Command::Bench(a) => cli::bench::run(a),
        Command::Inspect(a) => cli::inspect::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
