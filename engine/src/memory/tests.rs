//! Unit tests for the fixed pool, with a fake stream clock and a fake device region.

use super::pool::CLOSE_CROSSINGS;
use super::*;
use crate::error::Error;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A region at a fixed fake address (like device memory: never dereferenced).
struct FakeRegion {
    base: usize,
    len: usize,
}

impl Region for FakeRegion {
    fn base(&self) -> usize {
        self.base
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// A stream clock whose streams advance only when the test says so; counts calls.
#[derive(Default)]
struct FakeClock {
    /// stream -> (last recorded epoch, last completed epoch)
    state: Mutex<HashMap<StreamId, (u64, u64)>>,
    records: AtomicUsize,
    queries: AtomicUsize,
    capture: AtomicBool,
    /// Whether it orders one stream after another's point (as CUDA stream waits do).
    ordering: AtomicBool,
    /// Each ordering asked for: (waiting stream, stream, epoch).
    orders: Mutex<Vec<(StreamId, StreamId, EventId)>>,
    /// Idle streams: every point has passed as soon as it is recorded.
    idle: AtomicBool,
}

impl FakeClock {
    fn complete(&self, s: StreamId) {
        let mut st = self.state.lock().unwrap();
        let e = st.entry(s).or_insert((0, 0));
        e.1 = e.0;
    }
    fn records(&self) -> usize {
        self.records.load(Ordering::SeqCst)
    }
    fn queries(&self) -> usize {
        self.queries.load(Ordering::SeqCst)
    }
    /// A clock that orders streams after each other's points.
    fn ordering() -> FakeClock {
        let c = FakeClock::default();
        c.ordering.store(true, Ordering::SeqCst);
        c
    }
    /// A clock whose streams are idle: each point has passed once recorded.
    fn idle() -> FakeClock {
        let c = FakeClock::default();
        c.idle.store(true, Ordering::SeqCst);
        c
    }
    /// The orderings asked for so far, sorted.
    fn orders(&self) -> Vec<(StreamId, StreamId, EventId)> {
        let mut o = self.orders.lock().unwrap().clone();
        o.sort();
        o
    }
}

impl StreamClock for FakeClock {
    fn record(&self, stream: StreamId) -> EventId {
        self.records.fetch_add(1, Ordering::SeqCst);
        let mut st = self.state.lock().unwrap();
        let e = st.entry(stream).or_insert((0, 0));
        e.0 += 1;
        EventId(e.0)
    }
    fn is_complete(&self, stream: StreamId, epoch: EventId) -> bool {
        assert!(!self.capturing(), "event queried during capture");
        self.queries.fetch_add(1, Ordering::SeqCst);
        if self.idle.load(Ordering::SeqCst) {
            return true;
        }
        let st = self.state.lock().unwrap();
        st.get(&stream).is_some_and(|&(_, done)| epoch.0 <= done)
    }
    fn capturing(&self) -> bool {
        self.capture.load(Ordering::SeqCst)
    }
    fn orders_streams(&self) -> bool {
        self.ordering.load(Ordering::SeqCst)
    }
    fn order_after(&self, waiter: StreamId, stream: StreamId, epoch: EventId) -> bool {
        if !self.ordering.load(Ordering::SeqCst) {
            return false;
        }
        self.orders.lock().unwrap().push((waiter, stream, epoch));
        true
    }
}

const S0: StreamId = StreamId::DEFAULT;
const S1: StreamId = StreamId(1);
const S2: StreamId = StreamId(2);
const S3: StreamId = StreamId(3);
const U: usize = DEFAULT_ALIGN;

fn fake_pool(units: usize) -> (Arc<FixedPool<FakeRegion>>, Arc<FakeClock>) {
    let clock = Arc::new(FakeClock::default());
    let region = FakeRegion {
        base: 0x7f00_0000_0000,
        len: units * U,
    };
    let pool = FixedPool::new(region, clock.clone()).unwrap();
    (pool, clock)
}

/// Five 1-unit blocks a..e plus a tail block filling the rest of an 8-unit pool.
fn five_plus_tail() -> (Arc<FixedPool<FakeRegion>>, Vec<Block<FakeRegion>>) {
    let (pool, _) = fake_pool(8);
    let v: Vec<_> = (0..5).map(|_| pool.alloc(U, S0).unwrap()).collect();
    let tail = pool.alloc(3 * U, S0).unwrap();
    let mut v = v;
    v.push(tail);
    let offs: Vec<usize> = v.iter().map(|b| b.offset()).collect();
    assert_eq!(offs, vec![0, U, 2 * U, 3 * U, 4 * U, 5 * U]);
    assert_eq!(pool.stats().free_bytes, 0);
    (pool, v)
}

#[test]
fn coalesce_none() {
    let (pool, mut v) = five_plus_tail();
    drop(v.remove(2)); // c alone, b and d live
    let s = pool.stats();
    assert_eq!((s.free_blocks, s.largest_free, s.free_bytes), (1, U, U));
    drop(v.remove(0)); // a alone: two separate spans
    let s = pool.stats();
    assert_eq!((s.free_blocks, s.largest_free, s.free_bytes), (2, U, 2 * U));
    assert!((s.fragmentation - 0.5).abs() < 1e-12);
}

#[test]
fn coalesce_left() {
    let (pool, mut v) = five_plus_tail();
    drop(v.remove(1)); // b
    drop(v.remove(1)); // c, left neighbour b free
    let s = pool.stats();
    assert_eq!((s.free_blocks, s.largest_free), (1, 2 * U));
    let b = pool.alloc(2 * U, S0).unwrap();
    assert_eq!(b.offset(), U);
}

#[test]
fn coalesce_right() {
    let (pool, mut v) = five_plus_tail();
    drop(v.remove(2)); // c
    drop(v.remove(1)); // b, right neighbour c free
    let s = pool.stats();
    assert_eq!((s.free_blocks, s.largest_free), (1, 2 * U));
    let b = pool.alloc(2 * U, S0).unwrap();
    assert_eq!(b.offset(), U);
}

#[test]
fn coalesce_both() {
    let (pool, mut v) = five_plus_tail();
    let c = v.remove(2);
    let b = v.remove(1);
    let d = v.remove(1);
    drop(b);
    drop(d);
    assert_eq!(pool.stats().free_blocks, 2);
    drop(c); // both neighbours free
    let s = pool.stats();
    assert_eq!(
        (s.free_blocks, s.largest_free, s.free_bytes),
        (1, 3 * U, 3 * U)
    );
    assert_eq!(s.fragmentation, 0.0);
    drop(v);
    let s = pool.stats();
    assert_eq!((s.free_blocks, s.largest_free, s.in_use), (1, 8 * U, 0));
}

#[test]
fn every_offset_aligned() {
    for align in [64usize, 256, 4096] {
        let clock = Arc::new(SyncClock);
        let region = FakeRegion {
            base: 1 << 20,
            len: 1 << 20,
        };
        let pool = FixedPool::with_alignment(region, clock, align).unwrap();
        let mut live = Vec::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..400 {
            x = xorshift(x);
            let size = (x % 5000) as usize;
            if let Ok(b) = pool.alloc(size, S0) {
                assert_eq!(b.offset() % align, 0);
                assert_eq!(b.addr() % align, 0);
                assert_eq!(b.size(), size.max(1).div_ceil(align) * align);
                assert_eq!(b.requested(), size);
                live.push(b);
            }
            // The rounding's edges: nothing, one byte, and either side of one unit.
            if i < 4 {
                let edge = [0, 1, align - 1, align + 1][i];
                let b = pool.alloc(edge, S0).unwrap();
                assert_eq!(b.size(), if edge > align { 2 * align } else { align });
            }
            if i % 3 == 0 && !live.is_empty() {
                let k = (x >> 20) as usize % live.len();
                live.swap_remove(k);
            }
        }
    }
}

#[test]
fn bad_alignment_rejected() {
    let r = || FakeRegion {
        base: 0x1000,
        len: 4096,
    };
    assert!(matches!(
        FixedPool::with_alignment(r(), Arc::new(SyncClock), 3),
        Err(Error::BadInput(_))
    ));
    assert!(matches!(
        FixedPool::with_alignment(r(), Arc::new(SyncClock), 0x2000),
        Err(Error::BadInput(_))
    ));
}

/// A full span table fails an allocation that needs one more entry, with an error that says
/// so (never a panic, never a grown table), and allocations that need no new entry, or that
/// come after frees, still succeed.
#[test]
fn full_span_table_is_a_clear_error_and_recovers() {
    let region = || FakeRegion {
        base: 0x1000_0000,
        len: 64 * U,
    };
    let opts = |max_spans| PoolOptions {
        max_spans,
        ..PoolOptions::default()
    };
    match FixedPool::with_options(region(), Arc::new(SyncClock), opts(0)) {
        Err(Error::BadInput(m)) => assert!(m.contains("max_spans"), "{m}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    let pool = FixedPool::with_options(region(), Arc::new(SyncClock), opts(4)).unwrap();
    // Three one-unit blocks and the free rest fill the four entries.
    let a = pool.alloc(U, S0).unwrap();
    let b = pool.alloc(U, S0).unwrap();
    let c = pool.alloc(U, S0).unwrap();
    let err = pool.alloc(U, S0).unwrap_err();
    let Error::OutOfMemory(msg) = &err else {
        panic!("expected OutOfMemory, got {err:?}");
    };
    for part in [
        "span table 4 of 4 entries used (full: raise max_spans)",
        "largest free block 15616 B",
    ] {
        assert!(msg.contains(part), "{msg:?} lacks {part:?}");
    }
    // A block that takes the whole free span needs no new entry.
    let rest = pool.alloc(61 * U, S0).unwrap();
    assert_eq!(pool.stats().in_use, 64 * U);
    drop(rest);
    // Freeing a block gives its span back; one of its size fits without a split.
    drop(a);
    let a = pool.alloc(U, S0).unwrap();
    assert_eq!(a.offset(), 0);
    drop((a, b, c));
    // All merged back: one entry used, and splits work again.
    let blocks: Vec<_> = (0..3).map(|_| pool.alloc(2 * U, S0).unwrap()).collect();
    assert_eq!(pool.stats().blocks, 3);
    drop(blocks);
    assert_eq!(pool.stats().in_use, 0);
    assert_eq!(pool.stats().largest_free, 64 * U);
}

#[test]
fn exhaustion_message_and_recovery() {
    let (pool, _) = fake_pool(16); // 4096 bytes
    let big = pool.alloc(3000, S0).unwrap(); // 3072 aligned
    let small = pool.alloc(100, S0).unwrap(); // 256
    let err = pool.alloc(2000, S0).unwrap_err();
    let Error::OutOfMemory(msg) = &err else {
        panic!("expected OutOfMemory, got {err:?}");
    };
    for part in [
        "requested 2000 B",
        "2048 B aligned",
        "reserved 4096 B",
        "in use 3328 B in 2 blocks",
        "free 768 B",
        "largest free block 768 B",
    ] {
        assert!(msg.contains(part), "{msg:?} lacks {part:?}");
    }
    // Larger than the whole pool, and absurd sizes, are errors too, never panics.
    assert!(matches!(
        pool.alloc(1 << 20, S0),
        Err(Error::OutOfMemory(_))
    ));
    assert!(matches!(
        pool.alloc(usize::MAX, S0),
        Err(Error::OutOfMemory(_))
    ));
    drop(big);
    let again = pool.alloc(2000, S0).unwrap();
    assert_eq!(again.offset(), 0);
    drop(small);
    drop(again);
    let all = pool.alloc(4096, S0).unwrap();
    assert_eq!(all.offset(), 0);
}

#[test]
fn handles_free_on_drop_and_stats() {
    let (pool, _) = fake_pool(32);
    {
        let a = pool.alloc(1000, S0).unwrap();
        let b = pool.alloc(10, S0).unwrap();
        let s = pool.stats();
        assert_eq!((s.in_use, s.blocks), (a.size() + b.size(), 2));
        assert_eq!(s.in_use, 1024 + 256);
        assert_eq!(s.in_use + s.free_bytes, s.reserved);
    }
    let s = pool.stats();
    assert_eq!(
        (s.in_use, s.blocks, s.free_blocks, s.largest_free),
        (0, 0, 1, 32 * U)
    );
    assert_eq!(s.peak_in_use, 1280);
}

#[test]
fn same_stream_reuse_is_immediate_and_eventless() {
    for s in [S0, S1] {
        let (pool, clock) = fake_pool(4);
        let a = pool.alloc(4 * U, s).unwrap();
        drop(a);
        let b = pool.alloc(4 * U, s).unwrap();
        assert_eq!(b.offset(), 0);
        drop(b);
        let c = pool.alloc(U, s).unwrap();
        assert_eq!(c.offset(), 0);
        assert_eq!((clock.queries(), clock.records()), (0, 0));
    }
}

#[test]
fn other_stream_waits_for_owner_stream() {
    let (pool, clock) = fake_pool(4);
    drop(pool.alloc(4 * U, S1).unwrap());
    let err = pool.alloc(U, S2).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory(_)));
    assert_eq!(clock.records(), 1); // one event on S1
    assert_eq!(pool.stats().pending_bytes, 4 * U);
    clock.complete(S1);
    let b = pool.alloc(4 * U, S2).unwrap();
    assert_eq!(b.offset(), 0);
}

#[test]
fn record_use_blocks_reuse_until_epoch_completes() {
    let (pool, clock) = fake_pool(4);
    let mut a = pool.alloc(4 * U, S0).unwrap();
    a.record_use(S1).unwrap();
    drop(a);
    let s = pool.stats();
    assert_eq!((s.in_use, s.pending_bytes, s.free_bytes), (0, 4 * U, 0));
    assert!(matches!(pool.alloc(U, S0), Err(Error::OutOfMemory(_))));
    assert!(clock.queries() >= 1);
    clock.complete(S1);
    let b = pool.alloc(4 * U, S0).unwrap();
    assert_eq!(b.offset(), 0);
    assert_eq!(pool.stats().pending_bytes, 0);
}

#[test]
fn one_event_per_stream_per_epoch() {
    let (pool, clock) = fake_pool(16);
    let mut a = pool.alloc(U, S0).unwrap();
    let mut b = pool.alloc(U, S0).unwrap();
    a.record_use(S1).unwrap();
    b.record_use(S1).unwrap();
    b.record_use(S2).unwrap();
    drop(a);
    drop(b);
    // One event on S1 shared by both blocks, one on S2.
    assert_eq!(clock.records(), 2);
    let mut c = pool.alloc(U, S0).unwrap();
    c.record_use(S1).unwrap();
    drop(c);
    assert_eq!(clock.records(), 3); // a new use on S1 since its last record
                                    // S1 done but S2 not: a waits on S1 only, b on S1 and S2, c on S1 only.
    clock.complete(S1);
    let full = pool.alloc(16 * U, S0);
    assert!(full.is_err()); // b still pending
    assert_eq!(pool.stats().pending_bytes, U);
    clock.complete(S2);
    let full = pool.alloc(16 * U, S0).unwrap();
    assert_eq!(full.offset(), 0);
}

#[test]
fn free_block_preferred_over_pending() {
    let (pool, clock) = fake_pool(8);
    let mut a = pool.alloc(4 * U, S0).unwrap();
    a.record_use(S1).unwrap();
    drop(a);
    let q = clock.queries();
    let b = pool.alloc(4 * U, S0).unwrap();
    assert_eq!(b.offset(), 4 * U);
    assert_eq!(clock.queries(), q); // never looked at the GPU
}

#[test]
fn no_event_queries_during_capture() {
    let (pool, clock) = fake_pool(4);
    let mut a = pool.alloc(2 * U, S0).unwrap();
    a.record_use(S1).unwrap();
    drop(a);
    drop(pool.alloc(2 * U, S2).unwrap()); // free, but reserved for S2
    clock.complete(S1);
    clock.capture.store(true, Ordering::SeqCst);
    let q = clock.queries();
    let r = clock.records();
    assert!(matches!(pool.alloc(3 * U, S0), Err(Error::OutOfMemory(_))));
    // Same-stream reuse still works during capture.
    let c = pool.alloc(2 * U, S2).unwrap();
    drop(c);
    assert_eq!((clock.queries(), clock.records()), (q, r));
    clock.capture.store(false, Ordering::SeqCst);
    clock.complete(S2);
    assert!(pool.alloc(U, S0).is_ok());
}

#[test]
fn alloc_wait_wakes_on_free_and_times_out() {
    let (pool, _) = fake_pool(4);
    let a = pool.alloc(4 * U, S0).unwrap();
    let err = pool
        .alloc_wait(U, S0, Duration::from_millis(5))
        .unwrap_err();
    assert!(matches!(err, Error::OutOfMemory(_)));
    let err = pool
        .alloc_wait(5 * U, S0, Duration::from_secs(3600))
        .unwrap_err();
    assert!(matches!(err, Error::OutOfMemory(_))); // can never fit: no wait
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        drop(a);
    });
    let b = pool.alloc_wait(4 * U, S0, Duration::from_secs(60)).unwrap();
    assert_eq!(b.offset(), 0);
    t.join().unwrap();
}

