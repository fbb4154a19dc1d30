//! Execution backends, each behind the same small pair of traits (one module per backend).
//!
//! A backend compiles an optimized, shape-inferred graph into an [`Executable`] that owns the
//! weights; each [`BackendContext`] made from it owns only activation memory.

use std::sync::Arc;

use crate::error::Result;
use crate::ir::{Graph, Tensor};

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub(crate) mod resize_taps;

/// Where a model runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Device {
    /// The CPU backend (runs anywhere).
    #[default]
    Cpu,
    /// CUDA device 0; loading fails if it cannot be used.
    Cuda,
    /// CUDA when a usable GPU is present, else the CPU (with a log line saying why).
    Auto,
}

/// Arithmetic precision a backend runs a model at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// 32-bit float everywhere.
    #[default]
    Fp32,
    /// 16-bit float weights and activations, FP32 accumulation where accuracy needs it.
    Fp16,
    /// 8-bit integer weights and activations from explicit Q/DQ nodes or calibration.
    Int8,
}

/// Checks a run's tensors against the graph's signature (counts, and each input's type and
/// shape) before a backend touches its buffers; every backend's `run` starts with it.
pub fn check_signature(graph: &Graph, inputs: &[&Tensor], outputs: &[Tensor]) -> Result<()> {
    if inputs.len() != graph.inputs.len() || outputs.len() != graph.outputs.len() {
        return Err(crate::error::Error::BadInput(format!(
            "model takes {} inputs and gives {} outputs, got {} and {}",
            graph.inputs.len(),
            graph.outputs.len(),
            inputs.len(),
            outputs.len()
        )));
    }
    check_inputs(graph, inputs)
}

/// Checks the inputs' count, types and shapes against the graph (see [`check_signature`]).
pub fn check_inputs(graph: &Graph, inputs: &[&Tensor]) -> Result<()> {
    if inputs.len() != graph.inputs.len() {
        return Err(crate::error::Error::BadInput(format!(
            "model takes {} inputs, got {}",
            graph.inputs.len(),
            inputs.len()
        )));
    }
    for (&v, t) in graph.inputs.iter().zip(inputs) {
        let value = &graph.values[v];
        if t.dtype() != value.dtype || Some(t.shape.as_slice()) != value.shape.as_deref() {
            return Err(crate::error::Error::BadInput(format!(
                "input '{}' must be {:?} {:?}, got {:?} {:?}",
                value.name,
                value.dtype,
                value.shape.as_deref().unwrap_or(&[]),
                t.dtype(),
                t.shape
            )));
        }
    }
    Ok(())
}

/// The backend `device` selects here: `Auto` becomes `Cuda` when a usable GPU is present and
/// `Cpu` otherwise (with a log line saying why); `Cpu` and `Cuda` are returned as they are.
pub fn resolve_device(device: Device) -> Device {
    match device {
        Device::Auto => {
            #[cfg(feature = "cuda")]
            let why = match cuda::probe(0) {
                Ok(()) => return Device::Cuda,
                Err(e) => e.to_string(),
            };
            #[cfg(not(feature = "cuda"))]
            let why = "this build has no CUDA backend".to_string();
            tracing::info!("device auto: using the CPU backend because {why}");
            Device::Cpu
        }
        d => d,
    }
}

/// Whether convolution regions should run channels-last on this (resolved) device, precision
/// and batch. NHWC everywhere except CUDA fp32 at batch ≥ 8, where cuDNN's NCHW fp32 kernels
/// measured faster on the H200 (ResNet-50 b32 7.9 vs 9.3 ms, NanoDet-m b32 4.6 vs 7.3 ms) while
/// NHWC (with cuBLASLt pointwise convs) wins at batch 1 (docs/benchmarks.md).
/// `VIGIL_LAYOUT=nhwc|nchw` overrides (for A/B measurements).
pub fn prefers_nhwc(device: Device, precision: Precision, batch: usize) -> bool {
    match std::env::var("VIGIL_LAYOUT").as_deref() {
        Ok("nhwc") => return true,
        Ok("nchw") => return false,
        _ => {}
    }
    !(device == Device::Cuda && precision == Precision::Fp32 && batch >= 8)
}

/// Compiles `graph` on the backend `device` selects; `Auto` falls back to the CPU with a log line.
pub fn compile_for(
    device: Device,
    precision: Precision,
    threads: usize,
    graph: Arc<Graph>,
) -> Result<Arc<dyn Executable>> {
    let cpu = cpu::CpuBackend { threads };
    match resolve_device(device) {
        #[cfg(feature = "cuda")]
        Device::Cuda => cuda::CudaBackend {
            ordinal: 0,
            precision,
        }
        .compile(graph),
        #[cfg(not(feature = "cuda"))]
        Device::Cuda => {
            let _ = precision;
            Err(crate::error::Error::Unsupported(
                "this build has no CUDA backend (built without the `cuda` feature)".into(),
            ))
        }
        _ => cpu.compile(graph),
    }
}

