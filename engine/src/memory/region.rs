//! The memory a pool manages: an abstract address range, a host allocation, or host memory
//! whose physical pages move (the host twin of the CUDA virtual-memory region).

use super::clock::{EventId, StreamId};
use crate::error::{Error, Result};

/// One contiguous address range reserved up front (device or host memory).
///
/// The pool only does arithmetic on offsets inside it and never touches its bytes. A
/// remappable region also reserves a fixed set of physical pages up front and moves them
/// between places in the range when the pool asks (`map_pages`/`unmap_pages`).
pub trait Region: Send + Sync {
    /// Address of the first byte (a device or host address).
    fn base(&self) -> usize;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the region has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// For a remappable region, the size of the pages physical memory moves between places in
    /// it (a power of two); `None` (the default) when every byte is backed for good.
    fn page_size(&self) -> Option<usize> {
        None
    }
    /// Physical pages a remappable region reserved up front (backing at most this many of its
    /// pages at once); 0 for a fixed region.
    fn physical_pages(&self) -> usize {
        0
    }
    /// Backs region pages `first..first + count`, all unbacked, with free physical pages.
    fn map_pages(&self, first: usize, count: usize) -> Result<()> {
        let _ = (first, count);
        Err(Error::Unsupported("this region cannot remap pages".into()))
    }
    /// Returns the physical pages behind region pages `first..first + count` (all backed, and
    /// unused by any device or thread) to the free set.
    fn unmap_pages(&self, first: usize, count: usize) -> Result<()> {
        let _ = (first, count);
        Err(Error::Unsupported("this region cannot remap pages".into()))
    }
    /// Whether page moves run in the background, ordered on the streams (see
    /// [`order_after_moves`](Self::order_after_moves)); such a region can also unback pages
    /// only once streams pass given points ([`unmap_pages_after`](Self::unmap_pages_after)).
    fn moves_in_background(&self) -> bool {
        false
    }
    /// [`unmap_pages`](Self::unmap_pages) once every stream in `after` has passed its point
    /// (free pages last used on those streams); only a region that moves pages in the
    /// background can wait, the others take an empty `after`.
    fn unmap_pages_after(
        &self,
        first: usize,
        count: usize,
        after: &[(StreamId, EventId)],
    ) -> Result<()> {
        if after.is_empty() {
            self.unmap_pages(first, count)
        } else {
            Err(Error::Unsupported(
                "this region unbacks pages only at once, not after streams pass".into(),
            ))
        }
    }
    /// Orders `stream`'s later work after every page move still pending behind bytes
    /// `offset..offset + len`. Only a region that moves pages in the background (stream-ordered,
    /// like cudaMallocAsync) has any; the pool calls it for each block it hands out and each
    /// declared use. Fails when the region can no longer move pages.
    fn order_after_moves(&self, stream: StreamId, offset: usize, len: usize) -> Result<()> {
        let _ = (stream, offset, len);
        Ok(())
    }
    /// Whether `stream` waits on the device for a page move not yet done (a region that
    /// moves pages in the background): a point recorded on it now would pass only after the
    /// move, so the pool takes its spans' pages instead of waiting to promote them.
    fn stream_waits_on_moves(&self, stream: StreamId) -> bool {
        let _ = stream;
        false
    }
    /// Waits until every page move asked for so far is done (a no-op where moves are done when
    /// `map_pages`/`unmap_pages` return).
    fn settle(&self) -> Result<()> {
        Ok(())
    }
    /// Waits at most `limit` for the page moves asked for so far; true when none is left
    /// (always, where moves are done when `map_pages`/`unmap_pages` return).
    fn settle_within(&self, limit: std::time::Duration) -> Result<bool> {
        let _ = limit;
        Ok(true)
    }
}

/// Alignment of a [`HostRegion`]'s base address.
pub const HOST_REGION_ALIGN: usize = 256;

