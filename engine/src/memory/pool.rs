//! The fixed pool: best fit over one region, immediate coalescing, stream-safe reuse.

use super::clock::{EventId, StreamClock, StreamId};
use super::region::Region;
use crate::error::{Error, Result};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Default block alignment in bytes.
pub const DEFAULT_ALIGN: usize = 256;

/// Longest single wait in [`FixedPool::alloc_wait`] while memory is pending on a stream
/// (completion of GPU work signals no condition variable, so it is polled).
const PENDING_POLL: Duration = Duration::from_millis(1);

/// Who may reuse a free span: `Some(s)` only stream `s` (it was freed there and work on `s`
/// may still touch it), `None` any stream.
type Tag = Option<StreamId>;

/// A point-in-time snapshot of a pool's occupancy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PoolStats {
    /// Bytes the pool manages (the region's length rounded down to the alignment).
    pub reserved: usize,
    /// Bytes held by live blocks (rounded sizes).
    pub in_use: usize,
    /// Highest `in_use` seen since the pool was built.
    pub peak_in_use: usize,
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
}

/// A freed span waiting for streams to pass recorded points.
#[derive(Debug)]
struct Pending {
    offset: usize,
    size: usize,
    /// Tag the span gets once every dependency is complete.
    tag: Tag,
    deps: Vec<(StreamId, EventId)>,
}

/// Per-stream event cache: the last recorded epoch and whether a use was declared since.
#[derive(Debug, Clone, Copy)]
struct StreamState {
    last: Option<EventId>,
    dirty: bool,
}

/// Two spans may merge unless they are reserved for different streams; the merged span keeps
/// the stricter tag (a span free for any stream may serve one stream only).
fn compatible(a: Tag, b: Tag) -> bool {
    a == b || a.is_none() || b.is_none()
}

#[derive(Debug, Default)]
struct Inner {
    /// Free spans per tag, ordered by (size, offset) for best fit.
    by_size: HashMap<Tag, BTreeSet<(usize, usize)>>,
    /// Free spans by offset: offset -> (size, tag), for coalescing.
    by_off: BTreeMap<usize, (usize, Tag)>,
    free_bytes: usize,
    in_use: usize,
    peak_in_use: usize,
    blocks: usize,
    pending_bytes: usize,
    pending: Vec<Pending>,
    streams: HashMap<StreamId, StreamState>,
}

impl Inner {
    fn remove_span(&mut self, offset: usize, size: usize, tag: Tag) {
        self.by_off.remove(&offset);
        if let Some(set) = self.by_size.get_mut(&tag) {
            set.remove(&(size, offset));
        }
        self.free_bytes -= size;
    }

    /// Adds a free span, merging it with free neighbours whose tags are compatible.
    fn insert_free(&mut self, mut offset: usize, mut size: usize, mut tag: Tag) {
        let left = self
            .by_off
            .range(..offset)
            .next_back()
            .map(|(&o, &(s, t))| (o, s, t));
        if let Some((lo, ls, lt)) = left {
            if lo + ls == offset && compatible(lt, tag) {
                self.remove_span(lo, ls, lt);
                offset = lo;
                size += ls;
                tag = tag.or(lt);
            }
        }
        if let Some(&(rs, rt)) = self.by_off.get(&(offset + size)) {
            if compatible(rt, tag) {
                self.remove_span(offset + size, rs, rt);
                size += rs;
                tag = tag.or(rt);
            }
        }
        self.by_off.insert(offset, (size, tag));
        self.by_size.entry(tag).or_default().insert((size, offset));
        self.free_bytes += size;
    }

    /// Best fit among spans usable by `stream`; removes it, returns its offset.
    fn take_best(&mut self, size: usize, stream: StreamId) -> Option<usize> {
        let fit = |tag: Tag, inner: &Inner| {
            inner
                .by_size
                .get(&tag)
                .and_then(|set| set.range((size, 0)..).next().copied())
                .map(|(s, o)| (s, o, tag))
        };
        let own = fit(Some(stream), self);
        let any = fit(None, self);
        let (span, offset, tag) = match (own, any) {
            (Some(a), Some(b)) => {
                if b.0 < a.0 {
                    b
                } else {
                    a
                }
            }
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (None, None) => return None,
        };
        self.remove_span(offset, span, tag);
        if span > size {
            self.insert_free(offset + size, span - size, tag);
        }
        Some(offset)
    }

    fn largest_free(&self) -> usize {
        self.by_size
            .values()
            .filter_map(|set| set.last().map(|&(s, _)| s))
            .max()
            .unwrap_or(0)
    }

    /// Epoch covering every declared use of `stream`: the cached one unless a use was declared
    /// since it was recorded.
    fn epoch_for(&mut self, clock: &dyn StreamClock, stream: StreamId) -> EventId {
        let state = self.streams.entry(stream).or_insert(StreamState {
            last: None,
            dirty: true,
        });
        match state.last {
            Some(e) if !state.dirty => e,
            _ => {
                let e = clock.record(stream);
                state.last = Some(e);
                state.dirty = false;
                e
            }
        }
    }
}

