//! The span bookkeeping: nodes, the size-class free lists of each stream tag, and best fit.

use super::*;
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
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
pub(super) struct Node {
    pub(super) off: usize,
    pub(super) size: usize,
    pub(super) prev_phys: u32,
    pub(super) next_phys: u32,
    pub(super) prev_free: u32,
    pub(super) next_free: u32,
    pub(super) tag: u8,
    pub(super) state: State,
    /// Size class of the free list the span is linked in (`fl << SL_BITS | sl`); it may lag
    /// behind the size for the one stale span of a tag (see [`FreeIndex::stale`]).
    pub(super) class: u16,
}

impl Node {
    /// A span at `off..off + size` linked to no neighbour or list yet.
    pub(super) fn span(off: usize, size: usize, tag: u8, state: State) -> Node {
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
pub(super) struct FreeIndex {
    /// A span linked in a class below its size's (NIL: none). It grew by merging while its
    /// list was the highest non-empty one, so it stays there instead of moving up: with no
    /// span above it the best fit is unchanged. Linking a span above it moves it first.
    pub(super) stale: u32,
    pub(super) fl_bitmap: u64,
    pub(super) sl_bitmap: [u32; FL],
    pub(super) heads: [[u32; SL]; FL],
}

impl FreeIndex {
    pub(super) fn new() -> Self {
        FreeIndex {
            stale: NIL,
            fl_bitmap: 0,
            sl_bitmap: [0; FL],
            heads: [[NIL; SL]; FL],
        }
    }

    /// The highest non-empty class.
    #[inline(always)]
    pub(super) fn highest_class(&self) -> Option<u16> {
        if self.fl_bitmap == 0 {
            return None;
        }
        let f = 63 - self.fl_bitmap.leading_zeros() as usize;
        let s = 31 - self.sl_bitmap[f].leading_zeros() as usize;
        Some(class_of(f, s))
    }

    /// First non-empty class at or above `(fl, sl)`.
    #[inline]
    pub(super) fn find_from(&self, fl: usize, sl: usize) -> Option<(usize, usize)> {
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
pub(super) fn mapping(size: usize) -> (usize, usize) {
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
pub(super) fn class_of(fl: usize, sl: usize) -> u16 {
    ((fl << SL_BITS) | sl) as u16
}

/// The class after `(fl, sl)`.
#[inline]
pub(super) fn next_class(fl: usize, sl: usize) -> (usize, usize) {
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
pub(super) fn compatible(a: u8, b: u8) -> bool {
    a == b || a == ANY || b == ANY
}

#[inline]
pub(super) fn stricter(a: u8, b: u8) -> u8 {
    if a == ANY {
        b
    } else {
        a
    }
}

/// A freed span waiting for streams to pass recorded points.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pending {
    pub(super) node: u32,
    /// Tag the span gets once every dependency is complete.
    pub(super) tag: u8,
    /// Streams (bit `t - 1` for tag `t`) the span waits for, and the epoch on each.
    pub(super) mask: u64,
    pub(super) epochs: [EventId; MAX_STREAMS],
}

/// A vector indexed by numbers the pool hands out itself: node numbers (from
/// [`Table::push`] via `Inner::new_node`) and stream tags (from `Inner::tag_of`). Neither
/// table ever shrinks, so every number the pool stores (list heads, neighbour and free links,
/// a block's node and tag) is in bounds: indexing skips the bounds check, which the allocation
/// and free paths would otherwise pay a dozen times (checked in debug builds, which the tests
/// run).
pub(super) struct Table<T>(Vec<T>);

impl<T> Table<T> {
    pub(super) fn with_capacity(n: usize) -> Self {
        Table(Vec::with_capacity(n))
    }

    /// Appends `item`; its number.
    #[inline]
    pub(super) fn push(&mut self, item: T) -> u32 {
        self.0.push(item);
        (self.0.len() - 1) as u32
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    pub(super) fn get(&self, i: usize) -> Option<&T> {
        self.0.get(i)
    }

    pub(super) fn iter(&self) -> std::slice::Iter<'_, T> {
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

pub(super) struct Inner {
    pub(super) nodes: Table<Node>,
    pub(super) spare: Vec<u32>,
    /// Entries `nodes` was reserved with ([`PoolOptions::max_spans`], at most the region's
    /// units): it never grows past them, so no list of node numbers outgrows its reservation.
    pub(super) span_cap: usize,
    /// Per tag: its free lists (index 0 = any stream).
    pub(super) index: Table<FreeIndex>,
    /// Registered streams; stream `streams[i]` has tag `i + 1`.
    pub(super) streams: Vec<StreamId>,
    /// Per registered stream: the last recorded epoch, and whether a use was declared since.
    pub(super) last_epoch: Vec<Option<EventId>>,
    pub(super) dirty: Vec<bool>,
    /// Per registered stream: retired (its tag may go to a new stream once nothing waits on it).
    pub(super) retired: Vec<bool>,
    /// A fixed region with more than one registered stream not retired. A span freed for one
    /// stream then stays apart from its any-stream neighbours, so that the other streams keep
    /// them with no event recorded; [`Inner::consolidate`] merges them when that stream's
    /// allocation needs it. Page mode never keeps them apart: it stays within its footprint by
    /// promoting spans, and spans kept apart there fragment the backed bytes into more page
    /// moves (`examples/stream_counts`: 10.5k against 5.0k pages a million two-stream window
    /// steps).
    pub(super) multi: bool,
    pub(super) pending: Vec<Pending>,
    pub(super) free_units: usize,
    pub(super) free_spans: usize,
    pub(super) in_use: usize,
    pub(super) peak_in_use: usize,
    pub(super) high_water: usize,
    pub(super) low_water: usize,
    pub(super) units: usize,
    /// Blocks under this many units come from the top of their span (0: none).
    pub(super) small_units: usize,
    pub(super) blocks: usize,
    pub(super) pending_units: usize,
    /// Strong counts on the pool handed back by blocks freed under a claim, for the claim's
    /// next allocations (released when the claim ends).
    pub(super) prepaid: usize,
    /// Nesting depth of the claim on this pool (0: not claimed).
    pub(super) claims: usize,
    /// Units per page of a remappable region (0: a fixed region).
    pub(super) page_units: usize,
    /// Physical pages mapped nowhere, the most ever mapped at once, and those mapped now.
    pub(super) phys_free: usize,
    pub(super) peak_mapped: usize,
    pub(super) mapped: usize,
    pub(super) remaps: u64,
    /// Pages backed and unbacked so far (each costs a driver call's share).
    pub(super) page_maps: u64,
    pub(super) page_unmaps: u64,
    /// [`PoolOptions::reserve_first`].
    pub(super) reserve_first: bool,
    /// Free spans handed from one stream to another ([`FixedPool::adopt_foreign`]).
    pub(super) adoptions: u64,
    /// Allocations so far, the count at the last crossing of a span between streams, and how
    /// many crossings in a row came within [`CLOSE_CROSSING`] allocations of the one before
    /// ([`Self::note_crossing`]).
    pub(super) allocs: u64,
    pub(super) crossing_at: u64,
    pub(super) close_crossings: u32,
    /// The region moves pages in the background ([`Region::moves_in_background`]): free spans
    /// kept for a stream give pages too, unbacked once that stream passes a point recorded
    /// when they are taken, so nothing waits for streams to be promoted.
    pub(super) background: bool,
    /// Working lists of page moves and hand-overs (taken out while one runs).
    pub(super) moves: MoveScratch,
    /// The free spans of one stream tag ([`Inner::spans_of`]), reused between calls.
    pub(super) kept: Vec<u32>,
}

impl Inner {
    pub(super) fn new(
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
    pub(super) fn tag_of(&mut self, stream: StreamId) -> Result<u8> {
        if stream == StreamId::DEFAULT {
            return Ok(1);
        }
        self.tag_of_other(stream)
    }

    /// [`Self::tag_of`] for a stream other than the default one (kept out of the default
    /// stream's path).
    #[inline(never)]
    pub(super) fn tag_of_other(&mut self, stream: StreamId) -> Result<u8> {
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
    pub(super) fn note_streams(&mut self) {
        self.multi = self.page_units == 0 && self.retired.iter().filter(|&&r| !r).count() > 1;
    }

    /// Whether spans may have been kept apart ([`Self::multi`] was ever set): a fixed region
    /// that registered a second stream.
    pub(super) fn may_keep_apart(&self) -> bool {
        self.page_units == 0 && self.streams.len() > 1
    }

    /// Merges the free spans reserved for stream tag `t` with their any-stream neighbours (kept
    /// apart while several streams are in use), when `t`'s allocation finds no span that fits:
    /// no event is needed for that stream's own use. Returns whether any merged. O(spans of `t`).
    pub(super) fn consolidate(&mut self, t: u8) -> bool {
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
    pub(super) fn new_node(&mut self, node: Node) -> u32 {
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
    pub(super) fn span_room(&self) -> usize {
        self.spare.len() + (self.span_cap - self.nodes.len())
    }

    /// Whether the span table is full: a split (one more node) must fail.
    #[inline(always)]
    pub(super) fn span_table_full(&self) -> bool {
        self.spare.is_empty() && self.nodes.len() >= self.span_cap
    }

    #[inline]
    pub(super) fn drop_node(&mut self, i: u32) {
        self.nodes[i as usize].state = State::Unused;
        self.spare.push(i);
    }

    #[inline(always)]
    pub(super) fn link_free(&mut self, i: u32) {
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
    pub(super) fn fix_stale(&mut self, tag: u8) {
        let s = self.index[tag as usize].stale;
        self.unlink_free(s);
        self.link_free(s);
    }

    #[inline(always)]
    pub(super) fn unlink_free(&mut self, i: u32) {
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
    pub(super) fn scan(
        &self,
        tag: u8,
        fl: usize,
        sl: usize,
        size: usize,
    ) -> Option<(usize, usize, u32)> {
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
    pub(super) fn best_in(
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
    pub(super) fn take(&mut self, size: usize, own: Option<u8>) -> Option<u32> {
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
    pub(super) fn note_extent(&mut self, off: usize, size: usize) {
        if size < self.small_units {
            self.note_top_extent(off);
        } else {
            self.note_bottom_extent(off + size);
        }
    }

    /// [`Self::note_extent`] for a small block (carved from the top) starting at `off`.
    #[inline(always)]
    pub(super) fn note_top_extent(&mut self, off: usize) {
        if off >= self.high_water {
            self.low_water = self.low_water.min(off);
        }
    }

    /// [`Self::note_extent`] for a block from the bottom that ends at `end`.
    #[inline(always)]
    pub(super) fn note_bottom_extent(&mut self, end: usize) {
        if end <= self.low_water {
            self.high_water = self.high_water.max(end);
        }
    }

    /// Gives free node `i` a new size and tag, moving it between lists only when its size
    /// class or tag changes (and not when it grows as the highest span of its tag: it then
    /// stays listed below its size as the tag's stale span).
    #[inline(always)]
    pub(super) fn resize_free(&mut self, i: u32, size: usize, tag: u8) {
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
    pub(super) fn release(&mut self, i: u32, tag: u8) {
        self.release_with(i, tag, !self.multi)
    }

    /// [`Self::release`], merging any-stream neighbours into a span reserved for one stream
    /// (and the reverse) when `absorb_any`.
    #[inline(always)]
    pub(super) fn release_with(&mut self, i: u32, tag: u8, absorb_any: bool) {
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
    pub(super) fn note_handover(&mut self) {
        self.adoptions += 1;
        self.note_crossing();
    }

    /// Notes that a span kept for one stream served another (handed over, or promoted and
    /// taken back at once), and whether it came within [`CLOSE_CROSSING`] allocations of the
    /// previous such crossing.
    pub(super) fn note_crossing(&mut self) {
        if self.allocs.wrapping_sub(self.crossing_at) <= CLOSE_CROSSING {
            self.close_crossings += 1;
        } else {
            self.close_crossings = 0;
        }
        self.crossing_at = self.allocs;
    }

    /// [`Self::take`] out of line, for the slow paths (the allocation path inlines it).
    #[inline(never)]
    pub(super) fn take_cold(&mut self, size: usize, own: Option<u8>) -> Option<u32> {
        self.take(size, own)
    }

    /// [`Self::release`] out of line, for the slow paths (the free path inlines it).
    #[inline(never)]
    pub(super) fn release_cold(&mut self, i: u32, tag: u8) {
        self.release(i, tag)
    }

    pub(super) fn largest_free(&self) -> usize {
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
    pub(super) fn epoch_for(&mut self, clock: &dyn StreamClock, t: u8) -> EventId {
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
