//! The public facade: load a model, create execution contexts, run them.

use std::path::Path;
use std::sync::Arc;

use crate::backend::{
    compile_for, compile_laned, prefers_nhwc, resolve_device, BackendContext, Device, Executable,
    Precision,
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
    /// Equal parts of the batch run at once, each on its own CUDA stream (1: the whole batch
    /// as one chain). Small-M kernels leave SMs idle that a second chain fills.
    pub lanes: usize,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            batch: 1,
            threads: 0,
            optimize: true,
            device: Device::Cpu,
            precision: Precision::Fp32,
            lanes: 1,
        }
    }
}

/// Name, type and static shape of a model input or output.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TensorInfo {
    /// Tensor name in the model.
    pub name: String,
    /// Element type.
    pub dtype: DataType,
    /// Static shape once prepared (symbolic dims resolved, batch pinned).
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
    /// Executables for batch sizes other than the loaded one, compiled on first use.
    shapes: Arc<ShapeCache>,
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
        // Lanes are checked before any graph work (a laned model is prepared twice).
        match opts.lanes {
            0 => return Err(Error::BadInput("lanes must be at least 1".into())),
            lanes if !opts.batch.is_multiple_of(lanes) => {
                return Err(Error::BadInput(format!(
                    "{lanes} lanes must split the batch of {} evenly",
                    opts.batch
                )))
            }
            _ => {}
        }
        let device = resolve_device(opts.device);
        let nhwc = prefers_nhwc(device, opts.precision, opts.batch);
        // Exporters trace at batch 1 and may write it into Reshape shapes: at another batch
        // those must copy the input's batch instead, and the outputs must carry it through.
        let traced = if opts.batch != 1 {
            Some(free_baked_batch(&mut graph, 1)?.outputs)
        } else {
            None
        };
        // The imported graph, kept for other batch sizes (its constants are shared `Arc`s).
        let source = graph.clone();
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
        if let Some(at_one) = &traced {
            batch_carried(at_one, 1, opts.batch, &outputs)?;
        }
        let graph = Arc::new(graph);
        let executable = match opts.lanes {
            1 => compile_for(device, opts.precision, opts.threads, Arc::clone(&graph))?,
            lanes => {
                let each = opts.batch / lanes;
                let mut lane = source.clone();
                prepare_with(
                    &mut lane,
                    each,
                    opts.optimize,
                    prefers_nhwc(device, opts.precision, each),
                )?;
                let graphs = (Arc::new(lane), Arc::clone(&graph));
                compile_laned(device, opts.precision, graphs, lanes)?
            }
        };
        // CUDA models preprocess on the GPU (device 0, as `compile_for`); CPU if that fails.
        let preprocessor = Preprocessor::for_backend(executable.backend(), 0);
        let shapes = Arc::new(ShapeCache::new(
            source,
            opts,
            device,
            Arc::clone(&graph),
            Arc::clone(&executable),
        ));
        Ok(Model {
            graph,
            executable,
            inputs,
            outputs,
            report,
            preprocessor,
            shapes,
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

    /// The batch size the model was loaded for (other batches are compiled on first use).
    pub fn batch(&self) -> usize {
        self.shapes.batch
    }

    /// Batch sizes compiled so far, the loaded one first (at most [`MAX_SHAPES`]).
    pub fn compiled_batches(&self) -> Vec<usize> {
        let mut b = vec![self.shapes.batch];
        b.extend(self.shapes.lock().ok.iter().map(|s| s.batch));
        b
    }

    /// A new execution context whose activation arena is a block of `pool` (fails with an
    /// out-of-memory error stating the pool's state when it does not fit).
    pub fn new_context_in(&self, pool: &Arc<crate::memory::HostPool>) -> Result<ExecutionContext> {
        let inner = Arc::clone(&self.executable).new_context_in(pool)?;
        let mut ctx = self.wrap_context(inner);
        ctx.pool = Some(Arc::clone(pool));
        Ok(ctx)
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
            shapes: Arc::clone(&self.shapes),
            other_shapes: Vec::new(),
            pool: None,
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
    /// The model's per-batch executables.
    shapes: Arc<ShapeCache>,
    /// One arena (and output buffers) per other batch size this context has run.
    other_shapes: Vec<ShapeContext>,
    /// The host pool the arenas come from (`Model::new_context_in`), else each owns its own.
    pool: Option<Arc<crate::memory::HostPool>>,
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
    /// Inputs with another batch size run on that batch's executable (CPU backend; see
    /// [`ExecutionContext::arenas`]).
    pub fn run_ref(&mut self, inputs: &[&Tensor]) -> Result<&[Tensor]> {
        if inputs.len() != self.inputs.len() {
            return Err(Error::BadInput(format!(
                "model takes {} input(s), got {}",
                self.inputs.len(),
                inputs.len()
            )));
        }
        self.device_outputs = None;
        if !same_shapes(&self.inputs, inputs) {
            return self.run_other_shape(inputs);
        }
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
        if inputs.len() != self.inputs.len() || !same_shapes(&self.inputs, inputs) {
            return Err(Error::BadInput(format!(
                "vision runs take the model's {} input(s) at their loaded shapes",
                self.inputs.len()
            )));
        }
        if self.preprocessor.decodes_on_device(spec, overrides) {
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

    /// The raw outputs of the last [`Self::run_vision`] (or loaded-shape run) on the host,
    /// downloading them first if they were left on the device.
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

/// The most batch sizes one model tries (the loaded one, and batches it refused, included).
/// A run with a new batch size beyond this fails with [`Error::BadInput`]; nothing is evicted,
/// so every context's arenas stay valid and a server cannot be made to recompile by
/// alternating batch sizes.
pub const MAX_SHAPES: usize = 8;

/// One batch size's compiled model.
struct Specialised {
    batch: usize,
    executable: Arc<dyn Executable>,
    outputs: Vec<TensorInfo>,
}

/// A model's executables for batch sizes other than the loaded one, shared by its contexts.
///
/// A new batch re-runs the load-time passes (`prepare_with`) on the imported graph with that
/// batch pinned; constants the passes leave alone are the same `Arc`s as the loaded model's,
/// and constants they rewrite (folded, re-laid-out) are swapped for the loaded model's equal
/// copies where the bytes match. The backend then compiles it (`Executable::specialise`; the
/// CPU backend prepacks its kernel weights per batch) and takes the arena plan from the
/// `PlanCache`.
struct ShapeCache {
    /// The imported graph; on the first other batch, rewritten by [`free_baked_batch`].
    source: std::sync::Mutex<(Graph, bool)>,
    batch: usize,
    optimize: bool,
    device: Device,
    precision: Precision,
    /// Per model input: whether its leading dimension is the batch (`pin_inputs`' rule).
    batched: Vec<bool>,
    base_graph: Arc<Graph>,
    base: Arc<dyn Executable>,
    compiled: std::sync::Mutex<Compiled>,
}

/// Batch sizes tried so far (the loaded one aside).
#[derive(Default)]
struct Compiled {
    ok: Vec<Arc<Specialised>>,
    /// Batches the model cannot run, with the reason (answered again without recompiling).
    refused: Vec<(usize, String)>,
}

impl ShapeCache {
    fn new(
        source: Graph,
        opts: &ModelOptions,
        device: Device,
        base_graph: Arc<Graph>,
        base: Arc<dyn Executable>,
    ) -> Self {
        let batched = source
            .inputs
            .iter()
            .map(|&v| {
                matches!(
                    source.values[v].declared.as_deref().and_then(|d| d.first()),
                    Some(None) | Some(Some(1))
                )
            })
            .collect();
        ShapeCache {
            source: std::sync::Mutex::new((source, false)),
            batch: opts.batch,
            optimize: opts.optimize,
            device,
            precision: opts.precision,
            batched,
            base_graph,
            base,
            compiled: std::sync::Mutex::new(Compiled::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Compiled> {
        self.compiled.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The batch size `inputs` ask for, or `BadInput` naming what does not fit: every input
    /// must match the loaded signature except a batched input's leading dimension, and all
    /// batched inputs must agree on it.
    fn batch_of(&self, expected: &[TensorInfo], inputs: &[&Tensor]) -> Result<usize> {
        let mut batch = None;
        for ((info, t), &batched) in expected.iter().zip(inputs).zip(&self.batched) {
            let bad = |why: String| {
                Error::BadInput(format!(
                    "input '{}' must be {:?} {:?}{}, got {:?} {:?}: {why}",
                    info.name,
                    info.dtype,
                    info.shape,
                    if batched { " (any batch size)" } else { "" },
                    t.dtype(),
                    t.shape
                ))
            };
            if t.dtype() != info.dtype {
                return Err(bad("wrong element type".into()));
            }
            if t.shape.len() != info.shape.len() {
                return Err(bad(format!(
                    "rank {} instead of {}",
                    t.shape.len(),
                    info.shape.len()
                )));
            }
            let lead = usize::from(batched);
            if t.shape[lead..] != info.shape[lead..] {
                return Err(bad(if batched {
                    "only the batch (leading) dimension may differ".into()
                } else {
                    "this input has a fixed shape".into()
                }));
            }
            if batched {
                let n = t.shape[0];
                if n == 0 {
                    return Err(bad("the batch size must be at least 1".into()));
                }
                if batch.is_some_and(|b| b != n) {
                    return Err(bad(format!(
                        "batch {n} differs from another input's batch {}",
                        batch.unwrap_or(n)
                    )));
                }
                batch = Some(n);
            }
        }
        batch.ok_or_else(|| {
            Error::BadInput("inputs do not match the model's fixed input shapes".into())
        })
    }

    /// The executable for `batch`: compiled before, or compiled now (under the lock, so two
    /// contexts asking at once compile it once). A batch the model cannot run is remembered
    /// and refused again without recompiling; refused batches count towards [`MAX_SHAPES`].
    fn get_or_compile(&self, batch: usize) -> Result<Arc<Specialised>> {
        let mut compiled = self.lock();
        if let Some(s) = compiled.ok.iter().find(|s| s.batch == batch) {
            return Ok(Arc::clone(s));
        }
        if let Some((_, why)) = compiled.refused.iter().find(|r| r.0 == batch) {
            return Err(Error::Unsupported(why.clone()));
        }
        // Fail before the passes run where the backend cannot compile another shape.
        if self.base.backend() != "cpu" {
            return Err(Error::Unsupported(format!(
                "the {} backend runs only the batch size the model was loaded for ({}), got \
                 batch {batch}; load the model with the batch size you need",
                self.base.backend(),
                self.batch
            )));
        }
        if compiled.ok.len() + compiled.refused.len() + 1 >= MAX_SHAPES {
            let mut seen = vec![self.batch];
            seen.extend(compiled.ok.iter().map(|s| s.batch));
            let refused: Vec<usize> = compiled.refused.iter().map(|r| r.0).collect();
            return Err(Error::BadInput(format!(
                "batch {batch} would be this model's {}th input shape; at most {MAX_SHAPES} are \
                 tried (batches {seen:?} compiled, {refused:?} refused)",
                MAX_SHAPES + 1
            )));
        }
        match self.compile(batch) {
            Ok(s) => {
                let s = Arc::new(s);
                compiled.ok.push(Arc::clone(&s));
                Ok(s)
            }
            // Out of memory may pass; anything else about this batch will not.
            Err(e @ (Error::OutOfMemory(_) | Error::Io(_))) => Err(e),
            Err(Error::Unsupported(why)) => {
                compiled.refused.push((batch, why.clone()));
                Err(Error::Unsupported(why))
            }
            Err(e) => {
                let why = format!("this model cannot run batch {batch}: {e}");
                compiled.refused.push((batch, why.clone()));
                Err(Error::Unsupported(why))
            }
        }
    }

    /// Prepares and compiles the model for `batch` (see [`ShapeCache`]).
    fn compile(&self, batch: usize) -> Result<Specialised> {
        let mut graph = {
            let mut src = self.source.lock().unwrap_or_else(|e| e.into_inner());
            if !src.1 {
                let n = free_baked_batch(&mut src.0, self.batch)?.rewritten;
                tracing::debug!("{n} Reshape(s) with the batch size written in now copy it");
                src.1 = true;
            }
            src.0.clone()
        };
        let nhwc = prefers_nhwc(self.device, self.precision, batch);
        prepare_with(&mut graph, batch, self.optimize, nhwc)?;
        share_constants(&mut graph, &self.base_graph);
        let outputs = graph
            .outputs
            .iter()
            .map(|&v| {
                Ok(TensorInfo {
                    name: graph.values[v].name.clone(),
                    dtype: graph.values[v].dtype,
                    shape: graph.shape(v)?.to_vec(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        self.check_outputs(batch, &outputs)?;
        let executable = self.base.specialise(Arc::new(graph))?;
        Ok(Specialised {
            batch,
            executable,
            outputs,
        })
    }
}

impl ShapeCache {
    /// Refuses a specialisation whose outputs are not the loaded ones with the batch swapped
    /// (see [`batch_carried`]).
    fn check_outputs(&self, batch: usize, outputs: &[TensorInfo]) -> Result<()> {
        let base = &self.base_graph;
        let loaded = base
            .outputs
            .iter()
            .map(|&v| base.shape(v).map(<[usize]>::to_vec))
            .collect::<Result<Vec<_>>>()?;
        batch_carried(&loaded, self.batch, batch, outputs)
    }
}

/// Checks that outputs compiled for `batch` are the ones at `loaded_batch` (shapes `loaded`)
/// with the batch swapped: an output led by the loaded batch must be led by `batch` with the
/// same other dimensions, any other output must keep its shape. (A graph that folds the batch
/// into another dimension would otherwise give wrong results silently.)
fn batch_carried(
    loaded: &[Vec<usize>],
    loaded_batch: usize,
    batch: usize,
    outputs: &[TensorInfo],
) -> Result<()> {
    for (shape, got) in loaded.iter().zip(outputs) {
        let want: Vec<usize> = match shape.split_first() {
            Some((&b, rest)) if b == loaded_batch => {
                std::iter::once(batch).chain(rest.iter().copied()).collect()
            }
            _ => shape.clone(),
        };
        if got.shape != want {
            return Err(Error::Unsupported(format!(
                "this model cannot run batch {batch}: its output '{}' would be {:?} where \
                 batch {loaded_batch} gives {shape:?} (the graph does not carry the batch \
                 through); load a model exported for batch {batch}",
                got.name, got.shape
            )));
        }
    }
    Ok(())
}

/// Exporters often write the batch size they traced with into Reshape shapes (`[1, -1]` before
/// EfficientNet's Gemm; `[1, 80, -1]` computed from constants in NanoDet's heads). Where a
/// Reshape's shape does not depend on a model input (so it folds to the same constant at any
/// batch) and starts with the loaded `batch`, and its data depends on a model input with the
/// batch as leading dimension at the loaded size, the Reshape gets that shape with the leading
/// entry 0 ("copy the input's"): the same result at the loaded batch, and the batch carried
/// through at any other.
fn free_baked_batch(graph: &mut Graph, batch: usize) -> Result<BakedBatch> {
    use crate::ir::Op;
    // Folded at the loaded batch: every value's shape, and each constant shape subgraph's value.
    let mut shaped = graph.clone();
    crate::ir::shape::pin_inputs(&mut shaped, batch)?;
    crate::passes::fold_constants(&mut shaped)?;
    let mut from_input = vec![false; graph.values.len()];
    for &v in &graph.inputs {
        from_input[v] = true;
    }
    for n in &graph.nodes {
        if n.present_inputs().any(|v| from_input[v]) {
            for &o in &n.outputs {
                from_input[o] = true;
            }
        }
    }
    let mut rewritten = 0;
    for i in 0..graph.nodes.len() {
        let node = &graph.nodes[i];
        let (Op::Reshape { allowzero: false }, Some(x), Some(s)) =
            (&node.op, node.input(0), node.input(1))
        else {
            continue;
        };
        if from_input[s] || !from_input[x] {
            continue;
        }
        let Some(spec) = shaped.values.get(s).and_then(|v| v.constant.as_deref()) else {
            continue;
        };
        let mut dims = spec.to_i64_vec()?;
        let lead = shaped
            .values
            .get(x)
            .and_then(|v| v.shape.as_deref()?.first());
        if dims.first() != Some(&(batch as i64)) || lead != Some(&batch) {
            continue;
        }
        dims[0] = 0;
        let t = Tensor::from_i64(spec.shape.clone(), dims)?;
        let name = format!("{}/batch_free", graph.values[s].name);
        let c = graph.add_constant(name, t);
        graph.nodes[i].inputs[1] = Some(c);
        rewritten += 1;
    }
    let outputs = shaped
        .outputs
        .iter()
        .map(|&v| shaped.shape(v).map(<[usize]>::to_vec))
        .collect::<Result<Vec<_>>>()?;
    Ok(BakedBatch { rewritten, outputs })
}

/// What [`free_baked_batch`] did: Reshapes rewritten, and the output shapes at the batch it
/// folded the graph at (the rewrite keeps them).
struct BakedBatch {
    rewritten: usize,
    outputs: Vec<Vec<usize>>,
}

/// Replaces constants of `graph` equal (type, shape, bytes) to one of `base`'s with `base`'s
/// `Arc`, so a graph prepared for another batch holds no second copy of rewritten weights.
fn share_constants(graph: &mut Graph, base: &Graph) {
    use std::collections::{HashMap, HashSet};
    use std::hash::{Hash, Hasher};
    let shared: HashSet<*const Tensor> = base
        .values
        .iter()
        .filter_map(|v| v.constant.as_ref().map(Arc::as_ptr))
        .collect();
    let key = |t: &Tensor| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        t.as_bytes().hash(&mut h);
        (t.dtype(), t.shape.clone(), h.finish())
    };
    let mut by_key: HashMap<_, Vec<&Arc<Tensor>>> = HashMap::new();
    for c in base.values.iter().filter_map(|v| v.constant.as_ref()) {
        by_key.entry(key(c)).or_default().push(c);
    }
    for v in &mut graph.values {
        let Some(c) = &v.constant else { continue };
        if shared.contains(&Arc::as_ptr(c)) {
            continue;
        }
        let same = by_key
            .get(&key(c))
            .and_then(|cands| cands.iter().find(|b| b.as_bytes() == c.as_bytes()));
        if let Some(b) = same {
            v.constant = Some(Arc::clone(b));
        }
    }
}

/// Whether every input has exactly the shape (and type) the context was loaded for.
fn same_shapes(expected: &[TensorInfo], inputs: &[&Tensor]) -> bool {
    expected
        .iter()
        .zip(inputs)
        .all(|(i, t)| i.shape == t.shape && i.dtype == t.dtype())
}

/// A context's state for one other batch size: its arena and output buffers.
struct ShapeContext {
    batch: usize,
    inner: Box<dyn BackendContext>,
    outputs: Vec<Tensor>,
}

impl ExecutionContext {
    /// Activation arenas this context holds: one for the loaded batch size plus one per other
    /// batch size it has run (runs at a batch seen before allocate nothing).
    pub fn arenas(&self) -> usize {
        1 + self.other_shapes.len()
    }

    /// Runs inputs whose shapes differ from the loaded ones: finds (or makes, once) this
    /// context's arena for their batch size, compiling the model for it on first use.
    fn run_other_shape(&mut self, inputs: &[&Tensor]) -> Result<&[Tensor]> {
        let batch = self.shapes.batch_of(&self.inputs, inputs)?;
        let i = match self.other_shapes.iter().position(|s| s.batch == batch) {
            Some(i) => i,
            None => {
                let spec = self.shapes.get_or_compile(batch)?;
                let exe = Arc::clone(&spec.executable);
                let inner = match &self.pool {
                    Some(p) => exe.new_context_in(p)?,
                    None => exe.new_context()?,
                };
                let outputs = spec
                    .outputs
                    .iter()
                    .map(|o| Tensor::zeros(o.dtype, o.shape.clone()))
                    .collect();
                self.other_shapes.push(ShapeContext {
                    batch,
                    inner,
                    outputs,
                });
                self.other_shapes.len() - 1
            }
        };
        let s = &mut self.other_shapes[i];
        s.inner.run(inputs, &mut s.outputs)?;
        Ok(&s.outputs)
    }
}
