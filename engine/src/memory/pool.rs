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
    pub pages_unmapped: u64,
    /// Free spans handed from one stream to another in place, ordered on the device after a
    /// point on the giving stream (a pool whose region moves pages in the background).
    pub adoptions: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Free,
    Used,
    Pending,
    Unused,
    /// An address range with no physical memory behind it (remappable regions only); never
    /// in the free lists, never merged with free spans. Offset and size are whole pages.
    Unmapped,
}

/// One span of the region, in units of the alignment.
#[derive(Debug, Clone, Copy)]
struct Node {
    off: usize,
    size: usize,
    prev_phys: u32,
    next_phys: u32,
    prev_free: u32,
    next_free: u32,
    tag: u8,
    state: State,
    /// Size class of the free list the span is linked in (`fl << SL_BITS | sl`); it may lag
    /// behind the size for the one stale span of a tag (see [`FreeIndex::stale`]).
    class: u16,
}

impl Node {
    /// A span at `off..off + size` linked to no neighbour or list yet.
    fn span(off: usize, size: usize, tag: u8, state: State) -> Node {
        Node {
            off,
            size,
            prev_phys: NIL,
            next_phys: NIL,
            prev_free: NIL,
            next_free: NIL,
            tag,
            state,
            class: 0,
        }
    }
}

/// The size-class lists of one tag.
struct FreeIndex {
    /// A span linked in a class below its size's (NIL: none). It grew by merging while its
    /// list was the highest non-empty one, so it stays there instead of moving up: with no
    /// span above it the best fit is unchanged. Linking a span above it moves it first.
    stale: u32,
    fl_bitmap: u64,
    sl_bitmap: [u32; FL],
    heads: [[u32; SL]; FL],
}

impl FreeIndex {
    fn new() -> Self {
        FreeIndex {
            stale: NIL,
            fl_bitmap: 0,
            sl_bitmap: [0; FL],
            heads: [[NIL; SL]; FL],
        }
    }

    /// The highest non-empty class.
    #[inline(always)]
    fn highest_class(&self) -> Option<u16> {
        if self.fl_bitmap == 0 {
            return None;
        }
        let f = 63 - self.fl_bitmap.leading_zeros() as usize;
        let s = 31 - self.sl_bitmap[f].leading_zeros() as usize;
        Some(class_of(f, s))
    }

    /// First non-empty class at or above `(fl, sl)`.
    #[inline]
    fn find_from(&self, fl: usize, sl: usize) -> Option<(usize, usize)> {
        if fl >= FL {
            return None;
        }
        let sl_map = if sl < SL {
            self.sl_bitmap[fl] & (u32::MAX << sl)
        } else {
            0
        };
        if sl_map != 0 {
            return Some((fl, sl_map.trailing_zeros() as usize));
        }
        let fl_map = if fl + 1 < 64 {
            self.fl_bitmap & (u64::MAX << (fl + 1))
        } else {
            0
        };
        if fl_map == 0 {
            return None;
        }
        let f = fl_map.trailing_zeros() as usize;
        Some((f, self.sl_bitmap[f].trailing_zeros() as usize))
    }
}

/// Size class of a span of `size` units: exact below 32 units, else 32 classes per power of two.
#[inline(always)]
fn mapping(size: usize) -> (usize, usize) {
    if size < SL {
        (0, size)
    } else {
        let msb = usize::BITS - 1 - size.leading_zeros();
        let fl = (msb - SL_BITS + 1) as usize;
        let sl = (size >> (msb - SL_BITS)) - SL;
        (fl, sl)
    }
}

/// One number per class, ordered like the classes.
#[inline(always)]
fn class_of(fl: usize, sl: usize) -> u16 {
    ((fl << SL_BITS) | sl) as u16
}

/// The class after `(fl, sl)`.
#[inline]
fn next_class(fl: usize, sl: usize) -> (usize, usize) {
    if sl + 1 < SL {
        (fl, sl + 1)
    } else {
        (fl + 1, 0)
    }
}

/// Whether a span of tag `a` may serve stream tag `b` together with one of tag `b` (they are
/// reserved for the same stream, or one is free for any stream); the merged span keeps the
/// stricter tag (a span free for any stream may serve one stream only).
#[inline]
fn compatible(a: u8, b: u8) -> bool {
    a == b || a == ANY || b == ANY
}

#[inline]
fn stricter(a: u8, b: u8) -> u8 {
    if a == ANY {
        b
    } else {
        a
    }
}

/// The working lists of page moves and hand-overs, kept in the pool between calls: once grown
/// to the pool's span count they are only cleared and refilled, so neither slow path calls the
/// system allocator in the steady state (`tests/pool_slow_paths_alloc.rs`).
#[derive(Default)]
struct MoveScratch {
    /// Every span in address order ([`Inner::address_order`]).
    order: Vec<u32>,
    /// The spans a block is placed on: a page move's window, or the spans handed over.
    window: Vec<u32>,
    /// [`Inner::remap_plan`]'s candidate windows: (pages to map, first and last index in
    /// `order`).
    windows: Vec<(usize, usize, usize)>,
    /// [`Inner::donor_runs`]: (bytes, first page, pages, stream tag mask) per run.
    donors: Vec<(usize, usize, usize, u64)>,
    /// The page ranges a move unbacks: first page, pages, the donor spans' stream tags as a
    /// mask (bit `t - 1` for tag `t`).
    steals: Vec<(usize, usize, u64)>,
    /// One point recorded on each stream whose kept span gives pages: (tag, stream, point).
    points: Vec<(u8, StreamId, EventId)>,
    /// The points one unbacked range waits for.
    after: Vec<(StreamId, EventId)>,
    /// Page ranges (first page, pages) a move unbacked and backed.
    unbacked: Vec<(usize, usize)>,
    backed: Vec<(usize, usize)>,
}

impl MoveScratch {
    /// Lists sized for `spans` spans and every stream, so a first move allocates nothing either.
    fn with_capacity(spans: usize) -> Self {
        MoveScratch {
            order: Vec::with_capacity(spans),
            window: Vec::with_capacity(spans),
            windows: Vec::with_capacity(spans),
            donors: Vec::with_capacity(spans),
            steals: Vec::with_capacity(spans),
            points: Vec::with_capacity(MAX_STREAMS),
            after: Vec::with_capacity(MAX_STREAMS),
            unbacked: Vec::with_capacity(spans),
            backed: Vec::with_capacity(spans),
        }
    }
}

/// A freed span waiting for streams to pass recorded points.
#[derive(Debug, Clone, Copy)]
struct Pending {
    node: u32,
    /// Tag the span gets once every dependency is complete.
    tag: u8,
    /// Streams (bit `t - 1` for tag `t`) the span waits for, and the epoch on each.
    mask: u64,
    epochs: [EventId; MAX_STREAMS],
}

/// A vector indexed by numbers the pool hands out itself: node numbers (from
/// [`Table::push`] via `Inner::new_node`) and stream tags (from `Inner::tag_of`). Neither
/// table ever shrinks, so every number the pool stores (list heads, neighbour and free links,
/// a block's node and tag) is in bounds: indexing skips the bounds check, which the allocation
/// and free paths would otherwise pay a dozen times (checked in debug builds, which the tests
/// run).
struct Table<T>(Vec<T>);

impl<T> Table<T> {
    fn with_capacity(n: usize) -> Self {
        Table(Vec::with_capacity(n))
    }

    /// Appends `item`; its number.
    #[inline]
    fn push(&mut self, item: T) -> u32 {
        self.0.push(item);
        (self.0.len() - 1) as u32
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn get(&self, i: usize) -> Option<&T> {
        self.0.get(i)
    }

    fn iter(&self) -> std::slice::Iter<'_, T> {
        self.0.iter()
    }
}

impl<T> std::ops::Index<usize> for Table<T> {
    type Output = T;

    #[inline(always)]
    fn index(&self, i: usize) -> &T {
        debug_assert!(i < self.0.len(), "entry {i} of {}", self.0.len());
        // SAFETY: the numbers the pool stores are in bounds (see the type's comment).
        unsafe { self.0.get_unchecked(i) }
    }
}

impl<T> std::ops::IndexMut<usize> for Table<T> {
    #[inline(always)]
    fn index_mut(&mut self, i: usize) -> &mut T {
        debug_assert!(i < self.0.len(), "entry {i} of {}", self.0.len());
        // SAFETY: as for `index`.
        unsafe { self.0.get_unchecked_mut(i) }
    }
}

