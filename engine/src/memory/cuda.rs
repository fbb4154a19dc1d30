//! CUDA memory for the pools: a device region (one cudaMalloc at start-up), a pinned host
//! region (one cuMemHostAlloc), and a [`StreamClock`] over CUDA events.
//!
//! Raw calls go through cudarc's `driver::result`/`sys` layer; these types are the RAII
//! wrappers that free what they took, so the pool above never sees a CUDA call.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream};

use super::clock::{EventId, StreamClock, StreamId};
use super::region::Region;
use crate::error::{Error, Result};

fn cuda_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::OutOfMemory(format!("{what}: {e}"))
}

/// Device memory taken with one cudaMalloc (cuMemAlloc) and freed when dropped.
pub struct DeviceRegion {
    ctx: Arc<CudaContext>,
    ptr: sys::CUdeviceptr,
    len: usize,
}

impl DeviceRegion {
    /// Reserves `len` bytes of device memory on `ctx`'s device.
    pub fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self> {
        ctx.bind_to_thread()
            .map_err(|e| cuda_err("cannot bind the CUDA context", e))?;
        // SAFETY: a plain allocation; the pointer is freed exactly once, in Drop.
        let ptr = unsafe { result::malloc_sync(len.max(1)) }
            .map_err(|e| cuda_err(&format!("cudaMalloc of {len} B failed"), e))?;
        Ok(DeviceRegion {
            ctx: Arc::clone(ctx),
            ptr,
            len,
        })
    }

    /// The device pointer of the first byte.
    pub fn device_ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }
}

impl Region for DeviceRegion {
    fn base(&self) -> usize {
        self.ptr as usize
    }

    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for DeviceRegion {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `ptr` came from malloc_sync and is freed only here.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// Page-locked host memory (cuMemHostAlloc), so copies to and from the device run as DMA.
pub struct PinnedRegion {
    ctx: Arc<CudaContext>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the region is a plain byte range owned by this value; the pool hands out disjoint
// blocks of it and never dereferences it.
unsafe impl Send for PinnedRegion {}
// SAFETY: as above; shared access only reads the base address and length.
unsafe impl Sync for PinnedRegion {}

impl PinnedRegion {
    /// Reserves `len` bytes of pinned host memory.
    pub fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self> {
        ctx.bind_to_thread()
            .map_err(|e| cuda_err("cannot bind the CUDA context", e))?;
        // SAFETY: a plain allocation, freed exactly once in Drop.
        let ptr = unsafe { result::malloc_host(len.max(1), 0) }
            .map_err(|e| cuda_err(&format!("cuMemHostAlloc of {len} B failed"), e))?;
        Ok(PinnedRegion {
            ctx: Arc::clone(ctx),
            ptr: ptr.cast(),
            len,
        })
    }

    /// Pointer to the first byte, valid for `len()` bytes while the region lives.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Region for PinnedRegion {
    fn base(&self) -> usize {
        self.ptr as usize
    }

    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for PinnedRegion {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `ptr` came from malloc_host and is freed only here.
            let _ = unsafe { result::free_host(self.ptr.cast()) };
        }
    }
}

/// Events recorded on one stream, oldest first.
struct StreamEvents {
    id: StreamId,
    stream: Arc<CudaStream>,
    next_epoch: u64,
    completed: u64,
    inflight: VecDeque<(u64, CudaEvent)>,
    spare: Vec<CudaEvent>,
}

/// A [`StreamClock`] over CUDA streams: each recorded point is one CUDA event, recycled once
/// it completes. Errors are handled conservatively: a failed record synchronizes the stream,
/// a failed query reports "not yet".
pub struct CudaClock {
    ctx: Arc<CudaContext>,
    streams: Mutex<Vec<StreamEvents>>,
    capturing: AtomicBool,
}

impl CudaClock {
    /// A clock for streams of `ctx`; register each stream with [`add_stream`](Self::add_stream).
    pub fn new(ctx: &Arc<CudaContext>) -> Arc<Self> {
        Arc::new(CudaClock {
            ctx: Arc::clone(ctx),
            streams: Mutex::new(Vec::new()),
            capturing: AtomicBool::new(false),
        })
    }

    /// Maps pool stream `id` to the CUDA stream `stream`.
    pub fn add_stream(&self, id: StreamId, stream: Arc<CudaStream>) {
        let mut g = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        g.retain(|s| s.id != id);
        g.push(StreamEvents {
            id,
            stream,
            next_epoch: 0,
            completed: 0,
            inflight: VecDeque::new(),
            spare: Vec::new(),
        });
    }

    /// Forgets stream `id` (its work complete, its owner gone): drops the stream handle and
    /// its events; points asked about it later count as passed.
    pub fn remove_stream(&self, id: StreamId) {
        let mut g = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        g.retain(|s| s.id != id);
    }

    /// Marks a CUDA graph capture as in progress (no events are queried until it ends).
    pub fn set_capturing(&self, on: bool) {
        self.capturing.store(on, Ordering::Release);
    }
}

impl StreamClock for CudaClock {
    fn record(&self, stream: StreamId) -> EventId {
        let mut g = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        let Some(s) = g.iter_mut().find(|s| s.id == stream) else {
            // An unknown stream has no work we can wait for: its point is passed at once.
            return EventId(0);
        };
        s.next_epoch += 1;
        let epoch = s.next_epoch;
        let event = match s.spare.pop() {
            Some(e) => Ok(e),
            None => self.ctx.new_event(None),
        };
        match event.and_then(|e| e.record(&s.stream).map(|_| e)) {
            Ok(e) => s.inflight.push_back((epoch, e)),
            Err(_) => {
                // Cannot record: wait for the stream now, so the point is certainly passed.
                let _ = s.stream.synchronize();
                s.completed = epoch;
            }
        }
        EventId(epoch)
    }

    fn is_complete(&self, stream: StreamId, epoch: EventId) -> bool {
        let mut g = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        let Some(s) = g.iter_mut().find(|s| s.id == stream) else {
            return true;
        };
        while s.completed < epoch.0 {
            let Some((e, ev)) = s.inflight.front() else {
                break;
            };
            let e = *e;
            match ev.try_is_complete() {
                Ok(true) => {
                    s.completed = e;
                    if let Some((_, ev)) = s.inflight.pop_front() {
                        s.spare.push(ev);
                    }
                }
                _ => break,
            }
        }
        s.completed >= epoch.0
    }

    fn capturing(&self) -> bool {
        self.capturing.load(Ordering::Acquire)
    }
}
