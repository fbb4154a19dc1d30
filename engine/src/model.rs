//! The public facade: load a model, create execution contexts, run them.

use std::path::Path;
use std::sync::Arc;

use crate::backend::{
    compile_for, prefers_nhwc, resolve_device, BackendContext, Device, Executable, Precision,
};
use crate::error::{Error, Result};
use crate::ir::{DataType, Graph, Tensor};
use crate::passes::{prepare_with, OptimizeReport};
use crate::vision::Preprocessor;

/// How a model is loaded.
#[derive(Clone, Debug)]
pub struct ModelOptions {
    /// Batch size pinned into symbolic (or fixed-1) leading dimensions of the inputs.
    pub batch: usize,
    /// Worker threads for the CPU backend; 0 means one per core.
    pub threads: usize,
    /// Run the fusion and layout passes (constant folding always runs).
    pub optimize: bool,
    /// Backend selection (`cpu`, `cuda`, `auto`).
    pub device: Device,
    /// Arithmetic precision (`fp32`, `fp16`, `int8`).
    pub precision: Precision,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            batch: 1,
            threads: 0,
            optimize: true,
            device: Device::Cpu,
            precision: Precision::Fp32,
        }
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
    executable: Arc<dyn Executable>,
    inputs: Vec<TensorInfo>,
    outputs: Vec<TensorInfo>,
    report: OptimizeReport,
    /// Where image preprocessing runs for this model's contexts (GPU for CUDA models).
    preprocessor: Preprocessor,
}

impl Model {
    /// Loads an ONNX file.
    pub fn load(path: &Path, opts: &ModelOptions) -> Result<Model> {
        let bytes = std::fs::read(path).map_err(|e| {
            Error::InvalidModel(format!("cannot read model '{}': {e}", path.display()))
        })?;
        Model::from_bytes(&bytes, opts)
    }

    /// Loads an ONNX model from memory.
    pub fn from_bytes(bytes: &[u8], opts: &ModelOptions) -> Result<Model> {
        let graph = crate::onnx::load_model(bytes)?;
        Model::from_graph(graph, opts)
    }

    /// Optimizes and compiles an imported graph.
    pub fn from_graph(mut graph: Graph, opts: &ModelOptions) -> Result<Model> {
        if opts.batch == 0 {
            return Err(Error::BadInput("batch size must be at least 1".into()));
        }
        let device = resolve_device(opts.device);
        let nhwc = prefers_nhwc(device, opts.precision, opts.batch);
        let report = prepare_with(&mut graph, opts.batch, opts.optimize, nhwc)?;
        let info = |ids: &[usize]| -> Result<Vec<TensorInfo>> {
            ids.iter()
                .map(|&v| {
                    Ok(TensorInfo {
                        name: graph.values[v].name.clone(),
                        dtype: graph.values[v].dtype,
                        shape: graph.shape(v)?.to_vec(),
                    })
                })
                .collect()
        };
        let inputs = info(&graph.inputs)?;
        let outputs = info(&graph.outputs)?;
        let graph = Arc::new(graph);
        let executable = compile_for(device, opts.precision, opts.threads, Arc::clone(&graph))?;
        // CUDA models preprocess on the GPU (device 0, as `compile_for`); CPU if that fails.
        let preprocessor = Preprocessor::for_backend(executable.backend(), 0);
        Ok(Model {
            graph,
            executable,
            inputs,
            outputs,
            report,
            preprocessor,
        })
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

    /// What the optimizer did.
    pub fn optimize_report(&self) -> &OptimizeReport {
        &self.report
    }

    /// Backend name ("cpu", ...).
    pub fn backend(&self) -> &'static str {
        self.executable.backend()
    }

    /// Bytes of activation memory each context reserves.
    pub fn arena_bytes(&self) -> usize {
        self.executable.arena_bytes()
    }

    /// Lower bound on the arena (peak live activation bytes), to judge the plan against.
    pub fn arena_lower_bound(&self) -> usize {
        self.executable.arena_lower_bound()
    }

    /// A new execution context: its own activation arena, sharing this model's weights.
    pub fn new_context(&self) -> Result<ExecutionContext> {
        let inner = Arc::clone(&self.executable).new_context()?;
        Ok(self.wrap_context(inner))
    }

    /// A new execution context whose activation arena is a block of `pool` (fails with an
    /// out-of-memory error stating the pool's state when it does not fit).
    pub fn new_context_in(&self, pool: &Arc<crate::memory::HostPool>) -> Result<ExecutionContext> {
        let inner = Arc::clone(&self.executable).new_context_in(pool)?;
        Ok(self.wrap_context(inner))
    }

