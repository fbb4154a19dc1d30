//! Counts what the allocator benchmark's workloads ask of the driver, without a GPU: events
//! recorded and queried, and pages mapped, per million steps, on one stream and alternating
//! between two, over a fake fixed region and fake paged regions (inline and background moves).
//! On the H200 an event record or query costs a few hundred ns and a mapped page about a µs
//! (docs/benchmarks.md), so these counts say where a two-stream step's time goes.
//!
//! `cargo run --release -p vigil-engine --example stream_counts -- [STEPS]` (default 1000000).
//! `STREAM_COUNTS_DONE_PCT=N` makes only N% of event queries find their point passed (streams
//! that run behind); `STREAM_COUNTS_HELD_PCT=N` makes only N% of the background region's
//! answers say a stream waits behind a move (100 by default, so the pool never promotes);
//! `STREAM_COUNTS_NO_ORDER=1` gives a clock that cannot order streams.

#[path = "../benches/common/fake_region.rs"]
mod fake_region;
#[path = "../benches/common/workload.rs"]
mod workload;

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use fake_region::{FakePagedRegion, FakeRegion};
use vigil_engine::memory::{
    EventId, FixedPool, PoolOptions, Region, StreamClock, StreamId, DEFAULT_ALIGN,
};
use workload::{window_peak_live, Workload, TABLE, WINDOW};

/// A clock that counts the calls a real one makes. By default the device is idle (every point
/// has passed) and streams can be ordered on it, as with `CudaClock`.
#[derive(Default)]
struct CountingClock {
    records: AtomicU64,
    queries: AtomicU64,
    /// Device-side waits (a stream ordered after another's point: a hand-over).
    waits: AtomicU64,
    /// `STREAM_COUNTS_DONE_PCT`: the share of queries (in percent, spread evenly) that find
    /// their point passed, for a device whose streams run behind (100 when unset).
    done_pct: u64,
    /// `STREAM_COUNTS_NO_ORDER=1`: a clock that cannot order streams (the pool promotes other
    /// streams' spans instead of handing them over, as before the twenty-sixth session).
    no_order: bool,
}

impl CountingClock {
    /// A clock set from the environment (see the fields).
    fn from_env() -> CountingClock {
        CountingClock {
            done_pct: std::env::var("STREAM_COUNTS_DONE_PCT")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(100),
            no_order: std::env::var_os("STREAM_COUNTS_NO_ORDER").is_some(),
            ..CountingClock::default()
        }
    }
}

impl StreamClock for CountingClock {
    fn record(&self, _stream: StreamId) -> EventId {
        EventId(self.records.fetch_add(1, Relaxed) + 1)
    }
    fn is_complete(&self, _stream: StreamId, _epoch: EventId) -> bool {
        let q = self.queries.fetch_add(1, Relaxed);
        // A multiplicative hash spreads the passed queries evenly and reproducibly.
        (q.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 33) % 100 < self.done_pct
    }
    fn capturing(&self) -> bool {
        false
    }
    fn orders_streams(&self) -> bool {
        !self.no_order
    }
    fn order_after(&self, _waiter: StreamId, _stream: StreamId, _epoch: EventId) -> bool {
        if self.no_order {
            return false;
        }
        self.waits.fetch_add(1, Relaxed);
        true
    }
}

/// The fake paged region with streams held behind its background moves only part of the time:
/// `STREAM_COUNTS_HELD_PCT=N` (100 when unset, the fake's worst case) says N% of the pool's
/// asks find the stream held, spread evenly. Everything else is the fake's.
struct HeldRegion {
    inner: FakePagedRegion,
    held_pct: u64,
    asked: AtomicU64,
}

impl Region for HeldRegion {
    fn base(&self) -> usize {
        self.inner.base()
    }
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn page_size(&self) -> Option<usize> {
        self.inner.page_size()
    }
    fn physical_pages(&self) -> usize {
        self.inner.physical_pages()
    }
    fn map_pages(&self, first: usize, count: usize) -> vigil_engine::Result<()> {
        self.inner.map_pages(first, count)
    }
    fn unmap_pages(&self, first: usize, count: usize) -> vigil_engine::Result<()> {
        self.inner.unmap_pages(first, count)
    }
    fn moves_in_background(&self) -> bool {
        self.inner.moves_in_background()
    }
    fn unmap_pages_after(
        &self,
        first: usize,
        count: usize,
        after: &[(StreamId, EventId)],
    ) -> vigil_engine::Result<()> {
        self.inner.unmap_pages_after(first, count, after)
    }
    fn order_after_moves(
        &self,
        stream: StreamId,
        offset: usize,
        len: usize,
    ) -> vigil_engine::Result<()> {
        self.inner.order_after_moves(stream, offset, len)
    }
    fn stream_waits_on_moves(&self, stream: StreamId) -> bool {
        let k = self.asked.fetch_add(1, Relaxed);
        self.inner.stream_waits_on_moves(stream)
            && (k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 33) % 100 < self.held_pct
    }
}

