//! The fixed pool: two-level segregated free lists (TLSF) over one region, best fit, immediate
//! coalescing, stream-safe reuse.
//!
//! Bookkeeping lives in a node slab on the host (never in the region), so the same pool serves
//! device memory. Free spans sit in per-tag size-class lists found through two bitmaps: finding
//! a span, splitting it, and merging a freed span with its physical neighbours are O(1); the
//! only loop is the best-fit scan inside one size class, capped at [`SCAN_LIMIT`] spans.
//! A freed span merges with neighbours of its own stream tag at once; over a fixed region with
//! several streams in use it stays apart from any-stream space until its stream needs the room
//! ([`Inner::consolidate`]), so streams that alternate do not take each other's free space.
//!
//! Over a remappable region ([`Region::page_size`]) the pool also moves physical pages: free
//! spans are always backed, unbacked address ranges are `Unmapped` spans outside the lists, and
//! when no backed span fits, [`FixedPool::remap_take`] backs a new place for the block with
//! pages unbacked from spans no stream can still touch. Blocks never move; only the free
//! memory behind them does, so the physical footprint follows the live bytes. When the region
//! moves pages in the background (stream-ordered), a span kept for another stream, or pending,
//! is first handed to the allocating stream in place, ordered on the device after the giving
//! stream ([`StreamClock::order_after`]), which costs an event wait instead of page moves.
//! With such a clock it promotes no stream's spans (it takes their pages instead), so its
//! footprint does not depend on when events complete.

use super::clock::{EventId, StreamClock, StreamId};
use super::region::Region;
use crate::error::{Error, Result};
use std::cell::{Cell, UnsafeCell};
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

mod block;
mod claim;
mod paged;
mod spans;
mod streams;

pub use block::Block;
pub use claim::PoolClaim;
use claim::*;
use paged::*;
use spans::*;

/// Default block alignment in bytes.
pub const DEFAULT_ALIGN: usize = 256;

/// Most distinct streams one pool tracks (the default stream included).
pub const MAX_STREAMS: usize = 63;

/// Spans examined for the best fit inside one size class (classes span 1/32 of a power of two,
/// so beyond this the fit is within about 3% of the best).
pub const SCAN_LIMIT: usize = 32;

/// Longest single wait in [`FixedPool::alloc_wait`] while memory is pending on a stream
/// (completion of GPU work signals no condition variable, so it is polled).
const PENDING_POLL: Duration = Duration::from_millis(1);

/// Longest an allocation waits for a background mover to finish its page moves before it
/// moves pages itself (a few moves' worth: ~40-60 µs each on an H200).
const MOVER_WAIT: Duration = Duration::from_micros(200);

/// Page mode: allocations within which a span crossing between streams (a hand-over, or a
/// promotion taken back at once) follows the previous one "closely", and how many close ones in
/// a row make the pool back the next block from its reserve instead. The two-stream pair
/// crosses every allocation; the two-stream window (a hand-over every ~150 allocations, in
/// bursts) never meets this (`examples/stream_counts`; 4 within 8 allocations did, and took it
/// from 1.083 to 1.163 reserved / live).
pub(super) const CLOSE_CROSSING: u64 = 4;
pub(super) const CLOSE_CROSSINGS: u32 = 8;
const NIL: u32 = u32::MAX;
const SL_BITS: u32 = 5;
const SL: usize = 1 << SL_BITS;
const FL: usize = usize::BITS as usize - SL_BITS as usize + 1;
/// The positions of the set bits of `mask`, lowest first (in a stream mask, bit `b` is tag
/// `b + 1`).
fn set_bits(mut mask: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (mask != 0).then(|| {
            let b = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            b
        })
    })
}

/// Tag of spans any stream may take; tag `i + 1` is the `i`-th registered stream's.
const ANY: u8 = 0;