struct Inner {
    nodes: Table<Node>,
    spare: Vec<u32>,
    /// Entries `nodes` was reserved with ([`PoolOptions::max_spans`], at most the region's
    /// units): it never grows past them, so no list of node numbers outgrows its reservation.
    span_cap: usize,
    /// Per tag: its free lists (index 0 = any stream).
    index: Table<FreeIndex>,
    /// Registered streams; stream `streams[i]` has tag `i + 1`.
    streams: Vec<StreamId>,
    /// Per registered stream: the last recorded epoch, and whether a use was declared since.
    last_epoch: Vec<Option<EventId>>,
    dirty: Vec<bool>,
    /// Per registered stream: retired (its tag may go to a new stream once nothing waits on it).
    retired: Vec<bool>,
    /// A fixed region with more than one registered stream not retired. A span freed for one
    /// stream then stays apart from its any-stream neighbours, so that the other streams keep
    /// them with no event recorded; [`Inner::consolidate`] merges them when that stream's
    /// allocation needs it. Page mode never keeps them apart: it stays within its footprint by
    /// promoting spans, and spans kept apart there fragment the backed bytes into more page
    /// moves (`examples/stream_counts`: 10.5k against 5.0k pages a million two-stream window
    /// steps).
    multi: bool,
    pending: Vec<Pending>,
    free_units: usize,
    free_spans: usize,
    in_use: usize,
    peak_in_use: usize,
    high_water: usize,
    low_water: usize,
    units: usize,
    /// Blocks under this many units come from the top of their span (0: none).
    small_units: usize,
    blocks: usize,
    pending_units: usize,
    /// Strong counts on the pool handed back by blocks freed under a claim, for the claim's
    /// next allocations (released when the claim ends).
    prepaid: usize,
    /// Nesting depth of the claim on this pool (0: not claimed).
    claims: usize,
    /// Units per page of a remappable region (0: a fixed region).
    page_units: usize,
    /// Physical pages mapped nowhere, the most ever mapped at once, and those mapped now.
    phys_free: usize,
    peak_mapped: usize,
    mapped: usize,
    remaps: u64,
    /// Pages backed and unbacked so far (each costs a driver call's share).
    page_maps: u64,
    page_unmaps: u64,
    /// [`PoolOptions::reserve_first`].
    reserve_first: bool,
    /// Free spans handed from one stream to another ([`FixedPool::adopt_foreign`]).
    adoptions: u64,
    /// Allocations so far, the count at the last crossing of a span between streams, and how
    /// many crossings in a row came within [`CLOSE_CROSSING`] allocations of the one before
    /// ([`Self::note_crossing`]).
    allocs: u64,
    crossing_at: u64,
    close_crossings: u32,
    /// The region moves pages in the background ([`Region::moves_in_background`]): free spans
    /// kept for a stream give pages too, unbacked once that stream passes a point recorded
    /// when they are taken, so nothing waits for streams to be promoted.
    background: bool,
    /// Working lists of page moves and hand-overs (taken out while one runs).
    moves: MoveScratch,
    /// The free spans of one stream tag ([`Inner::spans_of`]), reused between calls.
    kept: Vec<u32>,
}

impl Inner {
    fn new(
        (units, small_units): (usize, usize),
        (page_units, phys_pages): (usize, usize),
        span_cap: usize,
    ) -> Inner {
        let mut inner = Inner {
            nodes: Table::with_capacity(span_cap),
            spare: Vec::with_capacity(span_cap),
            span_cap,
            index: {
                let mut v = Table::with_capacity(MAX_STREAMS + 1);
                v.push(FreeIndex::new());
                v
            },
            streams: Vec::with_capacity(MAX_STREAMS),
            last_epoch: Vec::with_capacity(MAX_STREAMS),
            dirty: Vec::with_capacity(MAX_STREAMS),
            retired: Vec::with_capacity(MAX_STREAMS),
            multi: false,
            // One entry per span at most, reserved with the span table so that no burst of
            // pending frees reaches the system allocator. An entry holds a point per stream
            // (about 0.5 KiB, 8 MiB for the default table); the allocator maps that address
            // space at once, and the host commits a page only when an entry on it is first
            // used, so memory follows the most spans ever pending together.
            pending: Vec::with_capacity(span_cap),
            free_units: 0,
            free_spans: 0,
            in_use: 0,
            peak_in_use: 0,
            high_water: 0,
            low_water: units,
            units,
            small_units,
            blocks: 0,
            pending_units: 0,
            prepaid: 0,
            claims: 0,
            page_units,
            phys_free: phys_pages,
            peak_mapped: 0,
            mapped: 0,
            remaps: 0,
            page_maps: 0,
            page_unmaps: 0,
            reserve_first: false,
            adoptions: 0,
            allocs: 0,
            crossing_at: 0,
            close_crossings: 0,
            background: false,
            moves: if page_units > 0 {
                MoveScratch::with_capacity(span_cap)
            } else {
                MoveScratch::default()
            },
            kept: Vec::with_capacity(span_cap),
        };
        // The default stream is always tag 1 (its lookup short-cuts to that).
        inner.streams.push(StreamId::DEFAULT);
        inner.last_epoch.push(None);
        inner.dirty.push(true);
        inner.retired.push(false);
        inner.index.push(FreeIndex::new());
        if units > 0 {
            let n = inner.new_node(Node {
                off: 0,
                size: units,
                prev_phys: NIL,
                next_phys: NIL,
                prev_free: NIL,
                next_free: NIL,
                tag: ANY,
                state: State::Free,
                class: 0,
            });
            if page_units > 0 {
                // Nothing is backed yet: the first allocations map what they need.
                inner.nodes[n as usize].state = State::Unmapped;
            } else {
                inner.link_free(n);
            }
        }
        inner
    }

    /// The tag of `stream`, registering it on first sight.
    #[inline]
    fn tag_of(&mut self, stream: StreamId) -> Result<u8> {
        if stream == StreamId::DEFAULT {
            return Ok(1);
        }
        self.tag_of_other(stream)
    }

    /// [`Self::tag_of`] for a stream other than the default one (kept out of the default
    /// stream's path).
    #[inline(never)]
    fn tag_of_other(&mut self, stream: StreamId) -> Result<u8> {
        if let Some(i) = self.streams.iter().position(|&s| s == stream) {
            return Ok(i as u8 + 1);
        }
        // A retired stream's tag, once no span is reserved for it or waits on it.
        let reusable = (1..self.streams.len()).find(|&k| {
            self.retired[k]
                && self.index[k + 1].fl_bitmap == 0
                && self
                    .pending
                    .iter()
                    .all(|p| p.mask & (1 << k) == 0 && p.tag != k as u8 + 1)
        });
        if let Some(k) = reusable {
            self.streams[k] = stream;
            self.last_epoch[k] = None;
            self.dirty[k] = true;
            self.retired[k] = false;
            self.note_streams();
            return Ok(k as u8 + 1);
        }
        if self.streams.len() >= MAX_STREAMS {
            return Err(Error::Unsupported(format!(
                "a memory pool tracks at most {MAX_STREAMS} streams; stream {} is one too many",
                stream.0
            )));
        }
        self.streams.push(stream);
        self.last_epoch.push(None);
        self.dirty.push(true);
        self.retired.push(false);
        self.index.push(FreeIndex::new());
        self.note_streams();
        Ok(self.streams.len() as u8)
    }

    /// Updates [`Self::multi`] after a stream is registered or retired.
    fn note_streams(&mut self) {
        self.multi = self.page_units == 0 && self.retired.iter().filter(|&&r| !r).count() > 1;
    }

    /// Whether spans may have been kept apart ([`Self::multi`] was ever set): a fixed region
    /// that registered a second stream.
    fn may_keep_apart(&self) -> bool {
        self.page_units == 0 && self.streams.len() > 1
    }

    /// Merges the free spans reserved for stream tag `t` with their any-stream neighbours (kept
    /// apart while several streams are in use), when `t`'s allocation finds no span that fits:
    /// no event is needed for that stream's own use. Returns whether any merged. O(spans of `t`).
    fn consolidate(&mut self, t: u8) -> bool {
        let mut merged = false;
        let mut kept = std::mem::take(&mut self.kept);
        self.spans_of(t, &mut kept);
        for &i in &kept {
            let n = self.nodes[i as usize];
            if n.state != State::Free || n.tag != t {
                // Merged into an earlier span of this pass.
                continue;
            }
            // A neighbour of tag `t` is one this pass just merged (with the any-stream span
            // between them).
            let joins = |j: u32| {
                j != NIL && {
                    let m = &self.nodes[j as usize];
                    m.state == State::Free && (m.tag == ANY || m.tag == t)
                }
            };
            if joins(n.prev_phys) || joins(n.next_phys) {
                self.unlink_free(i);
                self.release_with(i, t, true);
                merged = true;
            }
        }
        self.kept = kept;
        merged
    }

