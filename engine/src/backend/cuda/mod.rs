//! The CUDA backend: cudarc (loaded dynamically, so the crate builds and runs without CUDA),
//! cuDNN convolutions, cuBLAS(Lt) GEMMs and NVRTC-compiled kernels for everything else.

use std::sync::Arc;

mod codegen;
pub mod detect;
mod device;
mod dnn;
mod executable;
mod lt;
mod timing_cache;
pub mod vision;

pub use device::{alloc_counts, device_pool_stats, set_device_pool_size};
pub use dnn::algo_cache_len;
pub use executable::{
    back_to_back_kernels, last_device_ms, multicast_kernels, serial_split_kernels,
    stem_pool_kernels, CudaExecutable, LanedExecutable,
};

use crate::backend::{Backend, Executable, Precision};
use crate::error::{Error, Result};
use crate::ir::Graph;

/// Why no CUDA device can be used here, or `Ok(())` when device `ordinal` is usable.
pub fn probe(ordinal: usize) -> Result<()> {
    // SAFETY: only checks whether the driver library can be loaded.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(Error::Unsupported(
            "no CUDA driver library (libcuda.so) found".into(),
        ));
    }
    let count = cudarc::driver::result::init()
        .and_then(|_| cudarc::driver::result::device::get_count())
        .map_err(|e| Error::Unsupported(format!("CUDA driver failed to initialise: {e}")))?;
    if ordinal >= count as usize {
        return Err(Error::Unsupported(format!(
            "CUDA device {ordinal} requested but {count} device(s) present"
        )));
    }
    // SAFETY: each only checks whether a library can be loaded.
    let libs = unsafe {
        [
            ("cuDNN", cudarc::cudnn::sys::is_culib_present()),
            ("cuBLAS", cudarc::cublas::sys::is_culib_present()),
            ("cuBLASLt", cudarc::cublaslt::sys::is_culib_present()),
            ("NVRTC", cudarc::nvrtc::sys::is_culib_present()),
        ]
    };
    for (name, present) in libs {
        if !present {
            return Err(Error::Unsupported(format!(
                "the {name} library is not installed (or not on the loader path)"
            )));
        }
    }
    Ok(())
}

/// Compiles graphs for one CUDA device at one precision.
#[derive(Clone, Debug)]
pub struct CudaBackend {
    /// Device ordinal.
    pub ordinal: usize,
    /// Arithmetic precision of activations and weights.
    pub precision: Precision,
}

impl Backend for CudaBackend {
    fn compile(&self, graph: Arc<Graph>) -> Result<Arc<dyn Executable>> {
        probe(self.ordinal)?;
        // INT8 models (QDQ, folded into QConv/QGemm) run their int8 ops as int8 kernels and
        // the float ops between them in fp32.
        Ok(Arc::new(CudaExecutable::new(
            graph,
            self.ordinal,
            self.fp16(),
        )?))
    }
}

impl CudaBackend {
    /// Whether float weights and activations are stored as half: fp16 only (INT8 models run
    /// the float ops between their int8 ones in fp32).
    fn fp16(&self) -> bool {
        self.precision == Precision::Fp16
    }

    /// Compiles `lane` (the model at its batch divided by `lanes`) to run as `lanes` lanes at
    /// once, which together take `full`'s batch ([`LanedExecutable`]).
    pub fn compile_laned(
        &self,
        lane: Arc<Graph>,
        full: Arc<Graph>,
        lanes: usize,
    ) -> Result<Arc<dyn Executable>> {
        probe(self.ordinal)?;
        let exe = Arc::new(CudaExecutable::new(lane, self.ordinal, self.fp16())?);
        Ok(Arc::new(LanedExecutable::new(exe, full, lanes)?))
    }
}

/// Free bytes of device memory on the current device (for steady-state allocation checks).
pub fn free_device_memory() -> Result<usize> {
    let ctx = cudarc::driver::CudaContext::new(0)
        .map_err(|e| Error::Unsupported(format!("CUDA context: {e}")))?;
    ctx.mem_get_info()
        .map(|(free, _)| free)
        .map_err(|e| Error::Unsupported(format!("CUDA memory query: {e}")))
}
