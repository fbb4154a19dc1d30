//! The handle of a live allocation.

use super::*;

/// A live allocation in a [`FixedPool`]; it returns its bytes to the pool when dropped (on any
/// thread: on one that cannot take the pool's bookkeeping it is queued lock-free).
pub struct Block<R: Region> {
    /// One strong count on the pool (a `ManuallyDrop`, so a claimed thread's free can hand
    /// it back to the pool instead of decrementing).
    pub(super) pool: ManuallyDrop<Arc<FixedPool<R>>>,
    pub(super) node: u32,
    /// The owner stream's tag (`ANY` when the pool does not track streams).
    pub(super) tag: u8,
    pub(super) offset: usize,
    pub(super) size: usize,
    pub(super) requested: usize,
    pub(super) stream: StreamId,
    /// Streams (bit `t - 1` for tag `t`) declared to use the block besides its own.
    pub(super) uses: u64,
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
