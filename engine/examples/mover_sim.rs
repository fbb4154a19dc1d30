//! Replays the allocator benchmark's workloads on a paged pool whose page moves run in the
//! background, over a simulated region and clock: the pool's own decisions, with the H200's
//! costs (a page map or unmap on the mover thread, an event record or query on the allocating
//! thread) charged to two clocks, the host's and the mover's. Streams wait on the device for
//! the moves behind the blocks they get, as over `BackgroundPagedRegion`, and an event
//! recorded on a waiting stream completes only once the stream is released. Without a GPU it
//! says where a two-stream step's time goes, and what a change to the pool's policy would save.
//!
//! `cargo run --release -p vigil-engine --example mover_sim -- [STEPS [STREAMS]]` (default
//! 1000000 and 2). Costs in ns (`MOVER_SIM_PAGE_NS`, `_RECORD_NS`, `_QUERY_NS`, `_WAIT_NS` (a
//! stream waiting on another's event), `_STEP_NS` (the rest of a step on the host))
//! default to the H200's: a 4 MiB page move about 25 µs of mover time (docs/benchmarks.md,
//! twenty-fifth session: 99 ns of mover time a window step for 3,957 page moves a million),
//! and an event record plus a query about 600 ns (the two-stream pair before the twenty-sixth
//! session, which recorded and queried one a step).

#[path = "../benches/common/workload.rs"]
mod workload;

use std::collections::VecDeque;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use vigil_engine::memory::{EventId, FixedPool, PoolOptions, Region, StreamClock, StreamId};
use workload::{window_peak_live, Workload, TABLE, WINDOW};

/// Page size of the benchmark's background shape.
const PAGE: usize = 4 << 20;
/// Address space of the simulated region.
const ADDRESS: usize = 64 << 30;
/// Moves queued before the pool's calls wait for the mover (as in the real region).
const MAX_QUEUED: usize = 4096;

/// Simulated costs in ns.
#[derive(Clone, Copy)]
struct Costs {
    page: f64,
    record: f64,
    query: f64,
    wait: f64,
    step: f64,
}

/// The simulated device: the host's and the mover's clocks, and what waits on what.
#[derive(Default)]
struct Sim {
    /// Host time (ns).
    now: f64,
    /// When the mover finishes everything queued so far.
    mover_free: f64,
    /// Completion times of queued moves not yet done (for the queue bound).
    queued: VecDeque<f64>,
    /// Per region page: when its last queued move completes.
    page_ready: Vec<f64>,
    /// Per stream (by id): until when it waits on the device for a move.
    held: Vec<f64>,
    /// Completion time of each recorded event.
    events: Vec<f64>,
    mapped: usize,
    records: u64,
    queries: u64,
    /// Device-side waits on another stream's event (spans handed over).
    device_waits: u64,
    stream_waits: u64,
    host_waits_ns: f64,
    mover_busy_ns: f64,
}

impl Sim {
    fn held(&self, s: StreamId) -> f64 {
        self.held.get(s.0 as usize).copied().unwrap_or(0.0)
    }

    /// Host waits until `t`.
    fn wait_until(&mut self, t: f64) {
        if t > self.now {
            self.host_waits_ns += t - self.now;
            self.now = t;
        }
    }

    /// Queues a move of `count` pages at `first` that may start at `earliest`.
    fn queue(&mut self, first: usize, count: usize, earliest: f64, page_ns: f64) {
        while self.queued.front().is_some_and(|&t| t <= self.now) {
            self.queued.pop_front();
        }
        if self.queued.len() >= MAX_QUEUED {
            let t = self.queued[self.queued.len() - MAX_QUEUED];
            self.wait_until(t);
        }
        let start = self.mover_free.max(self.now).max(earliest);
        let cost = count as f64 * page_ns;
        self.mover_free = start + cost;
        self.mover_busy_ns += cost;
        self.queued.push_back(self.mover_free);
        for p in &mut self.page_ready[first..first + count] {
            *p = self.mover_free;
        }
    }
}

/// The simulated region: counts physical pages, queues moves on the simulated mover.
struct SimRegion {
    sim: Arc<Mutex<Sim>>,
    physical: usize,
    costs: Costs,
}