    /// A node for `node`: a spare one, or the next entry of the reserved table. Callers make
    /// sure there is room first ([`Self::span_room`]).
    #[inline]
    fn new_node(&mut self, node: Node) -> u32 {
        match self.spare.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                debug_assert!(self.nodes.len() < self.span_cap, "span table full");
                self.nodes.push(node)
            }
        }
    }

    /// Nodes that can still be made without growing the table.
    fn span_room(&self) -> usize {
        self.spare.len() + (self.span_cap - self.nodes.len())
    }

    /// Whether the span table is full: a split (one more node) must fail.
    #[inline(always)]
    fn span_table_full(&self) -> bool {
        self.spare.is_empty() && self.nodes.len() >= self.span_cap
    }

    #[inline]
    fn drop_node(&mut self, i: u32) {
        self.nodes[i as usize].state = State::Unused;
        self.spare.push(i);
    }

    #[inline(always)]
    fn link_free(&mut self, i: u32) {
        let n = self.nodes[i as usize];
        let (fl, sl) = mapping(n.size);
        let stale = self.index[n.tag as usize].stale;
        if stale != NIL && stale != i && class_of(fl, sl) > self.nodes[stale as usize].class {
            self.fix_stale(n.tag);
        }
        let idx = &mut self.index[n.tag as usize];
        let head = idx.heads[fl][sl];
        idx.heads[fl][sl] = i;
        idx.sl_bitmap[fl] |= 1 << sl;
        idx.fl_bitmap |= 1 << fl;
        {
            let node = &mut self.nodes[i as usize];
            node.prev_free = NIL;
            node.next_free = head;
            node.state = State::Free;
            node.class = class_of(fl, sl);
        }
        if head != NIL {
            self.nodes[head as usize].prev_free = i;
        }
        self.free_units += n.size;
        self.free_spans += 1;
    }

    /// Moves the stale span of `tag` to the list of its size.
    #[cold]
    fn fix_stale(&mut self, tag: u8) {
        let s = self.index[tag as usize].stale;
        self.unlink_free(s);
        self.link_free(s);
    }

    #[inline(always)]
    fn unlink_free(&mut self, i: u32) {
        let n = self.nodes[i as usize];
        let idx = &mut self.index[n.tag as usize];
        if idx.stale == i {
            idx.stale = NIL;
        }
        if n.prev_free != NIL {
            self.nodes[n.prev_free as usize].next_free = n.next_free;
        } else {
            let (fl, sl) = ((n.class >> SL_BITS) as usize, (n.class as usize) & (SL - 1));
            idx.heads[fl][sl] = n.next_free;
            if n.next_free == NIL {
                idx.sl_bitmap[fl] &= !(1 << sl);
                if idx.sl_bitmap[fl] == 0 {
                    idx.fl_bitmap &= !(1 << fl);
                }
            }
        }
        if n.next_free != NIL {
            self.nodes[n.next_free as usize].prev_free = n.prev_free;
        }
        self.free_units -= n.size;
        self.free_spans -= 1;
    }

    /// The smallest span in list `(fl, sl)` of `tag` holding `size` units (lowest offset on ties).
    #[inline(always)]
    fn scan(&self, tag: u8, fl: usize, sl: usize, size: usize) -> Option<(usize, usize, u32)> {
        let mut cur = self.index[tag as usize].heads[fl][sl];
        let mut best: Option<(usize, usize, u32)> = None;
        let mut seen = 0;
        while cur != NIL && seen < SCAN_LIMIT {
            let n = &self.nodes[cur as usize];
            if n.size >= size && best.is_none_or(|b| (n.size, n.off) < (b.0, b.1)) {
                best = Some((n.size, n.off, cur));
            }
            cur = n.next_free;
            seen += 1;
        }
        best
    }

    /// Best fit for `size` units (of class `(fl, sl)`) among the spans of `tag`: (span size,
    /// offset, node).
    #[inline(always)]
    fn best_in(
        &self,
        tag: u8,
        size: usize,
        (fl, sl): (usize, usize),
    ) -> Option<(usize, usize, u32)> {
        let idx = &self.index[tag as usize];
        if idx.fl_bitmap == 0 {
            return None;
        }
        if idx.heads[fl][sl] != NIL {
            if let Some(b) = self.scan(tag, fl, sl, size) {
                return Some(b);
            }
        }
        let (nf, ns) = next_class(fl, sl);
        match idx.find_from(nf, ns) {
            Some((f, s)) => self.scan(tag, f, s, 0),
            None => {
                // Nothing is listed above the request's class, but the stale span (listed
                // below its size, in the highest list) may still hold it.
                let st = idx.stale;
                let n = self.nodes.get(st as usize)?;
                (n.size >= size).then_some((n.size, n.off, st))
            }
        }
    }

    /// Takes the best span for `size` units usable by stream tag `own` (or any stream), splits
    /// it, and returns the used node.
    #[inline(always)]
    fn take(&mut self, size: usize, own: Option<u8>) -> Option<u32> {
        let class = mapping(size);
        let any = self.best_in(ANY, size, class);
        let mine = own.and_then(|t| self.best_in(t, size, class));
        let (_, _, i) = match (mine, any) {
            (Some(a), Some(b)) => {
                if (b.0, b.1) < (a.0, a.1) {
                    b
                } else {
                    a
                }
            }
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (None, None) => return None,
        };
        let n = self.nodes[i as usize];
        if n.size == size {
            self.unlink_free(i);
            self.nodes[i as usize].state = State::Used;
            self.note_extent(n.off, size);
            return Some(i);
        }
        if self.span_table_full() {
            // Splitting needs one more node; the slow path says why it fails.
            return None;
        }
        if size < self.small_units {
            // Carve a small block from the span's top: the span keeps its node and offset.
            let used = self.new_node(Node {
                off: n.off + n.size - size,
                size,
                prev_phys: i,
                next_phys: n.next_phys,
                prev_free: NIL,
                next_free: NIL,
                tag: n.tag,
                state: State::Used,
                class: 0,
            });
            if n.next_phys != NIL {
                self.nodes[n.next_phys as usize].prev_phys = used;
            }
            self.nodes[i as usize].next_phys = used;
            self.resize_free(i, n.size - size, n.tag);
            self.note_top_extent(n.off + n.size - size);
            return Some(used);
        }
        // Carve the block from the span's head: the span keeps its node and, while its size
        // class does not change, its place in the lists.
        self.note_bottom_extent(n.off + size);
        let used = self.new_node(Node {
            off: n.off,
            size,
            prev_phys: n.prev_phys,
            next_phys: i,
            prev_free: NIL,
            next_free: NIL,
            tag: n.tag,
            state: State::Used,
            class: 0,
        });
        if n.prev_phys != NIL {
            self.nodes[n.prev_phys as usize].next_phys = used;
        }
        self.nodes[i as usize].prev_phys = used;
        self.nodes[i as usize].off = n.off + size;
        self.resize_free(i, n.size - size, n.tag);
        Some(used)
    }

    /// Records how far blocks reach from each end: a block wholly above the bottom zone lowers
    /// the top zone's floor, one wholly below the top zone raises the bottom zone's ceiling.
    #[inline]
    fn note_extent(&mut self, off: usize, size: usize) {
        if size < self.small_units {
            self.note_top_extent(off);
        } else {
            self.note_bottom_extent(off + size);
        }
    }

    /// [`Self::note_extent`] for a small block (carved from the top) starting at `off`.
    #[inline(always)]
    fn note_top_extent(&mut self, off: usize) {
        if off >= self.high_water {
            self.low_water = self.low_water.min(off);
        }
    }

    /// [`Self::note_extent`] for a block from the bottom that ends at `end`.
    #[inline(always)]
    fn note_bottom_extent(&mut self, end: usize) {
        if end <= self.low_water {
            self.high_water = self.high_water.max(end);
        }
    }

    /// Gives free node `i` a new size and tag, moving it between lists only when its size
    /// class or tag changes (and not when it grows as the highest span of its tag: it then
    /// stays listed below its size as the tag's stale span).
    #[inline(always)]
    fn resize_free(&mut self, i: u32, size: usize, tag: u8) {
        let n = self.nodes[i as usize];
        if n.tag == tag {
            let (fl, sl) = mapping(size);
            let class = class_of(fl, sl);
            let idx = &mut self.index[tag as usize];
            let keep = class == n.class
                || (class > n.class
                    && (idx.stale == NIL || idx.stale == i)
                    && idx.highest_class() == Some(n.class));
            if keep {
                if class != n.class {
                    idx.stale = i;
                } else if idx.stale == i {
                    idx.stale = NIL;
                }
                self.free_units = self.free_units + size - n.size;
                self.nodes[i as usize].size = size;
                return;
            }
        }
        self.unlink_free(i);
        let node = &mut self.nodes[i as usize];
        node.size = size;
        node.tag = tag;
        self.link_free(i);
    }

    /// Returns node `i` to the free lists under `tag`, merging free neighbours of the same tag
    /// and, while one stream is in use ([`Self::multi`]), any-stream ones. With several streams
    /// a span freed for one would otherwise take its any-stream neighbours from the others, and
    /// stream-alternating work would record and query an event every step to promote it back.
    /// A merge into one neighbour that keeps its size class and tag touches no list.
    #[inline(always)]
    fn release(&mut self, i: u32, tag: u8) {
        self.release_with(i, tag, !self.multi)
    }

    /// [`Self::release`], merging any-stream neighbours into a span reserved for one stream
    /// (and the reverse) when `absorb_any`.
    #[inline(always)]
    fn release_with(&mut self, i: u32, tag: u8, absorb_any: bool) {
        let n = self.nodes[i as usize];
        let mut tag = tag;
        let free_with = |inner: &Inner, j: u32, tag: u8| {
            j != NIL && {
                let m = &inner.nodes[j as usize];
                m.state == State::Free
                    && (m.tag == tag || ((m.tag == ANY || tag == ANY) && absorb_any))
            }
        };
        let left = free_with(self, n.prev_phys, tag);
        if left {
            tag = stricter(tag, self.nodes[n.prev_phys as usize].tag);
        }
        let right = free_with(self, n.next_phys, tag);
        if right {
            tag = stricter(tag, self.nodes[n.next_phys as usize].tag);
        }
        match (left, right) {
            (false, false) => {
                let node = &mut self.nodes[i as usize];
                node.tag = tag;
                self.link_free(i);
            }
            (true, false) => {
                let l = n.prev_phys;
                let size = self.nodes[l as usize].size + n.size;
                self.resize_free(l, size, tag);
                self.nodes[l as usize].next_phys = n.next_phys;
                if n.next_phys != NIL {
                    self.nodes[n.next_phys as usize].prev_phys = l;
                }
                self.drop_node(i);
            }
            (false, true) => {
                let r = n.next_phys;
                let size = self.nodes[r as usize].size + n.size;
                self.nodes[r as usize].off = n.off;
                self.resize_free(r, size, tag);
                self.nodes[r as usize].prev_phys = n.prev_phys;
                if n.prev_phys != NIL {
                    self.nodes[n.prev_phys as usize].next_phys = r;
                }
                self.drop_node(i);
            }
            (true, true) => {
                let (l, r) = (n.prev_phys, n.next_phys);
                let rn = self.nodes[r as usize];
                self.unlink_free(r);
                self.drop_node(r);
                let size = self.nodes[l as usize].size + n.size + rn.size;
                self.resize_free(l, size, tag);
                self.nodes[l as usize].next_phys = rn.next_phys;
                if rn.next_phys != NIL {
                    self.nodes[rn.next_phys as usize].prev_phys = l;
                }
                self.drop_node(i);
            }
        }
    }

    /// Counts a hand-over ([`Self::note_crossing`]).
    fn note_handover(&mut self) {
        self.adoptions += 1;
        self.note_crossing();
    }

    /// Notes that a span kept for one stream served another (handed over, or promoted and
    /// taken back at once), and whether it came within [`CLOSE_CROSSING`] allocations of the
    /// previous such crossing.
    fn note_crossing(&mut self) {
        if self.allocs.wrapping_sub(self.crossing_at) <= CLOSE_CROSSING {
            self.close_crossings += 1;
        } else {
            self.close_crossings = 0;
        }
        self.crossing_at = self.allocs;
    }

    /// [`Self::take`] out of line, for the slow paths (the allocation path inlines it).
    #[inline(never)]
    fn take_cold(&mut self, size: usize, own: Option<u8>) -> Option<u32> {
        self.take(size, own)
    }

    /// [`Self::release`] out of line, for the slow paths (the free path inlines it).
    #[inline(never)]
    fn release_cold(&mut self, i: u32, tag: u8) {
        self.release(i, tag)
    }

    fn largest_free(&self) -> usize {
        let mut best = 0;
        for idx in self.index.iter() {
            if idx.fl_bitmap == 0 {
                continue;
            }
            let f = 63 - idx.fl_bitmap.leading_zeros() as usize;
            let s = 31 - idx.sl_bitmap[f].leading_zeros() as usize;
            let mut cur = idx.heads[f][s];
            while cur != NIL {
                let n = &self.nodes[cur as usize];
                best = best.max(n.size);
                cur = n.next_free;
            }
        }
        best
    }

    /// Epoch covering every declared use of stream tag `t`: the cached one unless a use was
    /// declared since it was recorded.
    fn epoch_for(&mut self, clock: &dyn StreamClock, t: u8) -> EventId {
        let k = t as usize - 1;
        match self.last_epoch[k] {
            Some(e) if !self.dirty[k] => e,
            _ => {
                let e = clock.record(self.streams[k]);
                self.last_epoch[k] = Some(e);
                self.dirty[k] = false;
                e
            }
        }
    }
}