/// Compiles `lane` (the model at its batch divided by `lanes`) to run as `lanes` lanes at once
/// that together take `full`'s batch: CUDA only, where each lane is a stream of its own.
pub fn compile_laned(
    device: Device,
    precision: Precision,
    (lane, full): (Arc<Graph>, Arc<Graph>),
    lanes: usize,
) -> Result<Arc<dyn Executable>> {
    match resolve_device(device) {
        #[cfg(feature = "cuda")]
        Device::Cuda => cuda::CudaBackend {
            ordinal: 0,
            precision,
        }
        .compile_laned(lane, full, lanes),
        _ => {
            let _ = (precision, lane, full);
            Err(crate::error::Error::Unsupported(format!(
                "{lanes} lanes need the CUDA backend (each lane is a stream of its own); this \
                 model runs on the CPU"
            )))
        }
    }
}

/// A compiled model on one backend. Shared by all its contexts (weights live here once).
pub trait Executable: Send + Sync {
    /// Backend name for logs and metrics ("cpu", "cuda", ...).
    fn backend(&self) -> &'static str;
    /// Creates an execution context with its own activation arena.
    fn new_context(self: Arc<Self>) -> Result<Box<dyn BackendContext>>;
    /// Creates an execution context whose host-side activation arena is a block of `pool`
    /// (backends whose activations live elsewhere, such as CUDA, keep their own arena).
    fn new_context_in(
        self: Arc<Self>,
        pool: &Arc<crate::memory::HostPool>,
    ) -> Result<Box<dyn BackendContext>> {
        let _ = pool;
        self.new_context()
    }
    /// Bytes of activation memory each context reserves.
    fn arena_bytes(&self) -> usize;
    /// The most activation bytes live at one step: no arena for this graph can be smaller.
    fn arena_lower_bound(&self) -> usize;
    /// Compiles `graph`, the same model prepared for other input shapes, sharing what this
    /// executable can share (the CPU backend: its worker pool). Backends that cannot change
    /// shapes after loading keep this default, an `Unsupported` error.
    fn specialise(&self, graph: Arc<Graph>) -> Result<Arc<dyn Executable>> {
        let _ = graph;
        Err(crate::error::Error::Unsupported(format!(
            "the {} backend runs only the input shapes the model was loaded for; load it with \
             the batch size you need",
            self.backend()
        )))
    }
}

/// A graph output left in device memory by [`BackendContext::run_on_device`]; the address is
/// valid until the context's next run.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceOutput {
    /// Device address of the first element.
    pub ptr: u64,
    /// Element type (f32 for float outputs, whatever the precision the model ran at).
    pub dtype: crate::ir::DataType,
    /// Shape of the output.
    pub shape: Vec<usize>,
}

/// Per-request execution state.
pub trait BackendContext: Send {
    /// Runs the graph: `inputs` in graph-input order, `outputs` pre-shaped in graph-output order.
    fn run(&mut self, inputs: &[&Tensor], outputs: &mut [Tensor]) -> Result<()>;

    /// Runs the graph and leaves its outputs on the device (nothing is copied back), for
    /// postprocessing there. `None`: this backend has no device memory, so call `run` instead.
    fn run_on_device(&mut self, inputs: &[&Tensor]) -> Result<Option<Vec<DeviceOutput>>> {
        let _ = inputs;
        Ok(None)
    }

    /// Copies the outputs of the last [`Self::run_on_device`] to the host (the fallback when
    /// device postprocessing fails).
    fn download_outputs(&mut self, outputs: &mut [Tensor]) -> Result<()> {
        let _ = outputs;
        Err(crate::error::Error::Unsupported(
            "this backend keeps no outputs on a device".into(),
        ))
    }
}

/// Compiles `graph` for a backend.
pub trait Backend {
    /// Compiles the graph (shapes inferred, passes applied) into an executable.
    fn compile(&self, graph: Arc<Graph>) -> Result<Arc<dyn Executable>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_choice_follows_device_precision_and_batch() {
        if std::env::var_os("VIGIL_LAYOUT").is_some() {
            println!("SKIP: VIGIL_LAYOUT is set, so the default rule is overridden");
            return;
        }
        assert!(prefers_nhwc(Device::Cpu, Precision::Fp32, 32));
        assert!(prefers_nhwc(Device::Cuda, Precision::Fp32, 1));
        assert!(!prefers_nhwc(Device::Cuda, Precision::Fp32, 32));
        assert!(prefers_nhwc(Device::Cuda, Precision::Fp16, 32));
        assert_eq!(resolve_device(Device::Cpu), Device::Cpu);
        assert_eq!(resolve_device(Device::Cuda), Device::Cuda);
    }
}
