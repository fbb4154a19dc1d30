//! Device memory, pinned host memory and the driver calls the executor makes, as RAII wrappers.
//!
//! Every device allocation the backend makes goes through [`DeviceBuffer::alloc`], which counts
//! it, so tests can prove that the steady state allocates nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{result as drv, sys, CudaContext, CudaStream};

use crate::memory::cuda::{CudaClock, DeviceRegion};
use crate::memory::{Block, FixedPool, PoolSize, PoolStats, StreamClock, StreamId};

use super::codegen::TensorMap2d;
use crate::error::{Error, Result};

static DEVICE_ALLOCS: AtomicUsize = AtomicUsize::new(0);
static DEVICE_FREES: AtomicUsize = AtomicUsize::new(0);

/// (device allocations, device frees) made by this backend since the process started.
pub fn alloc_counts() -> (usize, usize) {
    (
        DEVICE_ALLOCS.load(Ordering::Relaxed),
        DEVICE_FREES.load(Ordering::Relaxed),
    )
}

/// Maps a driver error to the engine's error type, naming what was being done.
pub fn drv_err(what: &str) -> impl Fn(drv::DriverError) -> Error + '_ {
    move |e| Error::Unsupported(format!("CUDA {what} failed: {e}"))
}

/// One device allocation (freed on drop).
pub struct DeviceBuffer {
    ctx: Arc<CudaContext>,
    ptr: sys::CUdeviceptr,
    len: usize,
}

#[allow(clippy::len_without_is_empty)]
impl DeviceBuffer {
    /// Allocates `len` bytes (at least 1) on the context's device.
    pub fn alloc(ctx: &Arc<CudaContext>, len: usize) -> Result<Self> {
        ctx.bind_to_thread().map_err(drv_err("bind context"))?;
        // SAFETY: plain device allocation; the pointer is owned by the returned value.
        let ptr = unsafe { drv::malloc_sync(len.max(256)) }.map_err(|e| {
            Error::OutOfMemory(format!("cannot allocate {len} bytes of device memory: {e}"))
        })?;
        DEVICE_ALLOCS.fetch_add(1, Ordering::Relaxed);
        Ok(DeviceBuffer {
            ctx: Arc::clone(ctx),
            ptr,
            len,
        })
    }

