//! Who holds a pool's bookkeeping: one call at a time, or a thread's claim, with other threads'
//! frees queued on a lock-free remote list.

use super::*;

/// This thread's token: never 0, unique for the life of the process (not reused when a thread
/// exits, unlike a thread-local's address). Inlined: every allocation and free reads it.
#[inline]
pub(super) fn thread_token() -> u64 {
    thread_local! {
        static TOKEN: Cell<u64> = const { Cell::new(0) };
    }
    #[cold]
    #[inline(never)]
    pub(super) fn first(t: &Cell<u64>) -> u64 {
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
pub(super) struct RemoteSlot {
    /// The next queued node (`NIL`: the last).
    pub(super) next: AtomicU32,
    pub(super) tag: AtomicU8,
    pub(super) uses: AtomicU64,
}

/// Exclusive access to a pool's bookkeeping for one call (or for the life of a claim).
pub(super) struct Held<'a, R: Region> {
    pub(super) pool: &'a FixedPool<R>,
    /// Whether dropping this releases the state (false inside a claim).
    pub(super) release: bool,
}

impl<R: Region> Held<'_, R> {
    /// The bookkeeping.
    pub(super) fn g(&mut self) -> &mut Inner {
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
    pub(super) pool: Arc<FixedPool<R>>,
    pub(super) _thread: PhantomData<*const ()>,
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
    pub(in crate::memory) fn remote_queued(&self) -> bool {
        self.remote.load(Ordering::SeqCst) != NIL
    }

    /// Whether the calling thread holds a claim on the pool.
    pub fn claimed_here(&self) -> bool {
        self.holder.load(Ordering::Relaxed) == thread_token()
    }

    /// Takes `state` until `deadline` (forever when `None`); false on timeout.
    pub(super) fn acquire(&self, me: u64, deadline: Option<Instant>) -> bool {
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

    pub(super) fn unlock(&self) {
        self.holder.store(0, Ordering::Release);
        self.wake();
    }

    /// Wakes threads sleeping in `alloc_wait` or `acquire`.
    pub(super) fn wake(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            drop(self.sleep.lock().unwrap_or_else(|e| e.into_inner()));
            self.freed.notify_all();
        }
    }

    /// Exclusive access to `state` for one call, draining the remote-free list.
    pub(super) fn hold(&self) -> Held<'_, R> {
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
    pub(super) fn drain_remote(&self, g: &mut Inner) {
        if self.remote.load(Ordering::Relaxed) != NIL {
            self.drain_remote_list(g);
        }
    }

    /// [`Self::drain_remote`] once the list holds blocks.
    #[cold]
    #[inline(never)]
    pub(super) fn drain_remote_list(&self, g: &mut Inner) {
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
    pub(super) fn free_remote(&self, node: u32, tag: u8, uses: u64) {
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
}
