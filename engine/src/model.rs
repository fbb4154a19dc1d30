//! The public facade: load a model, create execution contexts, run them.

use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::ir::{DataType, Graph, Tensor};

/// How a model is loaded.
#[derive(Clone, Debug)]
pub struct ModelOptions {
    /// Batch size pinned into symbolic (or fixed-1) leading dimensions of the inputs.
    pub batch: usize,
    /// Worker threads for the CPU backend; 0 means one per core.
    pub threads: usize,
    /// Run the graph optimizer (constant folding, fusion, layout).
    pub optimize: bool,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions { batch: 1, threads: 0, optimize: true }
    }
}

/// Name, type and static shape of a model input or output.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: DataType,
    pub shape: Vec<usize>,
}

/// A loaded, optimized model. Weights live here once and are shared by every context.
pub struct Model {
    graph: Arc<Graph>,
    inputs: Vec<TensorInfo>,
    outputs: Vec<TensorInfo>,
}

impl Model {
    /// Loads an ONNX file.
    pub fn load(path: &Path, opts: &ModelOptions) -> Result<Model> {
        let bytes = std::fs::read(path)?;
        Model::from_bytes(&bytes, opts)
    }

    /// Loads an ONNX model from memory.
    pub fn from_bytes(_bytes: &[u8], _opts: &ModelOptions) -> Result<Model> {
        Err(Error::Unsupported("model loading is not wired yet".into()))
    }

    /// The model's runtime inputs.
    pub fn inputs(&self) -> &[TensorInfo] {
        &self.inputs
    }

    /// The model's outputs.
    pub fn outputs(&self) -> &[TensorInfo] {
        &self.outputs
    }

    /// The optimized graph the backend runs.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// A new execution context: its own activation arena, sharing this model's weights.
    pub fn new_context(&self) -> Result<ExecutionContext> {
        Err(Error::Unsupported("execution is not wired yet".into()))
    }
}

/// Per-request (or per-camera) execution state: one planned activation arena.
pub struct ExecutionContext {}

impl ExecutionContext {
    /// Runs the model; `inputs` are in the order of [`Model::inputs`], outputs in [`Model::outputs`] order.
    pub fn run(&mut self, _inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        Err(Error::Unsupported("execution is not wired yet".into()))
    }
}
