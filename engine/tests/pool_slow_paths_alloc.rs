//! The pool's slow paths allocate nothing on the host once warm: page moves (inline and in the
//! background), hand-overs between streams, and merging a stream's kept spans run from working
//! lists the pool keeps, so after warm-up the allocator benchmark's window workload makes zero
//! heap allocations while those paths run. Nor do a first burst of live blocks (the span table
//! is reserved up front), blocks freed on another thread (queued through reserved entries), or
//! a burst of frees left pending on a busy stream (the pending list is reserved with the table).
//! Counted with a global allocator, on the thread that runs the path only. The background
//! region is a fake (the real one is CUDA's mover thread); the others are real host memory.

#[path = "../benches/common/fake_region.rs"]
mod fake_region;
#[path = "common/thread_allocations.rs"]
mod thread_allocations;
#[path = "../benches/common/workload.rs"]
mod workload;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use fake_region::FakePagedRegion;
use thread_allocations::counted;
use vigil_engine::memory::{
    EventId, FixedPool, HostPagedRegion, HostRegion, PoolOptions, Region, StreamClock, StreamId,
};
use workload::{Workload, TABLE, WINDOW};

/// An idle device whose streams can be ordered on it (as `CudaClock` is): every point has
/// passed. Counts the device-side waits (hand-overs).
#[derive(Default)]
struct IdleDevice {
    epoch: AtomicU64,
    waits: AtomicU64,
}

impl StreamClock for IdleDevice {
    fn record(&self, _stream: StreamId) -> EventId {
        EventId(self.epoch.fetch_add(1, Relaxed) + 1)
    }
    fn is_complete(&self, _stream: StreamId, _epoch: EventId) -> bool {
        true
    }
    fn capturing(&self) -> bool {
        false
    }
    fn orders_streams(&self) -> bool {
        true
    }
    fn order_after(&self, _waiter: StreamId, _stream: StreamId, _epoch: EventId) -> bool {
        self.waits.fetch_add(1, Relaxed);
        true
    }
}

/// What one counted stretch of window steps did: heap allocations on this thread (and where
/// the first ones came from), page moves, hand-overs and pages mapped.
#[derive(Debug)]
struct Stretch {
    allocations: u64,
    stacks: String,
    remaps: u64,
    adoptions: u64,
    pages: u64,
}

/// Runs `warm` window steps alternating over `streams` streams, then `steps` more with the
/// allocation counter on.
fn window<R: Region>(pool: &Arc<FixedPool<R>>, streams: u64, warm: usize, steps: usize) -> Stretch {
    let w = Workload::new();
    let claim = pool.claim();
    let mut live = Vec::with_capacity(WINDOW);
    for (i, &size) in w.window_sizes[..WINDOW].iter().enumerate() {
        let s = StreamId(i as u64 % streams);
        live.push(Some(claim.alloc(size, s).expect("first blocks")));
    }
    let mut step = |i: usize| {
        let v = w.victims[i % TABLE];
        live[v] = None;
        let size = w.window_sizes[(i + WINDOW) % TABLE];
        let s = StreamId(i as u64 % streams);
        match claim.alloc(size, s) {
            Ok(b) => live[v] = Some(b),
            Err(e) => panic!("step {i}: {e}"),
        }
    };
    for i in 0..warm {
        step(i);
    }
    let before = pool.stats();
    let ((), allocations, stacks) = counted(|| (warm..warm + steps).for_each(&mut step));
    let after = pool.stats();
    Stretch {
        allocations,
        stacks,
        remaps: after.remaps - before.remaps,
        adoptions: after.adoptions - before.adoptions,
        pages: after.pages_mapped - before.pages_mapped,
    }
}

const WARM: usize = 40_000;
const COUNTED: usize = 40_000;

#[test]
fn fixed_region_on_two_streams_allocates_nothing() {
    // Spans kept apart per stream and merged back when a stream's block needs them.
    let pool = FixedPool::with_options(
        HostRegion::try_new(2 << 30).expect("region"),
        Arc::new(IdleDevice::default()),
        PoolOptions::serving(),
    )
    .expect("pool");
    let s = window(&pool, 2, WARM, COUNTED);
    println!(
        "fixed region, two streams: {} allocations, {} page moves",
        s.allocations, s.remaps
    );
    assert_eq!(s.allocations, 0, "the first allocations:\n{}", s.stacks);
}

