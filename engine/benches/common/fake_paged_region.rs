//! A remappable region that maps nothing, for host-only paged pools: shared by
//! `benches/pool.rs` and `examples/paged_sweep.rs`.

use vigil_engine::memory::Region;

/// Address space of the paged pools: physical memory is what they are sized by.
pub const PAGED_ADDRESS: usize = 64 << 30;

/// A remappable region at a fake address for the host-only rows: it counts physical pages
/// and does no mapping (the device rows pay cuMemMap).
pub struct FakePagedRegion {
    /// Physical pages it has.
    pub physical: usize,
    /// Page size in bytes.
    pub page: usize,
    /// Pages mapped now.
    pub mapped: std::sync::atomic::AtomicUsize,
}

impl Region for FakePagedRegion {
    fn base(&self) -> usize {
        1 << 40
    }
    fn len(&self) -> usize {
        PAGED_ADDRESS
    }
    fn page_size(&self) -> Option<usize> {
        Some(self.page)
    }
    fn physical_pages(&self) -> usize {
        self.physical
    }
    fn map_pages(&self, _first: usize, count: usize) -> vigil_engine::Result<()> {
        use std::sync::atomic::Ordering::Relaxed;
        if self.mapped.load(Relaxed) + count > self.physical {
            return Err(vigil_engine::Error::OutOfMemory(
                "fake pages exhausted".into(),
            ));
        }
        self.mapped.fetch_add(count, Relaxed);
        Ok(())
    }
    fn unmap_pages(&self, _first: usize, count: usize) -> vigil_engine::Result<()> {
        self.mapped
            .fetch_sub(count, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}
