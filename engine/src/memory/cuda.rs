//! CUDA memory for the pools: a device region (one cudaMalloc at start-up), a paged device
//! region (a reserved virtual range whose physical pages, all made at start-up, are mapped and
//! unmapped at run time through CUDA's virtual memory management API), a pinned host region
//! (one cuMemHostAlloc), and a [`StreamClock`] over CUDA events.
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

mod background;
pub use background::{BackgroundPagedRegion, MovesPaused};

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

/// Which pages of a [`DevicePagedRegion`] are backed, and by what; and the physical pages
/// not mapped anywhere.
struct PageTable {
    /// One entry per region page: the physical page mapped there, if any.
    mapped: Vec<Option<sys::CUmemGenericAllocationHandle>>,
    /// Physical pages mapped nowhere (a stack).
    free: Vec<sys::CUmemGenericAllocationHandle>,
}

/// Device memory whose physical footprint can follow what is live: a reserved virtual range
/// (cuMemAddressReserve) and a fixed set of physical pages (cuMemCreate, all made at start-up)
/// that [`Region::map_pages`]/[`Region::unmap_pages`] move between places in it.
pub struct DevicePagedRegion {
    ctx: Arc<CudaContext>,
    /// Device ordinal, for the access descriptor.
    device: std::ffi::c_int,
    /// First byte of the reserved range.
    base: sys::CUdeviceptr,
    /// Reserved length, a multiple of `page`.
    len: usize,
    /// Page size: a power-of-two multiple of the device's minimum allocation granularity.
    page: usize,
    /// Physical pages created (mapped or free).
    handles: usize,
    table: Mutex<PageTable>,
    /// A second reserved range where every physical page stays mapped for good
    /// ([`keep_home_mappings`](Self::keep_home_mappings)): its first byte and length.
    home: Option<(sys::CUdeviceptr, usize)>,
}

// Every field is Send + Sync already (the handles are u64, the table sits behind a Mutex), so
// no unsafe impl is needed; this checks it stays so.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<DevicePagedRegion>()
};

impl DevicePagedRegion {
    /// Reserves `address_bytes` (rounded up to the page) of virtual device address space on
    /// `ctx`'s device and creates `ceil(physical_bytes / page)` physical pages, none mapped;
    /// pages of the device's minimum allocation granularity (2 MiB on current GPUs).
    pub fn new(
        ctx: &Arc<CudaContext>,
        address_bytes: usize,
        physical_bytes: usize,
    ) -> Result<Self> {
        Self::with_page(ctx, address_bytes, physical_bytes, None)
    }