#[test]
fn alloc_wait_polls_pending_streams() {
    let (pool, clock) = fake_pool(4);
    let mut a = pool.alloc(4 * U, S0).unwrap();
    a.record_use(S1).unwrap();
    drop(a);
    let c2 = clock.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        c2.complete(S1);
    });
    let b = pool.alloc_wait(4 * U, S0, Duration::from_secs(60)).unwrap();
    assert_eq!(b.offset(), 0);
    t.join().unwrap();
}

#[test]
fn host_region_backs_the_pool() {
    let region = HostRegion::new(10_000);
    assert_eq!(region.base() % HOST_REGION_ALIGN, 0);
    assert_eq!(region.len(), 10_000);
    let pool = FixedPool::new(region, Arc::new(SyncClock)).unwrap();
    assert_eq!(pool.stats().reserved, 9984); // rounded down to 256
    let mut a = pool.alloc(5000, S0).unwrap();
    a.record_use(S1).unwrap(); // synchronous clock: complete at once
    let b = pool.alloc(4000, S1).unwrap();
    assert_eq!(b.addr(), pool.region().base() + b.offset());
    drop(a);
    drop(b);
    let all = pool.alloc(9984, S1).unwrap(); // S0's span promoted without waiting
    assert_eq!(all.offset(), 0);
}