    fn wrap_context(&self, inner: Box<dyn BackendContext>) -> ExecutionContext {
        let outputs = self
            .outputs
            .iter()
            .map(|o| Tensor::zeros(o.dtype, o.shape.clone()))
            .collect();
        ExecutionContext {
            inner,
            inputs: self.inputs.clone(),
            outputs,
            preprocessor: self.preprocessor.clone(),
            device_outputs: None,
        }
    }
}

/// Per-request (or per-camera) execution state: one planned activation arena.
pub struct ExecutionContext {
    inner: Box<dyn BackendContext>,
    inputs: Vec<TensorInfo>,
    outputs: Vec<Tensor>,
    preprocessor: Preprocessor,
    /// The last run's outputs when [`ExecutionContext::run_vision`] left them on the device
    /// (the host `outputs` are then stale).
    device_outputs: Option<Vec<crate::backend::DeviceOutput>>,
}

impl ExecutionContext {
    /// The inputs this context expects.
    pub fn inputs(&self) -> &[TensorInfo] {
        &self.inputs
    }

    /// Where this context's image preprocessing runs (the model's choice unless replaced).
    pub fn preprocessor(&self) -> &Preprocessor {
        &self.preprocessor
    }

    /// Replaces where image preprocessing runs (e.g. [`Preprocessor::Cpu`] to force the host).
    pub fn set_preprocessor(&mut self, p: Preprocessor) {
        self.preprocessor = p;
    }

    /// Runs the model; `inputs` are in the order of [`Model::inputs`]. The returned outputs are
    /// buffers owned by the context (reused across runs, so nothing is allocated per inference).
    pub fn run_ref(&mut self, inputs: &[&Tensor]) -> Result<&[Tensor]> {
        if inputs.len() != self.inputs.len() {
            return Err(Error::BadInput(format!(
                "model takes {} input(s), got {}",
                self.inputs.len(),
                inputs.len()
            )));
        }
        self.device_outputs = None;
        self.inner.run(inputs, &mut self.outputs)?;
        Ok(&self.outputs)
    }

    /// Runs the model for a vision task whose results [`Self::postprocess`] will compute:
    /// when the preprocessor can decode `spec` on the device (NanoDet on CUDA), the outputs
    /// stay there and nothing but the final detections ever comes back to the host.
    pub fn run_vision(
        &mut self,
        inputs: &[&Tensor],
        spec: &crate::vision::VisionSpec,
        overrides: &crate::vision::Overrides,
    ) -> Result<()> {
        if self.preprocessor.decodes_on_device(spec, overrides) {
            if inputs.len() != self.inputs.len() {
                return Err(Error::BadInput(format!(
                    "model takes {} input(s), got {}",
                    self.inputs.len(),
                    inputs.len()
                )));
            }
            self.device_outputs = None;
            if let Some(d) = self.inner.run_on_device(inputs)? {
                self.device_outputs = Some(d);
                return Ok(());
            }
        }
        self.run_ref(inputs).map(|_| ())
    }

    /// Results of the last [`Self::run_vision`]: decoded on the device when its outputs stayed
    /// there (falling back, logged, to downloading them if that fails), else on the host.
    pub fn postprocess(
        &mut self,
        spec: &crate::vision::VisionSpec,
        transform: &crate::vision::ImageTransform,
        overrides: &crate::vision::Overrides,
    ) -> Result<crate::vision::Results> {
        if let Some(d) = &self.device_outputs {
            match self
                .preprocessor
                .postprocess_device(spec, d, transform, overrides)
            {
                Ok(r) => return Ok(r),
                Err(e) => {
                    tracing::warn!("device postprocessing failed, using the host: {e}");
                    self.inner.download_outputs(&mut self.outputs)?;
                    self.device_outputs = None;
                }
            }
        }
        self.preprocessor
            .postprocess(spec, &self.outputs, transform, overrides)
    }

    /// The last run's raw outputs on the host, downloading them first if they were left on
    /// the device (so callers may still inspect them after [`Self::run_vision`]).
    pub fn host_outputs(&mut self) -> Result<&[Tensor]> {
        if self.device_outputs.is_some() {
            self.inner.download_outputs(&mut self.outputs)?;
            self.device_outputs = None;
        }
        Ok(&self.outputs)
    }

    /// Whether the last run left its outputs on the device (see [`Self::run_vision`]).
    pub fn outputs_on_device(&self) -> bool {
        self.device_outputs.is_some()
    }

    /// Runs the model and returns owned copies of the outputs ([`Model::outputs`] order).
    pub fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let refs: Vec<&Tensor> = inputs.iter().collect();
        Ok(self.run_ref(&refs)?.to_vec())
    }
}
