//! Fixed-region memory pools shared by the backends.
//!
//! A [`FixedPool`] reserves one [`Region`] up front and hands out 256-byte aligned
//! [`Block`]s from it with best fit and immediate coalescing; its bookkeeping lives off the
//! region, so the same pool manages device memory (through a device [`Region`]) and host memory
//! ([`HostRegion`]). Stream safety follows a [`StreamClock`]: a block freed on its own stream
//! is reusable by that stream at once, while a block declared used on other streams
//! ([`Block::record_use`]) waits until those streams pass the point recorded at free time.
//! A thread that [`claim`](FixedPool::claim)s a pool allocates and frees with no lock and no
//! atomic read-modify-write; other threads' frees reach it through a lock-free remote-free list.
//! Over a remappable region ([`HostPagedRegion`], `cuda::DevicePagedRegion`) the pool moves free
//! physical pages to where a block fits instead of growing, so its footprint follows the live
//! bytes (blocks themselves never move).

mod clock;
#[cfg(feature = "cuda")]
pub mod cuda;
mod pool;
mod region;
mod size;

#[cfg(test)]
mod tests;

pub use clock::{EventId, StreamClock, StreamId, SyncClock};
pub use pool::{
    Block, FixedPool, PoolClaim, PoolOptions, PoolStats, DEFAULT_ALIGN, MAX_STREAMS, SCAN_LIMIT,
    SMALL_BLOCK,
};
pub use region::{HostPagedRegion, HostRegion, Region, HOST_REGION_ALIGN};
pub use size::{host_available_bytes, meminfo_available, PoolSize};

/// The host memory pool the CPU backend takes activation arenas from.
pub type HostPool = FixedPool<HostRegion>;

/// Builds a host pool of `bytes` (allocated once, zeroed) for synchronous CPU use.
pub fn host_pool(bytes: usize) -> crate::error::Result<std::sync::Arc<HostPool>> {
    FixedPool::with_options(
        HostRegion::try_new(bytes)?,
        std::sync::Arc::new(SyncClock),
        PoolOptions::serving(),
    )
}

/// Builds a host pool of `size`: a fixed size, or a share of the host memory available now
/// ([`host_available_bytes`]).
pub fn host_pool_sized(size: PoolSize) -> crate::error::Result<std::sync::Arc<HostPool>> {
    let free = if size.needs_free() {
        host_available_bytes()?
    } else {
        0
    };
    host_pool(size.resolve(free)?)
}