#[test]
fn page_moves_allocate_nothing() {
    // Real memory: a memfd's pages mapped into a reservation, moved where blocks fit.
    let page = 2 << 20;
    for streams in [1, 2] {
        let region = HostPagedRegion::new(64 << 30, 1 << 30, page).expect("region");
        let opts = PoolOptions {
            small_from_top: Some(page),
            ..PoolOptions::serving()
        };
        let pool =
            FixedPool::with_options(region, Arc::new(IdleDevice::default()), opts).expect("pool");
        let s = window(&pool, streams, WARM, COUNTED);
        println!("paged region, inline moves, {streams} stream(s): {s:?}");
        assert!(
            s.remaps > 0 && s.pages > 0,
            "no page move in the counted steps: {s:?}"
        );
        assert_eq!(s.allocations, 0, "the first allocations:\n{}", s.stacks);
    }
}

#[test]
fn background_moves_and_hand_overs_allocate_nothing() {
    // The fake stands in for CUDA's mover thread: it says every stream waits behind a move,
    // so the pool takes pages of spans kept for a stream, or hands them over.
    let page = 4 << 20;
    let region = FakePagedRegion {
        physical: (2usize << 30) / page,
        page,
        mapped: Default::default(),
        background: true,
    };
    let opts = PoolOptions {
        small_from_top: Some(4 * page),
        ..PoolOptions::serving()
    };
    let clock = Arc::new(IdleDevice::default());
    let pool = FixedPool::with_options(region, clock.clone(), opts).expect("pool");
    let s = window(&pool, 2, WARM, COUNTED);
    println!(
        "paged region, background moves (fake mover), two streams: {s:?}, {} device-side waits",
        clock.waits.load(Relaxed)
    );
    assert!(
        s.remaps > 0 && s.pages > 0,
        "no page move in the counted steps: {s:?}"
    );
    assert!(s.adoptions > 0, "no hand-over in the counted steps: {s:?}");
    assert_eq!(s.allocations, 0, "the first allocations:\n{}", s.stacks);
}

/// Blocks live at once past any count seen before.
const NEW_HIGH: usize = 10_000;

#[test]
fn new_highs_of_live_blocks_allocate_nothing() {
    // The span table is reserved when the pool is built (`max_spans`), so a first burst of
    // ten thousand live blocks, and freeing them, never reach the system allocator.
    let pool = FixedPool::new(
        HostRegion::try_new(256 << 20).expect("region"),
        Arc::new(IdleDevice::default()),
    )
    .expect("pool");
    let claim = pool.claim();
    let mut live = Vec::with_capacity(NEW_HIGH);
    let (peak, allocations, stacks) = counted(|| {
        for i in 0..NEW_HIGH {
            let size = 256 + (i * 7919) % 16_384;
            live.push(claim.alloc(size, StreamId::DEFAULT).expect("block"));
        }
        let peak = pool.stats().blocks;
        live.clear();
        peak
    });
    let stats = pool.stats();
    println!("{peak} live blocks at once, then none: {allocations} heap allocations");
    assert_eq!(peak, NEW_HIGH);
    assert_eq!((stats.in_use, stats.blocks), (0, 0));
    assert_eq!(allocations, 0, "the first allocations:\n{stacks}");
}