    /// [`new`](Self::new) with pages of `page` bytes (a power-of-two multiple of the
    /// granularity; `None`: the granularity). The driver charges each move per mapped handle,
    /// not per byte, so larger pages move the same bytes in fewer calls, for a coarser
    /// footprint (docs/benchmarks.md, sixteenth session: 4 MiB pages halve the window's cost).
    pub fn with_page(
        ctx: &Arc<CudaContext>,
        address_bytes: usize,
        physical_bytes: usize,
        page: Option<usize>,
    ) -> Result<Self> {
        ctx.bind_to_thread()
            .map_err(|e| cuda_err("cannot bind the CUDA context", e))?;
        let device = std::ffi::c_int::try_from(ctx.ordinal()).map_err(|_| {
            Error::OutOfMemory(format!("device ordinal {} out of range", ctx.ordinal()))
        })?;
        let prop = Self::allocation_prop(device);
        let mut granularity = 0usize;
        // SAFETY: `granularity` and `prop` are valid for the call; the driver only writes
        // `granularity`.
        unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        }
        .result()
        .map_err(|e| cuda_err("cannot query the device's allocation granularity", e))?;
        if granularity == 0 || !granularity.is_power_of_two() {
            return Err(Error::OutOfMemory(format!(
                "device allocation granularity {granularity} B is not a power of two"
            )));
        }
        let page = page.unwrap_or(granularity);
        if !page.is_power_of_two() || page < granularity {
            return Err(Error::BadInput(format!(
                "page size {page} B is not a power-of-two multiple of the device's \
                 {granularity} B allocation granularity"
            )));
        }
        let pages = address_bytes.max(1).div_ceil(page);
        let len = pages.checked_mul(page).ok_or_else(|| {
            Error::OutOfMemory(format!("address range of {address_bytes} B is too large"))
        })?;
        let physical = physical_bytes.div_ceil(page);
        let mut base: sys::CUdeviceptr = 0;
        // SAFETY: reserves address space only; freed exactly once, in Drop.
        unsafe { sys::cuMemAddressReserve(&mut base, len, page, 0, 0) }
            .result()
            .map_err(|e| cuda_err(&format!("cannot reserve {len} B of device addresses"), e))?;
        // From here on Drop releases whatever has been taken if a later step fails.
        let mut region = DevicePagedRegion {
            ctx: Arc::clone(ctx),
            device,
            base,
            len,
            page,
            handles: 0,
            home: None,
            table: Mutex::new(PageTable {
                mapped: vec![None; pages],
                free: Vec::with_capacity(physical),
            }),
        };
        let table = region.table.get_mut().unwrap_or_else(|e| e.into_inner());
        for _ in 0..physical {
            let mut handle: sys::CUmemGenericAllocationHandle = 0;
            // SAFETY: creates one physical page; released exactly once, in Drop.
            unsafe { sys::cuMemCreate(&mut handle, page, &prop, 0) }
                .result()
                .map_err(|e| {
                    cuda_err(
                        &format!(
                            "cannot create physical page {} of {physical} ({page} B each)",
                            table.free.len()
                        ),
                        e,
                    )
                })?;
            table.free.push(handle);
        }
        region.handles = physical;
        Ok(region)
    }

    /// Maps every physical page, once and for good, into a second reserved range of its own
    /// (no block is ever placed there). The moves in the region are then a page's second
    /// mapping, which the driver makes and removes for less than a first and last one
    /// (docs/benchmarks.md, thirteenth session: cuMemSetAccess 24 against 39 µs, cuMemUnmap 16
    /// against 23). Costs address space only, and a first mapping of each page now. Call it
    /// before any page is mapped.
    pub fn keep_home_mappings(&mut self) -> Result<()> {
        if self.home.is_some() {
            return Ok(());
        }
        let t = self.table.get_mut().unwrap_or_else(|e| e.into_inner());
        if t.free.len() != self.handles {
            return Err(Error::BadInput(
                "home mappings must be made before any page is mapped".into(),
            ));
        }
        let len = self.handles.max(1) * self.page;
        self.ctx
            .bind_to_thread()
            .map_err(|e| cuda_err("cannot bind the CUDA context", e))?;
        let mut base: sys::CUdeviceptr = 0;
        // SAFETY: reserves address space only; freed exactly once, in Drop (or below).
        unsafe { sys::cuMemAddressReserve(&mut base, len, self.page, 0, 0) }
            .result()
            .map_err(|e| cuda_err(&format!("cannot reserve {len} B of home addresses"), e))?;
        let mut mapped = 0;
        let mut failed = None;
        for (k, &handle) in t.free.iter().enumerate() {
            let at = base + (k * self.page) as sys::CUdeviceptr;
            // SAFETY: `at` lies in the fresh home range; `handle` is a live page-sized handle.
            if let Err(e) = unsafe { sys::cuMemMap(at, self.page, 0, handle, 0) }.result() {
                failed = Some(cuda_err("cuMemMap of a home page failed", e));
                break;
            }
            mapped += 1;
        }
        if failed.is_none() && mapped > 0 {
            let desc = sys::CUmemAccessDesc {
                location: sys::CUmemLocation {
                    type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                    id: self.device,
                },
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            // SAFETY: the first `mapped` pages of the home range are mapped; one descriptor.
            let r = unsafe { sys::cuMemSetAccess(base, mapped * self.page, &desc, 1) };
            if let Err(e) = r.result() {
                failed = Some(cuda_err("cuMemSetAccess on the home pages failed", e));
            }
        }
        if let Some(e) = failed {
            // SAFETY: unmaps what this call mapped and frees the range it reserved.
            unsafe {
                if mapped > 0 {
                    let _ = sys::cuMemUnmap(base, mapped * self.page);
                }
                let _ = sys::cuMemAddressFree(base, len);
            }
            return Err(e);
        }
        self.home = Some((base, len));
        Ok(())
    }

    /// Pinned device memory on device `device`: what the physical pages are made of.
    fn allocation_prop(device: std::ffi::c_int) -> sys::CUmemAllocationProp {
        sys::CUmemAllocationProp {
            type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: device,
            },
            win32HandleMetaData: std::ptr::null_mut(),
            allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
                compressionType: 0,
                gpuDirectRDMACapable: 0,
                usage: 0,
                reserved: [0; 4],
            },
        }
    }

    /// The device pointer of the first byte of the reserved range.
    pub fn device_ptr(&self) -> sys::CUdeviceptr {
        self.base
    }

    /// Region pages backed by physical memory now.
    pub fn mapped_pages(&self) -> usize {
        let t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        t.mapped.iter().filter(|m| m.is_some()).count()
    }

    /// Device address of region page `i`.
    fn page_ptr(&self, i: usize) -> sys::CUdeviceptr {
        self.base + (i * self.page) as sys::CUdeviceptr
    }

    /// Checks that `first..first + count` lies inside the region; returns its end.
    fn check_range(&self, t: &PageTable, first: usize, count: usize) -> Result<usize> {
        match first.checked_add(count) {
            Some(end) if end <= t.mapped.len() => Ok(end),
            _ => Err(Error::OutOfMemory(format!(
                "pages {first}..{first}+{count} lie outside the region's {} pages",
                t.mapped.len()
            ))),
        }
    }

    /// Unmaps the pages in `pages` and returns their physical pages to the free stack; a page
    /// whose unmap fails stays recorded as mapped. Returns the first error.
    fn unmap_locked(
        &self,
        t: &mut PageTable,
        pages: std::ops::Range<usize>,
    ) -> std::result::Result<(), result::DriverError> {
        let mut first_err = Ok(());
        for i in pages {
            let Some(handle) = t.mapped[i] else { continue };
            // SAFETY: page `i` is mapped (recorded in the table) with exactly one page.
            match unsafe { sys::cuMemUnmap(self.page_ptr(i), self.page) }.result() {
                Ok(()) => {
                    t.mapped[i] = None;
                    t.free.push(handle);
                }
                Err(e) => {
                    if first_err.is_ok() {
                        first_err = Err(e);
                    }
                }
            }
        }
        first_err
    }
}