/// A zero-filled host allocation aligned to 256 bytes, made once when the pool is built.
///
/// It is a raw allocation (not a `Vec`), so blocks handed out by a pool may be written through
/// pointers derived from [`as_mut_ptr`](Self::as_mut_ptr) while other blocks are read.
pub struct HostRegion {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the region owns its allocation; the pool hands out disjoint blocks of it.
unsafe impl Send for HostRegion {}
// SAFETY: shared access only reads the base address and length.
unsafe impl Sync for HostRegion {}

impl HostRegion {
    fn layout(len: usize) -> std::alloc::Layout {
        let size = len.max(1).div_ceil(HOST_REGION_ALIGN) * HOST_REGION_ALIGN;
        std::alloc::Layout::from_size_align(size, HOST_REGION_ALIGN)
            .unwrap_or(std::alloc::Layout::new::<u8>())
    }

    /// Allocates `len` bytes (rounded up to 256 internally) of zeroed host memory; fails
    /// cleanly when the system cannot provide them.
    pub fn try_new(len: usize) -> Result<Self> {
        let layout = Self::layout(len);
        if layout.size() < len {
            return Err(Error::OutOfMemory(format!(
                "host region of {len} B is too large"
            )));
        }
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(raw)
            .ok_or_else(|| Error::OutOfMemory(format!("cannot reserve {len} B of host memory")))?;
        Ok(HostRegion { ptr, len })
    }

    /// Allocates `len` bytes of zeroed host memory; aborts like `Vec` if the system has none.
    pub fn new(len: usize) -> Self {
        match Self::try_new(len) {
            Ok(r) => r,
            Err(_) => std::alloc::handle_alloc_error(Self::layout(len)),
        }
    }

    /// Raw pointer to the first byte (valid for `len()` bytes while the region lives).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Mutable raw pointer to the first byte; blocks of a pool over this region are written
    /// through pointers derived from it.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for HostRegion {
    fn drop(&mut self) {
        // SAFETY: allocated in try_new with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}

impl Region for HostRegion {
    fn base(&self) -> usize {
        self.as_ptr() as usize
    }

    fn len(&self) -> usize {
        self.len
    }
}

impl std::fmt::Debug for HostRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostRegion")
            .field("base", &self.base())
            .field("len", &self.len)
            .finish()
    }
}

/// Host memory whose physical pages move: a large address range reserved with no access, and
/// a fixed set of physical pages (one `memfd` file, sized once) mapped into it page by page.
///
/// It is the host twin of the CUDA virtual-memory region, so the pool's remapping runs, and is
/// tested on real memory, on any Linux machine. A page's bytes move with it (its old contents
/// appear at the new place), like device memory.
pub struct HostPagedRegion {
    base: *mut u8,
    len: usize,
    page: usize,
    fd: libc::c_int,
    physical: usize,
    /// Physical pages mapped nowhere, and the physical page behind each region page.
    table: std::sync::Mutex<PageTable>,
}

/// Where a paged region's physical pages are.
struct PageTable {
    free: Vec<usize>,
    at: Vec<Option<usize>>,
}

// SAFETY: the region owns its mapping and file descriptor; the page table is behind a mutex and
// the pool hands out disjoint blocks of the range.
unsafe impl Send for HostPagedRegion {}
// SAFETY: as above.
unsafe impl Sync for HostPagedRegion {}

fn os_error(what: &str) -> Error {
    Error::OutOfMemory(format!("{what}: {}", std::io::Error::last_os_error()))
}

impl HostPagedRegion {
    /// Reserves `address_bytes` of address space and `physical_bytes` of memory in pages of
    /// `page` bytes (a power of two and a multiple of the system page), both rounded up to it.
    pub fn new(address_bytes: usize, physical_bytes: usize, page: usize) -> Result<Self> {
        // SAFETY: sysconf has no preconditions.
        let sys_page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        if !page.is_power_of_two() || !page.is_multiple_of(sys_page) {
            return Err(Error::BadInput(format!(
                "page size {page} is not a power of two multiple of the system page ({sys_page})"
            )));
        }
        let pages = address_bytes.div_ceil(page).max(1);
        let physical = physical_bytes.div_ceil(page);
        let (len, file_len) = match (pages.checked_mul(page), physical.checked_mul(page)) {
            (Some(a), Some(b)) => (a, b),
            _ => return Err(Error::OutOfMemory("paged host region too large".into())),
        };
        // SAFETY: a fresh anonymous file; the name is a valid C string.
        let fd = unsafe { libc::memfd_create(c"vigil-pool".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(os_error("memfd_create failed"));
        }
        // SAFETY: `fd` is ours; the length fits in off_t (checked above against usize).
        if unsafe { libc::ftruncate(fd, file_len as libc::off_t) } != 0 {
            let e = os_error(&format!("cannot size the pool file to {file_len} B"));
            // SAFETY: closed once.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        // SAFETY: a fresh reservation with no access; nothing else maps this range.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            let e = os_error(&format!("cannot reserve {len} B of address space"));
            // SAFETY: closed once.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        Ok(HostPagedRegion {
            base: base.cast(),
            len,
            page,
            fd,
            physical,
            table: std::sync::Mutex::new(PageTable {
                free: (0..physical).rev().collect(),
                at: vec![None; pages],
            }),
        })
    }

