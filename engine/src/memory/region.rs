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

#[derive(Clone, Copy)]
#[repr(C, align(256))]
struct Chunk([u8; HOST_REGION_ALIGN]);

/// A zero-filled host allocation aligned to 256 bytes, made once when the pool is built.
pub struct HostRegion {
    chunks: Vec<Chunk>,
    len: usize,
}

impl HostRegion {
    /// Allocates `len` bytes (rounded up to 256 internally) of zeroed host memory.
    pub fn new(len: usize) -> Self {
        let n = len.div_ceil(HOST_REGION_ALIGN);
        HostRegion {
            chunks: vec![Chunk([0; HOST_REGION_ALIGN]); n],
            len,
        }
    }

    /// Raw pointer to the first byte (valid for `len()` bytes while the region lives).
    pub fn as_ptr(&self) -> *const u8 {
        self.chunks.as_ptr().cast()
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
