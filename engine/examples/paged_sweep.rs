//! Replays the allocator benchmark's window workload on a paged pool over a fake remappable
//! region (it counts pages and maps nothing), and prints the footprint and the page moves: what
//! page size, small-block threshold and reserve give, without a GPU. The H200's driver cost
//! per mapped page (docs/benchmarks.md) turns the page counts into time.
//!
//! `cargo run --release -p vigil-engine --example paged_sweep -- STEPS PAGE_MIB SMALL_KIB
//! [RESERVE [SEED [GROUP]]]`: `RESERVE` 0 (the default) lets the footprint follow the live
//! bytes; otherwise the pool gets that multiple of the peak live bytes with `reserve_first`.
//! `GROUP` > 1 also counts the handles the same moves would take if every aligned run of
//! `GROUP` pages inside a mapped or unmapped range were one physical handle: an optimistic
//! bound for mixed page sizes (the driver charges per handle).

#[path = "../benches/common/fake_region.rs"]
mod fake_region;
#[path = "../benches/common/workload.rs"]
mod workload;

use std::process::ExitCode;
use std::sync::Arc;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use fake_region::FakePagedRegion;
use vigil_engine::memory::{FixedPool, PoolOptions, Region, StreamId, SyncClock};
use workload::{window_peak_live, Workload, TABLE, WINDOW};

/// The fake region, counting the handles its moves would take with `group`-page handles in
/// aligned runs.
struct Grouped {
    inner: FakePagedRegion,
    group: usize,
    maps: AtomicU64,
    unmaps: AtomicU64,
}

impl Grouped {
    /// Handles for pages `first..first + count`: one per aligned whole group, one per page
    /// outside them.
    fn handles(&self, first: usize, count: usize) -> u64 {
        let g = self.group;
        let (start, end) = (first.div_ceil(g) * g, first + count);
        let groups = end.saturating_sub(start) / g;
        (count - groups * (g - 1)) as u64
    }
}

impl Region for Grouped {
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
        self.inner.map_pages(first, count)?;
        self.maps.fetch_add(self.handles(first, count), Relaxed);
        Ok(())
    }
    fn unmap_pages(&self, first: usize, count: usize) -> vigil_engine::Result<()> {
        self.inner.unmap_pages(first, count)?;
        self.unmaps.fetch_add(self.handles(first, count), Relaxed);
        Ok(())
    }
}

/// Argument `i` parsed as a `T`, or `default` when it is absent.
fn arg<T: std::str::FromStr>(
    args: &[String],
    i: usize,
    name: &str,
    default: Option<T>,
) -> Result<T, String> {
    match args.get(i) {
        Some(a) => a.parse().map_err(|_| format!("{name}: cannot parse {a:?}")),
        None => default.ok_or_else(|| format!("missing {name}")),
    }
}

/// Runs the sweep for the command line `args`; the result line or what went wrong.
fn run(args: &[String]) -> Result<String, String> {
    let steps: usize = arg(args, 1, "STEPS", None)?;
    let page_mib: usize = arg(args, 2, "PAGE_MIB", None)?;
    let small_kib: usize = arg(args, 3, "SMALL_KIB", None)?;
    let reserve: f64 = arg(args, 4, "RESERVE", Some(0.0))?;
    let seed: u64 = arg(args, 5, "SEED", Some(0x9e37_79b9_7f4a_7c15))?;
    let group: usize = arg(args, 6, "GROUP", Some(1))?;
    if group == 0 {
        return Err("GROUP must be at least 1".into());
    }
    let page = page_mib << 20;
    let w = Workload::with_seed(seed);
    let peak = window_peak_live(&w, steps);
    let physical = if reserve > 0.0 {
        ((peak as f64 * reserve) as usize).div_ceil(page)
    } else {
        (4usize << 30) / page
    };
    let region = Grouped {
        inner: FakePagedRegion {
            physical,
            page,
            mapped: Default::default(),
            background: false,
        },
        group,
        maps: AtomicU64::new(0),
        unmaps: AtomicU64::new(0),
    };
    let opts = PoolOptions {
        reserve_first: reserve > 0.0,
        small_from_top: (small_kib > 0).then_some(small_kib << 10),
        ..PoolOptions::serving()
    };
    let pool =
        FixedPool::with_options(region, Arc::new(SyncClock), opts).map_err(|e| e.to_string())?;
    let claim = pool.claim();
    let mut live = Vec::with_capacity(WINDOW);
    for &size in &w.window_sizes[..WINDOW] {
        live.push(Some(
            claim.alloc(size, StreamId(0)).map_err(|e| e.to_string())?,
        ));
    }
    for i in 0..steps {
        let v = w.victims[i % TABLE];
        live[v] = None;
        let size = w.window_sizes[(i + WINDOW) % TABLE];
        live[v] = Some(
            claim
                .alloc(size, StreamId(0))
                .map_err(|e| format!("out of memory at step {i}: {e}"))?,
        );
    }
    let st = pool.stats();
    let per_m = |n: u64| n as f64 * 1e6 / steps as f64;
    let grouped = if group > 1 {
        let r = pool.region();
        format!(
            "; with {group}-page handles: {:.0} mapped, {:.0} unmapped per million steps",
            per_m(r.maps.load(Relaxed)),
            per_m(r.unmaps.load(Relaxed)),
        )
    } else {
        String::new()
    };
    Ok(format!(
        "page {page_mib} MiB, small {small_kib} KiB, reserve {reserve}, seed {seed:#x}: \
         footprint / peak live {:.4}, moves {:.0}, pages mapped {:.0}, unmapped {:.0} per million \
         steps{grouped}",
        st.footprint as f64 / peak as f64,
        per_m(st.remaps),
        per_m(st.pages_mapped),
        per_m(st.pages_unmapped),
    ))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    match run(&args) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("paged_sweep: {e}");
            ExitCode::FAILURE
        }
    }
}
