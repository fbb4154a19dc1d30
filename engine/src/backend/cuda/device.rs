//! Device memory, pinned host memory and the driver calls the executor makes, as RAII wrappers.
//!
//! Every device allocation the backend makes goes through [`DeviceBuffer::alloc`], which counts
//! it, so tests can prove that the steady state allocates nothing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cudarc::driver::{result as drv, sys, CudaContext};

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

/// The one activation arena of an execution context. Kept behind this function so the memory
/// module's device region can replace the plain allocation.
pub fn alloc_arena(ctx: &Arc<CudaContext>, bytes: usize) -> Result<DeviceBuffer> {
    DeviceBuffer::alloc(ctx, bytes)
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

impl Module {
    /// Compiles CUDA C source with NVRTC for the device's architecture and loads it.
    pub fn compile(ctx: &Arc<CudaContext>, src: &str) -> Result<Self> {
        let (major, minor) = ctx
            .compute_capability()
            .map_err(drv_err("compute capability query"))?;
        let arch: Option<&'static str> = match (major, minor) {
            (9, 0) => Some("compute_90"),
            (8, 9) => Some("compute_89"),
            (8, 6) => Some("compute_86"),
            (8, 0) => Some("compute_80"),
            (7, 5) => Some("compute_75"),
            (10, 0) => Some("compute_100"),
            (12, 0) => Some("compute_120"),
            _ => None,
        };
        let opts = cudarc::nvrtc::CompileOptions {
            arch,
            options: vec!["--std=c++17".into()],
            ..Default::default()
        };
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(src, opts)
            .map_err(|e| Error::Unsupported(format!("NVRTC compilation failed: {e:?}")))?;
        let text = std::ffi::CString::new(ptx.to_src())
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
