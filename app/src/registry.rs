//! Loaded models: name → model, vision spec, tensor signature and execution queue.

use std::collections::BTreeMap;
use std::sync::Arc;

use vigil_engine::memory::{HostPool, PoolSize};

use vigil_engine::vision::{Task, VisionSpec};
use vigil_engine::{Model, ModelOptions, TensorInfo};

use crate::config::{read_labels, Limits, ModelConfig};
use crate::queue::{Executor, ModelQueue};

/// A model ready to serve.
pub struct LoadedModel {
    /// Name used in URLs.
    pub name: String,
    /// The engine model (None for models built from custom executors).
    pub model: Option<Arc<Model>>,
    /// Pre/post-processing recipe.
    pub spec: VisionSpec,
    /// Runtime inputs, in order.
    pub inputs: Vec<TensorInfo>,
    /// Outputs, in order.
    pub outputs: Vec<TensorInfo>,
    /// Admission control and the pool of execution contexts.
    pub queue: ModelQueue,
}

/// "classification" or "detection".
pub fn task_name(spec: &VisionSpec) -> &'static str {
    match spec.task {
        Task::Classification { .. } => "classification",
        Task::Detection { .. } => "detection",
    }
}

/// Loads a model entry's ONNX file (with its batch/threads options) and builds its vision spec
/// (labels read, input size taken from the model when the config gives none).
pub fn load_model(cfg: &ModelConfig, opts: &ModelOptions) -> Result<(Model, VisionSpec), String> {
    let path = model_file(cfg, opts)?;
    let model = Model::load(&path, opts)
        .map_err(|e| format!("model '{}': cannot load {}: {e}", cfg.name, path.display()))?;
    let labels = match &cfg.labels {
        Some(p) => read_labels(p).map_err(|e| {
            format!(
                "model '{}': cannot read labels {}: {e}",
                cfg.name,
                p.display()
            )
        })?,
        None => Vec::new(),
    };
    let input_hw = model
        .inputs()
        .first()
        .and_then(|i| match i.shape.as_slice() {
            [_, 3, h, w] => Some((u32::try_from(*h).ok()?, u32::try_from(*w).ok()?)),
            _ => None,
        });
    let spec = cfg
        .vision_spec(labels, input_hw)
        .map_err(|e| e.to_string())?;
    Ok((model, spec))
}

/// The ONNX file to load: the configured one, or for `precision = "int8"` on a float model,
/// the QDQ model `vigil calibrate` cached next to it (keyed by the model's hash).
fn model_file(cfg: &ModelConfig, opts: &ModelOptions) -> Result<std::path::PathBuf, String> {
    if opts.precision != vigil_engine::Precision::Int8 {
        return Ok(cfg.path.clone());
    }
    let graph = vigil_engine::onnx::load_file(&cfg.path).map_err(|e| {
        format!(
            "model '{}': cannot load {}: {e}",
            cfg.name,
            cfg.path.display()
        )
    })?;
    let quantized = graph
        .nodes
        .iter()
        .any(|n| matches!(n.op.name(), "QuantizeLinear" | "DequantizeLinear"));
    if quantized {
        return Ok(cfg.path.clone());
    }
    match vigil_engine::quant::find_artefacts(&cfg.path) {
        Ok(Some(a)) => {
            tracing::info!(model = %cfg.name, qdq = %a.qdq_onnx.display(), "int8: using the calibrated QDQ model");
            Ok(a.qdq_onnx)
        }
        Ok(None) => Err(format!(
            "model '{}': precision = \"int8\" needs a QDQ model or calibration artefacts; run \
             `vigil calibrate --model {} --images DIR` first",
            cfg.name,
            cfg.path.display()
        )),
        Err(e) => Err(format!(
            "model '{}': cannot look up INT8 artefacts for {}: {e}",
            cfg.name,
            cfg.path.display()
        )),
    }
}

/// The load options a config entry asks for.
pub fn model_options(cfg: &ModelConfig) -> ModelOptions {
    ModelOptions {
        batch: cfg.batch.unwrap_or(1),
        threads: cfg.threads.unwrap_or(0),
        optimize: true,
        device: cfg.device.unwrap_or_default(),
        precision: cfg.precision.unwrap_or_default(),
        lanes: cfg.lanes.unwrap_or(1),
    }
}

