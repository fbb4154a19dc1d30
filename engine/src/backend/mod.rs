//! Execution backends, each behind the same small pair of traits (one module per backend).
//!
//! A backend compiles an optimized, shape-inferred graph into an [`Executable`] that owns the
//! weights; each [`BackendContext`] made from it owns only activation memory.

use std::sync::Arc;

use crate::error::Result;
use crate::ir::{Graph, Tensor};

pub mod cpu;

/// A compiled model on one backend. Shared by all its contexts (weights live here once).
pub trait Executable: Send + Sync {
    /// Backend name for logs and metrics ("cpu", "cuda", ...).
    fn backend(&self) -> &'static str;
    /// Creates an execution context with its own activation arena.
    fn new_context(self: Arc<Self>) -> Result<Box<dyn BackendContext>>;
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