impl Region for DevicePagedRegion {
    fn base(&self) -> usize {
        self.base as usize
    }

    fn len(&self) -> usize {
        self.len
    }

    fn page_size(&self) -> Option<usize> {
        Some(self.page)
    }

    fn physical_pages(&self) -> usize {
        self.handles
    }

    fn map_pages(&self, first: usize, count: usize) -> Result<()> {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let end = self.check_range(&t, first, count)?;
        if let Some(i) = (first..end).find(|&i| t.mapped[i].is_some()) {
            return Err(Error::OutOfMemory(format!(
                "cannot map pages {first}..{end}: page {i} is already mapped"
            )));
        }
        if t.free.len() < count {
            return Err(Error::OutOfMemory(format!(
                "cannot map {count} pages: {} of {} physical pages are free",
                t.free.len(),
                self.handles
            )));
        }
        if count == 0 {
            return Ok(());
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| cuda_err("cannot bind the CUDA context", e))?;
        for i in first..end {
            let Some(&handle) = t.free.last() else {
                // Unreachable after the check above; undo and fail rather than panic.
                let _ = self.unmap_locked(&mut t, first..i);
                return Err(Error::OutOfMemory("no free physical page".into()));
            };
            // SAFETY: page `i` lies inside the reserved range and is unmapped; `handle` is a
            // live physical page of exactly one page's size.
            let mapped = unsafe { sys::cuMemMap(self.page_ptr(i), self.page, 0, handle, 0) };
            if let Err(e) = mapped.result() {
                let _ = self.unmap_locked(&mut t, first..i);
                return Err(cuda_err(&format!("cuMemMap of page {i} failed"), e));
            }
            t.free.pop();
            t.mapped[i] = Some(handle);
        }
        let desc = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: self.device,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: `first..end` is fully mapped (just above); `desc` is one valid descriptor.
        let access =
            unsafe { sys::cuMemSetAccess(self.page_ptr(first), count * self.page, &desc, 1) };
        if let Err(e) = access.result() {
            let _ = self.unmap_locked(&mut t, first..end);
            return Err(cuda_err(
                &format!("cuMemSetAccess on pages {first}..{end} failed"),
                e,
            ));
        }
        Ok(())
    }