impl SimRegion {
    fn sim(&self) -> std::sync::MutexGuard<'_, Sim> {
        self.sim.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Region for SimRegion {
    fn base(&self) -> usize {
        1 << 40
    }
    fn len(&self) -> usize {
        ADDRESS
    }
    fn page_size(&self) -> Option<usize> {
        Some(PAGE)
    }
    fn physical_pages(&self) -> usize {
        self.physical
    }
    fn map_pages(&self, first: usize, count: usize) -> vigil_engine::Result<()> {
        let mut s = self.sim();
        if s.mapped + count > self.physical {
            return Err(vigil_engine::Error::OutOfMemory(
                "simulated pages exhausted".into(),
            ));
        }
        s.mapped += count;
        let now = s.now;
        s.queue(first, count, now, self.costs.page);
        Ok(())
    }
    fn unmap_pages(&self, first: usize, count: usize) -> vigil_engine::Result<()> {
        self.unmap_pages_after(first, count, &[])
    }
    fn unmap_pages_after(
        &self,
        first: usize,
        count: usize,
        after: &[(StreamId, EventId)],
    ) -> vigil_engine::Result<()> {
        let mut s = self.sim();
        s.mapped -= count;
        let earliest = after
            .iter()
            .map(|&(_, e)| s.events[e.0 as usize - 1])
            .fold(s.now, f64::max);
        s.queue(first, count, earliest, self.costs.page);
        Ok(())
    }
    fn moves_in_background(&self) -> bool {
        true
    }
    fn order_after_moves(
        &self,
        stream: StreamId,
        offset: usize,
        len: usize,
    ) -> vigil_engine::Result<()> {
        let mut s = self.sim();
        let (p0, p1) = (offset / PAGE, (offset + len.max(1)).div_ceil(PAGE));
        let t = s.page_ready[p0..p1].iter().copied().fold(0.0, f64::max);
        if t > s.now && t > s.held(stream) {
            let k = stream.0 as usize;
            if s.held.len() <= k {
                s.held.resize(k + 1, 0.0);
            }
            s.held[k] = t;
            s.stream_waits += 1;
        }
        Ok(())
    }
    fn stream_waits_on_moves(&self, stream: StreamId) -> bool {
        let s = self.sim();
        s.held(stream) > s.now
    }
    fn settle(&self) -> vigil_engine::Result<()> {
        let mut s = self.sim();
        let t = s.mover_free;
        s.wait_until(t);
        Ok(())
    }
    fn settle_within(&self, limit: std::time::Duration) -> vigil_engine::Result<bool> {
        let mut s = self.sim();
        let limit = limit.as_nanos() as f64;
        let t = s.mover_free;
        if t <= s.now + limit {
            s.wait_until(t);
            Ok(true)
        } else {
            let t = s.now + limit;
            s.wait_until(t);
            Ok(false)
        }
    }
}

/// The simulated clock: an event completes once its stream is no longer held behind a move.
struct SimClock {
    sim: Arc<Mutex<Sim>>,
    costs: Costs,
}

impl StreamClock for SimClock {
    fn record(&self, stream: StreamId) -> EventId {
        let mut s = self.sim.lock().unwrap_or_else(|e| e.into_inner());
        s.now += self.costs.record;
        s.records += 1;
        let done = s.now.max(s.held(stream));
        s.events.push(done);
        EventId(s.events.len() as u64)
    }
    fn is_complete(&self, _stream: StreamId, epoch: EventId) -> bool {
        let mut s = self.sim.lock().unwrap_or_else(|e| e.into_inner());
        s.now += self.costs.query;
        s.queries += 1;
        s.events[epoch.0 as usize - 1] <= s.now
    }
    fn capturing(&self) -> bool {
        false
    }
    fn orders_streams(&self) -> bool {
        true
    }
    fn order_after(&self, waiter: StreamId, _stream: StreamId, epoch: EventId) -> bool {
        let mut s = self.sim.lock().unwrap_or_else(|e| e.into_inner());
        s.now += self.costs.wait;
        s.device_waits += 1;
        let done = s.events[epoch.0 as usize - 1];
        let k = waiter.0 as usize;
        if s.held.len() <= k {
            s.held.resize(k + 1, 0.0);
        }
        s.held[k] = s.held[k].max(done);
        true
    }
}

/// Runs `steps` of the pair or the window on `streams` streams; prints one line.
fn run(w: &Workload, steps: usize, streams: u64, window: bool, costs: Costs) -> Result<(), String> {
    let sim = Arc::new(Mutex::new(Sim {
        page_ready: vec![0.0; ADDRESS / PAGE],
        ..Sim::default()
    }));
    let region = SimRegion {
        sim: Arc::clone(&sim),
        physical: (2usize << 30) / PAGE,
        costs,
    };
    let clock = Arc::new(SimClock {
        sim: Arc::clone(&sim),
        costs,
    });
    let opts = PoolOptions {
        small_from_top: Some(2 * PAGE),
        ..PoolOptions::serving()
    };
    let pool = FixedPool::with_options(region, clock, opts).map_err(|e| e.to_string())?;
    let claim = pool.claim();
    let tick = |sim: &Mutex<Sim>| sim.lock().unwrap_or_else(|e| e.into_inner()).now += costs.step;
    let err = |i: usize, e: vigil_engine::Error| format!("step {i}: {e}");
    let mut live = Vec::with_capacity(WINDOW);
    if window {
        for (i, &size) in w.window_sizes[..WINDOW].iter().enumerate() {
            let s = StreamId(i as u64 % streams);
            live.push(Some(claim.alloc(size, s).map_err(|e| err(i, e))?));
        }
    }
    let t0 = sim.lock().unwrap_or_else(|e| e.into_inner()).now;
    let base = {
        let s = sim.lock().unwrap_or_else(|e| e.into_inner());
        (
            s.records,
            s.queries,
            s.stream_waits,
            s.host_waits_ns,
            s.mover_busy_ns,
            s.device_waits,
        )
    };
    let maps0 = pool.stats().pages_mapped;
    for i in 0..steps {
        tick(&sim);
        let s = StreamId(i as u64 % streams);
        if window {
            let v = w.victims[i % TABLE];
            live[v] = None;
            let size = w.window_sizes[(i + WINDOW) % TABLE];
            live[v] = Some(claim.alloc(size, s).map_err(|e| err(i, e))?);
        } else {
            drop(
                claim
                    .alloc(w.pair_sizes[i % TABLE], s)
                    .map_err(|e| err(i, e))?,
            );
        }
    }
    let st = pool.stats();
    let s = sim.lock().unwrap_or_else(|e| e.into_inner());
    let per = |x: f64| x / steps as f64;
    let per_m = |x: u64| x as f64 * 1e6 / steps as f64;
    let footprint = if window {
        format!(
            ", footprint {:.3}",
            st.footprint as f64 / window_peak_live(w, steps) as f64
        )
    } else {
        String::new()
    };
    println!(
        "{:<6} {streams} stream(s): host {:>7.1} ns a step (waits {:>7.1}), mover {:>7.1} ns a step; \
         a million steps: {:>7.0} records, {:>7.0} queries, {:>7.0} spans handed over, {:>7.0} pages mapped, \
         {:>7.0} stream waits{footprint}",
        if window { "window" } else { "pair" },
        per(s.now - t0),
        per(s.host_waits_ns - base.3),
        per(s.mover_busy_ns - base.4),
        per_m(s.records - base.0),
        per_m(s.queries - base.1),
        per_m(s.device_waits - base.5),
        per_m(st.pages_mapped - maps0),
        per_m(s.stream_waits - base.2),
    );
    Ok(())
}

/// `MOVER_SIM_<name>` in ns, or `default`.
fn cost(name: &str, default: f64) -> Result<f64, String> {
    match std::env::var(format!("MOVER_SIM_{name}")) {
        Err(_) => Ok(default),
        Ok(v) => v
            .parse()
            .map_err(|_| format!("MOVER_SIM_{name} must be a number of ns, not {v:?}")),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parse = |i: usize, default: u64| -> Result<u64, String> {
        args.get(i).map_or(Ok(default), |a| {
            a.parse().map_err(|_| format!("cannot parse {a:?}"))
        })
    };
    let setup = (|| -> Result<(usize, u64, Costs), String> {
        let costs = Costs {
            page: cost("PAGE_NS", 25_000.0)?,
            record: cost("RECORD_NS", 350.0)?,
            query: cost("QUERY_NS", 250.0)?,
            wait: cost("WAIT_NS", 300.0)?,
            step: cost("STEP_NS", 50.0)?,
        };
        Ok((parse(0, 1_000_000)? as usize, parse(1, 2)?.max(1), costs))
    })();
    let (steps, streams, costs) = match setup {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let w = Workload::new();
    let mut ok = true;
    for window in [false, true] {
        for n in 1..=streams {
            if let Err(e) = run(&w, steps, n, window, costs) {
                println!("{n} stream(s): out of memory at {e}");
                ok = false;
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