impl LoadedModel {
    /// Loads a model entry: the ONNX file, its labels, and `workers` execution contexts.
    pub fn load(cfg: &ModelConfig, limits: &Limits) -> Result<LoadedModel, String> {
        Self::load_in(cfg, limits, None)
    }

    /// Like [`load`](Self::load), with CPU activation arenas taken from `pool` when given.
    pub fn load_in(
        cfg: &ModelConfig,
        limits: &Limits,
        pool: Option<&Arc<HostPool>>,
    ) -> Result<LoadedModel, String> {
        let (model, spec) = load_model(cfg, &model_options(cfg))?;
        let mut executors: Vec<Box<dyn Executor>> = Vec::with_capacity(limits.workers);
        for _ in 0..limits.workers.max(1) {
            let ctx = match pool {
                Some(p) => model.new_context_in(p),
                None => model.new_context(),
            };
            let ctx = ctx.map_err(|e| {
                format!(
                    "model '{}': cannot create an execution context: {e}",
                    cfg.name
                )
            })?;
            executors.push(Box::new(ctx));
        }
        let inputs = model.inputs().to_vec();
        let outputs = model.outputs().to_vec();
        Ok(LoadedModel {
            queue: ModelQueue::new(&cfg.name, limits.queue_depth, executors),
            name: cfg.name.clone(),
            model: Some(Arc::new(model)),
            spec,
            inputs,
            outputs,
        })
    }

    /// A model served by custom executors (embedding, tests); `inputs`/`outputs` describe its tensors.
    pub fn from_executors(
        name: &str,
        spec: VisionSpec,
        inputs: Vec<TensorInfo>,
        outputs: Vec<TensorInfo>,
        executors: Vec<Box<dyn Executor>>,
        queue_depth: usize,
    ) -> LoadedModel {
        LoadedModel {
            name: name.to_string(),
            model: None,
            spec,
            inputs,
            outputs,
            queue: ModelQueue::new(name, queue_depth, executors),
        }
    }

    /// "classification" or "detection".
    pub fn task_name(&self) -> &'static str {
        task_name(&self.spec)
    }
}

/// All served models by name.
#[derive(Default)]
pub struct Registry {
    models: BTreeMap<String, Arc<LoadedModel>>,
    host_pool: Option<Arc<HostPool>>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Loads every configured model; the first failure is returned.
    pub fn load_all(models: &[ModelConfig], limits: &Limits) -> Result<Registry, String> {
        Self::load_all_in(models, limits, None)
    }

    /// Loads every configured model with CPU arenas from one host pool of `pool` (one
    /// reservation at start-up), or per-context arenas when `None`.
    pub fn load_all_in(
        models: &[ModelConfig],
        limits: &Limits,
        pool: Option<PoolSize>,
    ) -> Result<Registry, String> {
        let mut r = Registry::new();
        if let Some(size) = pool {
            let pool = vigil_engine::memory::host_pool_sized(size)
                .map_err(|e| format!("cannot reserve the host pool ({size}): {e}"))?;
            tracing::info!(
                mib = pool.stats().reserved >> 20,
                size = %size,
                "host activation pool reserved"
            );
            r.host_pool = Some(pool);
        }
        for m in models {
            let started = std::time::Instant::now();
            let loaded = LoadedModel::load_in(m, limits, r.host_pool.as_ref())?;
            tracing::info!(model = %m.name, path = %m.path.display(), task = loaded.task_name(),
                ms = started.elapsed().as_millis() as u64, "model loaded");
            r.insert(loaded);
        }
        Ok(r)
    }

    /// The host pool CPU arenas come from, when `memory.pool_mb` is set.
    pub fn host_pool(&self) -> Option<&Arc<HostPool>> {
        self.host_pool.as_ref()
    }

    /// Adds (or replaces) a model.
    pub fn insert(&mut self, m: LoadedModel) {
        self.models.insert(m.name.clone(), Arc::new(m));
    }

    /// Looks a model up by name.
    pub fn get(&self, name: &str) -> Option<Arc<LoadedModel>> {
        self.models.get(name).cloned()
    }

    /// All models, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<LoadedModel>> {
        self.models.values()
    }

    /// Number of models.
    pub fn len(&self) -> usize {
        self.models.len()
    }

    /// True when no model is loaded.
    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }
}