    fn unmap_pages(&self, first: usize, count: usize) -> Result<()> {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let end = self.check_range(&t, first, count)?;
        if let Some(i) = (first..end).find(|&i| t.mapped[i].is_none()) {
            return Err(Error::OutOfMemory(format!(
                "cannot unmap pages {first}..{end}: page {i} is not mapped"
            )));
        }
        if count == 0 {
            return Ok(());
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| cuda_err("cannot bind the CUDA context", e))?;
        self.unmap_locked(&mut t, first..end)
            .map_err(|e| cuda_err(&format!("cuMemUnmap of pages {first}..{end} failed"), e))
    }
}

impl Drop for DevicePagedRegion {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_err() {
            return;
        }
        let mut t = std::mem::replace(
            self.table.get_mut().unwrap_or_else(|e| e.into_inner()),
            PageTable {
                mapped: Vec::new(),
                free: Vec::new(),
            },
        );
        let pages = 0..t.mapped.len();
        let _ = self.unmap_locked(&mut t, pages);
        let still_mapped = t.mapped.iter().flatten().copied();
        for handle in t.free.iter().copied().chain(still_mapped) {
            // SAFETY: each handle came from cuMemCreate and is released only here; a handle
            // still mapped is freed by the driver once unmapped (with the range, below).
            let _ = unsafe { sys::cuMemRelease(handle) };
        }
        if let Some((home, len)) = self.home {
            // SAFETY: every home page is mapped (made so in keep_home_mappings) and the range
            // is freed only here.
            unsafe {
                let _ = sys::cuMemUnmap(home, len);
                let _ = sys::cuMemAddressFree(home, len);
            }
        }
        // SAFETY: the range came from cuMemAddressReserve and is freed only here.
        let _ = unsafe { sys::cuMemAddressFree(self.base, self.len) };
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

/// In-flight points on one stream past which recording one first recycles the completed ones.
const RETIRE_AT: usize = 64;

/// The most events one stream holds in flight. Past it, a new point re-records the newest
/// event instead of taking another, so the list never grows (the host never allocates).
const MAX_IN_FLIGHT: usize = 2 * RETIRE_AT;

/// Events recorded on one stream, oldest first.
struct StreamEvents {
    id: StreamId,
    stream: Arc<CudaStream>,
    next_epoch: u64,
    completed: u64,
    inflight: VecDeque<(u64, CudaEvent)>,
    spare: Vec<CudaEvent>,
}

impl StreamEvents {
    /// Recycles the oldest in-flight events that have completed, stopping at the first that
    /// has not or once `epoch` is passed; returns whether `epoch` is passed. Each event is
    /// queried until it completes, so a stream's list holds only points still in flight.
    fn retire_until(&mut self, epoch: u64) -> bool {
        while self.completed < epoch {
            let Some((e, ev)) = self.inflight.front() else {
                break;
            };
            let e = *e;
            match ev.try_is_complete() {
                Ok(true) => {
                    self.completed = e;
                    // Spare events past the list's reserved room are destroyed rather than
                    // grow it (recording never allocates on the host).
                    if let Some((_, ev)) = self.inflight.pop_front() {
                        if self.spare.len() < self.spare.capacity() {
                            self.spare.push(ev);
                        }
                    }
                }
                _ => break,
            }
        }
        self.completed >= epoch
    }