/// This thread's token: never 0, unique for the life of the process (not reused when a thread
/// exits, unlike a thread-local's address). Inlined: every allocation and free reads it.
#[inline]
fn thread_token() -> u64 {
    thread_local! {
        static TOKEN: Cell<u64> = const { Cell::new(0) };
    }
    #[cold]
    #[inline(never)]
    fn first(t: &Cell<u64>) -> u64 {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let v = NEXT.fetch_add(1, Ordering::Relaxed);
        t.set(v);
        v
    }
    TOKEN.with(|t| match t.get() {
        0 => first(t),
        v => v,
    })
}

/// The remote-free list's entry of one node: a block freed on a thread that could not take
/// the pool's state is queued through its node's entry (a Treiber stack over node numbers,
/// reserved with the span table) for whoever holds the state next, with no heap allocation.
#[derive(Default)]
struct RemoteSlot {
    /// The next queued node (`NIL`: the last).
    next: AtomicU32,
    tag: AtomicU8,
    uses: AtomicU64,
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

/// Exclusive access to a pool's bookkeeping for one call (or for the life of a claim).
struct Held<'a, R: Region> {
    pool: &'a FixedPool<R>,
    /// Whether dropping this releases the state (false inside a claim).
    release: bool,
}

impl<R: Region> Held<'_, R> {
    /// The bookkeeping.
    fn g(&mut self) -> &mut Inner {
        // SAFETY: this thread holds `state` (see `FixedPool::hold`), and the `&mut self`
        // borrow keeps this the only reference into it.
        unsafe { &mut *self.pool.state.get() }
    }
}

impl<R: Region> Drop for Held<'_, R> {
    fn drop(&mut self) {
        if self.release {
            self.pool.unlock();
        }
    }
}

/// A thread's claim on a pool (from [`FixedPool::claim`]): while it lives, that thread's
/// allocations and frees take no lock; other threads' frees queue on the remote-free list and
/// their allocations wait until the claim drops. Not `Send`: it belongs to the claiming thread.
pub struct PoolClaim<R: Region> {
    pool: Arc<FixedPool<R>>,
    _thread: PhantomData<*const ()>,
}

impl<R: Region> PoolClaim<R> {
    /// The claimed pool.
    pub fn pool(&self) -> &Arc<FixedPool<R>> {
        &self.pool
    }

    /// Allocates `size` bytes for `stream` on the claimed (lock-free) path.
    pub fn alloc(&self, size: usize, stream: StreamId) -> Result<Block<R>> {
        self.pool.alloc(size, stream)
    }
}

impl<R: Region> std::fmt::Debug for PoolClaim<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolClaim")
            .field("base", &self.pool.region.base())
            .finish()
    }
}