/// One run's counts per million steps, and the window's footprint over its peak live bytes.
struct Counts {
    records: f64,
    queries: f64,
    pages: f64,
    waits: f64,
    handed: f64,
    footprint: Option<f64>,
}

/// Runs `steps` of the pair (`window` false) or the window workload on `streams` streams
/// (allocations alternate, each block is freed on its own stream) over a fresh pool.
fn run<R: Region>(
    pool: Arc<FixedPool<R>>,
    clock: &CountingClock,
    w: &Workload,
    (steps, streams, window): (usize, u64, bool),
) -> Result<Counts, String> {
    let claim = pool.claim();
    let err = |i: usize, e: vigil_engine::Error| format!("step {i}: {e}");
    let (r0, q0, w0) = (
        clock.records.load(Relaxed),
        clock.queries.load(Relaxed),
        clock.waits.load(Relaxed),
    );
    let (p0, h0) = (pool.stats().pages_mapped, pool.stats().adoptions);
    let mut footprint = None;
    if window {
        let mut live = Vec::with_capacity(WINDOW);
        for (i, &size) in w.window_sizes[..WINDOW].iter().enumerate() {
            let s = StreamId(i as u64 % streams);
            live.push(Some(claim.alloc(size, s).map_err(|e| err(i, e))?));
        }
        for i in 0..steps {
            let v = w.victims[i % TABLE];
            live[v] = None;
            let size = w.window_sizes[(i + WINDOW) % TABLE];
            let s = StreamId(i as u64 % streams);
            live[v] = Some(claim.alloc(size, s).map_err(|e| err(i, e))?);
        }
        let reserved = pool.stats().footprint;
        footprint = Some(reserved as f64 / window_peak_live(w, steps) as f64);
    } else {
        for i in 0..steps {
            let s = StreamId(i as u64 % streams);
            drop(
                claim
                    .alloc(w.pair_sizes[i % TABLE], s)
                    .map_err(|e| err(i, e))?,
            );
        }
    }
    let per_m = |n: u64| n as f64 * 1e6 / steps as f64;
    Ok(Counts {
        records: per_m(clock.records.load(Relaxed) - r0),
        queries: per_m(clock.queries.load(Relaxed) - q0),
        pages: per_m(pool.stats().pages_mapped - p0),
        waits: per_m(clock.waits.load(Relaxed) - w0),
        handed: per_m(pool.stats().adoptions - h0),
        footprint,
    })
}

fn main() -> ExitCode {
    let steps: usize = match std::env::args().nth(1).map(|a| a.parse()) {
        None => 1_000_000,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            eprintln!("usage: stream_counts [STEPS]");
            return ExitCode::FAILURE;
        }
    };
    let w = Workload::new();
    let held_pct: u64 = std::env::var("STREAM_COUNTS_HELD_PCT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    println!(
        "per million steps: events recorded / queried / pages mapped / device-side waits / spans \
         handed over; window footprint = peak reserved / peak live ({steps} steps, alignment \
         {DEFAULT_ALIGN} B)"
    );
    let mut failed = false;
    for kind in ["fixed", "paged, inline moves", "paged, background moves"] {
        for window in [false, true] {
            for streams in [1u64, 2] {
                let clock = Arc::new(CountingClock::from_env());
                let c: Arc<dyn StreamClock> = clock.clone();
                let result = match kind {
                    "fixed" => {
                        FixedPool::with_options(FakeRegion(8 << 30), c, PoolOptions::serving())
                            .map_err(|e| e.to_string())
                            .and_then(|p| run(p, &clock, &w, (steps, streams, window)))
                    }
                    _ => {
                        let background = kind.contains("background");
                        let page = 4 << 20;
                        let region = HeldRegion {
                            inner: FakePagedRegion {
                                physical: (2usize << 30) / page,
                                page,
                                mapped: Default::default(),
                                background,
                            },
                            held_pct,
                            asked: AtomicU64::new(0),
                        };
                        let opts = PoolOptions {
                            small_from_top: Some(if background { 4 * page } else { page }),
                            ..PoolOptions::serving()
                        };
                        FixedPool::with_options(region, c, opts)
                            .map_err(|e| e.to_string())
                            .and_then(|p| run(p, &clock, &w, (steps, streams, window)))
                    }
                };
                let wl = if window { "window" } else { "pair" };
                match result {
                    Ok(r) => println!(
                        "{kind:<24} {wl:<6} {streams} stream(s): {:>9.0} / {:>9.0} / {:>9.0} / {:>9.0} / \
                         {:>9.0}{}",
                        r.records,
                        r.queries,
                        r.pages,
                        r.waits,
                        r.handed,
                        r.footprint
                            .map(|f| format!("  footprint {f:.3}"))
                            .unwrap_or_default()
                    ),
                    Err(e) => {
                        failed = true;
                        println!("{kind:<24} {wl:<6} {streams} stream(s): out of memory at {e}");
                    }
                }
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