    /// After the stream was synchronized: every point up to `epoch` has passed, and every
    /// in-flight event goes back to the spares (those past their room are destroyed).
    fn passed_all(&mut self, epoch: u64) {
        self.completed = epoch;
        while let Some((_, ev)) = self.inflight.pop_front() {
            if self.spare.len() < self.spare.capacity() {
                self.spare.push(ev);
            }
        }
    }
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
            inflight: VecDeque::with_capacity(2 * RETIRE_AT),
            spare: Vec::with_capacity(2 * RETIRE_AT),
        });
    }

    /// Forgets stream `id` (its work complete, its owner gone): drops the stream handle and
    /// its events; points asked about it later count as passed.
    pub fn remove_stream(&self, id: StreamId) {
        let mut g = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        g.retain(|s| s.id != id);
    }

    /// The CUDA stream registered as pool stream `id`, if any.
    pub fn stream(&self, id: StreamId) -> Option<Arc<CudaStream>> {
        let g = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        g.iter().find(|s| s.id == id).map(|s| Arc::clone(&s.stream))
    }

    /// Points recorded on stream `id` not yet seen complete (events held for it).
    pub fn in_flight(&self, id: StreamId) -> usize {
        let g = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        g.iter()
            .find(|s| s.id == id)
            .map_or(0, |s| s.inflight.len())
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
        // A stream that is never asked about (no query, no hand-over from it) would keep
        // every point in flight: past a bound, its completed ones are recycled here.
        if s.inflight.len() >= RETIRE_AT {
            s.retire_until(u64::MAX);
        }
        s.next_epoch += 1;
        let epoch = s.next_epoch;
        // Still full (the device runs far behind): the newest event is recorded again for
        // this point, and stands for the points it stood for too. A wait on one of those, or a
        // query, then covers this later point: never shorter than asked, only longer.
        let full = s.inflight.len() >= MAX_IN_FLIGHT;
        let recorded = match s.inflight.back_mut() {
            Some((e, ev)) if full => ev.record(&s.stream).map(|_| *e = epoch),
            _ => {
                let event = match s.spare.pop() {
                    Some(e) => Ok(e),
                    None => self.ctx.new_event(None),
                };
                event
                    .and_then(|e| e.record(&s.stream).map(|_| e))
                    .map(|e| s.inflight.push_back((epoch, e)))
            }
        };
        if recorded.is_err() {
            // Cannot record: wait for the stream now, so the point is certainly passed.
            let _ = s.stream.synchronize();
            s.passed_all(epoch);
        }
        EventId(epoch)
    }

    fn is_complete(&self, stream: StreamId, epoch: EventId) -> bool {
        let mut g = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        let Some(s) = g.iter_mut().find(|s| s.id == stream) else {
            return true;
        };
        s.retire_until(epoch.0)
    }

    fn capturing(&self) -> bool {
        self.capturing.load(Ordering::Acquire)
    }

    fn orders_streams(&self) -> bool {
        true
    }

    fn order_after(&self, waiter: StreamId, stream: StreamId, epoch: EventId) -> bool {
        if self.capturing() {
            return false;
        }
        let mut g = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        let (Some(si), Some(wi)) = (
            g.iter().position(|s| s.id == stream),
            g.iter().position(|s| s.id == waiter),
        ) else {
            return false;
        };
        // Retiring the completed points first keeps the in-flight list short when nothing
        // else queries this stream, and spares a device-side wait on a passed point.
        if g[si].retire_until(epoch.0) {
            return true;
        }
        let s = &g[si];
        // Every recorded point is in flight until it is seen complete, in epoch order; one
        // whose event was recorded again for a later point ([`MAX_IN_FLIGHT`]) waits for that.
        let k = s.inflight.partition_point(|(e, _)| *e < epoch.0);
        let Some((_, ev)) = s.inflight.get(k) else {
            return false;
        };
        g[wi].stream.wait(ev).is_ok()
    }
}
