//! Allocator benchmark: Vigil's fixed pool against cudaMallocAsync/cudaFreeAsync (the CUDA
//! driver's stream-ordered allocator, cuMemAllocAsync/cuMemFreeAsync) in one binary.
//!
//! Workloads (the seed's loops):
//! - pair: allocate then free, size uniform in [1 B, 10 MB];
//! - window: 64 live blocks, sizes log-uniform in [256 B, 64 MB], a random victim freed and
//!   replaced each step;
//! - the same two on two streams (allocations alternate between them).
//!
//! Reports ns per alloc+free pair and, for the window, peak reserved / peak live bytes.
//! `cargo bench -p vigil-engine --bench pool [-- ITERS]`; with no CUDA device it runs the
//! host-only rows (a fake device region) and says so.

use std::sync::Arc;
use std::time::Instant;

use vigil_engine::memory::{
    FixedPool, PoolClaim, PoolOptions, Region, StreamClock, StreamId, SyncClock, DEFAULT_ALIGN,
    SMALL_BLOCK,
};

#[path = "common/fake_region.rs"]
mod fake_region;
#[path = "common/workload.rs"]
mod workload;
use fake_region::{FakePagedRegion, FakeRegion};
use workload::{window_peak_live, Workload, TABLE, WINDOW};

/// Region of the pools in the first run of each row.
const FULL_REGION: usize = 8 << 30;

/// One result row.
struct Row {
    allocator: String,
    workload: &'static str,
    ns_per_pair: f64,
    reserved_over_live: Option<f64>,
    /// Times a paged pool moved pages during the window run, and the pages it mapped and
    /// unmapped.
    remaps: Option<(u64, u64, u64)>,
}

/// An allocator under test: `alloc` returns a handle (or says why it has none), `free` takes
/// it back.
trait Alloc {
    type H;
    fn alloc(&mut self, size: usize, stream: usize) -> Result<Self::H, String>;
    fn free(&mut self, h: Self::H, stream: usize);
    /// Bytes reserved from the device at peak (for the window ratio).
    fn peak_reserved(&mut self) -> usize;
    fn reset_peak(&mut self);
    /// Waits for work the allocator left running in the background (a pool whose page moves
    /// run on a thread of their own), so the timings include it.
    fn settle(&mut self) -> Result<(), String> {
        Ok(())
    }
}

/// The pair loop: ns per alloc+free, or the first allocation that failed.
fn run_pair<A: Alloc>(
    a: &mut A,
    w: &Workload,
    iters: usize,
    streams: usize,
) -> Result<f64, String> {
    let t = Instant::now();
    for i in 0..iters {
        let s = i % streams;
        let h = a
            .alloc(w.pair_sizes[i % TABLE], s)
            .map_err(|e| format!("pair step {i}: {e}"))?;
        a.free(h, s);
    }
    a.settle()?;
    Ok(t.elapsed().as_nanos() as f64 / iters as f64)
}

/// The window loop: (ns per alloc+free, peak reserved / peak live), or the first allocation
/// that failed (the blocks still live are freed).
fn run_window<A: Alloc>(
    a: &mut A,
    w: &Workload,
    iters: usize,
    streams: usize,
) -> Result<(f64, f64), String> {
    a.reset_peak();
    let mut live: Vec<Option<(A::H, usize, usize)>> = Vec::with_capacity(WINDOW);
    let mut live_bytes = 0usize;
    let mut peak_live = 0usize;
    for i in 0..WINDOW {
        let size = w.window_sizes[i];
        let s = i % streams;
        match a.alloc(size, s) {
            Ok(h) => live.push(Some((h, size, s))),
            Err(e) => {
                free_all(a, live);
                return Err(format!("window block {i}: {e}"));
            }
        }
        live_bytes += size;
    }
    peak_live = peak_live.max(live_bytes);
    let t = Instant::now();
    for i in 0..iters {
        let v = w.victims[i % TABLE];
        if let Some((h, size, s)) = live[v].take() {
            a.free(h, s);
            live_bytes -= size;
        }
        let size = w.window_sizes[(i + WINDOW) % TABLE];
        let s = i % streams;
        match a.alloc(size, s) {
            Ok(h) => live[v] = Some((h, size, s)),
            Err(e) => {
                free_all(a, live);
                return Err(format!("window step {i}: {e}"));
            }
        }
        live_bytes += size;
        peak_live = peak_live.max(live_bytes);
    }
    if let Err(e) = a.settle() {
        free_all(a, live);
        return Err(e);
    }
    let ns = t.elapsed().as_nanos() as f64 / iters as f64;
    free_all(a, live);
    Ok((ns, a.peak_reserved() as f64 / peak_live as f64))
}

/// Frees every live block of a window run.
fn free_all<A: Alloc>(a: &mut A, live: Vec<Option<(A::H, usize, usize)>>) {
    for (h, _, s) in live.into_iter().flatten() {
        a.free(h, s);
    }
}

/// The fixed pool over any region and clock, optionally claimed by the benchmark thread (the
/// lock-free owner path).
struct Pool<R: Region> {
    pool: Arc<FixedPool<R>>,
    _claim: Option<PoolClaim<R>>,
}

impl<R: Region> Pool<R> {
    fn new(pool: Arc<FixedPool<R>>, claim: bool) -> Self {
        let _claim = claim.then(|| pool.claim());
        Pool { pool, _claim }
    }
}

impl<R: Region> Alloc for Pool<R> {
    type H = vigil_engine::memory::Block<R>;
    fn alloc(&mut self, size: usize, stream: usize) -> Result<Self::H, String> {
        self.pool
            .alloc(size, StreamId(stream as u64))
            .map_err(|e| e.to_string())
    }
    fn free(&mut self, h: Self::H, _stream: usize) {
        drop(h);
    }
    fn peak_reserved(&mut self) -> usize {
        // A fixed pool reserves its region up front; the part blocks ever reached (from both
        // ends) is about what a pool sized for this workload needs (`verified_footprint`
        // reruns at that size, and grows it until the run fits).
        self.pool.stats().footprint
    }
    fn reset_peak(&mut self) {}
    fn settle(&mut self) -> Result<(), String> {
        self.pool.region().settle().map_err(|e| e.to_string())
    }
}