/// How a pool is built.
#[derive(Debug, Clone, Copy)]
pub struct PoolOptions {
    /// Block alignment (a power of two dividing the region's base address).
    pub align: usize,
    /// Track streams (the default). Off, every freed span is at once free for every stream and
    /// [`Block::record_use`] is ignored: only for single-stream use and for measuring the cost
    /// of the stream-safe layer.
    pub stream_safe: bool,
    /// Blocks smaller than this many bytes are carved from the top of their span and larger
    /// ones from the bottom, so small long-lived blocks do not split the holes large ones need
    /// (`None`: every block from the bottom).
    pub small_from_top: Option<usize>,
    /// Over a remappable region: back blocks from every unused reserve page before moving
    /// free ones. Fewer page moves (each costs tens of microseconds on a GPU), but the
    /// footprint becomes the whole reserve; off (the default), the footprint follows the most
    /// bytes ever live and pages move as soon as the footprint so far is used.
    pub reserve_first: bool,
    /// Entries of the span table, reserved up front: live blocks plus the free, pending and
    /// unbacked spans between them, all at once. The pool never grows it (nor calls the
    /// system allocator) after it is built; an allocation that would need one more entry
    /// fails with an out-of-memory error that says so.
    pub max_spans: usize,
}

/// The default [`PoolOptions::max_spans`]: 16 Ki entries, about 1 MiB of host metadata.
pub const DEFAULT_MAX_SPANS: usize = 16 << 10;

/// The size under which [`PoolOptions::serving`] places blocks from the top.
pub const SMALL_BLOCK: usize = 1 << 20;

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            align: DEFAULT_ALIGN,
            stream_safe: true,
            small_from_top: None,
            reserve_first: false,
            max_spans: DEFAULT_MAX_SPANS,
        }
    }
}

impl PoolOptions {
    /// The options the backends use: stream-safe, 256 B alignment, blocks under
    /// [`SMALL_BLOCK`] from the top.
    pub fn serving() -> Self {
        PoolOptions {
            small_from_top: Some(SMALL_BLOCK),
            ..PoolOptions::default()
        }
    }
}

/// A point-in-time snapshot of a pool's occupancy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PoolStats {
    /// Bytes the pool manages (the region's length rounded down to the alignment; for a
    /// remappable region, its physical pages).
    pub reserved: usize,
    /// Bytes backed by memory now: `reserved` for a fixed region, the mapped pages for a
    /// remappable one.
    pub committed: usize,
    /// Bytes held by live blocks (rounded sizes).
    pub in_use: usize,
    /// Highest `in_use` seen since the pool was built.
    pub peak_in_use: usize,
    /// Highest end offset any block carved from the bottom of a span has reached.
    pub high_water: usize,
    /// Bytes of the region blocks have ever reached from either end: `high_water` plus the
    /// distance from the lowest top-carved block to the end. A region this size would have
    /// served the same allocations. For a remappable region: the most pages ever mapped at once
    /// (physical memory of that size would have served them).
    pub footprint: usize,
    /// Number of live blocks.
    pub blocks: usize,
    /// Number of free spans (after coalescing).
    pub free_blocks: usize,
    /// Bytes in free spans.
    pub free_bytes: usize,
    /// Bytes freed but waiting for other streams to pass their recorded point.
    pub pending_bytes: usize,
    /// Size of the largest free span.
    pub largest_free: usize,
    /// `1 - largest_free / free_bytes` (0 when nothing is free).
    pub fragmentation: f64,
    /// Times a remappable region's pool moved physical pages to place a block (0 otherwise).
    pub remaps: u64,
    /// Pages a remappable region's pool has backed and unbacked so far (the driver work of
    /// its page moves: each costs tens of microseconds on a GPU).
    pub pages_mapped: u64,
    /// Pages it has unbacked so far (see `pages_mapped`).
    pub pages_unmapped: u64,
    /// Free spans handed from one stream to another in place, ordered on the device after a
    /// point on the giving stream (a pool whose region moves pages in the background).
    pub adoptions: u64,
}