fn xorshift(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

/// Maximal runs of free units in a unit bitmap: (start, len).
fn free_runs(used: &[bool]) -> Vec<(usize, usize)> {
    let mut runs = Vec::new();
    let mut i = 0;
    while i < used.len() {
        if used[i] {
            i += 1;
            continue;
        }
        let s = i;
        while i < used.len() && !used[i] {
            i += 1;
        }
        runs.push((s, i - s));
    }
    runs
}

/// Single stream, synchronous clock: the pool must choose exactly the reference best fit
/// (smallest maximal free run that fits, lowest offset on ties) and keep spans fully coalesced.
#[test]
fn randomized_against_reference_best_fit() {
    const UNITS: usize = 200;
    let region = FakeRegion {
        base: 0x10_0000,
        len: UNITS * U,
    };
    let pool = FixedPool::new(region, Arc::new(SyncClock)).unwrap();
    let mut used = vec![false; UNITS];
    let mut live: Vec<Block<FakeRegion>> = Vec::new();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut allocs = 0;
    let mut ooms = 0;
    for _ in 0..6000 {
        x = xorshift(x);
        let free_it = !live.is_empty() && (x % 100) < 45;
        if free_it {
            let k = (x >> 8) as usize % live.len();
            let b = live.swap_remove(k);
            let (o, n) = (b.offset() / U, b.size() / U);
            for u in &mut used[o..o + n] {
                assert!(*u);
                *u = false;
            }
            drop(b);
        } else {
            let size = 1 + (x >> 16) as usize % (12 * U);
            let units = size.div_ceil(U);
            let runs = free_runs(&used);
            let expect = runs
                .iter()
                .filter(|r| r.1 >= units)
                .min_by_key(|r| (r.1, r.0))
                .map(|r| r.0);
            match (pool.alloc(size, S0), expect) {
                (Ok(b), Some(o)) => {
                    assert_eq!(b.offset(), o * U);
                    assert_eq!(b.size(), units * U);
                    for u in &mut used[o..o + units] {
                        *u = true;
                    }
                    live.push(b);
                    allocs += 1;
                }
                (Err(Error::OutOfMemory(_)), None) => ooms += 1,
                (got, want) => panic!("pool gave {got:?}, reference expects {want:?}"),
            }
        }
        let runs = free_runs(&used);
        let s = pool.stats();
        let in_use = used.iter().filter(|u| **u).count() * U;
        assert_eq!(s.in_use, in_use);
        assert_eq!(s.in_use + s.free_bytes, s.reserved);
        assert_eq!(s.blocks, live.len());
        assert_eq!(s.free_blocks, runs.len());
        assert_eq!(
            s.largest_free,
            runs.iter().map(|r| r.1).max().unwrap_or(0) * U
        );
    }
    assert!(allocs > 1000 && ooms > 50, "allocs {allocs}, ooms {ooms}");
}

/// Several streams, cross-stream uses, random stream progress and captures: live blocks never
/// overlap and every byte is in use, free or pending.
#[test]
fn randomized_streams_keep_invariants() {
    const UNITS: usize = 128;
    let (pool, clock) = fake_pool(UNITS);
    let streams = [S0, S1, S2, S3];
    let mut live: Vec<Block<FakeRegion>> = Vec::new();
    let mut x = 0xdead_beef_cafe_f00du64;
    let mut allocs = 0;
    for step in 0..8000 {
        x = xorshift(x);
        let r = x % 100;
        let s = streams[(x >> 8) as usize % streams.len()];
        if r < 40 {
            let size = 1 + (x >> 16) as usize % (8 * U);
            if let Ok(b) = pool.alloc(size, s) {
                allocs += 1;
                live.push(b);
            }
        } else if r < 70 && !live.is_empty() {
            let k = (x >> 16) as usize % live.len();
            live.swap_remove(k);
        } else if r < 85 && !live.is_empty() {
            let k = (x >> 16) as usize % live.len();
            live[k].record_use(s).unwrap();
        } else if r < 97 {
            clock.complete(s);
        } else {
            let c = clock.capture.load(Ordering::SeqCst);
            clock.capture.store(!c, Ordering::SeqCst);
        }
        let mut spans: Vec<(usize, usize)> = live.iter().map(|b| (b.offset(), b.size())).collect();
        spans.sort_unstable();
        for w in spans.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "overlap at step {step}: {w:?}");
        }
        if let Some(last) = spans.last() {
            assert!(last.0 + last.1 <= UNITS * U);
        }
        let st = pool.stats();
        assert_eq!(st.in_use, spans.iter().map(|s| s.1).sum::<usize>());
        assert_eq!(st.in_use + st.free_bytes + st.pending_bytes, st.reserved);
        assert_eq!(st.blocks, live.len());
    }
    assert!(allocs > 1000, "allocs {allocs}");
    // Quiesce: everything returns and coalesces into one span.
    drop(live);
    clock.capture.store(false, Ordering::SeqCst);
    for s in streams {
        clock.complete(s);
    }
    // Spans reserved for different streams need a fresh point on each (promotion); once the
    // streams pass it, the whole region is one span again.
    let whole = match pool.alloc(UNITS * U, S0) {
        Ok(b) => b,
        Err(_) => {
            for s in streams {
                clock.complete(s);
            }
            pool.alloc(UNITS * U, S0).unwrap()
        }
    };
    assert_eq!(whole.offset(), 0);
}

#[test]
fn best_fit_prefers_smallest_span_across_tags() {
    let (pool, clock) = fake_pool(8);
    let _a = pool.alloc(U, S0).unwrap();
    let b = pool.alloc(U, S0).unwrap();
    let _c = pool.alloc(U, S0).unwrap();
    drop(b); // 1-unit span at U (S0's); the 5-unit tail at 3U is free for anyone
    let d = pool.alloc(U, S0).unwrap();
    assert_eq!(d.offset(), U);
    drop(d);
    // Another stream cannot take S0's span, so it gets the tail without touching S0's events.
    let e = pool.alloc(U, S1).unwrap();
    assert_eq!(e.offset(), 3 * U);
    assert_eq!((clock.queries(), clock.records()), (0, 0));
}

/// Two streams alternating over a fixed region: each block freed on its stream stays apart
/// from the space free for any stream, so neither stream waits for the other's point and no
/// event is recorded or queried (with the freed span merged into the free space, every step
/// would promote the other stream's span; this fake clock never completes, so it would fail).
#[test]
fn two_streams_alternating_record_no_event() {
    // Room for a few blocks of the largest size per stream (the pool sizes of the benchmark's
    // pair workload are larger still).
    let (pool, clock) = fake_pool(128);
    let mut x = 0x1234_5678_9abc_def1u64;
    for step in 0..2000 {
        x = xorshift(x);
        let s = if step % 2 == 0 { S1 } else { S2 };
        let size = 1 + (x >> 8) as usize % (16 * U);
        let b = pool
            .alloc(size, s)
            .unwrap_or_else(|e| panic!("step {step}: {e}"));
        drop(b);
    }
    assert_eq!((clock.records(), clock.queries()), (0, 0));
    assert_eq!(pool.stats().in_use, 0);
}

/// A span freed for one stream stays apart from its any-stream neighbour while another stream
/// is in use (which takes that neighbour with no event), and merges with it, still with no
/// event, when its own stream needs the room.
#[test]
fn spans_kept_apart_merge_when_their_stream_needs_them() {
    let (pool, clock) = fake_pool(8);
    let x = pool.alloc(U, S2).unwrap();
    let a = pool.alloc(2 * U, S1).unwrap();
    assert_eq!(a.offset(), U);
    drop(a);
    // S1's span [1, 3) and the free tail [3, 8) are two spans.
    let s = pool.stats();
    assert_eq!((s.free_blocks, s.free_bytes), (2, 7 * U));
    let y = pool.alloc(5 * U, S2).unwrap();
    assert_eq!(y.offset(), 3 * U);
    drop(y);
    // S1 now needs [1, 8): its span and the free tail (the tail is S2's again, so not yet).
    assert!(matches!(pool.alloc(7 * U, S1), Err(Error::OutOfMemory(_))));
    assert_eq!(clock.records(), 1); // the promotion of S2's span
    clock.complete(S2);
    let c = pool.alloc(7 * U, S1).unwrap();
    assert_eq!(c.offset(), U);
    assert_eq!(clock.records(), 1);
    drop((x, c));
    // Within the free tail and S1's span on their own, no event at all.
    let (pool, clock) = fake_pool(8);
    let _x = pool.alloc(U, S2).unwrap();
    drop(pool.alloc(2 * U, S1).unwrap());
    assert_eq!(pool.stats().free_blocks, 2);
    let c = pool.alloc(7 * U, S1).unwrap();
    assert_eq!(c.offset(), U);
    assert_eq!((clock.records(), clock.queries()), (0, 0));
    assert_eq!(pool.stats().free_blocks, 0);
}

