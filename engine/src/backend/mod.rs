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

/// Compiles `graph` on the backend `device` selects; `Auto` falls back to the CPU with a log line.
pub fn compile_for(
    device: Device,
    precision: Precision,
    threads: usize,
    graph: Arc<Graph>,
) -> Result<Arc<dyn Executable>> {
    let cpu = cpu::CpuBackend { threads };
    match device {
        Device::Cpu => cpu.compile(graph),
        #[cfg(feature = "cuda")]
        Device::Cuda => cuda::CudaBackend {
            ordinal: 0,
            precision,
        }
        .compile(graph),
        #[cfg(feature = "cuda")]
        Device::Auto => match cuda::probe(0) {
            Ok(()) => cuda::CudaBackend {
                ordinal: 0,
                precision,
            }
            .compile(graph),
            Err(e) => {
                tracing::info!("device auto: using the CPU backend because {e}");
                cpu.compile(graph)
            }
        },
        #[cfg(not(feature = "cuda"))]
        Device::Cuda => {
            let _ = precision;
            Err(crate::error::Error::Unsupported(
                "this build has no CUDA backend (built without the `cuda` feature)".into(),
            ))
        }
        #[cfg(not(feature = "cuda"))]
        Device::Auto => {
            tracing::info!(
                "device auto: using the CPU backend because this build has no CUDA backend"
            );
            cpu.compile(graph)
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
}

/// Per-request execution state.
pub trait BackendContext: Send {
    /// Runs the graph: `inputs` in graph-input order, `outputs` pre-shaped in graph-output order.
    fn run(&mut self, inputs: &[&Tensor], outputs: &mut [Tensor]) -> Result<()>;
}

/// Compiles `graph` for a backend.
pub trait Backend {
    /// Compiles the graph (shapes inferred, passes applied) into an executable.
    fn compile(&self, graph: Arc<Graph>) -> Result<Arc<dyn Executable>>;
}
