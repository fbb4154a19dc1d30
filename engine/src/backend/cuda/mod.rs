//! The CUDA backend: cudarc (loaded dynamically, so the crate builds and runs without CUDA),
//! cuDNN convolutions, cuBLAS(Lt) GEMMs and NVRTC-compiled kernels for everything else.

use std::sync::Arc;

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
    fn compile(&self, _graph: Arc<Graph>) -> Result<Arc<dyn Executable>> {
        probe(self.ordinal)?;
        Err(Error::Unsupported(
            "the CUDA backend cannot compile graphs yet".into(),
        ))
    }
}