/// A best-fit allocator over one region reserved up front; share it as `Arc<FixedPool<R>>`.
///
/// Allocation never touches the system allocator for payload memory; exhaustion returns
/// [`Error::OutOfMemory`] stating the pool's state. A span freed on stream `s` serves `s` at
/// once; another stream gets it only after one event recorded on `s` completes (never queried
/// during capture, and only when no span already usable by that stream fits).
pub struct FixedPool<R: Region> {
    region: R,
    clock: Arc<dyn StreamClock>,
    align: usize,
    reserved: usize,
    inner: Mutex<Inner>,
    freed: Condvar,
    waiters: AtomicUsize,
    pending_count: AtomicUsize,
}

impl<R: Region> std::fmt::Debug for FixedPool<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FixedPool")
            .field("base", &self.region.base())
            .field("align", &self.align)
            .field("stats", &self.stats())
            .finish()
    }
}

impl<R: Region> FixedPool<R> {
    /// Builds a pool over `region` with [`DEFAULT_ALIGN`] alignment.
    pub fn new(region: R, clock: Arc<dyn StreamClock>) -> Result<Arc<Self>> {
        Self::with_alignment(region, clock, DEFAULT_ALIGN)
    }

    /// Builds a pool whose blocks start at multiples of `align` (a power of two dividing the
    /// region's base address).
    pub fn with_alignment(
        region: R,
        clock: Arc<dyn StreamClock>,
        align: usize,
    ) -> Result<Arc<Self>> {
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
        let reserved = region.len() / align * align;
        let mut inner = Inner::default();
        if reserved > 0 {
            inner.insert_free(0, reserved, None);
        }
        Ok(Arc::new(FixedPool {
            region,
            clock,
            align,
            reserved,
            inner: Mutex::new(inner),
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

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Allocates `size` bytes (rounded up to the alignment; 0 counts as one unit) for `stream`.
    pub fn alloc(self: &Arc<Self>, size: usize, stream: StreamId) -> Result<Block<R>> {
        let rounded = self.round(size)?;
        let mut g = self.lock();
        self.alloc_locked(&mut g, size, rounded, stream)
    }

    /// Like [`alloc`](Self::alloc), but waits up to `timeout` for frees (or streams) to make
    /// room before returning the out-of-memory error.
    pub fn alloc_wait(
        self: &Arc<Self>,
        size: usize,
        stream: StreamId,
        timeout: Duration,
    ) -> Result<Block<R>> {
        let rounded = self.round(size)?;
        let deadline = Instant::now().checked_add(timeout);
        let mut g = self.lock();
        loop {
            let err = match self.alloc_locked(&mut g, size, rounded, stream) {
                Ok(b) => return Ok(b),
                Err(e) => e,
            };
            if rounded > self.reserved {
                return Err(err);
            }
            let now = Instant::now();
            let remaining = match deadline {
                Some(d) if d <= now => return Err(err),
                Some(d) => d - now,
                None => Duration::MAX,
            };
            let slice = if self.pending_count.load(Ordering::Acquire) > 0
                || Self::has_foreign(&g, stream)
            {
                remaining.min(PENDING_POLL)
            } else {
                remaining
            };
            self.waiters.fetch_add(1, Ordering::AcqRel);
            g = match self.freed.wait_timeout(g, slice) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
            self.waiters.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// A snapshot of the pool's occupancy.
    pub fn stats(&self) -> PoolStats {
        let g = self.lock();
        let largest_free = g.largest_free();
        PoolStats {
            reserved: self.reserved,
            in_use: g.in_use,
            peak_in_use: g.peak_in_use,
            blocks: g.blocks,
            free_blocks: g.by_off.len(),
            free_bytes: g.free_bytes,
            pending_bytes: g.pending_bytes,
            largest_free,
            fragmentation: if g.free_bytes == 0 {
                0.0
            } else {
                1.0 - largest_free as f64 / g.free_bytes as f64
            },
        }
    }

    fn round(&self, size: usize) -> Result<usize> {
        let units = size.max(1).div_ceil(self.align);
        units.checked_mul(self.align).ok_or_else(|| {
            Error::OutOfMemory(format!(
                "requested {size} B, more than the address space; pool reserved {} B",
                self.reserved
            ))
        })
    }

    fn has_foreign(g: &Inner, stream: StreamId) -> bool {
        g.by_size
            .iter()
            .any(|(t, set)| matches!(t, Some(s) if *s != stream) && !set.is_empty())
    }

    fn alloc_locked(
        self: &Arc<Self>,
        g: &mut Inner,
        requested: usize,
        rounded: usize,
        stream: StreamId,
    ) -> Result<Block<R>> {
        let mut found = g.take_best(rounded, stream);
        if found.is_none() && self.pending_count.load(Ordering::Acquire) > 0 {
            self.reclaim(g);
            found = g.take_best(rounded, stream);
        }
        if found.is_none() && self.promote_foreign(g, stream) {
            self.reclaim(g);
            found = g.take_best(rounded, stream);
        }
        match found {
            Some(offset) => {
                g.in_use += rounded;
                g.blocks += 1;
                g.peak_in_use = g.peak_in_use.max(g.in_use);
                Ok(Block {
                    pool: Arc::clone(self),
                    offset,
                    size: rounded,
                    requested,
                    stream,
                    uses: Vec::new(),
                })
            }
            None => Err(Error::OutOfMemory(format!(
                "pool exhausted: requested {requested} B ({rounded} B aligned) on stream {}; \
                 reserved {} B, in use {} B in {} blocks, free {} B, largest free block {} B, \
                 pending {} B",
                stream.0,
                self.reserved,
                g.in_use,
                g.blocks,
                g.free_bytes,
                g.largest_free(),
                g.pending_bytes
            ))),
        }
    }

    /// Moves pending spans whose streams have all passed their epochs to the free lists.
    /// Queries nothing during capture.
    fn reclaim(&self, g: &mut Inner) {
        if self.clock.capturing() {
            return;
        }
        let mut known: Vec<((StreamId, EventId), bool)> = Vec::new();
        let pending = std::mem::take(&mut g.pending);
        let mut kept = Vec::with_capacity(pending.len());
        for p in pending {
            let done = p.deps.iter().all(|&dep| {
                if let Some(&(_, c)) = known.iter().find(|(k, _)| *k == dep) {
                    return c;
                }
                let c = self.clock.is_complete(dep.0, dep.1);
                known.push((dep, c));
                c
            });
            if done {
                g.pending_bytes -= p.size;
                self.pending_count.fetch_sub(1, Ordering::AcqRel);
                g.insert_free(p.offset, p.size, p.tag);
            } else {
                kept.push(p);
            }
        }
        g.pending = kept;
    }

    /// Makes spans reserved for other streams available to every stream once those streams
    /// pass a freshly recorded point (one event per stream). Returns whether any moved.
    fn promote_foreign(&self, g: &mut Inner, stream: StreamId) -> bool {
        if self.clock.capturing() {
            return false;
        }
        let foreign: Vec<(usize, usize, StreamId)> = g
            .by_off
            .iter()
            .filter_map(|(&o, &(s, t))| match t {
                Some(t) if t != stream => Some((o, s, t)),
                _ => None,
            })
            .collect();
        if foreign.is_empty() {
            return false;
        }
        let mut epochs: Vec<(StreamId, EventId)> = Vec::new();
        for (offset, size, t) in foreign {
            let e = match epochs.iter().find(|(s, _)| *s == t) {
                Some(&(_, e)) => e,
                None => {
                    let e = self.clock.record(t);
                    epochs.push((t, e));
                    e
                }
            };
            g.remove_span(offset, size, Some(t));
            g.pending_bytes += size;
            self.pending_count.fetch_add(1, Ordering::AcqRel);
            g.pending.push(Pending {
                offset,
                size,
                tag: None,
                deps: vec![(t, e)],
            });
        }
        true
    }

    fn mark_use(&self, stream: StreamId) {
        let mut g = self.lock();
        g.streams
            .entry(stream)
            .and_modify(|s| s.dirty = true)
            .or_insert(StreamState {
                last: None,
                dirty: true,
            });
    }

    fn release(&self, offset: usize, size: usize, stream: StreamId, uses: &[StreamId]) {
        {
            let mut g = self.lock();
            g.in_use -= size;
            g.blocks -= 1;
            if uses.is_empty() {
                g.insert_free(offset, size, Some(stream));
            } else {
                let deps = uses
                    .iter()
                    .map(|&s| (s, g.epoch_for(self.clock.as_ref(), s)))
                    .collect();
                g.pending_bytes += size;
                self.pending_count.fetch_add(1, Ordering::AcqRel);
                g.pending.push(Pending {
                    offset,
                    size,
                    tag: Some(stream),
                    deps,
                });
            }
        }
        if self.waiters.load(Ordering::Acquire) > 0 {
            self.freed.notify_all();
        }
    }
}

/// A live allocation in a [`FixedPool`]; it returns its bytes to the pool when dropped.
pub struct Block<R: Region> {
    pool: Arc<FixedPool<R>>,
    offset: usize,
    size: usize,
    requested: usize,
    stream: StreamId,
    uses: Vec<StreamId>,
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

    /// Declares that work already enqueued on `stream` uses the block, so it is not reused
    /// until `stream` passes the point recorded when the block is freed. Call it after
    /// enqueuing the work (again after each later use); the owner stream needs no call.
    pub fn record_use(&mut self, stream: StreamId) {
        if stream == self.stream {
            return;
        }
        if !self.uses.contains(&stream) {
            self.uses.push(stream);
        }
        self.pool.mark_use(stream);
    }
}

impl<R: Region> std::fmt::Debug for Block<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block")
            .field("offset", &self.offset)
            .field("size", &self.size)
            .field("stream", &self.stream)
            .field("uses", &self.uses)
            .finish()
    }
}

impl<R: Region> Drop for Block<R> {
    fn drop(&mut self) {
        let uses = std::mem::take(&mut self.uses);
        self.pool
            .release(self.offset, self.size, self.stream, &uses);
    }
}