    /// Allocates and fills from host bytes (synchronously).
    pub fn upload(ctx: &Arc<CudaContext>, bytes: &[u8]) -> Result<Self> {
        let b = DeviceBuffer::alloc(ctx, bytes.len())?;
        if !bytes.is_empty() {
            // SAFETY: the buffer holds at least bytes.len() bytes.
            unsafe { drv::memcpy_htod_sync(b.ptr, bytes) }.map_err(drv_err("weight upload"))?;
        }
        Ok(b)
    }

    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by malloc_sync and not freed before; the owner synchronised its
            // stream before dropping.
            let _ = unsafe { drv::free_sync(self.ptr) };
            DEVICE_FREES.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Bytes of one encoded TMA tensor map (`CUtensorMap`).
pub const TENSOR_MAP_BYTES: usize = std::mem::size_of::<sys::CUtensorMap>();

/// Encodes `m` over the device address `base` (`cuTensorMapEncodeTiled`: unsigned bytes, 64-byte
/// boxes of `m.box_rows` rows, 64-byte swizzle, zeros past the edges).
pub fn encode_tensor_map(base: u64, m: &TensorMap2d) -> Result<sys::CUtensorMap> {
    use sys::{
        CUtensorMapDataType as Dt, CUtensorMapFloatOOBfill as Fill, CUtensorMapInterleave as Il,
        CUtensorMapL2promotion as L2, CUtensorMapSwizzle as Sw,
    };
    let bad = |why: &str| Error::Unsupported(format!("TMA tensor map {m:?}: {why}"));
    if !base.is_multiple_of(16) || !m.row_bytes.is_multiple_of(16) {
        return Err(bad("address and row pitch must be multiples of 16 bytes"));
    }
    let box_rows = u32::try_from(m.box_rows)
        .ok()
        .filter(|r| (1..=256).contains(r))
        .ok_or_else(|| bad("a box holds 1 to 256 rows"))?;
    let dims = [m.row_bytes as u64, m.rows as u64];
    let strides = [m.row_bytes as u64];
    let boxes = [64u32, box_rows];
    let elems = [1u32, 1];
    // SAFETY: the map is plain data the call fills; the arrays hold `rank` (2) entries, and
    // strides the rank minus one.
    unsafe {
        let mut map: sys::CUtensorMap = std::mem::zeroed();
        sys::cuTensorMapEncodeTiled(
            &mut map,
            Dt::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            2,
            base as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elems.as_ptr(),
            Il::CU_TENSOR_MAP_INTERLEAVE_NONE,
            Sw::CU_TENSOR_MAP_SWIZZLE_64B,
            L2::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            Fill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
        .result()
        .map_err(drv_err("TMA tensor map encoding"))?;
        Ok(map)
    }
}

/// Encoded TMA tensor maps in device memory, [`TENSOR_MAP_BYTES`] apart: what the kernels'
/// [`Arg::Map`](super::codegen::Arg::Map) parameters point at.
pub struct TensorMaps {
    buf: Option<DeviceBuffer>,
    count: usize,
}

impl TensorMaps {
    /// The device address of map `k`, if there is one.
    pub fn ptr(&self, k: usize) -> Option<u64> {
        let b = self.buf.as_ref().filter(|_| k < self.count)?;
        Some(b.ptr() + (k * TENSOR_MAP_BYTES) as u64)
    }
}

/// Encodes each `(address, map)` ([`encode_tensor_map`]) and uploads them, in order.
pub fn upload_tensor_maps(
    ctx: &Arc<CudaContext>,
    maps: &[(u64, TensorMap2d)],
) -> Result<TensorMaps> {
    if maps.is_empty() {
        return Ok(TensorMaps {
            buf: None,
            count: 0,
        });
    }
    let mut bytes = Vec::with_capacity(maps.len() * TENSOR_MAP_BYTES);
    for (base, m) in maps {
        let map = encode_tensor_map(*base, m)?;
        // SAFETY: the map is plain data of TENSOR_MAP_BYTES bytes.
        bytes.extend_from_slice(unsafe {
            std::slice::from_raw_parts((&map as *const sys::CUtensorMap).cast(), TENSOR_MAP_BYTES)
        });
    }
    Ok(TensorMaps {
        buf: Some(DeviceBuffer::upload(ctx, &bytes)?),
        count: maps.len(),
    })
}

/// The process-wide activation pool of one device: one [`DeviceRegion`] (a single cudaMalloc)
/// managed by a [`FixedPool`], with every context's stream registered in one [`CudaClock`].
pub struct DevicePool {
    pool: Arc<FixedPool<DeviceRegion>>,
    clock: Arc<CudaClock>,
}

impl DevicePool {
    /// Forgets a stream whose work is complete (its context is gone), so that its tag and
    /// clock entry do not outlive it.
    fn retire(&self, stream: StreamId) {
        self.pool.retire_stream(stream);
        self.clock.remove_stream(stream);
    }
}

static NEXT_STREAM: AtomicU64 = AtomicU64::new(1);

/// The size each device's activation pool is reserved with (`None`: the default, a quarter of
/// the free device memory), set by [`set_device_pool_size`] before the first CUDA model loads.
static POOL_SIZE: Mutex<Option<PoolSize>> = Mutex::new(None);

/// The process-wide device pools, one per device ordinal, reserved on first use.
static POOLS: OnceLock<Mutex<HashMap<usize, Arc<DevicePool>>>> = OnceLock::new();

/// Sets the size of the activation pool each device reserves when its first CUDA model loads
/// (the config's `memory.cuda_pool_mb` or `memory.cuda_pool_fraction`). Fails once a pool is
/// reserved, since a reserved region cannot change size; `VIGIL_CUDA_POOL_MB` overrides it.
pub fn set_device_pool_size(size: PoolSize) -> Result<()> {
    let reserved = POOLS
        .get()
        .is_some_and(|p| !p.lock().unwrap_or_else(|e| e.into_inner()).is_empty());
    let mut g = POOL_SIZE.lock().unwrap_or_else(|e| e.into_inner());
    if reserved && *g != Some(size) {
        return Err(Error::BadInput(format!(
            "the CUDA activation pool is already reserved; it cannot become {size}"
        )));
    }
    *g = Some(size);
    Ok(())
}

/// The statistics of each device's activation pool reserved so far, by device ordinal (for
/// /metrics; empty until a CUDA model loads).
pub fn device_pool_stats() -> Vec<(usize, PoolStats)> {
    let Some(pools) = POOLS.get() else {
        return Vec::new();
    };
    let g = pools.lock().unwrap_or_else(|e| e.into_inner());
    let mut stats: Vec<_> = g.iter().map(|(&d, p)| (d, p.pool.stats())).collect();
    stats.sort_by_key(|&(d, _)| d);
    stats
}

/// Bytes the device pool reserves: `VIGIL_CUDA_POOL_MB` when set, else the configured
/// [`PoolSize`] as stated (a share of the free device memory: on a Jetson, of the DRAM the CPU
/// shares), else a quarter of the free device memory but never less than four arenas of the
/// first model (plus 64 MiB).
fn pool_bytes(ctx: &Arc<CudaContext>, first: usize) -> Result<usize> {
    if let Some(mb) = std::env::var("VIGIL_CUDA_POOL_MB")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
    {
        return Ok(mb << 20);
    }
    let configured = *POOL_SIZE.lock().unwrap_or_else(|e| e.into_inner());
    let size = configured.unwrap_or(PoolSize::FractionOfFree(0.25));
    let free = if size.needs_free() {
        ctx.mem_get_info().map_err(drv_err("memory query"))?.0
    } else {
        0
    };
    let bytes = size.resolve(free)?;
    Ok(match configured {
        Some(_) => bytes,
        None => bytes.max(first.saturating_mul(4) + (64 << 20)),
    })
}

fn device_pool(ctx: &Arc<CudaContext>, first: usize) -> Result<Arc<DevicePool>> {
    let pools = POOLS.get_or_init(|| Mutex::new(HashMap::new()));
    let mut g = pools.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = g.get(&ctx.ordinal()) {
        return Ok(Arc::clone(p));
    }
    let bytes = pool_bytes(ctx, first)?;
    let region = DeviceRegion::new(ctx, bytes)?;
    DEVICE_ALLOCS.fetch_add(1, Ordering::Relaxed);
    let clock = CudaClock::new(ctx);
    let pool = FixedPool::new(region, Arc::clone(&clock) as Arc<dyn StreamClock>)?;
    tracing::info!(
        device = ctx.ordinal(),
        mib = bytes >> 20,
        "CUDA activation pool reserved"
    );
    let p = Arc::new(DevicePool { pool, clock });
    g.insert(ctx.ordinal(), Arc::clone(&p));
    Ok(p)
}

/// The activation arena of one execution context: a block of the device pool, or (when the
/// pool is full) its own allocation. Its owner must have waited for its stream before dropping
/// it: the drop returns the block and retires the stream from the pool and its clock.
pub enum Arena {
    /// A block of the process-wide device pool, taken on `stream`.
    Pooled {
        block: Option<Block<DeviceRegion>>,
        pool: Arc<DevicePool>,
        stream: StreamId,
    },
    /// A separate allocation (the pool had no room).
    Own(DeviceBuffer),
}

impl Arena {
    /// The device address of the first byte.
    pub fn ptr(&self) -> u64 {
        match self {
            Arena::Pooled { block, .. } => block.as_ref().map_or(0, |b| b.addr() as u64),
            Arena::Own(b) => b.ptr(),
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        if let Arena::Pooled {
            block,
            pool,
            stream,
        } = self
        {
            drop(block.take());
            pool.retire(*stream);
        }
    }
}

/// Takes a context's arena of `bytes` from the device pool, registering `stream` in the pool's
/// clock under a fresh stream id; falls back to a plain allocation when the pool is full.
pub fn alloc_arena(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    bytes: usize,
) -> Result<Arena> {
    let p = device_pool(ctx, bytes)?;
    let id = StreamId(NEXT_STREAM.fetch_add(1, Ordering::Relaxed));
    p.clock.add_stream(id, Arc::clone(stream));
    match p.pool.alloc(bytes, id) {
        Ok(b) => Ok(Arena::Pooled {
            block: Some(b),
            pool: p,
            stream: id,
        }),
        Err(e) => {
            p.retire(id);
            tracing::warn!("CUDA activation pool full ({e}); allocating the arena separately");
            Ok(Arena::Own(DeviceBuffer::alloc(ctx, bytes)?))
        }
    }
}

/// Page-locked host memory for input and output staging (freed on drop).
pub struct PinnedBuffer {
    ctx: Arc<CudaContext>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain host memory owned by this value.
unsafe impl Send for PinnedBuffer {}

impl PinnedBuffer {
    /// Allocates `len` bytes of pinned host memory.
    pub fn alloc(ctx: &Arc<CudaContext>, len: usize) -> Result<Self> {
        ctx.bind_to_thread().map_err(drv_err("bind context"))?;
        // SAFETY: plain pinned allocation owned by the returned value.
        let ptr = unsafe { drv::malloc_host(len.max(64), 0) }
            .map_err(|e| Error::OutOfMemory(format!("cannot pin {len} host bytes: {e}")))?;
        Ok(PinnedBuffer {
            ctx: Arc::clone(ctx),
            ptr: ptr as *mut u8,
            len,
        })
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: ptr holds len bytes for the buffer's lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, exclusively borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by malloc_host and not freed before.
            let _ = unsafe { drv::free_host(self.ptr as *mut std::ffi::c_void) };
        }
    }
}

/// NVRTC's virtual architecture for compute capability `cc`; `None` (NVRTC's default, which
/// the driver JIT-compiles anywhere) for devices this build does not know.
pub fn nvrtc_arch(cc: (i32, i32)) -> Option<&'static str> {
    match cc {
        // 90a: Hopper's own instructions (wgmma) for the int8 implicit GEMM.
        (9, 0) => Some("compute_90a"),
        (8, 9) => Some("compute_89"),
        // Jetson Orin.
        (8, 7) => Some("compute_87"),
        (8, 6) => Some("compute_86"),
        (8, 0) => Some("compute_80"),
        (7, 5) => Some("compute_75"),
        // Jetson Xavier.
        (7, 2) => Some("compute_72"),
        (10, 0) => Some("compute_100"),
        (12, 0) => Some("compute_120"),
        _ => None,
    }
}

/// Whether the int8 implicit GEMM's instructions (`cp.async`, `mma.sync` on bytes, sm_80) can
/// be compiled for compute capability `cc`: Ampere or later, with a known architecture (the
/// NVRTC default is older).
pub fn igemm_capable(cc: (i32, i32)) -> bool {
    cc >= (8, 0) && nvrtc_arch(cc).is_some()
}

/// Whether generated kernels for compute capability `cc` may be launched as programmatic
/// dependents: their `GRID_SYNC()` waits only when compiled for sm_90 or later, so the device
/// must be Hopper or newer *and* have a known architecture (NVRTC's default is older, and a
/// kernel that does not wait must never overlap its predecessor).
pub fn programmatic_launch_capable(cc: (i32, i32)) -> bool {
    cc >= (9, 0) && nvrtc_arch(cc).is_some()
}

/// A loaded module of NVRTC-compiled kernels (unloaded on drop).
pub struct Module {
    ctx: Arc<CudaContext>,
    module: sys::CUmodule,
}

// SAFETY: a CUmodule handle may be used from any thread with its context bound.
unsafe impl Send for Module {}
// SAFETY: as above; functions are only looked up and launched, never mutated.
unsafe impl Sync for Module {}

/// A kernel function handle inside a [`Module`].
#[derive(Clone, Copy)]
pub struct Function(pub sys::CUfunction);
// SAFETY: a CUfunction is an immutable handle valid while its module is loaded.
unsafe impl Send for Function {}
// SAFETY: as above.
unsafe impl Sync for Function {}

impl Function {
    /// Launches this kernel on `stream`. With `overlap` (programmatic dependent launch, sm_90+)
    /// it may start while the stream's previous kernel finishes: the generated kernels'
    /// `GRID_SYNC()` then waits for that kernel's writes before touching activations.
    ///
    /// # Safety
    /// `params` must point at exactly the kernel's arguments, each valid for the launch.
    pub unsafe fn launch(
        &self,
        (grid, block, smem): ((u32, u32, u32), u32, u32),
        stream: sys::CUstream,
        params: &mut [*mut std::ffi::c_void],
        overlap: bool,
    ) -> Result<()> {
        // SAFETY: the attribute value is plain data, zeroed then set through its own field.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: smem,
            hStream: stream,
            attrs: &mut attr,
            numAttrs: u32::from(overlap),
        };
        // SAFETY: the caller guarantees the arguments; the config and attribute outlive the call.
        unsafe {
            sys::cuLaunchKernelEx(&config, self.0, params.as_mut_ptr(), std::ptr::null_mut())
                .result()
        }
        .map_err(drv_err("kernel launch"))
    }
}

impl Module {
    /// Compiles CUDA C source with NVRTC for the device's architecture and loads it.
    pub fn compile(ctx: &Arc<CudaContext>, src: &str) -> Result<Self> {
        Self::load(ctx, &Self::ptx(ctx, src)?)
    }