/// CUDA's virtual-memory granularity on current GPUs.
const PAGE: usize = 2 << 20;

/// One paged-region configuration: page size, blocks under how many bytes come from the top
/// of their span, and its label.
type PagedShape = (usize, usize, &'static str);

/// The paged configurations compared. The driver charges per mapped handle, not per byte
/// (thirteenth session), so 4 MiB pages move the window's bytes in about a third of the calls;
/// with them, blocks under one page come from the top of their span (of the thresholds tried
/// on the window, 0.25–16 MiB, it gave the smallest footprint). Which rows each runs: [`paged_rows`].
const PAGED_SHAPES: [PagedShape; 2] = [
    (PAGE, SMALL_BLOCK, "2 MiB pages"),
    (2 * PAGE, 2 * PAGE, "4 MiB pages"),
];
/// The background-moving paged pool's shape: 4 MiB pages, blocks under two pages from the top
/// of their span. Its pool takes pages from spans kept for a stream without promoting them first,
/// which places blocks a little differently; of the thresholds tried on the window (1, 4, 8,
/// 16 and 32 MiB: footprint 1.099, 1.105, 1.094, 1.094, 1.099 over the fake region) two pages
/// gave the smallest footprint with the fewest pages moved.
const BACKGROUND_SHAPE: PagedShape = (2 * PAGE, 4 * PAGE, "4 MiB pages");
/// Most physical memory a paged pool row takes (its peak live is under 1 GiB).
const PAGED_PHYSICAL: usize = 2 << 30;

/// Which rows a run measures (`POOL_BENCH_ROWS`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rows {
    /// Every row (unset or any other value).
    All,
    /// `paged`: only the paged rows (and, on a GPU, the driver call costs).
    Paged,
    /// `vmm`: only the driver call costs (GPU).
    Vmm,
    /// `ab`: only the stream-safety A/B over the fixed region.
    Ab,
    /// `background`: the paged pool whose pages move on a thread of their own, beside the
    /// fixed region (default stream and two streams), the inline-moving paged pool and
    /// cudaMallocAsync (GPU).
    Background,
}

impl Rows {
    fn asked() -> Rows {
        match std::env::var("POOL_BENCH_ROWS").as_deref() {
            Ok("paged") => Rows::Paged,
            Ok("vmm") => Rows::Vmm,
            Ok("ab") => Rows::Ab,
            Ok("background") => Rows::Background,
            _ => Rows::All,
        }
    }

    /// Whether the fixed-region rows (and the stream-safety A/B) run.
    fn fixed(self) -> bool {
        matches!(self, Rows::All | Rows::Ab)
    }
}

/// Footprints given to the reserve-first paged rows, as multiples of the window's peak live.
const RESERVE_FIRST_SIZES: [f64; 4] = [1.08, 1.09, 1.12, 1.16];

/// Paged pools with `PoolOptions::reserve_first`, given physical memory of a few multiples of
/// the window's peak live bytes (default stream, claimed): how often they move pages, and at
/// what cost, for a footprint fixed in advance.
fn reserve_first_rows<R: Region>(
    label: &str,
    make: &mut dyn FnMut(usize) -> Option<Arc<FixedPool<R>>>,
    w: &Workload,
    iters: usize,
    rows: &mut Vec<Row>,
) {
    let peak = window_peak_live(w, iters);
    for f in RESERVE_FIRST_SIZES {
        let Some(pool) = make((peak as f64 * f) as usize) else {
            continue;
        };
        let mut p = Pool::new(pool, true);
        let (ns, ratio) = match run_window(&mut p, w, iters, 1) {
            Ok(r) => r,
            Err(e) => {
                println!("{label}, reserve first at {f:.3} x peak live: out of memory at {e}");
                continue;
            }
        };
        let st = p.pool.stats();
        rows.push(Row {
            allocator: format!("{label} (reserve first, physical {f:.2} x peak live)"),
            workload: "window",
            ns_per_pair: ns,
            reserved_over_live: Some(ratio.max(st.reserved as f64 / peak as f64)),
            remaps: Some((st.remaps, st.pages_mapped, st.pages_unmapped)),
        });
    }
}

/// The rows of one paged shape, over pools from `paged(options, physical bytes)` with blocks
/// under `small` bytes from the top: every variant and the reserve-first rows for the first
/// shape, the serving and two-stream variants for the others.
fn paged_rows<R: Region>(
    label: &str,
    paged: &dyn Fn(PoolOptions, usize) -> Option<Arc<FixedPool<R>>>,
    small: usize,
    (w, iters): (&Workload, usize),
    first_shape: bool,
    rows: &mut Vec<Row>,
) {
    let variants: &[Variant] = if first_shape {
        &ALL_VARIANTS
    } else {
        &SERVING_AND_TWO_STREAMS
    };
    let options = PoolOptions {
        small_from_top: Some(small),
        ..PoolOptions::serving()
    };
    let mut make = |safe: bool, bytes: usize| {
        let opts = PoolOptions {
            stream_safe: safe,
            ..options
        };
        paged(opts, bytes.min(PAGED_PHYSICAL))
    };
    pool_rows(label, &mut make, (w, iters), variants, rows);
    if first_shape {
        let mut make = |bytes: usize| {
            let opts = PoolOptions {
                reserve_first: true,
                ..options
            };
            paged(opts, bytes)
        };
        reserve_first_rows(label, &mut make, w, iters, rows);
    }
}

