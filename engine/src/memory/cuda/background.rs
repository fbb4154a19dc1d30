//! A paged device region whose page moves run on a thread of their own, ordered on the streams
//! like cudaMallocAsync's allocations: the pool's calls return at once, and a stream that gets a
//! block whose pages are still moving waits for them on the device (`cuStreamWaitValue64` on a
//! pinned counter the mover thread advances), not on the host.
//!
//! Why: a page move costs the driver tens of microseconds a handle (cuMemSetAccess,
//! cuMemUnmap; docs/benchmarks.md, ninth and thirteenth sessions), which the allocating thread
//! paid inline. Here that thread only does the bookkeeping.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use cudarc::driver::{sys, CudaContext, CudaEvent};

use super::{cuda_err, CudaClock, DevicePagedRegion};
use crate::error::{Error, Result};
use crate::memory::clock::{EventId, StreamClock, StreamId};
use crate::memory::region::Region;

/// How often the mover looks at a stream it waits for before unbacking pages.
const STREAM_POLL: std::time::Duration = std::time::Duration::from_micros(20);

/// Most page moves queued before the pool's calls wait for the mover (bounds the queue).
const MAX_QUEUED: usize = 4096;

/// One page move the pool asked for: map or unmap `count` pages from `first`, an unmap only
/// once the events in `after` (recorded on the streams that last used the pages) complete.
struct Move {
    first: usize,
    count: usize,
    map: bool,
    ticket: u64,
    after: Afters,
}

/// Events one unmap waits for, one per stream whose spans gave its pages.
const AFTER_INLINE: usize = 4;

/// The events of one move: up to [`AFTER_INLINE`] held inline, so queuing a move allocates
/// nothing on the host; more streams than that (rare) spill into a list.
#[derive(Default)]
struct Afters {
    inline: [Option<CudaEvent>; AFTER_INLINE],
    more: Vec<CudaEvent>,
}

impl Afters {
    fn push(&mut self, event: CudaEvent) {
        match self.inline.iter_mut().find(|e| e.is_none()) {
            Some(slot) => *slot = Some(event),
            None => self.more.push(event),
        }
    }

    fn iter(&self) -> impl Iterator<Item = &CudaEvent> {
        self.inline.iter().flatten().chain(&self.more)
    }

    /// Moves every event into `spare`.
    fn drain_into(&mut self, spare: &mut Vec<CudaEvent>) {
        spare.extend(self.inline.iter_mut().filter_map(Option::take));
        spare.append(&mut self.more);
    }
}

/// What the pool's thread and the mover share behind one lock.
#[derive(Default)]
struct Queue {
    moves: VecDeque<Move>,
    /// Tests hold moves back to show that streams wait for them.
    paused: bool,
    shutdown: bool,
    /// The first driver failure; later calls fail with it.
    failed: Option<String>,
    /// The mover is parked on `Shared::work`: only then does queuing a move wake it. The
    /// condition variables' notify is a futex system call whether or not anyone waits (on
    /// gVisor hosts, microseconds), and the pool's thread queues moves while the mover works.
    mover_parked: bool,
    /// Threads parked on `Shared::done_cv`: the mover signals a finished move only to them.
    done_waiters: usize,
}

/// A word of pinned host memory the device can read: the last ticket the mover finished.
struct PinnedCounter {
    host: *mut u64,
    device: sys::CUdeviceptr,
}

// SAFETY: the pointer is a pinned allocation owned by this value, written only through
// atomic stores by the mover and read by the device.
unsafe impl Send for PinnedCounter {}
// SAFETY: as above.
unsafe impl Sync for PinnedCounter {}

impl PinnedCounter {
    fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        ctx.bind_to_thread()
            .map_err(|e| cuda_err("cannot bind the CUDA context", e))?;
        let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: allocates 8 bytes of pinned memory, freed exactly once (below or in Drop).
        unsafe { sys::cuMemHostAlloc(&mut host, 8, flags) }
            .result()
            .map_err(|e| cuda_err("cuMemHostAlloc of the page-move counter failed", e))?;
        let mut device: sys::CUdeviceptr = 0;
        // SAFETY: `host` is a live mapped pinned allocation.
        let mapped = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host, 0) }.result();
        if let Err(e) = mapped {
            // SAFETY: allocated above and not yet owned by anything.
            let _ = unsafe { sys::cuMemFreeHost(host) };
            return Err(cuda_err(
                "cannot map the page-move counter for the device",
                e,
            ));
        }
        let counter = PinnedCounter {
            host: host.cast(),
            device,
        };
        counter.store(0);
        Ok(counter)
    }

    fn store(&self, v: u64) {
        // SAFETY: `host` is 8 aligned bytes of pinned memory owned by this value.
        unsafe { &*(self.host as *const AtomicU64) }.store(v, Ordering::Release);
    }
}