/// A claimed pool serves its thread without the lock; a block freed on another thread waits
/// on the remote-free list until the owner's next allocation drains it.
#[test]
fn claimed_pool_takes_frees_from_other_threads_through_the_remote_list() {
    let (pool, _clock) = fake_pool(16);
    let claim = pool.claim();
    assert!(pool.claimed_here());
    let a = claim.alloc(4 * U, S0).unwrap();
    let b = claim.alloc(4 * U, S0).unwrap();
    assert_eq!((a.offset(), b.offset()), (0, 4 * U));
    // Freed on another thread: the owner holds the state, so the block is queued.
    std::thread::spawn(move || drop(a)).join().unwrap();
    assert!(pool.remote_queued());
    // The owner's next allocation drains the list first and reuses the bytes at once.
    let c = claim.alloc(4 * U, S0).unwrap();
    assert_eq!(c.offset(), 0);
    assert!(!pool.remote_queued());
    let s = pool.stats();
    assert_eq!((s.blocks, s.in_use), (2, 8 * U));
    drop((b, c));
    drop(claim);
    assert!(!pool.claimed_here());
    let s = pool.stats();
    assert_eq!((s.blocks, s.in_use, s.free_blocks), (0, 0, 1));
}

/// Blocks freed under a claim hand their reference to the pool back for reuse; when the claim
/// ends those references are released, so the pool is dropped with its last handle.
#[test]
fn claim_returns_prepaid_references() {
    let (pool, _clock) = fake_pool(16);
    {
        let claim = pool.claim();
        let blocks: Vec<_> = (0..4).map(|_| claim.alloc(U, S0).unwrap()).collect();
        assert_eq!(Arc::strong_count(&pool), 2 + 4);
        drop(blocks);
        // The four counts now wait in the pool for the claim's next allocations.
        assert_eq!(Arc::strong_count(&pool), 2 + 4);
        let again = claim.alloc(U, S0).unwrap();
        assert_eq!(Arc::strong_count(&pool), 2 + 4);
        drop(again);
    }
    assert_eq!(Arc::strong_count(&pool), 1);
    let weak = Arc::downgrade(&pool);
    drop(pool);
    assert!(weak.upgrade().is_none());
}

/// Another thread's allocation waits while the pool is claimed and proceeds once the claim
/// drops; `alloc_wait` gives up at its deadline instead.
#[test]
fn other_threads_wait_for_a_claim() {
    let (pool, _clock) = fake_pool(16);
    let claim = pool.claim();
    let p = Arc::clone(&pool);
    let timed = std::thread::spawn(move || {
        p.alloc_wait(U, S0, Duration::from_millis(20))
            .map(|b| b.offset())
    })
    .join()
    .unwrap();
    assert!(matches!(timed, Err(Error::OutOfMemory(_))), "{timed:?}");
    let p = Arc::clone(&pool);
    let waiter = std::thread::spawn(move || p.alloc(2 * U, S0).map(|b| (b.offset(), b.size())));
    std::thread::sleep(Duration::from_millis(20));
    let mine = claim.alloc(U, S0).unwrap();
    assert_eq!(mine.offset(), 0);
    drop(claim);
    // The waiter got the pool after the claim and allocated past the claimed block.
    assert_eq!(waiter.join().unwrap().unwrap(), (U, 2 * U));
    drop(mine);
    assert_eq!(pool.stats().blocks, 0);
}

/// Many threads free blocks of a claimed pool at once: every byte comes back exactly once.
#[test]
fn concurrent_remote_frees_all_return() {
    const N: usize = 256;
    let (pool, _clock) = fake_pool(2 * N);
    let claim = pool.claim();
    let mut blocks: Vec<_> = (0..N).map(|_| claim.alloc(U, S0).unwrap()).collect();
    let mut handles = Vec::new();
    for _ in 0..4 {
        let mine: Vec<_> = blocks.drain(..N / 4).collect();
        handles.push(std::thread::spawn(move || drop(mine)));
    }
    for h in handles {
        h.join().unwrap();
    }
    let s = pool.stats();
    assert_eq!((s.blocks, s.in_use, s.free_blocks), (0, 0, 1));
    // Everything coalesced: the whole region is one block again.
    let whole = claim.alloc(2 * N * U, S0).unwrap();
    assert_eq!(whole.offset(), 0);
}

/// The same random sequence through a claimed and an unclaimed pool gives the same offsets
/// (the owner path is the same allocator without the lock).
#[test]
fn claimed_and_unclaimed_pools_place_identically() {
    let run = |claim: bool| {
        let (pool, _clock) = fake_pool(400);
        let _c = claim.then(|| pool.claim());
        let mut live: Vec<Block<FakeRegion>> = Vec::new();
        let mut offsets = Vec::new();
        let mut x = 0x1234_5678_9abc_def1u64;
        for _ in 0..3000 {
            x = xorshift(x);
            if !live.is_empty() && x % 100 < 45 {
                live.swap_remove((x >> 8) as usize % live.len());
            } else if let Ok(b) = pool.alloc(1 + (x >> 16) as usize % (20 * U), S0) {
                offsets.push(b.offset());
                live.push(b);
            }
        }
        offsets
    };
    assert_eq!(run(true), run(false));
}

/// A span that grows back across a size class while it is the highest free span stays listed
/// in its old class (no relink on the alloc/free ping-pong); it still serves requests of its
/// full size and is moved up when a span is linked above it.
#[test]
fn stale_highest_span_still_serves_its_full_size() {
    let (pool, _clock) = fake_pool(64);
    let a = pool.alloc(U, S0).unwrap(); // the free tail (63 units) drops a class
    drop(a); // merged back to 64 units, listed in the 63-unit class
    let whole = pool.alloc(64 * U, S0).unwrap();
    assert_eq!((whole.offset(), whole.size()), (0, 64 * U));
    drop(whole);
    // Best fit over a stale span and a span linked above its listed class.
    let (pool, _clock) = fake_pool(200);
    let x = pool.alloc(100 * U, S0).unwrap();
    let y = pool.alloc(U, S0).unwrap();
    let z = pool.alloc(U, S0).unwrap();
    drop(x); // 100-unit hole at 0; the 98-unit tail at 102
    let w = pool.alloc(98 * U, S0).unwrap();
    assert_eq!(w.offset(), 102 * U); // the exact fit, not the larger hole
    drop((y, z, w));
    let s = pool.stats();
    assert_eq!((s.free_blocks, s.largest_free), (1, 200 * U));
    assert_eq!(pool.alloc(200 * U, S0).unwrap().offset(), 0);
}