/// The smallest region, from `footprint` (plus one alignment unit per block) up in steps of
/// 1%, in which a pool made by `make` serves the whole window run again. A fixed pool's first
/// run shows what its blocks reached, but its best fit also weighs the spare span between the
/// two zones, whose size differs in a tighter region, so the rerun may take other holes.
fn verified_footprint<R: Region>(
    make: &mut MakePool<'_, R>,
    (safe, claim, streams): (bool, bool, usize),
    footprint: usize,
    w: &Workload,
    iters: usize,
) -> usize {
    let mut bytes = footprint + WINDOW * DEFAULT_ALIGN;
    for _ in 0..30 {
        let Some(pool) = make(safe, bytes) else {
            break;
        };
        let mut tight = Pool::new(pool, claim);
        match run_window(&mut tight, w, iters, streams) {
            Ok(_) => return bytes,
            Err(e) => println!("a region of {bytes} B ran out at {e}; trying 1% more"),
        }
        bytes += bytes / 100;
    }
    println!("no region up to {bytes} B served the run again");
    bytes
}

/// Rounds of the stream-safety A/B.
const AB_ROUNDS: usize = 10;

/// What the stream-safe layer costs on the default stream, measured apart from the rows: pair
/// and window runs of `iters / AB_ROUNDS` steps, stream safety off and on alternating (each
/// round swaps which goes first), on fresh claimed pools. Adds the two arms' medians as rows
/// and prints the median of the rounds' ratios, which a slow round on either arm moves less
/// than a ratio of medians.
fn stream_safety_ab<R: Region>(
    label: &str,
    make: &mut MakePool<'_, R>,
    (w, iters): (&Workload, usize),
    rows: &mut Vec<Row>,
) {
    let steps = (iters / AB_ROUNDS).max(1);
    for wl in ["pair", "window"] {
        let mut ns = [Vec::new(), Vec::new()];
        let mut ratios = Vec::new();
        for round in 0..AB_ROUNDS {
            let mut round_ns = [0.0; 2];
            for k in 0..2 {
                let safe = (k + round) % 2 == 1;
                let Some(pool) = make(safe, FULL_REGION) else {
                    return;
                };
                let mut p = Pool::new(pool, true);
                let run = if wl == "pair" {
                    run_pair(&mut p, w, steps, 1)
                } else {
                    run_window(&mut p, w, steps, 1).map(|(ns, _)| ns)
                };
                match run {
                    Ok(t) => round_ns[usize::from(safe)] = t,
                    Err(e) => {
                        println!("{label}: stream-safety A/B out of memory at {e}");
                        return;
                    }
                }
            }
            ratios.push(round_ns[1] / round_ns[0]);
            for (arm, t) in round_ns.into_iter().enumerate() {
                ns[arm].push(t);
            }
        }
        let [off, on] = ns.map(median);
        println!(
            "{label}, {wl}: stream-safe layer on the default stream {:+.1}% (median of {AB_ROUNDS} \
             alternating rounds of {steps} steps; arms {on:.1} vs {off:.1} ns)",
            (median(ratios) - 1.0) * 100.0
        );
        for (arm, t) in [("off", off), ("on", on)] {
            rows.push(Row {
                allocator: format!("{label} (stream-safety A/B, {arm}, claimed)"),
                workload: wl,
                ns_per_pair: t,
                reserved_over_live: None,
                remaps: None,
            });
        }
    }
}

/// Adds one configuration's pair and window rows: ns per step of each, the window's
/// footprint ratio and page moves.
fn push_pair_and_window(
    rows: &mut Vec<Row>,
    allocator: String,
    streams: usize,
    [pair, window]: [f64; 2],
    (ratio, remaps): (f64, Option<(u64, u64, u64)>),
) {
    rows.push(Row {
        allocator: allocator.clone(),
        workload: if streams == 1 {
            "pair"
        } else {
            "pair, 2 streams"
        },
        ns_per_pair: pair,
        reserved_over_live: None,
        remaps: None,
    });
    rows.push(Row {
        allocator,
        workload: if streams == 1 {
            "window"
        } else {
            "window, 2 streams"
        },
        ns_per_pair: window,
        reserved_over_live: Some(ratio),
        remaps,
    });
}

/// Repetitions of each pool row, interleaved across configurations; the median is reported.
const REPS: usize = 3;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Builds the pool of a row: (stream-safe, bytes) to a pool, or `None` for a configuration the
/// region does not support (a remappable region needs stream safety).
type MakePool<'a, R> = dyn FnMut(bool, usize) -> Option<Arc<FixedPool<R>>> + 'a;