impl Drop for PinnedCounter {
    fn drop(&mut self) {
        // SAFETY: allocated in `new`, freed only here.
        let _ = unsafe { sys::cuMemFreeHost(self.host.cast()) };
    }
}

/// What the mover thread and the region's owner share.
struct Shared {
    ctx: Arc<CudaContext>,
    /// Events the mover has waited for, for later unmaps to record again.
    spare_events: Mutex<Vec<CudaEvent>>,
    region: DevicePagedRegion,
    queue: Mutex<Queue>,
    /// Signals the mover (work, resume, shutdown).
    work: Condvar,
    /// Signals waiters (a move done, room in the queue).
    done_cv: Condvar,
    /// Last ticket finished (also in `counter`, for the device).
    done: AtomicU64,
    /// Tickets issued so far (under the region's `logical` lock; read without it on the
    /// allocation's fast path).
    issued: AtomicU64,
    counter: PinnedCounter,
    /// Nanoseconds the mover spent in driver calls.
    busy_ns: AtomicU64,
    /// Set once `Queue::failed` is, so the pool's calls check it without the lock.
    broken: AtomicBool,
}

/// Which region pages the pool has backed (what it asked for, done or not) and the ticket of
/// the move that last mapped each one.
struct Logical {
    backed: Vec<bool>,
    free: usize,
    ready: Vec<u64>,
}

/// A [`DevicePagedRegion`] whose page moves run on a mover thread and are ordered on the
/// streams: `map_pages`/`unmap_pages` queue the move and return, and
/// [`Region::order_after_moves`] makes a stream wait on the device for the moves behind a
/// block. Streams are found through the pool's [`CudaClock`]; a stream it does not know waits
/// on the host instead.
pub struct BackgroundPagedRegion {
    shared: Arc<Shared>,
    clock: Arc<CudaClock>,
    /// Per stream, the highest ticket a wait already enqueued on it covers: later work on
    /// that stream is ordered after every move up to it, so it needs no second wait (outside
    /// graph capture, where a wait lands in the graph instead).
    ordered: Mutex<Vec<(StreamId, u64)>>,
    /// Device-side waits enqueued so far.
    waits: AtomicU64,
    logical: Mutex<Logical>,
    mover: Option<std::thread::JoinHandle<()>>,
}

/// Holds the mover back while it lives (see [`BackgroundPagedRegion::pause_moves`]).
pub struct MovesPaused<'a>(&'a BackgroundPagedRegion);

impl Drop for MovesPaused<'_> {
    fn drop(&mut self) {
        let mut q = self.0.shared.lock();
        q.paused = false;
        self.0.shared.work.notify_all();
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The mover: runs queued moves in order, advancing `done` and the device's counter.
    fn run(&self) {
        if let Err(e) = self.ctx.bind_to_thread() {
            let mut q = self.lock();
            q.failed = Some(format!("page mover cannot bind the CUDA context: {e}"));
            self.broken.store(true, Ordering::Release);
        }
        let mut q = self.lock();
        loop {
            if q.shutdown {
                return;
            }
            let next = if q.paused { None } else { q.moves.pop_front() };
            let Some(m) = next else {
                q.mover_parked = true;
                q = self.work.wait(q).unwrap_or_else(|e| e.into_inner());
                q.mover_parked = false;
                continue;
            };
            let broken = q.failed.is_some();
            drop(q);
            // Pages freed on a stream are unbacked once it has passed the event recorded when
            // they were taken (its earlier waits on this mover are for earlier moves, all
            // done). The mover takes no lock another thread may hold while blocked on a stream.
            for ev in m.after.iter().filter(|_| !broken) {
                loop {
                    match ev.try_is_complete() {
                        Ok(true) => break,
                        Ok(false) => std::thread::sleep(STREAM_POLL),
                        // A failed query: wait for the event outright.
                        Err(_) => {
                            let _ = ev.synchronize();
                            break;
                        }
                    }
                }
            }
            let mut after = m.after;
            after.drain_into(&mut self.spare_events.lock().unwrap_or_else(|e| e.into_inner()));
            let t = Instant::now();
            let r = if broken {
                Ok(())
            } else if m.map {
                self.region.map_pages(m.first, m.count)
            } else {
                self.region.unmap_pages(m.first, m.count)
            };
            self.busy_ns
                .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            q = self.lock();
            if let Err(e) = r {
                q.failed
                    .get_or_insert_with(|| format!("background page move failed: {e}"));
                self.broken.store(true, Ordering::Release);
            }
            // Even after a failure the counter advances, so no stream waits forever; the
            // region then refuses every later call.
            self.done.store(m.ticket, Ordering::Release);
            self.counter.store(m.ticket);
            if q.done_waiters > 0 {
                self.done_cv.notify_all();
            }
        }
    }
}