/// Serving options (small blocks from the top), claimed and unclaimed: blocks never overlap,
/// spans stay fully coalesced, and an allocation fails only when no free run could hold it
/// (the stale highest span included).
#[test]
fn randomized_serving_options_never_fail_while_a_run_fits() {
    for claim in [false, true] {
        const UNITS: usize = 300;
        let region = FakeRegion {
            base: 0x20_0000,
            len: UNITS * U,
        };
        let opts = PoolOptions {
            small_from_top: Some(4 * U),
            ..PoolOptions::default()
        };
        let pool = FixedPool::with_options(region, Arc::new(SyncClock), opts).unwrap();
        let _c = claim.then(|| pool.claim());
        let mut used = vec![false; UNITS];
        let mut live: Vec<Block<FakeRegion>> = Vec::new();
        let mut x = 0x0bad_5eed_1234_5678u64;
        let (mut allocs, mut ooms) = (0, 0);
        for _ in 0..6000 {
            x = xorshift(x);
            if !live.is_empty() && (x % 100) < 45 {
                let b = live.swap_remove((x >> 8) as usize % live.len());
                let (o, n) = (b.offset() / U, b.size() / U);
                used[o..o + n].iter_mut().for_each(|u| *u = false);
            } else {
                // Mostly small, sometimes close to the whole region.
                let size = if x.is_multiple_of(7) {
                    1 + (x >> 16) as usize % (UNITS * U)
                } else {
                    1 + (x >> 16) as usize % (16 * U)
                };
                let units = size.div_ceil(U);
                let fits = free_runs(&used).iter().any(|r| r.1 >= units);
                match pool.alloc(size, S0) {
                    Ok(b) => {
                        let o = b.offset() / U;
                        assert!(o + units <= UNITS);
                        for u in &mut used[o..o + units] {
                            assert!(!*u, "overlap");
                            *u = true;
                        }
                        live.push(b);
                        allocs += 1;
                    }
                    Err(Error::OutOfMemory(_)) => {
                        assert!(!fits, "failed while a free run of {units} units exists");
                        ooms += 1;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            let runs = free_runs(&used);
            let s = pool.stats();
            assert_eq!(s.free_blocks, runs.len());
            assert_eq!(s.free_bytes + s.in_use, s.reserved);
            assert_eq!(
                s.largest_free,
                runs.iter().map(|r| r.1).max().unwrap_or(0) * U
            );
        }
        assert!(allocs > 1000 && ooms > 50, "allocs {allocs}, ooms {ooms}");
    }
}

#[test]
fn retired_streams_free_their_spans_and_tags() {
    let (pool, clock) = fake_pool(128);
    // Every tag taken: the default stream plus MAX_STREAMS - 1 others (one live block each).
    let streams: Vec<StreamId> = (1..MAX_STREAMS as u64).map(StreamId).collect();
    let held: Vec<_> = streams.iter().map(|&s| pool.alloc(U, s).unwrap()).collect();
    let extra = StreamId(1000);
    assert!(matches!(pool.alloc(U, extra), Err(Error::Unsupported(_))));
    // A block freed on stream 5 leaves the free space reserved for stream 5...
    let records = clock.records();
    let big = pool.alloc(32 * U, streams[4]).unwrap();
    let at = big.offset();
    drop(big);
    // ...until stream 5 is retired: then a new stream takes its tag and the space at once,
    // with no event recorded or queried.
    pool.retire_stream(streams[4]);
    let b = pool.alloc(32 * U, extra).unwrap();
    assert_eq!(
        b.offset(),
        at,
        "the retired stream's span is reused in place"
    );
    assert_eq!((clock.records(), clock.queries()), (records, 0));
    assert_eq!(b.stream(), extra);
    // Retiring an unknown stream or the default stream changes nothing: still no free tag.
    pool.retire_stream(StreamId(4242));
    pool.retire_stream(S0);
    assert!(matches!(
        pool.alloc(U, StreamId(1001)),
        Err(Error::Unsupported(_))
    ));
    drop(b);
    pool.retire_stream(extra);
    let c = pool.alloc(U, StreamId(1001)).unwrap();
    assert_eq!(pool.stats().in_use, held.len() * U + c.size());
}

#[test]
fn retired_tag_waits_for_blocks_pending_on_it() {
    let (pool, clock) = fake_pool(128);
    let _held: Vec<_> = (1..MAX_STREAMS as u64 - 1)
        .map(|s| pool.alloc(U, StreamId(s)).unwrap())
        .collect();
    let last = StreamId(MAX_STREAMS as u64 - 1);
    let mut a = pool.alloc(4 * U, S0).unwrap();
    a.record_use(last).unwrap(); // takes the last tag
    drop(a); // pending on `last`
    pool.retire_stream(last);
    // The pending block still refers to the tag: a new stream cannot have it yet.
    assert!(matches!(
        pool.alloc(U, StreamId(2000)),
        Err(Error::Unsupported(_))
    ));
    clock.complete(last);
    // A failed allocation reclaims the completed pending block, which clears the reference:
    // the new stream now gets the tag (and fails only for room, all free space being
    // reserved for the default stream that freed it last).
    assert!(matches!(
        pool.alloc(1000 * U, S0),
        Err(Error::OutOfMemory(_))
    ));
    assert_eq!(pool.stats().pending_bytes, 0);
    assert!(matches!(
        pool.alloc(U, StreamId(2000)),
        Err(Error::OutOfMemory(_))
    ));
}

/// A remappable region at a fake address: it keeps which pages are backed, rejects mapping a
/// backed page, unmapping an unbacked one, or backing more pages than it has, and counts calls.
struct FakePagedRegion {
    page: usize,
    physical: usize,
    backed: Mutex<Vec<bool>>,
    maps: AtomicUsize,
    unmaps: AtomicUsize,
    /// Background mode: mapped pages stay pending until `settle`, like a region whose mover
    /// thread has not reached them yet.
    deferred: AtomicBool,
    pending: Mutex<Vec<bool>>,
    /// Each `order_after_moves` call: the stream, and whether a page behind it was pending.
    orders: Mutex<Vec<(StreamId, bool)>>,
    /// Makes `order_after_moves` fail (a mover that can no longer move pages).
    fail_orders: AtomicBool,
    /// Says it moves pages in the background (read when the pool is built).
    background: bool,
    /// The points each `unmap_pages_after` call was to wait for.
    afters: Mutex<Vec<Vec<(StreamId, EventId)>>>,
    /// Background mode: streams count as held only while a move is pending, and
    /// `settle_within` finishes the moves (else every stream is held and the mover never
    /// finishes in time).
    held_until_settled: bool,
    /// `settle_within` calls.
    settles: AtomicUsize,
}

impl FakePagedRegion {
    fn new(page: usize, pages: usize, physical: usize) -> Self {
        FakePagedRegion {
            page,
            physical,
            backed: Mutex::new(vec![false; pages]),
            maps: AtomicUsize::new(0),
            unmaps: AtomicUsize::new(0),
            deferred: AtomicBool::new(false),
            pending: Mutex::new(vec![false; pages]),
            orders: Mutex::new(Vec::new()),
            fail_orders: AtomicBool::new(false),
            background: false,
            afters: Mutex::new(Vec::new()),
            held_until_settled: false,
            settles: AtomicUsize::new(0),
        }
    }
    /// Background mode where streams are held only while a move is pending, and a short wait
    /// for the mover finishes the moves.
    fn held_until_settled(self) -> Self {
        FakePagedRegion {
            held_until_settled: true,
            ..self
        }
    }
    /// A region that moves pages in the background: maps stay pending until `settle`.
    fn background(self) -> Self {
        self.deferred.store(true, Ordering::SeqCst);
        FakePagedRegion {
            background: true,
            ..self
        }
    }
    fn orders(&self) -> Vec<(StreamId, bool)> {
        std::mem::take(&mut *self.orders.lock().unwrap())
    }
    fn backed_pages(&self) -> usize {
        self.backed.lock().unwrap().iter().filter(|b| **b).count()
    }
    /// Whether every page under `off..off + len` (bytes from the base) is backed.
    fn covers(&self, off: usize, len: usize) -> bool {
        let b = self.backed.lock().unwrap();
        (off / self.page..(off + len).div_ceil(self.page)).all(|p| b[p])
    }
}

impl Region for FakePagedRegion {
    fn base(&self) -> usize {
        0x7e00_0000_0000
    }
    fn len(&self) -> usize {
        self.backed.lock().unwrap().len() * self.page
    }
    fn page_size(&self) -> Option<usize> {
        Some(self.page)
    }
    fn physical_pages(&self) -> usize {
        self.physical
    }
    fn map_pages(&self, first: usize, count: usize) -> crate::error::Result<()> {
        let mut b = self.backed.lock().unwrap();
        let used = b.iter().filter(|x| **x).count();
        if b[first..first + count].iter().any(|x| *x) {
            return Err(Error::BadInput("mapping a backed page".into()));
        }
        if used + count > self.physical {
            return Err(Error::OutOfMemory("no physical page left".into()));
        }
        b[first..first + count].iter_mut().for_each(|x| *x = true);
        if self.deferred.load(Ordering::SeqCst) {
            let mut p = self.pending.lock().unwrap();
            p[first..first + count].iter_mut().for_each(|x| *x = true);
        }
        self.maps.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn order_after_moves(
        &self,
        stream: StreamId,
        offset: usize,
        len: usize,
    ) -> crate::error::Result<()> {
        if self.fail_orders.load(Ordering::SeqCst) {
            return Err(Error::OutOfMemory("the page mover failed".into()));
        }
        let p = self.pending.lock().unwrap();
        let behind = (offset / self.page..(offset + len).div_ceil(self.page)).any(|i| p[i]);
        self.orders.lock().unwrap().push((stream, behind));
        Ok(())
    }
    fn moves_in_background(&self) -> bool {
        self.background
    }
    /// In background mode every stream counts as held behind a move (the pool then never
    /// promotes a stream's spans, and takes their pages instead).
    fn stream_waits_on_moves(&self, _stream: StreamId) -> bool {
        if self.held_until_settled {
            return self.pending.lock().unwrap().iter().any(|p| *p);
        }
        self.background
    }
    fn settle_within(&self, _limit: std::time::Duration) -> crate::error::Result<bool> {
        self.settles.fetch_add(1, Ordering::SeqCst);
        if self.held_until_settled {
            self.settle()?;
        }
        Ok(self.held_until_settled)
    }
    fn unmap_pages_after(
        &self,
        first: usize,
        count: usize,
        after: &[(StreamId, EventId)],
    ) -> crate::error::Result<()> {
        assert!(self.background || after.is_empty());
        self.afters.lock().unwrap().push(after.to_vec());
        self.unmap_pages(first, count)
    }
    fn settle(&self) -> crate::error::Result<()> {
        self.pending
            .lock()
            .unwrap()
            .iter_mut()
            .for_each(|x| *x = false);
        Ok(())
    }
    fn unmap_pages(&self, first: usize, count: usize) -> crate::error::Result<()> {
        let mut b = self.backed.lock().unwrap();
        if b[first..first + count].iter().any(|x| !*x) {
            return Err(Error::BadInput("unmapping an unbacked page".into()));
        }
        b[first..first + count].iter_mut().for_each(|x| *x = false);
        self.unmaps.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Pages of 4 units.
const PAGE: usize = 4 * U;

fn paged_pool(
    pages: usize,
    physical: usize,
    clock: Arc<dyn StreamClock>,
) -> Arc<FixedPool<FakePagedRegion>> {
    FixedPool::new(FakePagedRegion::new(PAGE, pages, physical), clock).unwrap()
}

#[test]
fn paged_pool_backs_pages_on_demand_and_reuses_backed_spans() {
    let pool = paged_pool(16, 8, Arc::new(SyncClock));
    let s = pool.stats();
    assert_eq!((s.reserved, s.committed, s.free_bytes), (8 * PAGE, 0, 0));
    // 2.5 pages: three pages backed, the half page past the block stays free.
    let a = pool.alloc(10 * U, S0).unwrap();
    assert!(pool.region().covers(a.offset(), a.size()));
    let s = pool.stats();
    assert_eq!(
        (s.committed, s.in_use, s.free_bytes),
        (3 * PAGE, 10 * U, 2 * U)
    );
    assert_eq!((s.remaps, s.footprint), (1, 3 * PAGE));
    // The free half page serves a small block without any mapping.
    let b = pool.alloc(2 * U, S0).unwrap();
    assert_eq!(pool.region().maps.load(Ordering::SeqCst), 1);
    drop(a);
    let a2 = pool.alloc(10 * U, S0).unwrap(); // the backed span again
    assert_eq!(a2.offset(), 0);
    assert_eq!(pool.stats().remaps, 1);
    drop((a2, b));
    let s = pool.stats();
    assert_eq!(
        (s.committed, s.free_bytes, s.in_use),
        (3 * PAGE, 3 * PAGE, 0)
    );
}

/// Over a region that moves pages in the background, every block handed out orders its stream
/// after the moves behind it (the region decides whether any are pending), and `ready_on` does
/// the same for another stream.
#[test]
fn background_moves_order_the_streams_that_use_a_block() {
    let region = FakePagedRegion::new(PAGE, 16, 8).background();
    let pool = FixedPool::new(region, Arc::new(FakeClock::default())).unwrap();
    let a = pool.alloc(6 * U, S1).unwrap(); // two pages mapped, not yet moved
    assert_eq!(pool.region().orders(), vec![(S1, true)]);
    a.ready_on(S2).unwrap();
    a.ready_on(S1).unwrap();
    assert_eq!(pool.region().orders(), vec![(S2, true), (S1, true)]);
    pool.region().settle().unwrap();
    // The free part of a backed page: no move behind it any more.
    let b = pool.alloc(U, S1).unwrap();
    assert_eq!(pool.region().orders(), vec![(S1, false)]);
    assert_eq!(pool.region().maps.load(Ordering::SeqCst), 1);
    drop((a, b));
}

/// In background mode the pages of spans kept for a stream move at once, without waiting for
/// that stream: the unmap carries a point recorded on it, and no event is queried (the region
/// unbacks them once the stream passes). The same layout over an inline region waits.
#[test]
fn background_moves_take_a_streams_pages_with_a_point_to_wait_for() {
    let clock = Arc::new(FakeClock::default());
    let region = FakePagedRegion::new(PAGE, 16, 5).background();
    let pool = FixedPool::new(region, clock.clone()).unwrap();
    let a = pool.alloc(2 * PAGE, S0).unwrap();
    let b = pool.alloc(PAGE, S0).unwrap();
    let c = pool.alloc(2 * PAGE, S0).unwrap();
    drop(a);
    drop(c);
    let d = pool
        .alloc(4 * PAGE, S0)
        .expect("pages move without waiting for S0");
    assert_eq!(clock.queries(), 0, "no event queried");
    let afters = std::mem::take(&mut *pool.region().afters.lock().unwrap());
    assert!(!afters.is_empty());
    assert!(
        afters.iter().all(|a| a.len() == 1 && a[0].0 == S0),
        "every unmap waits for S0: {afters:?}"
    );
    assert!(pool.region().covers(d.offset(), d.size()));
    assert!(pool.region().covers(b.offset(), b.size()));
    assert_eq!(pool.region().backed_pages(), 5);
    let s = pool.stats();
    assert_eq!(
        (s.committed, s.free_bytes, s.pending_bytes),
        (5 * PAGE, 0, 0)
    );
}

/// Spans kept for different streams do not merge, so a whole page may lie across several of
/// them: in background mode such a run gives its page, with a point on each of its streams.
#[test]
fn background_moves_take_a_page_split_between_two_streams_spans() {
    let clock = Arc::new(FakeClock::default());
    let region = FakePagedRegion::new(PAGE, 16, 4).background();
    let pool = FixedPool::new(region, clock.clone()).unwrap();
    let a = pool.alloc(2 * U, S1).unwrap();
    let b = pool.alloc(2 * U, S2).unwrap();
    let c = pool.alloc(3 * PAGE, S0).unwrap();
    assert_eq!((a.offset(), b.offset(), c.offset()), (0, 2 * U, PAGE));
    assert_eq!(pool.region().backed_pages(), 4);
    drop((a, b));
    pool.region().afters.lock().unwrap().clear();
    // No physical page left; page 0 is two free halves, one kept for S1, one for S2.
    let d = pool
        .alloc(PAGE, S0)
        .expect("page 0 moves under the new block");
    assert!(pool.region().covers(d.offset(), d.size()));
    let afters = std::mem::take(&mut *pool.region().afters.lock().unwrap());
    assert_eq!(afters.len(), 1, "{afters:?}");
    let mut streams: Vec<StreamId> = afters[0].iter().map(|p| p.0).collect();
    streams.sort();
    assert_eq!(streams, vec![S1, S2]);
    assert_eq!(clock.queries(), 0);
    let s = pool.stats();
    assert_eq!(
        (s.committed, s.free_bytes, s.pending_bytes),
        (4 * PAGE, 0, 0)
    );
    drop((c, d));
}

/// The layout of the test above with a clock that orders streams after each other's points:
/// the run of S1's and S2's halves of page 0 is handed to S0 in place, S0 ordered on the
/// device after a point on each, and no page moves (over a clock that cannot order, the page
/// moves, as above).
#[test]
fn background_moves_hand_a_run_of_other_streams_spans_over_in_place() {
    let clock = Arc::new(FakeClock::ordering());
    let region = FakePagedRegion::new(PAGE, 16, 4).background();
    let pool = FixedPool::new(region, clock.clone()).unwrap();
    let a = pool.alloc(2 * U, S1).unwrap();
    let b = pool.alloc(2 * U, S2).unwrap();
    let c = pool.alloc(3 * PAGE, S0).unwrap();
    drop((a, b));
    let maps = pool.region().maps.load(Ordering::SeqCst);
    pool.region().afters.lock().unwrap().clear();
    let d = pool.alloc(PAGE, S0).expect("page 0 changes hands");
    assert_eq!(d.offset(), 0);
    assert_eq!(
        pool.region().maps.load(Ordering::SeqCst),
        maps,
        "no page moved"
    );
    assert!(pool.region().afters.lock().unwrap().is_empty());
    let orders: Vec<(StreamId, StreamId)> = clock.orders().iter().map(|o| (o.0, o.1)).collect();
    assert_eq!(orders, vec![(S0, S1), (S0, S2)]);
    assert_eq!((clock.records(), clock.queries()), (2, 0));
    let s = pool.stats();
    assert_eq!((s.adoptions, s.pending_bytes, s.free_bytes), (1, 0, 0));
    drop((c, d));
}

/// With every physical page in use, a span freed on a busy stream (S1) is handed to S2 in place
/// (S2 ordered after a point recorded on S1; nothing queried, no page moved), and a span still
/// pending on a declared use (S3) is handed over behind the point already recorded for it.
#[test]
fn background_moves_hand_free_and_pending_spans_to_another_stream() {
    let clock = Arc::new(FakeClock::ordering());
    let region = FakePagedRegion::new(PAGE, 16, 3).background();
    let pool = FixedPool::new(region, clock.clone()).unwrap();
    let x = pool.alloc(2 * PAGE, S1).unwrap();
    let k = pool.alloc(PAGE, S2).unwrap();
    let x_off = x.offset();
    drop(x);
    let maps = pool.region().maps.load(Ordering::SeqCst);
    let mut z = pool.alloc(2 * PAGE, S2).expect("S1's span changes hands");
    assert_eq!(z.offset(), x_off);
    let e1 = EventId(1);
    assert_eq!(clock.orders(), vec![(S2, S1, e1)]);
    assert_eq!((clock.records(), clock.queries()), (1, 0));
    // Now pending: declared used on S3, freed on S2.
    z.record_use(S3).unwrap();
    drop(z);
    assert_eq!(pool.stats().pending_bytes, 2 * PAGE);
    let records = clock.records();
    let w = pool
        .alloc(2 * PAGE, S1)
        .expect("the pending span changes hands");
    assert_eq!(w.offset(), x_off);
    assert_eq!(
        clock.records(),
        records,
        "its point was recorded at the free"
    );
    let last = clock.orders().into_iter().find(|o| o.0 == S1).unwrap();
    assert_eq!((last.0, last.1), (S1, S3));
    // One query: the pool first looked whether S3 had passed (it had not).
    assert_eq!(clock.queries(), 1);
    assert_eq!(
        pool.region().maps.load(Ordering::SeqCst),
        maps,
        "no page moved"
    );
    let s = pool.stats();
    assert_eq!((s.adoptions, s.pending_bytes), (2, 0));
    drop((k, w));
}

/// A background pool whose clock orders streams promotes no stream's spans, even when the
/// stream is not held behind a move: a promoted span would stay pending until its point passes,
/// while taking its pages (unbacked after that point) serves at once. With a clock that cannot
/// order streams the pool still promotes.
#[test]
fn background_moves_with_an_ordering_clock_take_pages_instead_of_promoting() {
    for ordering in [true, false] {
        let clock = Arc::new(if ordering {
            FakeClock::ordering()
        } else {
            FakeClock::default()
        });
        let region = FakePagedRegion::new(PAGE, 16, 4)
            .background()
            .held_until_settled();
        let pool = FixedPool::new(region, clock.clone()).unwrap();
        // a, k, b, m: one page each, every physical page in use; a and b (S1) are not adjacent.
        let a = pool.alloc(PAGE, S1).unwrap();
        let k = pool.alloc(PAGE, S2).unwrap();
        let b = pool.alloc(PAGE, S1).unwrap();
        let m = pool.alloc(PAGE, S2).unwrap();
        assert_eq!(b.offset() - a.offset(), 2 * PAGE);
        drop((a, b));
        pool.region().settle().unwrap();
        assert!(!pool.region().stream_waits_on_moves(S1), "S1 is not held");
        let got = pool.alloc(2 * PAGE, S2);
        let s = pool.stats();
        if ordering {
            let z = got.expect("S1's pages, unbacked after its point, back S2's block");
            assert_eq!(
                (clock.queries(), s.pending_bytes, s.adoptions),
                (0, 0, 0),
                "no span promoted, none handed over (none fits alone)"
            );
            let afters = pool.region().afters.lock().unwrap().clone();
            assert!(
                afters.iter().any(|a| a.iter().any(|&(st, _)| st == S1)),
                "S1's pages are unbacked only after its point: {afters:?}"
            );
            drop(z);
        } else {
            // Promoted: both spans wait for S1's point, which has not passed.
            assert!(s.pending_bytes >= 2 * PAGE, "{s:?}");
            assert!(clock.queries() > 0);
            drop(got);
        }
        drop((k, m));
    }
}

/// A background pool whose clock orders streams places a block over a free span kept for
/// another stream and the unbacked range after it, the allocating stream ordered after a point
/// on the other stream: one page maps instead of two (mapping both and unbacking the span's).
/// With a clock that cannot order streams the span only gives its page.
#[test]
fn background_moves_place_a_block_over_another_streams_span() {
    for ordering in [true, false] {
        let clock = Arc::new(if ordering {
            FakeClock::ordering()
        } else {
            FakeClock::default()
        });
        let region = FakePagedRegion::new(PAGE, 16, 3)
            .background()
            .held_until_settled();
        let pool = FixedPool::new(region, clock.clone()).unwrap();
        // k (S2) on page 0, a (S1) on page 1; pages 2.. unbacked, one physical page left.
        let k = pool.alloc(PAGE, S2).unwrap();
        let a = pool.alloc(PAGE, S1).unwrap();
        let a_off = a.offset();
        assert_eq!(a_off, PAGE);
        drop(a);
        pool.region().settle().unwrap();
        let maps = pool.region().maps.load(Ordering::SeqCst);
        let unmaps = pool.region().unmaps.load(Ordering::SeqCst);
        let got = pool.alloc(2 * PAGE, S2);
        let (mapped, unmapped) = (
            pool.region().maps.load(Ordering::SeqCst) - maps,
            pool.region().unmaps.load(Ordering::SeqCst) - unmaps,
        );
        if ordering {
            let z = got.expect("S1's span and one more page for S2");
            assert_eq!(z.offset(), a_off, "the block starts on S1's span");
            assert_eq!((mapped, unmapped), (1, 0), "one page maps, none unbacked");
            let orders = clock.orders();
            assert!(
                orders.iter().any(|&(w, s, _)| w == S2 && s == S1),
                "S2 ordered after S1's point: {orders:?}"
            );
            drop(z);
        } else {
            // Promoted instead: the span waits for S1's point, which has not passed.
            let e = got.expect_err("S1's span is pending");
            assert!(e.to_string().contains(&format!("pending {PAGE} B")), "{e}");
            assert_eq!((mapped, unmapped), (0, 0));
        }
        drop(k);
    }
}

/// Two streams alternating on a span too large for each to keep one (the two-stream pair): once
/// the span has crossed between them [`CLOSE_CROSSINGS`] times in a row, the pool maps reserve
/// pages for the receiving stream, and the crossings (each recording an event) stop. Before, a
/// background pool with an ordering clock handed the span over on every allocation (an event
/// and a device-side wait each), one without moved its pages every allocation, and an inline
/// pool promoted it (an event recorded and queried each).
#[test]
fn streams_alternating_on_one_span_get_pages_of_their_own() {
    for (background, ordering) in [(true, true), (true, false), (false, false)] {
        let clock = Arc::new(if ordering {
            FakeClock::ordering()
        } else {
            FakeClock::idle()
        });
        let region = FakePagedRegion::new(PAGE, 16, 8);
        let region = if background {
            region.background()
        } else {
            region
        };
        let pool = FixedPool::new(region, clock.clone()).unwrap();
        let steps = 400;
        for i in 0..steps {
            let s = if i % 2 == 0 { S1 } else { S2 };
            let b = pool
                .alloc(2 * PAGE + U, s)
                .unwrap_or_else(|e| panic!("step {i}: {e}"));
            drop(b);
        }
        let st = pool.stats();
        let shape = format!("background {background}, ordering clock {ordering}");
        let crossings = clock.records();
        // Up to CLOSE_CROSSINGS crossings before the pool grows, an event or two each.
        assert!(
            crossings <= 2 * (CLOSE_CROSSINGS as usize + 2) && crossings <= steps / 10,
            "{shape}: {crossings} events recorded in {steps} steps"
        );
        assert!(
            st.committed <= 6 * PAGE,
            "{shape}: {} B backed, more than three pages a stream",
            st.committed
        );
        assert!(st.remaps <= 12, "{shape}: {} page moves", st.remaps);
    }
}

/// Stream-alternating work over a background region: a span kept for a stream held behind a
/// move is promoted after a short wait for the mover, instead of giving its pages, so the
/// other stream reuses it and no page moves again.
#[test]
fn background_moves_wait_briefly_for_the_mover_before_moving_more_pages() {
    let region = FakePagedRegion::new(PAGE, 16, 8)
        .background()
        .held_until_settled();
    let pool = FixedPool::new(region, Arc::new(SyncClock)).unwrap();
    let a = pool.alloc(3 * PAGE, S0).unwrap(); // three pages mapped, still moving
    let off = a.offset();
    drop(a);
    assert!(pool.region().stream_waits_on_moves(S0));
    let maps = pool.region().maps.load(Ordering::SeqCst);
    let b = pool
        .alloc(3 * PAGE, S1)
        .expect("S0's span, once the mover is done");
    assert_eq!(b.offset(), off, "the span kept for S0, promoted");
    assert_eq!(
        pool.region().maps.load(Ordering::SeqCst),
        maps,
        "no page moved"
    );
    assert!(pool.region().afters.lock().unwrap().is_empty());
    assert_eq!(pool.region().settles.load(Ordering::SeqCst), 1);
}

/// A region that can no longer move pages fails the allocation, and the span goes back.
#[test]
fn failed_move_ordering_fails_the_allocation_and_returns_the_span() {
    let pool = paged_pool(16, 8, Arc::new(SyncClock));
    let keep = pool.alloc(PAGE, S0).unwrap();
    pool.region().fail_orders.store(true, Ordering::SeqCst);
    match pool.alloc(2 * PAGE, S0) {
        Err(Error::OutOfMemory(m)) => assert!(m.contains("mover"), "{m}"),
        other => panic!("expected the mover's error, got {other:?}"),
    }
    let s = pool.stats();
    assert_eq!((s.in_use, s.blocks), (PAGE, 1));
    pool.region().fail_orders.store(false, Ordering::SeqCst);
    let b = pool.alloc(2 * PAGE, S0).unwrap();
    assert_eq!(b.offset(), PAGE);
    drop((keep, b));
    assert_eq!(pool.stats().in_use, 0);
}

/// Free pages move to where a block fits, but only once no stream can still touch them; a
/// block freed on its stream is reusable there at once, yet unbacked only after that stream
/// passes a point recorded when the pages are wanted.
#[test]
fn paged_pool_moves_free_pages_only_after_their_stream_passes() {
    let clock = Arc::new(FakeClock::default());
    let pool = paged_pool(16, 5, clock.clone());
    let a = pool.alloc(2 * PAGE, S0).unwrap();
    let b = pool.alloc(PAGE, S0).unwrap();
    let c = pool.alloc(2 * PAGE, S0).unwrap();
    assert_eq!(pool.stats().committed, 5 * PAGE);
    drop(a);
    drop(c);
    // Two free 2-page spans around `b`, no page in reserve: 4 pages fit only by moving them.
    match pool.alloc(4 * PAGE, S0) {
        Err(Error::OutOfMemory(m)) => assert!(m.contains("pool exhausted"), "{m}"),
        other => panic!("expected out of memory while S0 may use the pages, got {other:?}"),
    }
    assert_eq!(pool.region().unmaps.load(Ordering::SeqCst), 0);
    // That attempt recorded a point on S0; once S0 passes it the pages move.
    clock.complete(S0);
    let d = pool.alloc(4 * PAGE, S0).unwrap();
    assert!(pool.region().covers(d.offset(), d.size()));
    assert!(pool.region().covers(b.offset(), b.size()));
    let s = pool.stats();
    assert_eq!(
        (s.committed, s.footprint, s.free_bytes),
        (5 * PAGE, 5 * PAGE, 0)
    );
    assert_eq!(pool.region().backed_pages(), 5);
    assert!(pool.region().unmaps.load(Ordering::SeqCst) >= 1);
}

/// During capture no event is recorded or queried: only any-stream spans and the reserve serve.
#[test]
fn paged_pool_takes_only_the_reserve_during_capture() {
    let clock = Arc::new(FakeClock::default());
    let pool = paged_pool(16, 7, clock.clone());
    let a = pool.alloc(2 * PAGE, S0).unwrap();
    let _b = pool.alloc(PAGE, S0).unwrap();
    drop(a);
    clock.capture.store(true, Ordering::SeqCst);
    let records = clock.records();
    let c = pool.alloc(3 * PAGE, S0).unwrap(); // 3 of the 4 reserve pages
    assert!(pool.region().covers(c.offset(), c.size()));
    assert!(pool.alloc(3 * PAGE, S0).is_err()); // would need S0's two free pages
    assert_eq!(clock.records(), records);
    clock.capture.store(false, Ordering::SeqCst);
    assert!(pool.alloc(3 * PAGE, S0).is_err()); // records a point on S0, not yet passed
    clock.complete(S0);
    let d = pool.alloc(3 * PAGE, S0).unwrap();
    assert!(pool.region().covers(d.offset(), d.size()));
}

#[test]
fn paged_pool_needs_stream_safety() {
    let opts = PoolOptions {
        stream_safe: false,
        ..PoolOptions::default()
    };
    let region = FakePagedRegion::new(PAGE, 4, 4);
    match FixedPool::with_options(region, Arc::new(SyncClock), opts) {
        Err(Error::BadInput(m)) => assert!(m.contains("stream tracking"), "{m}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Random sizes on a paged pool: blocks never overlap and are always backed; backed bytes are
/// exactly those of live, free and pending spans; an allocation fails only when the pages no
/// live block touches cannot hold it.
#[test]
fn randomized_paged_pool_keeps_pages_consistent() {
    for small in [None, Some(3 * U)] {
        const PAGES: usize = 64;
        const PHYS: usize = 24;
        let opts = PoolOptions {
            small_from_top: small,
            ..PoolOptions::default()
        };
        let region = FakePagedRegion::new(PAGE, PAGES, PHYS);
        let pool = FixedPool::with_options(region, Arc::new(SyncClock), opts).unwrap();
        let mut used = vec![false; PAGES * 4];
        let mut live: Vec<Block<FakePagedRegion>> = Vec::new();
        let mut x = 0x005e_edf0_a6e5_u64;
        let (mut allocs, mut ooms) = (0, 0);
        for _ in 0..20_000 {
            x = xorshift(x);
            if !live.is_empty() && (x % 100) < 48 {
                let b = live.swap_remove((x >> 8) as usize % live.len());
                let (o, n) = (b.offset() / U, b.size() / U);
                used[o..o + n].iter_mut().for_each(|u| *u = false);
            } else {
                let size = if x.is_multiple_of(5) {
                    1 + (x >> 16) as usize % (6 * PAGE)
                } else {
                    1 + (x >> 16) as usize % (2 * U)
                };
                let units = size.div_ceil(U);
                let touched: usize = (0..PAGES)
                    .filter(|p| used[p * 4..p * 4 + 4].iter().any(|u| *u))
                    .count();
                match pool.alloc(size, S0) {
                    Ok(b) => {
                        let o = b.offset() / U;
                        for u in &mut used[o..o + units] {
                            assert!(!*u, "overlap");
                            *u = true;
                        }
                        assert!(pool.region().covers(b.offset(), b.size()), "unbacked block");
                        live.push(b);
                        allocs += 1;
                    }
                    Err(Error::OutOfMemory(_)) => {
                        assert!(
                            PHYS - touched < units.div_ceil(4) + 1,
                            "failed with {} untouched pages for {units} units",
                            PHYS - touched
                        );
                        ooms += 1;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            let s = pool.stats();
            let backed = pool.region().backed_pages();
            assert!(backed <= PHYS);
            assert_eq!(s.committed, backed * PAGE);
            assert_eq!(s.in_use + s.free_bytes + s.pending_bytes, s.committed);
            assert_eq!((s.pages_mapped - s.pages_unmapped) as usize, backed);
            assert!(s.footprint >= s.committed);
        }
        let s = pool.stats();
        assert!(
            allocs > 5000 && ooms > 20 && s.remaps > 100,
            "allocs {allocs}, ooms {ooms}, remaps {}",
            s.remaps
        );
    }
}

/// The same pool over real host memory whose pages move (memfd + mmap): every live block keeps
/// its bytes while free pages are unbacked and backed elsewhere around it.
#[test]
fn host_paged_region_keeps_live_data_while_pages_move() {
    let page = 64 << 10;
    let region = HostPagedRegion::new(48 * page, 12 * page, page).unwrap();
    assert_eq!(
        (region.page_size(), region.physical_pages()),
        (Some(page), 12)
    );
    let pool =
        FixedPool::with_options(region, Arc::new(SyncClock), PoolOptions::serving()).unwrap();
    let base = pool.region().as_mut_ptr();
    let mut live: Vec<(Block<HostPagedRegion>, u8)> = Vec::new();
    let mut x = 0x00c0_ffee_u64;
    let check = |b: &Block<HostPagedRegion>, v: u8| {
        // SAFETY: the block is live and backed; nothing else writes it.
        let bytes = unsafe { std::slice::from_raw_parts(base.add(b.offset()), b.requested()) };
        assert!(
            bytes.iter().all(|&y| y == v),
            "block at {} lost its bytes",
            b.offset()
        );
    };
    for step in 0..8000u32 {
        x = xorshift(x);
        if !live.is_empty() && x % 100 < 50 {
            let (b, v) = live.swap_remove((x >> 8) as usize % live.len());
            check(&b, v);
        } else {
            let size = 1 + (x >> 16) as usize % (3 * page);
            if let Ok(b) = pool.alloc(size, S0) {
                let v = (step % 251) as u8 + 1;
                // SAFETY: a fresh, backed block of `size` bytes.
                unsafe { std::ptr::write_bytes(base.add(b.offset()), v, size) };
                live.push((b, v));
            }
        }
    }
    for (b, v) in &live {
        check(b, *v);
    }
    // Each remap backs at least one page: far more remaps than physical pages means pages
    // were unbacked and backed again elsewhere.
    let s = pool.stats();
    assert!(s.remaps > 36, "remaps {}", s.remaps);
    assert_eq!(s.committed, pool.region().mapped_pages() * page);
}

/// A paged pool whose physical pages are exactly the footprint of a run (the most pages it
/// ever had backed) repeats that run block for block, on two streams: the pool's choices do
/// not depend on how large its unused reserve is, so the footprint is a size that serves.
#[test]
fn paged_pool_sized_at_its_footprint_repeats_the_run() {
    const PAGE: usize = 64 << 10;
    const STEPS: usize = 100_000;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let draws: Vec<(usize, usize)> = (0..STEPS + 64)
        .map(|_| {
            x = xorshift(x);
            let u = (x % 1_000_000) as f64 / 1e6;
            ((256.0 * 8192f64.powf(u)) as usize, (x >> 40) as usize % 64)
        })
        .collect();
    let run = |physical: usize| -> (Vec<usize>, PoolStats, usize) {
        let region = FakePagedRegion::new(PAGE, 4096, physical);
        let pool =
            FixedPool::with_options(region, Arc::new(SyncClock), PoolOptions::serving()).unwrap();
        let mut live: Vec<Option<(Block<FakePagedRegion>, usize)>> = Vec::new();
        let (mut bytes, mut peak) = (0, 0);
        let mut offsets = Vec::with_capacity(STEPS);
        for (i, &(size, victim)) in draws.iter().enumerate() {
            let slot = if i < 64 { i } else { victim };
            if slot < live.len() {
                if let Some((_, s)) = live[slot].take() {
                    bytes -= s;
                }
            }
            let stream = StreamId((i % 2) as u64);
            let b = match pool.alloc(size, stream) {
                Ok(b) => b,
                Err(e) => panic!("step {i} with {physical} physical pages: {e}"),
            };
            offsets.push(b.offset());
            bytes += size;
            peak = peak.max(bytes);
            if slot < live.len() {
                live[slot] = Some((b, size));
            } else {
                live.push(Some((b, size)));
            }
        }
        (offsets, pool.stats(), peak)
    };
    let (first, stats, peak_live) = run(4096);
    let pages = stats.footprint / PAGE;
    let (again, tight, _) = run(pages);
    println!(
        "footprint {pages} pages, {:.3} of peak live; {} page moves",
        stats.footprint as f64 / peak_live as f64,
        stats.remaps
    );
    assert!(
        stats.remaps > 100,
        "the run moved pages {} times",
        stats.remaps
    );
    assert_eq!(first, again, "the tight pool placed blocks differently");
    assert_eq!(tight.footprint, stats.footprint);
}

/// With `reserve_first`, a block that fits nowhere backed takes unused reserve pages before
/// any free page moves; without it, free pages move as soon as the footprint so far is used.
#[test]
fn reserve_first_backs_from_the_reserve_before_moving_pages() {
    for reserve_first in [false, true] {
        let opts = PoolOptions {
            reserve_first,
            ..PoolOptions::default()
        };
        let region = FakePagedRegion::new(PAGE, 32, 8);
        let pool = FixedPool::with_options(region, Arc::new(SyncClock), opts).unwrap();
        let a = pool.alloc(2 * PAGE, S0).unwrap();
        let _b = pool.alloc(PAGE, S0).unwrap();
        drop(a);
        // 3 backed pages (2 free), 5 in reserve: a 2-page block fits in a's span; a 3-page
        // one needs new backing.
        let c = pool.alloc(3 * PAGE, S0).unwrap();
        assert!(pool.region().covers(c.offset(), c.size()));
        let s = pool.stats();
        if reserve_first {
            assert_eq!((s.pages_unmapped, s.committed), (0, 6 * PAGE));
        } else {
            assert_eq!((s.pages_unmapped, s.committed), (2, 4 * PAGE));
        }
        assert_eq!(s.footprint, s.committed);
    }
}