    /// Mutable raw pointer to the first byte; only mapped pages may be touched.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.base
    }

    /// Region pages backed by memory now.
    pub fn mapped_pages(&self) -> usize {
        let t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        t.at.iter().filter(|p| p.is_some()).count()
    }

    /// Puts region page `i` back to no access (its physical page stays the caller's).
    fn unback(&self, i: usize) -> Result<()> {
        // SAFETY: `i` is inside the reservation; MAP_FIXED replaces only that page.
        let r = unsafe {
            libc::mmap(
                self.base.add(i * self.page).cast(),
                self.page,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if r == libc::MAP_FAILED {
            return Err(os_error("cannot unmap a pool page"));
        }
        Ok(())
    }
}

impl Region for HostPagedRegion {
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
        self.physical
    }

    fn map_pages(&self, first: usize, count: usize) -> Result<()> {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let range = first..first.saturating_add(count);
        if range.end > t.at.len() || t.at[range.clone()].iter().any(|p| p.is_some()) {
            return Err(Error::BadInput(format!(
                "pages {range:?} are not all unmapped pages of the region"
            )));
        }
        if count > t.free.len() {
            return Err(Error::OutOfMemory(format!(
                "{count} pages wanted, {} physical pages free",
                t.free.len()
            )));
        }
        // Physical pages come off the free list one at a time (no list is built: a page move
        // allocates nothing on the host).
        for i in range.clone() {
            let Some(p) = t.free.pop() else { break };
            // SAFETY: page `i` is inside the reservation and unmapped; `p` is a page of the
            // file, mapped nowhere else.
            let r = unsafe {
                libc::mmap(
                    self.base.add(i * self.page).cast(),
                    self.page,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    self.fd,
                    (p * self.page) as libc::off_t,
                )
            };
            if r == libc::MAP_FAILED {
                let e = os_error("cannot map a pool page");
                t.free.push(p);
                for j in first..i {
                    if let Some(q) = t.at[j].take() {
                        let _ = self.unback(j);
                        t.free.push(q);
                    }
                }
                return Err(e);
            }
            t.at[i] = Some(p);
        }
        Ok(())
    }

    fn unmap_pages(&self, first: usize, count: usize) -> Result<()> {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let range = first..first.saturating_add(count);
        if range.end > t.at.len() || t.at[range.clone()].iter().any(|p| p.is_none()) {
            return Err(Error::BadInput(format!(
                "pages {range:?} are not all mapped pages of the region"
            )));
        }
        for i in range {
            self.unback(i)?;
            if let Some(p) = t.at[i].take() {
                t.free.push(p);
            }
        }
        Ok(())
    }
}

impl Drop for HostPagedRegion {
    fn drop(&mut self) {
        // SAFETY: the reservation and the descriptor are ours and released once.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
            libc::close(self.fd);
        }
    }
}

impl std::fmt::Debug for HostPagedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostPagedRegion")
            .field("base", &self.base())
            .field("len", &self.len)
            .field("page", &self.page)
            .field("physical_pages", &self.physical)
            .finish()
    }
}