/// A pool row's variant: (stream-safe, streams, claimed by this thread, label).
type Variant = (bool, usize, bool, &'static str);

/// Every variant: what the fixed region and the first paged shape run.
const ALL_VARIANTS: [Variant; 4] = [
    (false, 1, true, "stream safety off, 1 stream, claimed"),
    (true, 1, true, "stream-safe, default stream, claimed"),
    (true, 1, false, "stream-safe, default stream, unclaimed"),
    (true, 2, true, "stream-safe, 2 streams, claimed"),
];

/// The serving variant and the two-stream one (the paged shapes after the first, to keep one
/// device call under its limit).
const SERVING_AND_TWO_STREAMS: [Variant; 2] = [ALL_VARIANTS[1], ALL_VARIANTS[3]];

fn pool_rows<R: Region>(
    label: &str,
    make: &mut MakePool<'_, R>,
    (w, iters): (&Workload, usize),
    variants: &[Variant],
    rows: &mut Vec<Row>,
) {
    let mut pair = vec![Vec::new(); variants.len()];
    let mut window = vec![Vec::new(); variants.len()];
    let mut ratio = vec![0.0; variants.len()];
    let mut remaps = vec![(0u64, 0u64, 0u64); variants.len()];
    let peak = window_peak_live(w, iters);
    for _ in 0..REPS {
        for (k, &(safe, streams, claim, _)) in variants.iter().enumerate() {
            let Some(pool) = make(safe, FULL_REGION) else {
                continue;
            };
            let mut p = Pool::new(pool, claim);
            let ns = run_pair(&mut p, w, iters, streams);
            drop(p);
            let Some(pool) = make(safe, FULL_REGION) else {
                continue;
            };
            let mut p = Pool::new(pool, claim);
            let (ns, (wns, r)) = match (ns, run_window(&mut p, w, iters, streams)) {
                (Ok(ns), Ok(win)) => (ns, win),
                (Err(e), _) | (_, Err(e)) => {
                    println!("{label}: out of memory in a {FULL_REGION} B region at {e}");
                    continue;
                }
            };
            pair[k].push(ns);
            window[k].push(wns);
            if ratio[k] == 0.0 {
                let st = p.pool.stats();
                remaps[k] = (st.remaps, st.pages_mapped, st.pages_unmapped);
                drop(p);
                let verified =
                    verified_footprint(make, (safe, claim, streams), st.footprint, w, iters);
                ratio[k] = r.max(verified as f64 / peak as f64);
            }
        }
    }
    for (k, &(_, streams, _, tag)) in variants.iter().enumerate() {
        if pair[k].is_empty() {
            continue;
        }
        push_pair_and_window(
            rows,
            format!("{label} ({tag})"),
            streams,
            [
                median(std::mem::take(&mut pair[k])),
                median(std::mem::take(&mut window[k])),
            ],
            (ratio[k], (remaps[k].0 > 0).then_some(remaps[k])),
        );
    }
}

#[cfg(feature = "cuda")]
mod device {
    //! cuMemAllocAsync/cuMemFreeAsync on the device's default memory pool, and the fixed pool
    //! over a cudaMalloc'd region with a CUDA-event clock.
    use super::fake_region::PAGED_ADDRESS;
    use super::*;
    use cudarc::driver::{result, sys, CudaContext, CudaStream};
    use vigil_engine::memory::cuda::{
        BackgroundPagedRegion, CudaClock, DevicePagedRegion, DeviceRegion,
    };

    pub struct MallocAsync {
        pub streams: Vec<Arc<CudaStream>>,
        pub pool: sys::CUmemoryPool,
    }

    impl MallocAsync {
        pub fn new(ctx: &Arc<CudaContext>) -> Self {
            let streams = (0..2).map(|_| ctx.new_stream().expect("stream")).collect();
            let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
            unsafe {
                sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device())
                    .result()
                    .expect("default mem pool");
                // Keep freed memory cached (what a serving process would configure).
                let mut threshold: u64 = u64::MAX;
                sys::cuMemPoolSetAttribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    (&mut threshold as *mut u64).cast(),
                )
                .result()
                .expect("release threshold");
            }
            MallocAsync { streams, pool }
        }

        fn attr(&self, a: sys::CUmemPool_attribute) -> u64 {
            let mut v: u64 = 0;
            unsafe {
                let _ = sys::cuMemPoolGetAttribute(self.pool, a, (&mut v as *mut u64).cast());
            }
            v
        }
    }

    impl Alloc for MallocAsync {
        type H = sys::CUdeviceptr;
        fn alloc(&mut self, size: usize, stream: usize) -> Result<Self::H, String> {
            unsafe { result::malloc_async(self.streams[stream].cu_stream(), size) }
                .map_err(|e| format!("cuMemAllocAsync: {e}"))
        }
        fn free(&mut self, h: Self::H, stream: usize) {
            unsafe { result::free_async(h, self.streams[stream].cu_stream()) }
                .expect("cuMemFreeAsync");
        }
        fn peak_reserved(&mut self) -> usize {
            self.attr(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) as usize
        }
        fn reset_peak(&mut self) {
            for s in &self.streams {
                let _ = s.synchronize();
            }
            unsafe {
                let _ = sys::cuMemPoolTrimTo(self.pool, 0);
                let mut zero: u64 = 0;
                let _ = sys::cuMemPoolSetAttribute(
                    self.pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
                    (&mut zero as *mut u64).cast(),
                );
                let _ = sys::cuMemPoolSetAttribute(
                    self.pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                    (&mut zero as *mut u64).cast(),
                );
            }
        }
    }

    /// Device 0's pinned physical allocations, and read-write access to them from it: what
    /// the driver-cost measurements create and map.
    fn vmm_props() -> (sys::CUmemAllocationProp, sys::CUmemAccessDesc) {
        let prop = sys::CUmemAllocationProp {
            type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: 0,
            },
            win32HandleMetaData: std::ptr::null_mut(),
            // SAFETY: the flags are a plain C struct of integers; zero is "no flags".
            allocFlags: unsafe { std::mem::zeroed() },
        };
        let desc = sys::CUmemAccessDesc {
            location: prop.location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        (prop, desc)
    }

    /// What the paged device region's driver calls cost (µs, median of `reps`), so the paged
    /// rows' window time can be split into placement and page moves.
    pub fn vmm_costs(ctx: &Arc<CudaContext>, reps: usize) -> Result<(), String> {
        let e = |what: &str, r: sys::CUresult| r.result().map_err(|x| format!("{what}: {x}"));
        ctx.bind_to_thread().map_err(|x| x.to_string())?;
        let (prop, desc) = vmm_props();
        const N: usize = 8;
        let mut handles = [0u64; N];
        let mut va: sys::CUdeviceptr = 0;
        unsafe {
            for h in &mut handles {
                e("cuMemCreate", sys::cuMemCreate(h, PAGE, &prop, 0))?;
            }
            e(
                "cuMemAddressReserve",
                sys::cuMemAddressReserve(&mut va, 4 * N * PAGE, PAGE, 0, 0),
            )?;
        }
        let at = |i: usize| va + (i * PAGE) as u64;
        let mut t: [Vec<f64>; 6] = Default::default();
        let us = |t0: Instant| t0.elapsed().as_nanos() as f64 / 1e3;
        for r in 0..reps {
            let o = (r % 3) * N; // move around the range like the pool does
            unsafe {
                let t0 = Instant::now();
                for (k, h) in handles.iter().enumerate() {
                    e("cuMemMap", sys::cuMemMap(at(o + k), PAGE, 0, *h, 0))?;
                }
                t[0].push(us(t0) / N as f64);
                let t0 = Instant::now();
                e(
                    "cuMemSetAccess",
                    sys::cuMemSetAccess(at(o), N * PAGE, &desc, 1),
                )?;
                t[1].push(us(t0));
                let t0 = Instant::now();
                for k in 0..N {
                    e("cuMemUnmap", sys::cuMemUnmap(at(o + k), PAGE))?;
                }
                t[2].push(us(t0) / N as f64);
                e("cuMemMap", sys::cuMemMap(at(o), PAGE, 0, handles[0], 0))?;
                let t0 = Instant::now();
                e("cuMemSetAccess", sys::cuMemSetAccess(at(o), PAGE, &desc, 1))?;
                t[3].push(us(t0));
                e("cuMemUnmap", sys::cuMemUnmap(at(o), PAGE))?;
                for (k, h) in handles.iter().enumerate() {
                    e("cuMemMap", sys::cuMemMap(at(o + k), PAGE, 0, *h, 0))?;
                }
                e(
                    "cuMemSetAccess",
                    sys::cuMemSetAccess(at(o), N * PAGE, &desc, 1),
                )?;
                let t0 = Instant::now();
                e("cuMemUnmap", sys::cuMemUnmap(at(o), N * PAGE))?;
                t[4].push(us(t0));
            }
        }
        let clock = CudaClock::new(ctx);
        let s = ctx.new_stream().map_err(|x| x.to_string())?;
        clock.add_stream(StreamId(9), s);
        for _ in 0..reps {
            let t0 = Instant::now();
            let ev = clock.record(StreamId(9));
            let _ = clock.is_complete(StreamId(9), ev);
            t[5].push(us(t0));
        }
        unsafe {
            let _ = sys::cuMemAddressFree(va, 4 * N * PAGE);
            for h in handles {
                let _ = sys::cuMemRelease(h);
            }
        }
        let names = [
            "cuMemMap, per 2 MiB page",
            "cuMemSetAccess, 8 pages",
            "cuMemUnmap, per page",
            "cuMemSetAccess, 1 page",
            "cuMemUnmap, one call over 8 mapped pages",
            "CUDA event record + query (CudaClock)",
        ];
        println!("driver call costs, µs (median of {reps}):");
        for (n, v) in names.iter().zip(t) {
            println!("  {n}: {:.1}", median(v));
        }
        Ok(())
    }

    /// How the driver's page-move cost scales with the handle and mapping shape (µs, median of
    /// `reps`): whether bigger physical handles or a second mapping of a still-mapped page would
    /// make the paged pool's moves cheaper (mappings at an offset into a handle are unsupported).
    pub fn vmm_shapes(ctx: &Arc<CudaContext>, reps: usize) -> Result<(), String> {
        let e = |what: &str, r: sys::CUresult| r.result().map_err(|x| format!("{what}: {x}"));
        ctx.bind_to_thread().map_err(|x| x.to_string())?;
        let (prop, desc) = vmm_props();
        const BIG: usize = 32; // pages in the largest handle (64 MiB)
        let mut small = 0u64;
        let mut h16 = 0u64;
        let mut h64 = 0u64;
        let mut va: sys::CUdeviceptr = 0;
        unsafe {
            e(
                "cuMemCreate 2M",
                sys::cuMemCreate(&mut small, PAGE, &prop, 0),
            )?;
            e(
                "cuMemCreate 16M",
                sys::cuMemCreate(&mut h16, 8 * PAGE, &prop, 0),
            )?;
            e(
                "cuMemCreate 64M",
                sys::cuMemCreate(&mut h64, BIG * PAGE, &prop, 0),
            )?;
            e(
                "cuMemAddressReserve",
                sys::cuMemAddressReserve(&mut va, 4 * BIG * PAGE, PAGE, 0, 0),
            )?;
        }
        let at = |i: usize| va + (i * PAGE) as u64;
        let us = |t0: Instant| t0.elapsed().as_nanos() as f64 / 1e3;
        // (name, [map, setAccess, unmap]) per shape.
        let mut t: Vec<[Vec<f64>; 3]> = (0..4).map(|_| Default::default()).collect();
        for r in 0..reps {
            let o = (r % 3) * BIG;
            unsafe {
                // 0, 1, 2: one handle of 1, 8 or 32 pages in one mapping.
                for (s, (h, n)) in [(small, 1), (h16, 8), (h64, BIG)].into_iter().enumerate() {
                    let t0 = Instant::now();
                    e("cuMemMap", sys::cuMemMap(at(o), n * PAGE, 0, h, 0))?;
                    t[s][0].push(us(t0));
                    let t0 = Instant::now();
                    e(
                        "cuMemSetAccess",
                        sys::cuMemSetAccess(at(o), n * PAGE, &desc, 1),
                    )?;
                    t[s][1].push(us(t0));
                    let t0 = Instant::now();
                    e("cuMemUnmap", sys::cuMemUnmap(at(o), n * PAGE))?;
                    t[s][2].push(us(t0));
                }
                // 3: a second mapping of a page that stays mapped (and accessible) elsewhere.
                e("cuMemMap", sys::cuMemMap(at(o), PAGE, 0, small, 0))?;
                e("cuMemSetAccess", sys::cuMemSetAccess(at(o), PAGE, &desc, 1))?;
                let t0 = Instant::now();
                e(
                    "cuMemMap alias",
                    sys::cuMemMap(at(o + 1), PAGE, 0, small, 0),
                )?;
                t[3][0].push(us(t0));
                let t0 = Instant::now();
                e(
                    "cuMemSetAccess alias",
                    sys::cuMemSetAccess(at(o + 1), PAGE, &desc, 1),
                )?;
                t[3][1].push(us(t0));
                let t0 = Instant::now();
                e("cuMemUnmap alias", sys::cuMemUnmap(at(o + 1), PAGE))?;
                t[3][2].push(us(t0));
                e("cuMemUnmap", sys::cuMemUnmap(at(o), PAGE))?;
            }
        }
        // Does a page mapped again where access was once set keep that access?
        let remapped = unsafe {
            e("cuMemMap", sys::cuMemMap(at(0), PAGE, 0, small, 0))?;
            e("cuMemSetAccess", sys::cuMemSetAccess(at(0), PAGE, &desc, 1))?;
            e("cuMemUnmap", sys::cuMemUnmap(at(0), PAGE))?;
            e("cuMemMap", sys::cuMemMap(at(0), PAGE, 0, small, 0))?;
            let mut flags = 0u64;
            let loc = prop.location;
            let r = sys::cuMemGetAccess(&mut flags, &loc, at(0));
            let _ = sys::cuMemUnmap(at(0), PAGE);
            format!("{r:?}, flags {flags}")
        };
        unsafe {
            let _ = sys::cuMemAddressFree(va, 4 * BIG * PAGE);
            for h in [small, h16, h64] {
                let _ = sys::cuMemRelease(h);
            }
        }
        let names = [
            "one 2 MiB handle, one mapping",
            "one 16 MiB handle, one mapping",
            "one 64 MiB handle, one mapping",
            "second mapping of a mapped 2 MiB page",
        ];
        println!("driver call shapes, µs (median of {reps}): map / setAccess / unmap");
        for (n, v) in names.iter().zip(t) {
            let [a, b, c] = v;
            println!(
                "  {n}: {:.1} / {:.1} / {:.1}",
                median(a),
                median(b),
                median(c)
            );
        }
        println!("  access after unmap and map again (no setAccess): {remapped}");
        Ok(())
    }

    /// The paged pool with 4 MiB pages whose moves run on a mover thread
    /// (`BackgroundPagedRegion`), default stream claimed and two streams: ns per step include
    /// waiting for the mover at the end of each run; prints the mover's driver time per step.
    fn background_rows(
        ctx: &Arc<CudaContext>,
        streams: &[Arc<CudaStream>],
        (w, iters): (&Workload, usize),
        rows: &mut Vec<Row>,
    ) {
        // Home mappings only on the default stream, to keep one device call under its limit.
        for (home, n) in [(false, 2), (true, 1)] {
            background_shape_rows(ctx, streams, (home, n), (w, iters), rows);
        }
    }

    /// [`background_rows`] for one shape: with or without home mappings, on the default
    /// stream and (with `most_streams` 2) on two.
    fn background_shape_rows(
        ctx: &Arc<CudaContext>,
        streams: &[Arc<CudaStream>],
        (home, most_streams): (bool, usize),
        (w, iters): (&Workload, usize),
        rows: &mut Vec<Row>,
    ) {
        let (page, small, shape) = BACKGROUND_SHAPE;
        let homes = if home { ", home mappings" } else { "" };
        let label =
            format!("Vigil FixedPool, paged device region, {shape}, background moves{homes}");
        let make = || -> Option<Arc<FixedPool<BackgroundPagedRegion>>> {
            let clock = CudaClock::new(ctx);
            for (i, s) in streams.iter().enumerate() {
                clock.add_stream(StreamId(i as u64), Arc::clone(s));
            }
            let region =
                match DevicePagedRegion::with_page(ctx, PAGED_ADDRESS, PAGED_PHYSICAL, Some(page))
                    .and_then(|mut r| {
                        if home {
                            r.keep_home_mappings()?;
                        }
                        Ok(r)
                    })
                    .and_then(|r| BackgroundPagedRegion::new(r, Arc::clone(&clock)))
                {
                    Ok(r) => r,
                    Err(e) => {
                        println!("{label}: {e}");
                        return None;
                    }
                };
            let opts = PoolOptions {
                small_from_top: Some(small),
                ..PoolOptions::serving()
            };
            FixedPool::with_options(region, clock, opts).ok()
        };
        let peak = window_peak_live(w, iters);
        // The region's per-allocation check alone (no move pending), to tell its share of the
        // pair from the pool's.
        if let Some(pool) = make() {
            let region = pool.region();
            let calls = iters * 4;
            let t = Instant::now();
            for i in 0..calls {
                let off = std::hint::black_box(i << 8);
                if let Err(e) = region.order_after_moves(StreamId::DEFAULT, off, 256) {
                    println!("{label}: {e}");
                    return;
                }
            }
            println!(
                "{label}: order_after_moves alone {:.2} ns a call ({calls} calls)",
                t.elapsed().as_nanos() as f64 / calls as f64
            );
        }
        for n_streams in 1..=most_streams {
            let (mut pair, mut window, mut busy) = (Vec::new(), Vec::new(), Vec::new());
            let (mut ratio, mut remaps) = (0.0, (0, 0, 0));
            for _ in 0..REPS {
                let Some(pool) = make() else { return };
                let mut p = Pool::new(pool, true);
                let ns = run_pair(&mut p, w, iters, n_streams);
                let pair_moves = (
                    p.pool.stats().remaps,
                    p.pool.region().mover_busy_ns(),
                    p.pool.stats().adoptions,
                );
                drop(p);
                let Some(pool) = make() else { return };
                let mut p = Pool::new(pool, true);
                match (ns, run_window(&mut p, w, iters, n_streams)) {
                    (Ok(ns), Ok((wns, r))) => {
                        pair.push(ns);
                        window.push(wns);
                        let region = p.pool.region();
                        busy.push(region.mover_busy_ns() as f64 / iters as f64);
                        let st = p.pool.stats();
                        // The row reports the largest footprint of its rounds (the mover's
                        // pace can move a block, so rounds may differ).
                        let round = r.max(st.footprint as f64 / peak as f64);
                        ratio = f64::max(ratio, round);
                        remaps = (st.remaps, st.pages_mapped, st.pages_unmapped);
                        // Printed as it goes, so a run cut short still shows its rounds.
                        println!(
                            "{label}, {n_streams} stream(s): pair {ns:.1} ns ({} page moves, \
                             mover {:.1} ns a step, {} spans handed over), window {wns:.1} ns \
                             at {round:.3}; mover {:.1} ns a window step; {} stream waits; {} \
                             page moves, {} spans handed over",
                            pair_moves.0,
                            pair_moves.1 as f64 / iters as f64,
                            pair_moves.2,
                            region.mover_busy_ns() as f64 / iters as f64,
                            region.stream_waits(),
                            st.remaps,
                            st.adoptions
                        );
                    }
                    (Err(e), _) | (_, Err(e)) => {
                        println!("{label}: {e}");
                        return;
                    }
                }
            }
            let tag = if n_streams == 1 {
                "stream-safe, default stream, claimed"
            } else {
                "stream-safe, 2 streams, claimed"
            };
            println!(
                "{label} ({tag}): the mover spent {:.1} ns a window step in driver calls \
                 (median of {REPS}), off the allocating thread",
                median(busy)
            );
            push_pair_and_window(
                rows,
                format!("{label} ({tag})"),
                n_streams,
                [median(pair), median(window)],
                (ratio, Some(remaps)),
            );
        }
    }

    pub fn rows(w: &Workload, iters: usize, rows: &mut Vec<Row>) -> Result<(), String> {
        vigil_engine::backend::cuda::probe(0).map_err(|e| e.to_string())?;
        let ctx = CudaContext::new(0).map_err(|e| e.to_string())?;
        let asked = Rows::asked();
        if asked != Rows::Ab {
            if let Err(e) = vmm_costs(&ctx, 200) {
                println!("driver call costs not measured: {e}");
            }
        }
        if !matches!(asked, Rows::Ab | Rows::Background) {
            if let Err(e) = vmm_shapes(&ctx, 100) {
                println!("driver call shapes not measured: {e}");
            }
        }
        if asked == Rows::Vmm {
            return Ok(());
        }
        let streams: Vec<Arc<CudaStream>> = (0..2)
            .map(|_| ctx.new_stream().map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?;
        let mut make = |safe: bool, region_bytes: usize| {
            let clock = CudaClock::new(&ctx);
            for (i, s) in streams.iter().enumerate() {
                clock.add_stream(StreamId(i as u64), Arc::clone(s));
            }
            let clock: Arc<dyn StreamClock> = clock;
            let region = DeviceRegion::new(&ctx, region_bytes).expect("device region");
            FixedPool::with_options(
                region,
                clock,
                PoolOptions {
                    stream_safe: safe,
                    ..PoolOptions::serving()
                },
            )
            .ok()
        };
        if asked.fixed() {
            if asked == Rows::All {
                pool_rows(
                    "Vigil FixedPool, cudaMalloc'd region",
                    &mut make,
                    (w, iters),
                    &ALL_VARIANTS,
                    rows,
                );
            }
            stream_safety_ab(
                "Vigil FixedPool, cudaMalloc'd region",
                &mut make,
                (w, iters),
                rows,
            );
        }
        if asked == Rows::Ab {
            return Ok(());
        }
        if asked == Rows::Background {
            pool_rows(
                "Vigil FixedPool, cudaMalloc'd region",
                &mut make,
                (w, iters),
                &[ALL_VARIANTS[0], ALL_VARIANTS[1], ALL_VARIANTS[3]],
                rows,
            );
        }
        let shapes = match asked {
            Rows::Background => &PAGED_SHAPES[1..],
            _ => &PAGED_SHAPES[..],
        };
        for (k, &(page, small, shape)) in shapes.iter().enumerate() {
            // A paged pool over `bytes` of physical pages (every stream on its clock).
            let paged = |opts: PoolOptions, bytes: usize| {
                let clock = CudaClock::new(&ctx);
                for (i, s) in streams.iter().enumerate() {
                    clock.add_stream(StreamId(i as u64), Arc::clone(s));
                }
                let region =
                    match DevicePagedRegion::with_page(&ctx, PAGED_ADDRESS, bytes, Some(page)) {
                        Ok(r) => r,
                        Err(e) => {
                            println!("paged device region of {bytes} B: {e}");
                            return None;
                        }
                    };
                FixedPool::with_options(region, clock, opts).ok()
            };
            let label = format!("Vigil FixedPool, paged device region (cuMemMap), {shape}");
            if asked == Rows::Background {
                let options = PoolOptions {
                    small_from_top: Some(small),
                    ..PoolOptions::serving()
                };
                let mut make =
                    |_safe: bool, bytes: usize| paged(options, bytes.min(PAGED_PHYSICAL));
                pool_rows(&label, &mut make, (w, iters), &[ALL_VARIANTS[1]], rows);
                continue;
            }
            paged_rows(&label, &paged, small, (w, iters), k == 0, rows);
        }
        if asked == Rows::Paged {
            return Ok(());
        }
        let mut m = MallocAsync::new(&ctx);
        for streams in [1, 2] {
            let ns = run_pair(&mut m, w, iters, streams)?;
            rows.push(Row {
                allocator: "cudaMallocAsync/cudaFreeAsync".into(),
                workload: if streams == 1 {
                    "pair"
                } else {
                    "pair, 2 streams"
                },
                ns_per_pair: ns,
                reserved_over_live: None,
                remaps: None,
            });
            let (ns, ratio) = run_window(&mut m, w, iters, streams)?;
            rows.push(Row {
                allocator: "cudaMallocAsync/cudaFreeAsync".into(),
                workload: if streams == 1 {
                    "window"
                } else {
                    "window, 2 streams"
                },
                ns_per_pair: ns,
                reserved_over_live: Some(ratio),
                remaps: None,
            });
        }
        for s in &m.streams {
            let _ = s.synchronize();
        }
        if asked == Rows::Background {
            // The other rows first, printed, so a run cut short still shows them.
            print_table(rows, iters);
            rows.clear();
            background_rows(&ctx, &streams, (w, iters), rows);
        }
        Ok(())
    }
}

