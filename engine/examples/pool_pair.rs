//! The allocator benchmark's pair loop alone (allocate then free, size uniform in [1 B, 10 MB],
//! default stream, claimed) over a host-only pool, for profilers: under
//! `valgrind --tool=cachegrind` it gives a deterministic instruction count per pair, which a
//! noisy VM's timings cannot resolve (`scripts/pool-pair-instructions.sh`).
//!
//! `cargo run --release -p vigil-engine --example pool_pair -- [fixed|paged|background] [STEPS]
//! [off]`: `fixed` is a fixed 8 GiB region; `paged` and `background` are the benchmark's 4 MiB-page
//! shapes over a fake remappable region, moving pages inline or (as placed) in the background;
//! `off` turns stream safety off (the benchmark's A/B arm; the fixed region only: paged pools
//! need stream tracking). `POOL_PAIR_SMALL_PAGES=N` carves blocks under N pages from the top
//! in a paged shape (default 1 inline, 2 background), to tell the placement's share of a
//! difference from the background region's. `POOL_PAIR_WINDOW=1` runs the window workload's
//! steps instead (64 live blocks, a random victim freed and replaced each step).
//! `POOL_PAIR_STREAMS=N` alternates the allocations between N streams (the default one and
//! N - 1 others; the benchmark's two-stream rows), each block freed on its own stream.

#[path = "../benches/common/fake_region.rs"]
mod fake_region;
#[path = "../benches/common/workload.rs"]
mod workload;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use fake_region::{FakePagedRegion, FakeRegion};
use vigil_engine::memory::{FixedPool, PoolOptions, Region, StreamClock, StreamId, SyncClock};
use workload::{Workload, TABLE, WINDOW};

/// Runs `steps` pairs (or window steps) on `pool` from this thread's claim, alternating
/// between `streams` streams: ns per step.
fn run<R: Region>(
    pool: Arc<FixedPool<R>>,
    w: &Workload,
    (steps, streams): (usize, u64),
    window: bool,
) -> Result<f64, String> {
    if window {
        return run_window(pool, w, (steps, streams));
    }
    let _claim = pool.claim();
    let t = Instant::now();
    for i in 0..steps {
        let block = pool
            .alloc(w.pair_sizes[i % TABLE], StreamId(i as u64 % streams))
            .map_err(|e| format!("pair step {i}: {e}"))?;
        drop(std::hint::black_box(block));
    }
    Ok(t.elapsed().as_nanos() as f64 / steps.max(1) as f64)
}

/// Runs `steps` window steps on `pool` from this thread's claim: ns per step.
fn run_window<R: Region>(
    pool: Arc<FixedPool<R>>,
    w: &Workload,
    (steps, streams): (usize, u64),
) -> Result<f64, String> {
    let _claim = pool.claim();
    let mut live = Vec::with_capacity(WINDOW);
    for (i, &size) in w.window_sizes[..WINDOW].iter().enumerate() {
        let block = pool
            .alloc(size, StreamId(i as u64 % streams))
            .map_err(|e| format!("window block {i}: {e}"))?;
        live.push(Some(block));
    }
    let t = Instant::now();
    for i in 0..steps {
        // The victim is freed before its replacement is taken, as in the benchmark.
        let v = w.victims[i % TABLE];
        drop(live[v].take());
        let size = w.window_sizes[(i + WINDOW) % TABLE];
        let block = pool
            .alloc(size, StreamId(i as u64 % streams))
            .map_err(|e| format!("window step {i}: {e}"))?;
        live[v] = Some(block);
    }
    Ok(t.elapsed().as_nanos() as f64 / steps.max(1) as f64)
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let shape = args.next().unwrap_or_else(|| "fixed".into());
    let steps = match args.next().map(|a| a.parse::<usize>()) {
        None => 10_000_000,
        Some(Ok(n)) => n,
        Some(Err(e)) => {
            eprintln!("STEPS must be a count: {e}");
            return ExitCode::FAILURE;
        }
    };
    let stream_safe = match args.next().as_deref() {
        None => true,
        Some("off") => false,
        Some(other) => {
            eprintln!("unknown option {other:?}: only `off` (stream safety off)");
            return ExitCode::FAILURE;
        }
    };
    let window = std::env::var_os("POOL_PAIR_WINDOW").is_some();
    let streams = match std::env::var("POOL_PAIR_STREAMS").map(|v| v.parse::<u64>()) {
        Err(_) => 1,
        Ok(Ok(n)) if n >= 1 => n,
        Ok(_) => {
            eprintln!("POOL_PAIR_STREAMS must be a count of at least 1");
            return ExitCode::FAILURE;
        }
    };
    let w = Workload::new();
    let clock: Arc<dyn StreamClock> = Arc::new(SyncClock);
    // The benchmark's shapes: the serving options; paged, 4 MiB pages with blocks under one page
    // (inline) or two pages (background) from the top of their span, 2 GiB of physical pages.
    let page = 4 << 20;
    let options = |small_from_top: Option<usize>| PoolOptions {
        small_from_top,
        stream_safe,
        ..PoolOptions::serving()
    };
    let result = match shape.as_str() {
        "fixed" => FixedPool::with_options(
            FakeRegion(8 << 30),
            clock,
            options(PoolOptions::serving().small_from_top),
        )
        .map_err(|e| e.to_string())
        .and_then(|p| run(p, &w, (steps, streams), window)),
        "paged" | "background" => {
            let background = shape == "background";
            let region = FakePagedRegion {
                physical: (2usize << 30) / page,
                page,
                mapped: Default::default(),
                background,
            };
            let pages = match std::env::var("POOL_PAIR_SMALL_PAGES") {
                Err(_) => Ok(if background { 2 } else { 1 }),
                Ok(v) => v
                    .parse::<usize>()
                    .map_err(|e| format!("POOL_PAIR_SMALL_PAGES must be a count: {e}")),
            };
            let small = match pages {
                Ok(n) => n * page,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::FAILURE;
                }
            };
            FixedPool::with_options(region, clock, options(Some(small)))
                .map_err(|e| e.to_string())
                .and_then(|p| run(p, &w, (steps, streams), window))
        }
        other => Err(format!(
            "unknown shape {other:?}: fixed, paged or background"
        )),
    };
    match result {
        Ok(ns) => {
            let what = if window { "window steps" } else { "pairs" };
            println!("{shape}: {steps} {what}, {ns:.1} ns each");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