impl BackgroundPagedRegion {
    /// Moves `region`'s pages on a thread of its own; `clock` maps the pool's streams to CUDA
    /// streams (give the pool the same clock).
    pub fn new(region: DevicePagedRegion, clock: Arc<CudaClock>) -> Result<Self> {
        let ctx = Arc::clone(&region.ctx);
        let counter = PinnedCounter::new(&ctx)?;
        let (pages, physical) = (region.len() / region.page, region.physical_pages());
        let shared = Arc::new(Shared {
            ctx,
            spare_events: Mutex::new(Vec::new()),
            region,
            // The queue never holds more than MAX_QUEUED moves: reserved now, so queuing one
            // never allocates.
            queue: Mutex::new(Queue {
                moves: VecDeque::with_capacity(MAX_QUEUED),
                ..Queue::default()
            }),
            work: Condvar::new(),
            done_cv: Condvar::new(),
            done: AtomicU64::new(0),
            issued: AtomicU64::new(0),
            counter,
            busy_ns: AtomicU64::new(0),
            broken: AtomicBool::new(false),
        });
        let s = Arc::clone(&shared);
        let mover = std::thread::Builder::new()
            .name("vigil-page-mover".into())
            .spawn(move || s.run())
            .map_err(|e| Error::OutOfMemory(format!("cannot start the page mover: {e}")))?;
        Ok(BackgroundPagedRegion {
            shared,
            clock,
            ordered: Mutex::new(Vec::new()),
            waits: AtomicU64::new(0),
            logical: Mutex::new(Logical {
                backed: vec![false; pages],
                free: physical,
                ready: vec![0; pages],
            }),
            mover: Some(mover),
        })
    }

    /// The region whose pages move (its page table shows the moves done so far).
    pub fn inner(&self) -> &DevicePagedRegion {
        &self.shared.region
    }

