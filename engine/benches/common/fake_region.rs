//! Regions at fake addresses that map nothing, for host-only pools: shared by
//! `benches/pool.rs`, `examples/paged_sweep.rs` and `examples/pool_pair.rs`.
// Each including target uses part of it.
#![allow(dead_code)]

use vigil_engine::memory::Region;

/// A fixed region of `.0` bytes at a fake address (never dereferenced).
pub struct FakeRegion(pub usize);

impl Region for FakeRegion {
    fn base(&self) -> usize {
        1 << 40
    }
    fn len(&self) -> usize {
        self.0
    }
}

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
    /// Say it moves pages in the background (the pool then takes pages of spans kept for a
    /// stream without waiting for it, as over `BackgroundPagedRegion`).
    pub background: bool,
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
    fn moves_in_background(&self) -> bool {
        self.background
    }
    /// The worst case of a real mover: every stream is still held behind a move, so the pool
    /// never promotes spans kept for a stream and takes their pages instead.
    fn stream_waits_on_moves(&self, _stream: vigil_engine::memory::StreamId) -> bool {
        self.background
    }
    fn unmap_pages_after(
        &self,
        first: usize,
        count: usize,
        _after: &[(
            vigil_engine::memory::StreamId,
            vigil_engine::memory::EventId,
        )],
    ) -> vigil_engine::Result<()> {
        self.unmap_pages(first, count)
    }
    fn unmap_pages(&self, _first: usize, count: usize) -> vigil_engine::Result<()> {
        self.mapped
            .fetch_sub(count, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}