impl<R: Region> Drop for PoolClaim<R> {
    fn drop(&mut self) {
        let pool = &*self.pool;
        // SAFETY: the claim holds `state` on this thread (claims are not Send).
        let g = unsafe { &mut *pool.state.get() };
        g.claims -= 1;
        if g.claims > 0 {
            return;
        }
        pool.drain_remote(g);
        let prepaid = std::mem::take(&mut g.prepaid);
        let ptr = Arc::as_ptr(&self.pool);
        for _ in 0..prepaid {
            // SAFETY: each prepaid count is a strong count a freed block handed over (from
            // `Arc::into_raw`); `self.pool` keeps the count above zero meanwhile.
            unsafe { Arc::decrement_strong_count(ptr) };
        }
        pool.unlock();
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

    /// Claims the pool for the calling thread until the returned guard drops (waiting while
    /// another thread holds a claim). Claims nest on one thread.
    pub fn claim(self: &Arc<Self>) -> PoolClaim<R> {
        let me = thread_token();
        if self.holder.load(Ordering::Relaxed) != me {
            self.acquire(me, None);
        }
        // SAFETY: this thread now holds `state`.
        let g = unsafe { &mut *self.state.get() };
        g.claims += 1;
        self.drain_remote(g);
        PoolClaim {
            pool: Arc::clone(self),
            _thread: PhantomData,
        }
    }

    /// Whether blocks wait on the remote-free list (for tests).
    #[cfg(test)]
    pub(super) fn remote_queued(&self) -> bool {
        self.remote.load(Ordering::SeqCst) != NIL
    }

    /// Whether the calling thread holds a claim on the pool.
    pub fn claimed_here(&self) -> bool {
        self.holder.load(Ordering::Relaxed) == thread_token()
    }

    /// Takes `state` until `deadline` (forever when `None`); false on timeout.
    fn acquire(&self, me: u64, deadline: Option<Instant>) -> bool {
        let mut spins = 0u32;
        loop {
            if self.holder.load(Ordering::Relaxed) == 0
                && self
                    .holder
                    .compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return true;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return false;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else if spins < 128 {
                std::thread::yield_now();
            } else {
                // Held for long (a claim): sleep until it is released (polled, so a missed
                // notification costs at most one slice).
                let s = self.sleep.lock().unwrap_or_else(|e| e.into_inner());
                self.waiters.fetch_add(1, Ordering::SeqCst);
                if self.holder.load(Ordering::SeqCst) != 0 {
                    let _ = self.freed.wait_timeout(s, PENDING_POLL);
                }
                self.waiters.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    fn unlock(&self) {
        self.holder.store(0, Ordering::Release);
        self.wake();
    }

    /// Wakes threads sleeping in `alloc_wait` or `acquire`.
    fn wake(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            drop(self.sleep.lock().unwrap_or_else(|e| e.into_inner()));
            self.freed.notify_all();
        }
    }

    /// Exclusive access to `state` for one call, draining the remote-free list.
    fn hold(&self) -> Held<'_, R> {
        let me = thread_token();
        let release = self.holder.load(Ordering::Relaxed) != me;
        if release {
            self.acquire(me, None);
        }
        let mut h = Held {
            pool: self,
            release,
        };
        self.drain_remote(h.g());
        h
    }

    /// Returns every block queued on the remote-free list to the free lists (inlined: every
    /// allocation checks the list).
    #[inline(always)]
    fn drain_remote(&self, g: &mut Inner) {
        if self.remote.load(Ordering::Relaxed) != NIL {
            self.drain_remote_list(g);
        }
    }

    /// [`Self::drain_remote`] once the list holds blocks.
    #[cold]
    #[inline(never)]
    fn drain_remote_list(&self, g: &mut Inner) {
        let mut p = self.remote.swap(NIL, Ordering::SeqCst);
        while p != NIL {
            // The swap made this thread the list's only reader; a node's entry is written
            // again only once its span is reused, after this reads it.
            let e = &self.remote_slots[p as usize];
            let next = e.next.load(Ordering::Relaxed);
            let (tag, uses) = (
                e.tag.load(Ordering::Relaxed),
                e.uses.load(Ordering::Relaxed),
            );
            self.release_in(g, p, tag, uses);
            p = next;
        }
    }

    /// Queues a freed block for the thread holding `state` (lock-free push).
    fn free_remote(&self, node: u32, tag: u8, uses: u64) {
        // The block owns its node until it is queued, so this thread alone writes its entry.
        let e = &self.remote_slots[node as usize];
        e.tag.store(tag, Ordering::Relaxed);
        e.uses.store(uses, Ordering::Relaxed);
        let mut head = self.remote.load(Ordering::Relaxed);
        loop {
            // Published by the release half of the exchange (the drain swaps the whole list
            // away, so a head seen twice is no ABA hazard: the entry still leads the list).
            e.next.store(head, Ordering::Relaxed);
            match self
                .remote
                .compare_exchange_weak(head, node, Ordering::SeqCst, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(h) => head = h,
            }
        }
        self.wake();
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

    /// [`Self::alloc_in`] when no listed span fits: reclaims pending spans, promotes other
    /// streams' spans, moves pages (in page mode), or reports the pool's state. Kept out of
    /// line so that the common path stays small.
    #[cold]
    #[inline(never)]
    fn alloc_slow(
        &self,
        g: &mut Inner,
        requested: usize,
        units: usize,
        (stream, own): (StreamId, Option<u8>),
    ) -> Result<u32> {
        // Spans kept apart from this stream's own first (no event needed), then pending spans
        // whose streams passed, then other streams' spans.
        let mut found = None;
        if let Some(t) = own.filter(|_| g.may_keep_apart()) {
            if g.consolidate(t) {
                found = g.take_cold(units, own);
            }
        }
        if found.is_none() && self.pending_count.load(Ordering::Acquire) > 0 {
            self.reclaim(g);
            found = Self::retake(g, units, own);
        }
        // Page mode: spans that cross between streams every few allocations (streams taking
        // turns on too few pages to keep a span each, as in the two-stream pair) cost an event
        // and a device-side wait, or an event recorded and queried, every time; backing this
        // stream's block from the reserve ends that for good.
        if found.is_none() && g.page_units > 0 && g.close_crossings >= CLOSE_CROSSINGS {
            g.close_crossings = 0;
            found = self.remap_take(g, units, (stream, own), true)?;
        }
        // Background moves (stream-ordered, like cudaMallocAsync): a pending span, or a span or
        // run of spans kept for other streams, that fits is handed over at once, this stream
        // ordered on the device after those streams' points, instead of moving pages for the
        // block (two page operations a page, tens of µs each on the mover) or waiting on the
        // host for the streams to pass (a promotion fails while they are busy). A point an
        // idle stream has passed adds no wait on the device.
        if found.is_none() && g.background {
            if let Some(t) = own {
                if self.adopt_pending(g, (stream, t), units)
                    || self.adopt_foreign(g, (stream, t), units)
                {
                    found = g.take_cold(units, own);
                }
            }
        }
        // With a clock that orders streams, a background pool promotes nothing: a promoted span
        // stays pending until its stream passes a point, which a stream held behind the mover
        // passes late, and meanwhile the pool maps new pages. The hand-overs above and the page
        // takes of `remap_take` serve without waiting (two-stream window: 1.14-1.20 reserved /
        // live on the H200 with promotions; 1.110 without, over the fakes, however late events
        // complete).
        let promote = !(g.background && self.clock.orders_streams());
        if found.is_none() && promote && self.promote_foreign(g, own) {
            self.reclaim(g);
            found = Self::retake(g, units, own);
            if found.is_some() {
                g.note_crossing();
            }
        }
        // Background moves: free spans kept for a stream held on the device behind a move are
        // not promoted (their point would pass only after the mover). Waiting briefly for the
        // mover, then promoting them, beats moving more pages: each move adds tens of µs of
        // mover time, and stream-alternating work would otherwise move pages every step.
        if found.is_none()
            && promote
            && g.background
            && self.held_foreign_spans(g, own)
            && self.region.settle_within(MOVER_WAIT)?
            && self.promote_foreign(g, own)
        {
            self.reclaim(g);
            found = Self::retake(g, units, own);
            if found.is_some() {
                g.note_crossing();
            }
        }
        if found.is_none() && g.page_units > 0 {
            found = self.remap_take(g, units, (stream, own), false)?;
        }
        found.ok_or_else(|| {
            let full = if g.span_room() < 3 {
                " (full: raise max_spans)"
            } else {
                ""
            };
            let table = format!(
                "; span table {} of {} entries used{full}",
                g.span_cap - g.span_room(),
                g.span_cap
            );
            Error::OutOfMemory(format!(
                "pool exhausted: requested {requested} B ({} B aligned) on stream {}; \
                 reserved {} B, in use {} B in {} blocks, free {} B, largest free block {} B, \
                 pending {} B{table}",
                units << self.shift,
                stream.0,
                self.reserved,
                g.in_use << self.shift,
                g.blocks,
                g.free_units << self.shift,
                g.largest_free() << self.shift,
                g.pending_units << self.shift
            ))
        })
    }

    /// [`Inner::take`] after spans came back to the free lists: merges them with the stream's
    /// own first where spans may have been kept apart ([`Inner::may_keep_apart`]).
    fn retake(g: &mut Inner, units: usize, own: Option<u8>) -> Option<u32> {
        if let Some(t) = own.filter(|_| g.may_keep_apart()) {
            g.consolidate(t);
        }
        g.take_cold(units, own)
    }

    /// Moves pending spans whose streams have all passed their epochs to the free lists.
    /// Queries nothing during capture.
    fn reclaim(&self, g: &mut Inner) {
        if self.clock.capturing() {
            return;
        }
        // Per stream tag: 0 unknown, 1 complete, 2 not complete (for the epoch asked first).
        let mut known: [(EventId, u8); MAX_STREAMS] = [(EventId(0), 0); MAX_STREAMS];
        let mut k = 0;
        while k < g.pending.len() {
            let p = g.pending[k];
            let mut done = true;
            for b in set_bits(p.mask) {
                let epoch = p.epochs[b];
                let c = match known[b] {
                    (e, 1) if e >= epoch => true,
                    (e, 2) if e <= epoch => false,
                    _ => {
                        let c = self.clock.is_complete(g.streams[b], epoch);
                        known[b] = (epoch, if c { 1 } else { 2 });
                        c
                    }
                };
                if !c {
                    done = false;
                    break;
                }
            }
            if done {
                g.pending.swap_remove(k);
                let size = g.nodes[p.node as usize].size;
                g.pending_units -= size;
                self.pending_count.fetch_sub(1, Ordering::AcqRel);
                g.release_cold(p.node, p.tag);
            } else {
                k += 1;
            }
        }
    }

    /// Hands stream tag `own` (stream `stream`) the smallest pending span holding `units`,
    /// ordered on the device after the points it waits for (already recorded, so no event is
    /// recorded here). Returns whether one was.
    fn adopt_pending(&self, g: &mut Inner, (stream, own): (StreamId, u8), units: usize) -> bool {
        if self.clock.capturing() || !self.stream_safe {
            return false;
        }
        let best = (0..g.pending.len())
            .filter(|&k| g.nodes[g.pending[k].node as usize].size >= units)
            .min_by_key(|&k| {
                let n = &g.nodes[g.pending[k].node as usize];
                (n.size, n.off)
            });
        let Some(k) = best else {
            return false;
        };
        let p = g.pending[k];
        for b in set_bits(p.mask) {
            if !self.clock.order_after(stream, g.streams[b], p.epochs[b]) {
                return false;
            }
        }
        g.pending.swap_remove(k);
        g.pending_units -= g.nodes[p.node as usize].size;
        self.pending_count.fetch_sub(1, Ordering::AcqRel);
        g.release_cold(p.node, own);
        g.note_handover();
        true
    }

    /// Hands stream tag `own` (stream `stream`) the best fit for `units` among the free spans
    /// kept for other streams, or else the smallest run of adjacent free spans that holds it
    /// ([`Inner::free_run_for`]): its stream is ordered on the device after a point recorded
    /// now on each giving stream ([`StreamClock::order_after`]), so neither the host nor the
    /// mover waits. Only those spans change hands; the other streams keep the rest. Returns
    /// whether any did (never during capture, or with a clock that cannot order streams).
    fn adopt_foreign(&self, g: &mut Inner, (stream, own): (StreamId, u8), units: usize) -> bool {
        if self.clock.capturing() || !self.stream_safe {
            return false;
        }
        let class = mapping(units);
        let mut best: Option<(usize, usize, u32, u8)> = None;
        for t in 1..g.index.len() as u8 {
            if t == own {
                continue;
            }
            if let Some((size, off, i)) = g.best_in(t, units, class) {
                if best.is_none_or(|b| (size, off) < (b.0, b.1)) {
                    best = Some((size, off, i, t));
                }
            }
        }
        let mut s = std::mem::take(&mut g.moves);
        s.window.clear();
        match best {
            Some((_, _, i, _)) => s.window.push(i),
            None => {
                g.address_order(&mut s.order);
                if let Some((a, b)) = g.free_run_for(&s.order, units, own) {
                    s.window.extend_from_slice(&s.order[a..=b]);
                }
            }
        }
        s.points.clear();
        let handed =
            !s.window.is_empty() && self.hand_over(g, (stream, own), &s.window, &mut s.points);
        g.moves = s;
        handed
    }

    /// [`Self::adopt_foreign`] once the spans are chosen: orders `stream` after a point on
    /// each stream that keeps one of `run` (free spans in address order), then releases them
    /// to stream tag `own`. Returns whether it could order the streams.
    fn hand_over(
        &self,
        g: &mut Inner,
        (stream, own): (StreamId, u8),
        run: &[u32],
        points: &mut Vec<(u8, StreamId, EventId)>,
    ) -> bool {
        let tags = g.foreign_tags(run, own);
        if !self.order_after_streams(g, stream, tags, points) {
            return false;
        }
        for &i in run {
            // A span merged into an earlier one of the run (its node dropped) is skipped.
            if g.nodes[i as usize].state == State::Free {
                g.unlink_free(i);
                g.release_cold(i, own);
            }
        }
        g.note_handover();
        true
    }

    /// Orders `stream` on the device after a point recorded now on each stream in `tags` (bit
    /// `t - 1` for tag `t`: one event and one device-side wait each), noting the points in
    /// `points`. False if the clock could not order one.
    fn order_after_streams(
        &self,
        g: &mut Inner,
        stream: StreamId,
        tags: u64,
        points: &mut Vec<(u8, StreamId, EventId)>,
    ) -> bool {
        for b in set_bits(tags) {
            let t = b as u8 + 1;
            let e = g.epoch_for_fresh(self.clock.as_ref(), t);
            points.push((t, g.streams[b], e));
            if !self.clock.order_after(stream, g.streams[b], e) {
                return false;
            }
        }
        true
    }

    /// Whether a stream other than `own` keeps free spans and waits on the device behind a
    /// background page move (so [`Self::promote_foreign`] passes it over).
    fn held_foreign_spans(&self, g: &Inner, own: Option<u8>) -> bool {
        (1..g.index.len() as u8).any(|t| {
            Some(t) != own
                && g.index[t as usize].fl_bitmap != 0
                && self.region.stream_waits_on_moves(g.streams[t as usize - 1])
        })
    }

    /// Makes spans reserved for other streams available to every stream once those streams
    /// pass a freshly recorded point (one event per stream). Returns whether any moved.
    fn promote_foreign(&self, g: &mut Inner, own: Option<u8>) -> bool {
        if self.clock.capturing() || !self.stream_safe {
            return false;
        }
        let mut moved = false;
        for t in 1..g.index.len() as u8 {
            if Some(t) == own || g.index[t as usize].fl_bitmap == 0 {
                continue;
            }
            // A stream held behind background page moves would keep its spans pending until
            // the mover catches up; they stay where they are, and give pages instead.
            if g.background && self.region.stream_waits_on_moves(g.streams[t as usize - 1]) {
                continue;
            }
            let epoch = g.epoch_for_fresh(self.clock.as_ref(), t);
            // Take every span of tag t out of its lists.
            let mut kept = std::mem::take(&mut g.kept);
            g.spans_of(t, &mut kept);
            for &i in &kept {
                g.unlink_free(i);
                g.nodes[i as usize].state = State::Pending;
                g.pending_units += g.nodes[i as usize].size;
                self.pending_count.fetch_add(1, Ordering::AcqRel);
                let mut epochs = [EventId(0); MAX_STREAMS];
                epochs[t as usize - 1] = epoch;
                g.pending.push(Pending {
                    node: i,
                    tag: ANY,
                    mask: 1 << (t - 1),
                    epochs,
                });
                moved = true;
            }
            g.kept = kept;
        }
        moved
    }

    /// Page mode, when no backed free span fits: places `size` units on a run of free spans
    /// usable by `own` and unbacked ranges ([`Inner::remap_plan`]), backing its unbacked pages
    /// with pages unbacked from free spans no queued work can touch, or from the region's
    /// unused reserve, and returns the used node. It stays within the footprint so far if it
    /// can, then promotes spans kept for one stream and tries again, and grows the footprint
    /// only last. `None` when even that cannot hold the block (the promoted spans may serve a
    /// later call once their streams pass). With `grow_first` it grows at once: the block on
    /// this stream's spans and unbacked ranges, backed from any-stream free spans and then the
    /// reserve, no other stream's span touched.
    #[cold]
    #[inline(never)]
    fn remap_take(
        &self,
        g: &mut Inner,
        size: usize,
        (stream, own): (StreamId, Option<u8>),
        grow_first: bool,
    ) -> Result<Option<u32>> {
        let mut s = std::mem::take(&mut g.moves);
        let taken = self.remap_take_with(g, &mut s, size, (stream, own), grow_first);
        g.moves = s;
        taken
    }

    /// [`Self::remap_take`] with its working lists `s` taken out of `g`.
    fn remap_take_with(
        &self,
        g: &mut Inner,
        s: &mut MoveScratch,
        size: usize,
        (stream, own): (StreamId, Option<u8>),
        grow_first: bool,
    ) -> Result<Option<u32>> {
        let key = (size, own.unwrap_or(ANY));
        if grow_first {
            s.points.clear();
            if !g.remap_plan(key, true, (false, false), s) {
                return Ok(None);
            }
            return self.remap_apply(g, s, size);
        }
        // With a clock that orders streams, the second try may also place the block over free
        // spans kept for other streams, the allocating stream ordered after a point on each
        // (as a hand-over): fewer pages move, and the footprint stays nearer the live bytes.
        let mut foreign = g.background
            && self.stream_safe
            && own.is_some()
            && !self.clock.capturing()
            && self.clock.orders_streams();
        loop {
            s.points.clear();
            let Some(tags) = self.remap_plan_tries(g, s, key, foreign) else {
                return Ok(None);
            };
            // The allocating stream ordered after a point on each other stream whose span the
            // window takes.
            if self.order_after_streams(g, stream, tags, &mut s.points) {
                break;
            }
            foreign = false;
        }
        self.remap_apply(g, s, size)
    }

    /// Carries out the plan in `s` (from [`Self::remap_plan_tries`] or [`Inner::remap_plan`],
    /// with the points the window ordered the allocating stream after in `s.points`): unbacks
    /// the donors' pages, backs the window's, and returns the block's node.
    fn remap_apply(&self, g: &mut Inner, s: &mut MoveScratch, size: usize) -> Result<Option<u32>> {
        // Each unbacked range splits at most two spans, and the window leaves at most three
        // nodes: with less room in the span table the move is not started.
        if g.span_room() < 2 * s.steals.len() + 3 {
            return Ok(None);
        }
        let pu = g.page_units;
        // One point recorded now on each stream whose kept span gives pages (the window's
        // points serve too).
        for &(_, _, tags) in &s.steals {
            for b in set_bits(tags) {
                let t = b as u8 + 1;
                if !s.points.iter().any(|p| p.0 == t) {
                    let e = g.epoch_for_fresh(self.clock.as_ref(), t);
                    s.points.push((t, g.streams[t as usize - 1], e));
                }
            }
        }
        // Unback the donors' pages (the region's side; the spans change below).
        s.unbacked.clear();
        let mut failed = None;
        for &(first, count, tags) in &s.steals {
            s.after.clear();
            s.after.extend(
                s.points
                    .iter()
                    .filter(|p| tags & (1 << (p.0 - 1)) != 0)
                    .map(|p| (p.1, p.2)),
            );
            match self.region.unmap_pages_after(first, count, &s.after) {
                Ok(()) => s.unbacked.push((first, count)),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        // Back the window's unbacked pages, undoing this call's maps if one fails.
        let start = g.nodes[s.window[0] as usize].off;
        let end = start + size;
        s.backed.clear();
        if failed.is_none() {
            for &k in &s.window {
                let m = g.nodes[k as usize];
                if m.state != State::Unmapped {
                    continue;
                }
                let (p0, p1) = (m.off / pu, (m.off + m.size).min(end).div_ceil(pu));
                if let Err(e) = self.region.map_pages(p0, p1 - p0) {
                    for &(q0, n) in &s.backed {
                        let _ = self.region.unmap_pages(q0, n);
                    }
                    s.backed.clear();
                    failed = Some(e);
                    break;
                }
                s.backed.push((p0, p1 - p0));
            }
        }
        let used = match failed {
            None => {
                g.remaps += 1;
                // Pages or spans kept for another stream served this one: a crossing.
                if !s.points.is_empty() {
                    g.note_crossing();
                }
                Some(g.fill_window(&s.window, size, pu))
            }
            Some(_) => None,
        };
        for &(first, count) in &s.unbacked {
            g.unback_free(first * pu, count * pu, &mut s.order);
            g.phys_free += count;
            g.mapped -= count;
            g.page_unmaps += count as u64;
        }
        for &(_, count) in &s.backed {
            g.phys_free -= count;
            g.mapped += count;
            g.page_maps += count as u64;
        }
        g.peak_mapped = g.peak_mapped.max(g.mapped);
        g.merge_unmapped_runs(&mut s.order);
        match (used, failed) {
            (Some(used), _) => {
                g.note_extent(start, size);
                Ok(Some(used))
            }
            (None, Some(e)) => Err(e),
            (None, None) => Ok(None),
        }
    }

    /// [`Self::remap_take`]'s plan into `s.window` and `s.steals`: within the footprint so far
    /// first; then with spans kept for one stream made any stream's (once a point recorded on
    /// it now has passed; no event during capture); only then growing the footprint from the
    /// reserve. In background mode spans kept for a stream give pages at the second try
    /// instead of being promoted (not during capture, when no point may be recorded): the
    /// mover unbacks them once their stream passes a point recorded now; with `foreign` the
    /// window may take them too. Returns the tags (bit `t - 1` for tag `t`) of the other
    /// streams' spans in the window, `None` if no plan serves.
    fn remap_plan_tries(
        &self,
        g: &mut Inner,
        s: &mut MoveScratch,
        key: (usize, u8),
        foreign: bool,
    ) -> Option<u64> {
        let all_tags = g.background && !self.clock.capturing();
        let (mut reach, mut promoted) = ((false, false), false);
        loop {
            if g.remap_plan(key, false, reach, s) {
                break;
            }
            if !promoted {
                promoted = true;
                if all_tags {
                    reach = (true, foreign);
                    continue;
                }
                if !g.background && self.promote_foreign(g, None) {
                    self.reclaim(g);
                    continue;
                }
            }
            if g.remap_plan(key, true, reach, s) {
                break;
            }
            return None;
        }
        Some(g.foreign_tags(&s.window, key.1))
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

impl Inner {
    /// The smallest run of two or more adjacent free spans, at least one of them kept for a
    /// stream other than `own`, holding `units` (lowest offset on ties), among `order` (every
    /// span in address order): its first and last index there. O(spans).
    fn free_run_for(&self, order: &[u32], units: usize, own: u8) -> Option<(usize, usize)> {
        // (bytes, offset, first index, last index) of the best run so far.
        let mut best: Option<(usize, usize, usize, usize)> = None;
        // The open run: its first index, bytes (0: none open), and whether a span is foreign.
        let (mut first, mut bytes, mut foreign) = (0, 0, false);
        for k in 0..=order.len() {
            let free = order
                .get(k)
                .map(|&i| self.nodes[i as usize])
                .filter(|n| n.state == State::Free);
            if let Some(n) = free {
                if bytes == 0 {
                    first = k;
                }
                bytes += n.size;
                foreign |= n.tag != ANY && n.tag != own;
                continue;
            }
            if bytes >= units && k - first >= 2 && foreign {
                let off = self.nodes[order[first] as usize].off;
                if best.is_none_or(|b| (bytes, off) < (b.0, b.1)) {
                    best = Some((bytes, off, first, k - 1));
                }
            }
            (bytes, foreign) = (0, false);
        }
        best.map(|b| (b.2, b.3))
    }

    /// The stream tags (bit `t - 1` for tag `t`) of the spans in `spans` kept for streams other
    /// than `own` (unbacked ranges are any stream's).
    fn foreign_tags(&self, spans: &[u32], own: u8) -> u64 {
        spans
            .iter()
            .map(|&i| self.nodes[i as usize].tag)
            .filter(|&t| t != ANY && t != own)
            .fold(0, |m, t| m | 1 << (t - 1))
    }

    /// Every span in address order, into `order` (cleared first; page mode's slow paths,
    /// O(spans)).
    fn address_order(&self, order: &mut Vec<u32>) {
        order.clear();
        let mut cur = self
            .nodes
            .iter()
            .position(|n| n.state != State::Unused && n.off == 0)
            .map_or(NIL, |i| i as u32);
        while cur != NIL {
            order.push(cur);
            cur = self.nodes[cur as usize].next_phys;
        }
    }

    /// Page mode's plan for `size` units on stream tag `own`: the window (a run of adjacent
    /// free spans usable by `own` and unbacked ranges, the block at its start) and the page
    /// ranges to unback for it (whole pages of any-stream free spans outside the block,
    /// smallest spans first). Without `grow`, only plans within the footprint so far: reserve
    /// pages up to the most ever backed (every reserve page with
    /// [`PoolOptions::reserve_first`]), then donors; the first window, by pages needed, that
    /// this serves. With `grow`, donors first and then any reserve page: the window needing
    /// the fewest pages (or, if the reserve cannot serve it, the first that can). Neither
    /// choice depends on the reserve's size while the footprint fits in it, so a pool sized
    /// at a run's footprint repeats that run. The plan goes to `s.window` (the window's spans)
    /// and `s.steals` (the page ranges to unback); false if no window can be served.
    fn remap_plan(
        &self,
        (size, own): (usize, u8),
        grow: bool,
        (any_tag, foreign): (bool, bool),
        s: &mut MoveScratch,
    ) -> bool {
        let pu = self.page_units;
        self.address_order(&mut s.order);
        let MoveScratch {
            order,
            window,
            windows,
            donors,
            steals,
            ..
        } = s;
        let usable = |n: &Node| match n.state {
            State::Unmapped => true,
            State::Free => foreign || compatible(n.tag, own),
            _ => false,
        };
        // (pages to map, first and last window index in `order`) for each start.
        windows.clear();
        for i in 0..order.len() {
            let first = self.nodes[order[i] as usize];
            if !usable(&first) {
                continue;
            }
            let end = first.off + size;
            let mut need = 0;
            for (j, &k) in order.iter().enumerate().skip(i) {
                let m = self.nodes[k as usize];
                if !usable(&m) {
                    break;
                }
                if m.state == State::Unmapped {
                    need += (m.off + m.size).min(end).div_ceil(pu) - m.off / pu;
                }
                if m.off + m.size >= end {
                    windows.push((need, i, j));
                    break;
                }
            }
        }
        windows.sort_unstable();
        let headroom = if self.reserve_first {
            self.phys_free
        } else {
            self.peak_mapped
                .saturating_sub(self.mapped)
                .min(self.phys_free)
        };
        let reserve = if grow { self.phys_free } else { headroom };
        for &(need, wi, wj) in windows.iter() {
            let end = self.nodes[order[wi] as usize].off + size;
            self.donor_runs(order, (wi, wj), end, any_tag, donors);
            let stealable: usize = donors.iter().map(|d| d.2).sum();
            if stealable + reserve < need {
                continue;
            }
            donors.sort_unstable();
            // Within the footprint the reserve goes first (no page to unback); growing it,
            // donors go first.
            let mut left = if grow {
                need
            } else {
                need - need.min(headroom)
            };
            steals.clear();
            for &(_, p0, pages, tags) in donors.iter() {
                if left == 0 {
                    break;
                }
                let take = pages.min(left);
                steals.push((p0 + pages - take, take, tags));
                left -= take;
            }
            window.clear();
            window.extend_from_slice(&order[wi..=wj]);
            return true;
        }
        false
    }

    /// Whole pages that free spans outside the window `order[wi..wj]` can give: runs of
    /// adjacent any-stream free spans (with `any_tag`, of every free span; spans kept for
    /// different streams do not merge, so a page may straddle several), the window's last span
    /// giving what lies past the block's `end`. Each run: (bytes of its spans, first page,
    /// pages, its spans' stream tags as a mask, bit `t - 1` for tag `t`). Without `any_tag`
    /// every run is one span (adjacent any-stream spans are always merged). Into `donors`
    /// (cleared first).
    fn donor_runs(
        &self,
        order: &[u32],
        (wi, wj): (usize, usize),
        end: usize,
        any_tag: bool,
        donors: &mut Vec<(usize, usize, usize, u64)>,
    ) {
        let pu = self.page_units;
        donors.clear();
        // The open run: (first byte, end, bytes of its spans, tag mask).
        let mut run: Option<(usize, usize, usize, u64)> = None;
        let close = |run: &mut Option<(usize, usize, usize, u64)>,
                     donors: &mut Vec<(usize, usize, usize, u64)>| {
            if let Some((from, to, bytes, tags)) = run.take() {
                let (p0, p1) = (from.div_ceil(pu), to / pu);
                if p1 > p0 {
                    donors.push((bytes, p0, p1 - p0, tags));
                }
            }
        };
        for (k, &i) in order.iter().enumerate() {
            let n = self.nodes[i as usize];
            let gives = (k < wi || k >= wj) && n.state == State::Free && (n.tag == ANY || any_tag);
            if !gives {
                close(&mut run, donors);
                continue;
            }
            let from = if k == wj { end.max(n.off) } else { n.off };
            let bit = if n.tag == ANY { 0 } else { 1u64 << (n.tag - 1) };
            match &mut run {
                Some((_, to, bytes, tags)) if *to == from => {
                    *to = n.off + n.size;
                    *bytes += n.size;
                    *tags |= bit;
                }
                _ => {
                    close(&mut run, donors);
                    run = Some((from, n.off + n.size, n.size, bit));
                }
            }
        }
        close(&mut run, donors);
    }

    /// Marks `off..off + len` (whole pages of adjacent free spans, just unbacked) unbacked;
    /// `order` is a working list.
    fn unback_free(&mut self, off: usize, len: usize, order: &mut Vec<u32>) {
        let end = off + len;
        self.address_order(order);
        order.retain(|&i| {
            let n = &self.nodes[i as usize];
            n.state == State::Free && n.off < end && off < n.off + n.size
        });
        for &i in order.iter() {
            let n = self.nodes[i as usize];
            let from = off.max(n.off);
            self.carve_unmapped(i, from, end.min(n.off + n.size) - from);
        }
    }

    /// Splits free span `i` around `off..off + len` (whole pages inside it, just unbacked):
    /// that range becomes an `Unmapped` span, what lies either side stays free with `i`'s tag.
    fn carve_unmapped(&mut self, i: u32, off: usize, len: usize) {
        let n = self.nodes[i as usize];
        self.unlink_free(i);
        let free_piece = |o: usize, size: usize, prev: u32, next: u32| Node {
            prev_phys: prev,
            next_phys: next,
            ..Node::span(o, size, n.tag, State::Free)
        };
        let mut prev = n.prev_phys;
        if off > n.off {
            let head = self.new_node(free_piece(n.off, off - n.off, n.prev_phys, i));
            if n.prev_phys != NIL {
                self.nodes[n.prev_phys as usize].next_phys = head;
            }
            self.link_free(head);
            prev = head;
        }
        let mut next = n.next_phys;
        if off + len < n.off + n.size {
            let tail_off = off + len;
            let tail = self.new_node(free_piece(tail_off, n.off + n.size - tail_off, i, next));
            if next != NIL {
                self.nodes[next as usize].prev_phys = tail;
            }
            self.link_free(tail);
            next = tail;
        }
        let node = &mut self.nodes[i as usize];
        node.off = off;
        node.size = len;
        node.prev_phys = prev;
        node.next_phys = next;
        node.state = State::Unmapped;
        node.tag = ANY;
    }

    /// Replaces the run of spans `window` (free spans and backed-for-this `Unmapped` ones,
    /// adjacent, in address order) with one used node of `size` units at the run's start;
    /// the rest of the last span stays free (the backed part of an unbacked span, free for any
    /// stream) or unbacked.
    fn fill_window(&mut self, window: &[u32], size: usize, pu: usize) -> u32 {
        let first = self.nodes[window[0] as usize];
        let last = self.nodes[window[window.len() - 1] as usize];
        let (start, end, last_end) = (first.off, first.off + size, last.off + last.size);
        for &k in window {
            if self.nodes[k as usize].state == State::Free {
                self.unlink_free(k);
            }
            self.drop_node(k);
        }
        let blank = Node::span;
        // The used node, then what is left of the last span: at most three nodes.
        let mut chain = [NIL; 3];
        let mut len = 1;
        chain[0] = self.new_node(blank(start, size, ANY, State::Used));
        let mut rest = None;
        if last_end > end {
            if last.state == State::Free {
                let r = self.new_node(blank(end, last_end - end, last.tag, State::Used));
                (chain[len], len) = (r, len + 1);
                rest = Some((r, last.tag));
            } else {
                let backed_end = end.div_ceil(pu) * pu;
                if backed_end > end {
                    let r = self.new_node(blank(end, backed_end - end, ANY, State::Used));
                    (chain[len], len) = (r, len + 1);
                    rest = Some((r, ANY));
                }
                if last_end > backed_end {
                    let u = blank(backed_end, last_end - backed_end, ANY, State::Unmapped);
                    (chain[len], len) = (self.new_node(u), len + 1);
                }
            }
        }
        let mut prev = first.prev_phys;
        for &k in &chain[..len] {
            self.nodes[k as usize].prev_phys = prev;
            if prev != NIL {
                self.nodes[prev as usize].next_phys = k;
            }
            prev = k;
        }
        self.nodes[prev as usize].next_phys = last.next_phys;
        if last.next_phys != NIL {
            self.nodes[last.next_phys as usize].prev_phys = prev;
        }
        if let Some((r, tag)) = rest {
            // Not yet linked; `release` links it, merging a free neighbour on its right.
            self.release_cold(r, tag);
        }
        chain[0]
    }

    /// Merges adjacent `Unmapped` spans (left by unbacking next to an unbacked range); `order`
    /// is a working list.
    fn merge_unmapped_runs(&mut self, order: &mut Vec<u32>) {
        self.address_order(order);
        let mut k = 0;
        while k < order.len() {
            let a = order[k];
            let mut j = k + 1;
            while self.nodes[a as usize].state == State::Unmapped
                && j < order.len()
                && self.nodes[order[j] as usize].state == State::Unmapped
            {
                let b = order[j];
                let bn = self.nodes[b as usize];
                self.nodes[a as usize].size += bn.size;
                self.nodes[a as usize].next_phys = bn.next_phys;
                if bn.next_phys != NIL {
                    self.nodes[bn.next_phys as usize].prev_phys = a;
                }
                self.drop_node(b);
                j += 1;
            }
            k = j;
        }
    }

    /// Every free span reserved for stream tag `t`, into `spans` (cleared first).
    fn spans_of(&self, t: u8, spans: &mut Vec<u32>) {
        let idx = &self.index[t as usize];
        spans.clear();
        let mut fls = idx.fl_bitmap;
        while fls != 0 {
            let fl = fls.trailing_zeros() as usize;
            fls &= fls - 1;
            let mut sls = idx.sl_bitmap[fl];
            while sls != 0 {
                let sl = sls.trailing_zeros() as usize;
                sls &= sls - 1;
                let mut cur = idx.heads[fl][sl];
                while cur != NIL {
                    spans.push(cur);
                    cur = self.nodes[cur as usize].next_free;
                }
            }
        }
    }

    /// A freshly recorded epoch on stream tag `t` (used when promoting its free spans).
    fn epoch_for_fresh(&mut self, clock: &dyn StreamClock, t: u8) -> EventId {
        let k = t as usize - 1;
        let e = clock.record(self.streams[k]);
        self.last_epoch[k] = Some(e);
        self.dirty[k] = false;
        e
    }
}

/// A live allocation in a [`FixedPool`]; it returns its bytes to the pool when dropped (on any
/// thread: on one that cannot take the pool's bookkeeping it is queued lock-free).
pub struct Block<R: Region> {
    /// One strong count on the pool (a `ManuallyDrop`, so a claimed thread's free can hand
    /// it back to the pool instead of decrementing).
    pool: ManuallyDrop<Arc<FixedPool<R>>>,
    node: u32,
    /// The owner stream's tag (`ANY` when the pool does not track streams).
    tag: u8,
    offset: usize,
    size: usize,
    requested: usize,
    stream: StreamId,
    /// Streams (bit `t - 1` for tag `t`) declared to use the block besides its own.
    uses: u64,
}
impl<R: Region> Block<R> {
    /// Offset of the first byte from the region's base (a multiple of the pool's alignment).
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Address of the first byte (`region.base() + offset`).
    pub fn addr(&self) -> usize {
        self.pool.region.base() + self.offset
    }

    /// Bytes reserved for the block (the requested size rounded up to the alignment).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Bytes the caller asked for.
    pub fn requested(&self) -> usize {
        self.requested
    }

    /// The stream that allocated (and owns) the block.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// The pool the block came from.
    pub fn pool(&self) -> &Arc<FixedPool<R>> {
        &self.pool
    }

    /// Orders `stream`'s later work after any page move still pending behind the block. Over a
    /// region that moves pages in the background, call it before enqueuing work on a stream
    /// other than the block's own (the owner stream is ordered when the block is handed out);
    /// elsewhere it does nothing.
    pub fn ready_on(&self, stream: StreamId) -> Result<()> {
        self.pool
            .region
            .order_after_moves(stream, self.offset, self.size)
    }

    /// Declares that work already enqueued on `stream` uses the block, so it is not reused
    /// until `stream` passes the point recorded when the block is freed. Call it after
    /// enqueuing the work (again after each later use); the owner stream needs no call.
    /// Fails only when the pool already tracks [`MAX_STREAMS`] other streams.
    pub fn record_use(&mut self, stream: StreamId) -> Result<()> {
        if stream == self.stream || !self.pool.stream_safe {
            return Ok(());
        }
        let t = self.pool.mark_use(stream)?;
        self.uses |= 1 << (t - 1);
        Ok(())
    }
}

impl<R: Region> std::fmt::Debug for Block<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block")
            .field("offset", &self.offset)
            .field("size", &self.size)
            .field("stream", &self.stream)
            .field("uses", &format_args!("{:#x}", self.uses))
            .finish()
    }
}

impl<R: Region> Drop for Block<R> {
    fn drop(&mut self) {
        // SAFETY: taken once, here; the field is not used again.
        let pool = unsafe { ManuallyDrop::take(&mut self.pool) };
        let me = thread_token();
        if pool.holder.load(Ordering::Relaxed) == me {
            // This thread claims the pool: no lock, and the block's strong count goes back
            // to the pool for the next allocation (no atomic).
            // SAFETY: this thread holds `state` for the life of its claim.
            let g = unsafe { &mut *pool.state.get() };
            pool.release_in(g, self.node, self.tag, self.uses);
            g.prepaid += 1;
            let _ = Arc::into_raw(pool);
            return;
        }
        if pool.holder.load(Ordering::Relaxed) == 0
            && pool
                .holder
                .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            // SAFETY: this thread now holds `state` until `unlock`.
            let g = unsafe { &mut *pool.state.get() };
            pool.drain_remote(g);
            pool.release_in(g, self.node, self.tag, self.uses);
            pool.unlock();
        } else {
            pool.free_remote(self.node, self.tag, self.uses);
        }
    }
}