    /// Compiles CUDA C source to PTX with NVRTC for the device's architecture (no context
    /// needed bound: callers may compile several modules on threads and load them after).
    pub fn ptx(ctx: &Arc<CudaContext>, src: &str) -> Result<String> {
        let (major, minor) = ctx
            .compute_capability()
            .map_err(drv_err("compute capability query"))?;
        let arch = nvrtc_arch((major, minor));
        let opts = cudarc::nvrtc::CompileOptions {
            arch,
            options: vec!["--std=c++17".into()],
            ..Default::default()
        };
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(src, opts)
            .map_err(|e| Error::Unsupported(format!("NVRTC compilation failed: {e:?}")))?;
        Ok(ptx.to_src())
    }

    /// Loads a PTX image (the driver compiles it for the device).
    pub fn load(ctx: &Arc<CudaContext>, ptx: &str) -> Result<Self> {
        let text = std::ffi::CString::new(ptx)
            .map_err(|_| Error::Unsupported("NVRTC produced PTX with a NUL byte".into()))?;
        ctx.bind_to_thread().map_err(drv_err("bind context"))?;
        // SAFETY: a NUL-terminated PTX image.
        let module = unsafe { drv::module::load_data(text.as_ptr() as *const _) }
            .map_err(drv_err("module load"))?;
        Ok(Module {
            ctx: Arc::clone(ctx),
            module,
        })
    }