/// A best-fit allocator over one region reserved up front; share it as `Arc<FixedPool<R>>`.
///
/// Allocation never touches the system allocator for payload memory; exhaustion returns
/// [`Error::OutOfMemory`] stating the pool's state. A span freed on stream `s` serves `s` at
/// once; another stream gets it only after one event recorded on `s` completes (never queried
/// during capture, and only when no span already usable by that stream fits).
///
/// The bookkeeping is owned by one thread at a time. Without a [`claim`](Self::claim), each
/// call takes it for its own duration (one compare-and-swap, one store). A thread that claims
/// the pool keeps it: its allocations and frees then run with no lock and no atomic
/// read-modify-write at all, while blocks freed on other threads go through a lock-free
/// remote-free list that the owner drains when it is not empty (mimalloc's scheme).
pub struct FixedPool<R: Region> {
    region: R,
    clock: Arc<dyn StreamClock>,
    align: usize,
    shift: u32,
    stream_safe: bool,
    reserved: usize,
    /// The bookkeeping; only the thread whose token is in `holder` touches it.
    state: UnsafeCell<Inner>,
    /// Token of the thread holding `state` (0: nobody).
    holder: AtomicU64,
    /// The first of the blocks freed by threads that could not take `state` (`NIL`: none),
    /// linked through `remote_slots`, one per span-table entry.
    remote: AtomicU32,
    remote_slots: Box<[RemoteSlot]>,
    /// Threads sleeping in `alloc_wait` or waiting for `state`; `freed` wakes them.
    sleep: Mutex<()>,
    freed: Condvar,
    waiters: AtomicUsize,
    pending_count: AtomicUsize,
}

// SAFETY: `state` is only accessed by the thread whose token `holder` holds (acquired with a
// compare-and-swap, released with a release store); everything else is atomics, a mutex or
// immutable. `Inner` holds plain data.
unsafe impl<R: Region> Sync for FixedPool<R> {}
// SAFETY: as above; the pool owns its state.
unsafe impl<R: Region> Send for FixedPool<R> {}

impl<R: Region> std::fmt::Debug for FixedPool<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FixedPool")
            .field("base", &self.region.base())
            .field("align", &self.align)
            .field("stream_safe", &self.stream_safe)
            .field("stats", &self.stats())
            .finish()
    }
}
impl<R: Region> FixedPool<R> {
    /// Builds a stream-safe pool over `region` with [`DEFAULT_ALIGN`] alignment.
    pub fn new(region: R, clock: Arc<dyn StreamClock>) -> Result<Arc<Self>> {
        Self::with_options(region, clock, PoolOptions::default())
    }

    /// Builds a stream-safe pool whose blocks start at multiples of `align` (a power of two
    /// dividing the region's base address).
    pub fn with_alignment(
        region: R,
        clock: Arc<dyn StreamClock>,
        align: usize,
    ) -> Result<Arc<Self>> {
        Self::with_options(
            region,
            clock,
            PoolOptions {
                align,
                ..PoolOptions::default()
            },
        )
    }

