//! The memory a pool manages: an abstract address range, or a host allocation.

/// One contiguous address range reserved up front (device or host memory).
///
/// The pool only does arithmetic on offsets inside it and never touches its bytes.
pub trait Region: Send + Sync {
    /// Address of the first byte (a device or host address).
    fn base(&self) -> usize;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the region has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
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
    pub fn try_new(len: usize) -> crate::error::Result<Self> {
        let layout = Self::layout(len);
        if layout.size() < len {
            return Err(crate::error::Error::OutOfMemory(format!(
                "host region of {len} B is too large"
            )));
        }
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(raw).ok_or_else(|| {
            crate::error::Error::OutOfMemory(format!("cannot reserve {len} B of host memory"))
        })?;
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