/// Prints `rows` as a markdown table.
fn print_table(rows: &[Row], iters: usize) {
    println!("iterations per row: {iters}; pool rows: median of {REPS} interleaved runs");
    println!("| allocator | workload | ns per alloc+free | peak reserved / peak live |");
    println!("| --- | --- | --- | --- |");
    for r in rows {
        println!(
            "| {} | {} | {:.1} | {} |",
            r.allocator,
            r.workload,
            r.ns_per_pair,
            r.reserved_over_live
                .map(|x| format!("{x:.3}"))
                .unwrap_or_else(|| "-".into())
        );
    }
}

fn main() {
    let iters: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(10_000_000);
    let w = Workload::new();
    let mut rows = Vec::new();
    #[cfg(feature = "cuda")]
    let device = device::rows(&w, iters, &mut rows);
    #[cfg(not(feature = "cuda"))]
    let device: Result<(), String> = Err("built without the cuda feature".into());
    if let Err(e) = &device {
        println!("no CUDA device ({e}): host-only rows over a fake 8 GiB region");
        let mut make = |safe: bool, bytes: usize| {
            let clock: Arc<dyn StreamClock> = Arc::new(SyncClock);
            FixedPool::with_options(
                FakeRegion(bytes),
                clock,
                PoolOptions {
                    stream_safe: safe,
                    ..PoolOptions::serving()
                },
            )
            .ok()
        };
        let asked = Rows::asked();
        if asked.fixed() {
            if asked == Rows::All {
                pool_rows(
                    "Vigil FixedPool, fake region",
                    &mut make,
                    (&w, iters),
                    &ALL_VARIANTS,
                    &mut rows,
                );
            }
            stream_safety_ab(
                "Vigil FixedPool, fake region",
                &mut make,
                (&w, iters),
                &mut rows,
            );
        }
        let paged = matches!(asked, Rows::All | Rows::Paged);
        for (k, &(page, small, _)) in PAGED_SHAPES.iter().enumerate().filter(|_| paged) {
            // A paged pool over `bytes` of fake physical pages.
            let paged = |opts: PoolOptions, bytes: usize| {
                let region = FakePagedRegion {
                    physical: bytes.div_ceil(page),
                    page,
                    mapped: Default::default(),
                    background: false,
                };
                FixedPool::with_options(region, Arc::new(SyncClock), opts).ok()
            };
            let label = format!(
                "Vigil FixedPool, fake paged region, {} MiB pages",
                page >> 20
            );
            paged_rows(&label, &paged, small, (&w, iters), k == 0, &mut rows);
        }
        if paged || asked == Rows::Background {
            // The placement of the background-moving region (every free span gives pages),
            // beside the inline one's (unless the paged rows above had it).
            for background in [false, true].into_iter().filter(|&b| b || !paged) {
                let (page, small, shape) = if background {
                    BACKGROUND_SHAPE
                } else {
                    PAGED_SHAPES[1]
                };
                let options = PoolOptions {
                    small_from_top: Some(small),
                    ..PoolOptions::serving()
                };
                let mut make = |_safe: bool, bytes: usize| {
                    let region = FakePagedRegion {
                        physical: bytes.min(PAGED_PHYSICAL).div_ceil(page),
                        page,
                        mapped: Default::default(),
                        background,
                    };
                    FixedPool::with_options(region, Arc::new(SyncClock), options).ok()
                };
                let moves = if background { ", background moves" } else { "" };
                let label = format!("Vigil FixedPool, fake paged region, {shape}{moves}");
                pool_rows(
                    &label,
                    &mut make,
                    (&w, iters),
                    &SERVING_AND_TWO_STREAMS,
                    &mut rows,
                );
            }
        }
    }
    print_table(&rows, iters);
    for r in rows.iter().filter(|r| r.remaps.is_some()) {
        println!(
            "{} ({}): {} page moves in {iters} steps ({:.0} per million), pages mapped {} and \
             unmapped {} per million steps",
            r.allocator,
            r.workload,
            r.remaps.map_or(0, |m| m.0),
            r.remaps.map_or(0, |m| m.0) as f64 * 1e6 / iters as f64,
            r.remaps.map_or(0, |m| m.1) as f64 * 1e6 / iters as f64,
            r.remaps.map_or(0, |m| m.2) as f64 * 1e6 / iters as f64,
        );
    }
    let find = |a: &str, wl: &str| {
        rows.iter()
            .find(|r| r.allocator.contains(a) && r.workload == wl)
            .map(|r| r.ns_per_pair)
    };
    for wl in ["pair", "window"] {
        if let (Some(on), Some(off)) = (
            find("stream-safe, default stream, claimed", wl),
            find("stream safety off", wl),
        ) {
            println!(
                "stream-safe layer on the default stream, {wl}: {:+.1}% ({on:.1} vs {off:.1} ns)",
                (on / off - 1.0) * 100.0
            );
        }
        if let (Some(ours), Some(peer)) = (
            find("stream-safe, default stream, claimed", wl),
            find("cudaMallocAsync", wl),
        ) {
            println!("{wl}: cudaMallocAsync / Vigil = {:.1}x", peer / ours);
        }
    }
}