    /// Builds a pool with explicit options.
    pub fn with_options(
        region: R,
        clock: Arc<dyn StreamClock>,
        opts: PoolOptions,
    ) -> Result<Arc<Self>> {
        let align = opts.align;
        if !align.is_power_of_two() {
            return Err(Error::BadInput(format!(
                "pool alignment {align} is not a power of two"
            )));
        }
        if !region.base().is_multiple_of(align) {
            return Err(Error::BadInput(format!(
                "region base {:#x} is not aligned to {align} bytes",
                region.base()
            )));
        }
        let (units, page_units, reserved) = match region.page_size() {
            None => {
                let reserved = region.len() / align * align;
                (reserved / align, 0, reserved)
            }
            Some(page) => {
                if !page.is_power_of_two() || page < align {
                    return Err(Error::BadInput(format!(
                        "region page size {page} is not a power of two of at least the \
                         alignment {align}"
                    )));
                }
                if !opts.stream_safe {
                    return Err(Error::BadInput(
                        "a remappable region needs stream tracking: free pages are unbacked \
                         only once every stream has passed them"
                            .into(),
                    ));
                }
                let pages = region.len() / page;
                let phys = region.physical_pages().min(pages);
                (pages * (page / align), page / align, phys * page)
            }
        };
        let phys_pages = if page_units > 0 {
            reserved / (page_units * align)
        } else {
            0
        };
        if opts.max_spans == 0 {
            return Err(Error::BadInput(
                "a pool's span table needs at least one entry (max_spans = 0)".into(),
            ));
        }
        // Every node covers at least one unit, so a region of fewer units needs fewer entries.
        let span_cap = opts.max_spans.min(units.max(1));
        let mut inner = Inner::new(
            (units, opts.small_from_top.map_or(0, |b| b.div_ceil(align))),
            (page_units, phys_pages),
            span_cap,
        );
        inner.reserve_first = opts.reserve_first;
        inner.background = page_units > 0 && region.moves_in_background();
        Ok(Arc::new(FixedPool {
            state: UnsafeCell::new(inner),
            region,
            clock,
            align,
            shift: align.trailing_zeros(),
            stream_safe: opts.stream_safe,
            reserved,
            holder: AtomicU64::new(0),
            remote: AtomicU32::new(NIL),
            remote_slots: (0..span_cap).map(|_| RemoteSlot::default()).collect(),
            sleep: Mutex::new(()),
            freed: Condvar::new(),
            waiters: AtomicUsize::new(0),
            pending_count: AtomicUsize::new(0),
        }))
    }

    /// The managed region.
    pub fn region(&self) -> &R {
        &self.region
    }

    /// Block alignment in bytes.
    pub fn alignment(&self) -> usize {
        self.align
    }

    /// Whether the pool tracks streams.
    pub fn stream_safe(&self) -> bool {
        self.stream_safe
    }

    /// Allocates `size` bytes (rounded up to the alignment; 0 counts as one unit) for `stream`.
    /// Without a claim on this thread it waits while another thread holds one.
    pub fn alloc(self: &Arc<Self>, size: usize, stream: StreamId) -> Result<Block<R>> {
        let units = self.units(size)?;
        if self.holder.load(Ordering::Relaxed) == thread_token() {
            // Claimed by this thread: no lock, and the block's reference to the pool comes
            // from the counts earlier frees handed back (no atomic on the steady state).
            // SAFETY: this thread holds `state` for the life of its claim.
            let g = unsafe { &mut *self.state.get() };
            self.drain_remote(g);
            let (node, tag, offset) = self.alloc_in(g, size, units, stream)?;
            let pool = if g.prepaid > 0 {
                g.prepaid -= 1;
                // SAFETY: a prepaid strong count, handed over by `Arc::into_raw` of this pool.
                unsafe { Arc::from_raw(Arc::as_ptr(self)) }
            } else {
                Arc::clone(self)
            };
            return self.block(pool, node, tag, offset, units, size, stream);
        }
        let mut h = self.hold();
        let (node, tag, offset) = self.alloc_in(h.g(), size, units, stream)?;
        drop(h);
        self.block(Arc::clone(self), node, tag, offset, units, size, stream)
    }