#[test]
fn remote_frees_allocate_nothing() {
    // Blocks freed on a thread that cannot take the pool (this thread holds a claim) are
    // queued through entries reserved with the span table, not boxed; the owner's next
    // allocation takes them back.
    let pool = FixedPool::new(
        HostRegion::try_new(256 << 20).expect("region"),
        Arc::new(IdleDevice::default()),
    )
    .expect("pool");
    let claim = pool.claim();
    let blocks: Vec<_> = (0..NEW_HIGH)
        .map(|i| {
            claim
                .alloc(256 + (i % 64) * 256, StreamId::DEFAULT)
                .expect("block")
        })
        .collect();
    let in_use = pool.stats().in_use;
    let (freed, allocations, stacks) = std::thread::spawn(move || {
        let mut blocks = blocks;
        counted(|| {
            let n = blocks.len();
            blocks.clear();
            n
        })
    })
    .join()
    .expect("freeing thread");
    // Queued while this thread held the pool; reading the statistics takes them back.
    assert!(in_use >= NEW_HIGH * 256);
    assert_eq!(pool.stats().in_use, 0);
    let one = claim
        .alloc(1 << 20, StreamId::DEFAULT)
        .expect("block after the frees");
    let stats = pool.stats();
    println!(
        "{freed} blocks freed on another thread: {allocations} heap allocations there; \
         in use after the owner's next allocation: {} B",
        stats.in_use
    );
    assert_eq!((stats.in_use, stats.blocks), (one.size(), 1));
    assert_eq!(allocations, 0, "the first allocations:\n{stacks}");
}

/// A device whose streams are busy until [`BusyDevice::finish`]: points recorded on them stay
/// incomplete, so spans freed after a declared use stay pending.
#[derive(Default)]
struct BusyDevice {
    epoch: AtomicU64,
    done: std::sync::atomic::AtomicBool,
}

impl BusyDevice {
    /// The streams pass every point recorded so far.
    fn finish(&self) {
        self.done.store(true, Relaxed);
    }
}

impl StreamClock for BusyDevice {
    fn record(&self, _stream: StreamId) -> EventId {
        EventId(self.epoch.fetch_add(1, Relaxed) + 1)
    }
    fn is_complete(&self, _stream: StreamId, _epoch: EventId) -> bool {
        self.done.load(Relaxed)
    }
    fn capturing(&self) -> bool {
        false
    }
}

/// Resident set size of this process in bytes (Linux), for the pending list's reservation.
fn resident_bytes() -> Option<usize> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: usize = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[test]
fn pending_frees_allocate_nothing() {
    // Blocks also used on another stream wait on that stream once freed. The pending list is
    // reserved with the span table, so ten thousand of them pending at once never reach the
    // system allocator; once the stream passes, the next allocation reclaims them.
    let device = Arc::new(BusyDevice::default());
    let before = resident_bytes();
    let pool = FixedPool::new(
        HostRegion::try_new(256 << 20).expect("region"),
        device.clone(),
    )
    .expect("pool");
    let built = resident_bytes();
    let claim = pool.claim();
    let other = StreamId(7);
    let mut blocks: Vec<_> = (0..NEW_HIGH)
        .map(|i| {
            let mut b = claim
                .alloc(256 + (i % 64) * 256, StreamId::DEFAULT)
                .expect("block");
            b.record_use(other).expect("declared use");
            b
        })
        .collect();
    let in_use = pool.stats().in_use;
    let (freed, allocations, stacks) = counted(|| {
        let n = blocks.len();
        blocks.clear();
        n
    });
    let stats = pool.stats();
    // The pool's own resident memory: what building it added beyond its (touched) region.
    // Only this test's figure with `--test-threads=1`; other tests run beside it otherwise.
    let metadata = before
        .zip(built)
        .map(|(b, a)| a.saturating_sub(b).saturating_sub(256 << 20));
    println!(
        "{freed} blocks freed while their other stream is busy: {allocations} heap \
         allocations, {} B pending; the pool's resident metadata when built: {metadata:?} B",
        stats.pending_bytes
    );
    assert_eq!(stats.pending_bytes, in_use);
    assert_eq!(stats.in_use, 0);
    assert_eq!(allocations, 0, "the first allocations:\n{stacks}");
    // Nothing is reused while the stream is busy; the whole region is after it passes.
    let free = pool.stats().free_bytes;
    assert!(claim.alloc(free + 256, StreamId::DEFAULT).is_err());
    device.finish();
    let all = claim
        .alloc(pool.stats().reserved, StreamId::DEFAULT)
        .expect("the whole region once the stream passed");
    assert_eq!(pool.stats().pending_bytes, 0);
    assert_eq!(all.size(), pool.stats().reserved);
}