    /// Looks a kernel up by name.
    pub fn function(&self, name: &str) -> Result<Function> {
        let c = std::ffi::CString::new(name)
            .map_err(|_| Error::Unsupported(format!("bad kernel name {name}")))?;
        // SAFETY: the module is loaded.
        let f = unsafe { drv::module::get_function(self.module, c) }
            .map_err(drv_err("kernel lookup"))?;
        Ok(Function(f))
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: loaded by load_data and not unloaded before.
            let _ = unsafe { drv::module::unload(self.module) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jetson_and_hopper_get_their_own_architectures() {
        assert_eq!(nvrtc_arch((8, 7)), Some("compute_87"));
        assert_eq!(nvrtc_arch((7, 2)), Some("compute_72"));
        assert_eq!(nvrtc_arch((9, 0)), Some("compute_90a"));
        assert_eq!(nvrtc_arch((13, 0)), None);
        // Orin and the H200 run the implicit GEMM; Xavier (sm_72, no cp.async) and unknown
        // devices (compiled for NVRTC's default) do not.
        assert!(igemm_capable((8, 7)) && igemm_capable((9, 0)));
        assert!(!igemm_capable((7, 2)) && !igemm_capable((7, 5)) && !igemm_capable((13, 0)));
        // Programmatic launches: only where the kernels' wait is compiled in (sm_90+, known).
        assert!(programmatic_launch_capable((9, 0)) && programmatic_launch_capable((10, 0)));
        assert!(!programmatic_launch_capable((8, 7)) && !programmatic_launch_capable((13, 0)));
    }
}