    /// The handle of a span just taken, with `stream` ordered after any page move still pending
    /// behind it (a region that moves pages in the background); on failure the span goes back.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn block(
        &self,
        pool: Arc<Self>,
        node: u32,
        tag: u8,
        offset: usize,
        units: usize,
        requested: usize,
        stream: StreamId,
    ) -> Result<Block<R>> {
        let block = Block {
            pool: ManuallyDrop::new(pool),
            node,
            tag,
            offset,
            size: units << self.shift,
            requested,
            stream,
            uses: 0,
        };
        self.region
            .order_after_moves(stream, block.offset, block.size)?;
        Ok(block)
    }

    /// Like [`alloc`](Self::alloc), but waits up to `timeout` for frees (or streams, or
    /// another thread's claim) to make room before returning the out-of-memory error.
    pub fn alloc_wait(
        self: &Arc<Self>,
        size: usize,
        stream: StreamId,
        timeout: Duration,
    ) -> Result<Block<R>> {
        let units = self.units(size)?;
        let deadline = Instant::now().checked_add(timeout);
        let me = thread_token();
        loop {
            let claimed = self.holder.load(Ordering::Relaxed) == me;
            if !claimed && !self.acquire(me, deadline) {
                return Err(Error::OutOfMemory(format!(
                    "pool busy: another thread held it for the whole wait ({} B requested)",
                    units << self.shift
                )));
            }
            // Register as a waiter before the attempt, so a free after it wakes us.
            let sleep = self.sleep.lock().unwrap_or_else(|e| e.into_inner());
            self.waiters.fetch_add(1, Ordering::SeqCst);
            let attempt = {
                // SAFETY: this thread holds `state` (claimed, or just acquired).
                let g = unsafe { &mut *self.state.get() };
                self.drain_remote(g);
                let r = match self.alloc_in(g, size, units, stream) {
                    Ok(b) => Ok(b),
                    Err(e) => {
                        let foreign = self.pending_count.load(Ordering::Acquire) > 0
                            || Self::has_foreign(g, stream);
                        Err((e, foreign))
                    }
                };
                if !claimed {
                    // Released without `wake` (this thread holds `sleep`); others waiting for
                    // the state are woken directly.
                    self.holder.store(0, Ordering::Release);
                    if self.waiters.load(Ordering::SeqCst) > 1 {
                        self.freed.notify_all();
                    }
                }
                r
            };
            let (err, foreign) = match attempt {
                Ok((node, tag, offset)) => {
                    self.waiters.fetch_sub(1, Ordering::SeqCst);
                    drop(sleep);
                    let pool = Arc::clone(self);
                    return self.block(pool, node, tag, offset, units, size, stream);
                }
                Err(e) => e,
            };
            if units << self.shift > self.reserved || matches!(err, Error::Unsupported(_)) {
                self.waiters.fetch_sub(1, Ordering::SeqCst);
                return Err(err);
            }
            let now = Instant::now();
            let remaining = match deadline {
                Some(d) if d <= now => {
                    self.waiters.fetch_sub(1, Ordering::SeqCst);
                    return Err(err);
                }
                Some(d) => d - now,
                None => Duration::MAX,
            };
            let slice = if foreign {
                remaining.min(PENDING_POLL)
            } else {
                remaining
            };
            drop(
                self.freed
                    .wait_timeout(sleep, slice)
                    .unwrap_or_else(|e| e.into_inner()),
            );
            self.waiters.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Forgets `stream` once the caller has waited for all of its work (an execution context
    /// being dropped): the spans reserved for it become free for every stream at once, and its
    /// tag goes to a later new stream once no freed block still waits on it. Without this a
    /// process could register only [`MAX_STREAMS`] streams in its life.
    pub fn retire_stream(&self, stream: StreamId) {
        if stream == StreamId::DEFAULT {
            return;
        }
        let mut h = self.hold();
        let g = h.g();
        let Some(k) = g.streams.iter().position(|&s| s == stream) else {
            return;
        };
        let t = k as u8 + 1;
        // Spans of one tag are never adjacent (they would have merged), so each is released
        // on its own; merging with a neighbour reserved for another stream keeps that tag.
        let mut kept = std::mem::take(&mut g.kept);
        g.spans_of(t, &mut kept);
        for &i in &kept {
            g.unlink_free(i);
            g.release_cold(i, ANY);
        }
        g.kept = kept;
        g.retired[k] = true;
        g.note_streams();
    }

    /// A snapshot of the pool's occupancy.
    pub fn stats(&self) -> PoolStats {
        let mut h = self.hold();
        let g = h.g();
        let largest_free = g.largest_free() << self.shift;
        let free_bytes = g.free_units << self.shift;
        let page = g.page_units << self.shift;
        PoolStats {
            reserved: self.reserved,
            committed: if page > 0 {
                g.mapped * page
            } else {
                self.reserved
            },
            in_use: g.in_use << self.shift,
            peak_in_use: g.peak_in_use << self.shift,
            high_water: g.high_water << self.shift,
            footprint: if page > 0 {
                g.peak_mapped * page
            } else {
                (g.high_water + (g.units - g.low_water)).min(g.units) << self.shift
            },
            blocks: g.blocks,
            free_blocks: g.free_spans,
            free_bytes,
            pending_bytes: g.pending_units << self.shift,
            largest_free,
            fragmentation: if free_bytes == 0 {
                0.0
            } else {
                1.0 - largest_free as f64 / free_bytes as f64
            },
            remaps: g.remaps,
            pages_mapped: g.page_maps,
            pages_unmapped: g.page_unmaps,
            adoptions: g.adoptions,
        }
    }

    fn units(&self, size: usize) -> Result<usize> {
        // A shift, not a division (the alignment is a power of two): this is on every
        // allocation's path, and a 64-bit divide's latency depends on the host CPU.
        let units = (size.saturating_sub(1) >> self.shift) + 1;
        if units > usize::MAX >> self.shift {
            return Err(Error::OutOfMemory(format!(
                "requested {size} B, more than the address space; pool reserved {} B",
                self.reserved
            )));
        }
        Ok(units)
    }

    fn has_foreign(g: &Inner, stream: StreamId) -> bool {
        g.streams
            .iter()
            .enumerate()
            .any(|(k, &s)| s != stream && g.index[k + 1].fl_bitmap != 0)
    }

    /// Takes a span for `units` on `stream`: (node, owner tag, byte offset).
    #[inline(always)]
    fn alloc_in(
        &self,
        g: &mut Inner,
        requested: usize,
        units: usize,
        stream: StreamId,
    ) -> Result<(u32, u8, usize)> {
        let own = if self.stream_safe {
            Some(g.tag_of(stream)?)
        } else {
            None
        };
        let node = match g.take(units, own) {
            Some(node) => node,
            None => self.alloc_slow(g, requested, units, (stream, own))?,
        };
        g.in_use += units;
        g.blocks += 1;
        g.allocs = g.allocs.wrapping_add(1);
        g.peak_in_use = g.peak_in_use.max(g.in_use);
        Ok((
            node,
            own.unwrap_or(ANY),
            g.nodes[node as usize].off << self.shift,
        ))
    }
    /// Registers a declared use on `stream` (its cached epoch no longer covers it); returns
    /// the stream's tag.
    fn mark_use(&self, stream: StreamId) -> Result<u8> {
        let mut h = self.hold();
        let g = h.g();
        let t = g.tag_of(stream)?;
        g.dirty[t as usize - 1] = true;
        Ok(t)
    }

    /// Returns a block's span: free at once for its own stream, or pending on the streams
    /// declared to use it.
    #[inline(always)]
    fn release_in(&self, g: &mut Inner, node: u32, tag: u8, uses: u64) {
        let size = g.nodes[node as usize].size;
        g.in_use -= size;
        g.blocks -= 1;
        if !self.stream_safe {
            g.release(node, ANY);
        } else if uses == 0 {
            g.release(node, tag);
        } else {
            let mut epochs = [EventId(0); MAX_STREAMS];
            for b in set_bits(uses) {
                epochs[b] = g.epoch_for(self.clock.as_ref(), b as u8 + 1);
            }
            g.nodes[node as usize].state = State::Pending;
            g.pending_units += size;
            self.pending_count.fetch_add(1, Ordering::AcqRel);
            g.pending.push(Pending {
                node,
                tag,
                mask: uses,
                epochs,
            });
        }
    }
}