    /// Holds page moves back until the returned guard drops (tests: a stream given a block
    /// whose pages are still to move must wait for them).
    pub fn pause_moves(&self) -> MovesPaused<'_> {
        self.shared.lock().paused = true;
        MovesPaused(self)
    }

    /// Page moves queued and not yet done.
    pub fn pending_moves(&self) -> u64 {
        self.shared.issued.load(Ordering::Acquire) - self.shared.done.load(Ordering::Acquire)
    }

    /// Device-side waits enqueued on streams so far (one per stream per newer move at most).
    pub fn stream_waits(&self) -> u64 {
        self.waits.load(Ordering::Relaxed)
    }

    /// Time the mover thread has spent in driver calls so far, in nanoseconds (the work taken
    /// off the allocating thread).
    pub fn mover_busy_ns(&self) -> u64 {
        self.shared.busy_ns.load(Ordering::Relaxed)
    }

    fn failed(q: &Queue) -> Result<()> {
        match &q.failed {
            Some(e) => Err(Error::OutOfMemory(e.clone())),
            None => Ok(()),
        }
    }

    /// Queues a move of `first..first + count`, checked against what the pool has asked so far.
    fn queue(&self, first: usize, count: usize, map: bool, after: Afters) -> Result<()> {
        let mut l = self.logical.lock().unwrap_or_else(|e| e.into_inner());
        let end = match first.checked_add(count) {
            Some(end) if end <= l.backed.len() => end,
            _ => {
                return Err(Error::OutOfMemory(format!(
                    "pages {first}..{first}+{count} lie outside the region's {} pages",
                    l.backed.len()
                )))
            }
        };
        if let Some(i) = (first..end).find(|&i| l.backed[i] == map) {
            let what = if map { "already mapped" } else { "not mapped" };
            return Err(Error::OutOfMemory(format!(
                "cannot move pages {first}..{end}: page {i} is {what}"
            )));
        }
        if map && l.free < count {
            return Err(Error::OutOfMemory(format!(
                "cannot map {count} pages: {} of {} physical pages are free",
                l.free,
                self.physical_pages()
            )));
        }
        if count == 0 {
            return Ok(());
        }
        let mut q = self.shared.lock();
        Self::failed(&q)?;
        while q.moves.len() >= MAX_QUEUED && q.failed.is_none() {
            q.done_waiters += 1;
            q = self
                .shared
                .done_cv
                .wait(q)
                .unwrap_or_else(|e| e.into_inner());
            q.done_waiters -= 1;
        }
        Self::failed(&q)?;
        // Tickets are issued under `logical`, so this read-then-store cannot race.
        let ticket = self.shared.issued.load(Ordering::Relaxed) + 1;
        for i in first..end {
            l.backed[i] = map;
            if map {
                l.ready[i] = ticket;
            }
        }
        if map {
            l.free -= count;
        } else {
            l.free += count;
        }
        q.moves.push_back(Move {
            first,
            count,
            map,
            ticket,
            after,
        });
        self.shared.issued.store(ticket, Ordering::Release);
        if q.mover_parked {
            self.shared.work.notify_one();
        }
        Ok(())
    }

    /// [`Region::order_after_moves`] once a move is pending (or the mover failed): orders
    /// `stream` after the moves behind `offset..offset + len`, on the device where it can.
    #[cold]
    #[inline(never)]
    fn order_after_pending_moves(&self, stream: StreamId, offset: usize, len: usize) -> Result<()> {
        // A mover that failed leaves pages unmapped behind blocks: every later call fails.
        if self.shared.broken.load(Ordering::Acquire) {
            return Self::failed(&self.shared.lock());
        }
        let ticket = {
            let l = self.logical.lock().unwrap_or_else(|e| e.into_inner());
            let (p0, p1) = (
                offset / self.shared.region.page,
                (offset + len.max(1)).div_ceil(self.shared.region.page),
            );
            l.ready[p0.min(l.ready.len())..p1.min(l.ready.len())]
                .iter()
                .copied()
                .max()
                .unwrap_or(0)
        };
        if self.shared.done.load(Ordering::Acquire) >= ticket {
            return Ok(());
        }
        let capturing = self.clock.capturing();
        let mut ordered = self.ordered.lock().unwrap_or_else(|e| e.into_inner());
        let slot = match ordered.iter().position(|o| o.0 == stream) {
            Some(i) => i,
            None => {
                ordered.push((stream, 0));
                ordered.len() - 1
            }
        };
        if !capturing && ordered[slot].1 >= ticket {
            return Ok(());
        }
        let Some(s) = self.clock.stream(stream) else {
            drop(ordered);
            return self.wait_done(ticket);
        };
        self.shared
            .ctx
            .bind_to_thread()
            .map_err(|e| cuda_err("cannot bind the CUDA context", e))?;
        // SAFETY: the counter is a live pinned allocation mapped for the device, and outlives
        // the stream's wait (the region's drop waits for nothing, but a dropped pool has no
        // streams waiting on blocks it handed out).
        let r = unsafe {
            sys::cuStreamWaitValue64_v2(
                s.cu_stream(),
                self.shared.counter.device,
                ticket,
                sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as std::ffi::c_uint,
            )
        };
        match r.result() {
            Ok(()) => {
                if !capturing {
                    ordered[slot].1 = ticket;
                }
                self.waits.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            // No device-side wait: the host waits for the move instead.
            Err(_) => self.wait_done(ticket),
        }
    }

    /// Waits on the host until the mover has finished `ticket`.
    fn wait_done(&self, ticket: u64) -> Result<()> {
        self.wait_done_until(ticket, None).map(|_| ())
    }

    /// Waits on the host until the mover has finished `ticket` or `deadline` passes; true
    /// when the ticket is done. A mover that failed is an error either way.
    fn wait_done_until(&self, ticket: u64, deadline: Option<Instant>) -> Result<bool> {
        let mut q = self.shared.lock();
        while self.shared.done.load(Ordering::Acquire) < ticket {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left.is_some_and(|l| l.is_zero()) {
                break;
            }
            q.done_waiters += 1;
            q = match left {
                None => self
                    .shared
                    .done_cv
                    .wait(q)
                    .unwrap_or_else(|e| e.into_inner()),
                Some(left) => {
                    self.shared
                        .done_cv
                        .wait_timeout(q, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
            q.done_waiters -= 1;
        }
        Self::failed(&q)?;
        Ok(self.shared.done.load(Ordering::Acquire) >= ticket)
    }
}

impl Region for BackgroundPagedRegion {
    fn base(&self) -> usize {
        self.shared.region.base()
    }

    fn len(&self) -> usize {
        self.shared.region.len()
    }

    fn page_size(&self) -> Option<usize> {
        Some(self.shared.region.page)
    }

    fn physical_pages(&self) -> usize {
        self.shared.region.physical_pages()
    }

    fn map_pages(&self, first: usize, count: usize) -> Result<()> {
        self.queue(first, count, true, Afters::default())
    }

    fn unmap_pages(&self, first: usize, count: usize) -> Result<()> {
        self.queue(first, count, false, Afters::default())
    }

    fn moves_in_background(&self) -> bool {
        true
    }

    fn unmap_pages_after(
        &self,
        first: usize,
        count: usize,
        after: &[(StreamId, EventId)],
    ) -> Result<()> {
        // The pool recorded its points just now; an event of the region's own recorded on
        // each stream here sits at the same place or later, and the mover waits for it
        // without the clock's lock.
        let mut events = Afters::default();
        for &(id, _) in after {
            let Some(stream) = self.clock.stream(id) else {
                continue; // an unknown stream has no work to wait for
            };
            let spare = self
                .shared
                .spare_events
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop();
            let event = match spare {
                Some(e) => e,
                None => self
                    .shared
                    .ctx
                    .new_event(None)
                    .map_err(|e| cuda_err("cannot create an event for a page move", e))?,
            };
            event
                .record(&stream)
                .map_err(|e| cuda_err("cannot record a page move's event", e))?;
            events.push(event);
        }
        self.queue(first, count, false, events)
    }

    #[inline]
    fn order_after_moves(&self, stream: StreamId, offset: usize, len: usize) -> Result<()> {
        // Fast path, inlined into every allocation: no move pending and the mover sound
        // (three loads, no lock).
        if !self.shared.broken.load(Ordering::Acquire)
            && self.shared.done.load(Ordering::Acquire)
                >= self.shared.issued.load(Ordering::Acquire)
        {
            return Ok(());
        }
        self.order_after_pending_moves(stream, offset, len)
    }

    fn stream_waits_on_moves(&self, stream: StreamId) -> bool {
        let done = self.shared.done.load(Ordering::Acquire);
        let ordered = self.ordered.lock().unwrap_or_else(|e| e.into_inner());
        ordered.iter().any(|&(s, t)| s == stream && t > done)
    }

    fn settle(&self) -> Result<()> {
        self.wait_done(self.shared.issued.load(Ordering::Acquire))
    }

    fn settle_within(&self, limit: std::time::Duration) -> Result<bool> {
        let ticket = self.shared.issued.load(Ordering::Acquire);
        self.wait_done_until(ticket, Some(Instant::now() + limit))
    }
}

impl Drop for BackgroundPagedRegion {
    fn drop(&mut self) {
        // Release any stream still waiting on the counter, and let it read the counter
        // before the counter is freed.
        self.shared.counter.store(u64::MAX);
        if self.shared.issued.load(Ordering::Acquire) > 0
            && self.shared.ctx.bind_to_thread().is_ok()
        {
            let _ = self.shared.ctx.synchronize();
        }
        {
            let mut q = self.shared.lock();
            q.shutdown = true;
            q.paused = false;
            self.shared.work.notify_all();
        }
        if let Some(t) = self.mover.take() {
            let _ = t.join();
        }
    }
}

impl std::fmt::Debug for BackgroundPagedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackgroundPagedRegion")
            .field("base", &self.base())
            .field("len", &self.len())
            .field("page", &self.shared.region.page)
            .field("physical_pages", &self.physical_pages())
            .field("pending_moves", &self.pending_moves())
            .finish()
    }
}
