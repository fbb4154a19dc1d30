//! INT8 post-training calibration: FP32 activation statistics → scales → a QDQ ONNX model, a
//! TensorRT calibration cache and an accuracy report.
//!
//! Flow: [`Calibrator`] runs the FP32 graph (batch pinned, constants folded, ONNX names intact)
//! over preprocessed images and streams every activation into a [`Histogram`]; [`Calibrator::finish`]
//! picks thresholds ([`Method`]: TensorRT's entropy search, a percentile or min-max) and quantizes
//! weights symmetrically per output channel. The resulting [`Calibration`] writes the QDQ model
//! ([`qdq`]), the TensorRT cache ([`TrtCache`]) and evaluates itself ([`Calibration::evaluate`]):
//! per-layer SQNR and FP32-vs-INT8 agreement, computed by running the QDQ arithmetic as plain
//! f32 ops in the engine (fake quantization, see [`observe`]).
//!
//! Artefacts live next to the model, keyed by the model's sha256 ([`artefacts_for`]).

pub mod calibrate;
pub mod histogram;
pub mod observe;
pub mod qdq;
pub mod report;
pub mod trt_cache;

use std::path::{Path, PathBuf};

use rayon::prelude::*;
use sha2::{Digest, Sha256};

pub use calibrate::{compute_amax, quantize_weights, scale_for, Method, QuantizedWeights};
pub use histogram::{Histogram, DEFAULT_BINS};
pub use observe::{QuantGraph, QuantLayer};
pub use report::{Agreement, LayerReport, Report};
pub use trt_cache::{TrtCache, DEFAULT_TRT_VERSION};

use crate::error::{Error, Result};
use crate::ir::Tensor;
use crate::model::{Model, ModelOptions};
use crate::vision::{self, DecodeLimits, ImageTransform, Overrides, Results, Task, VisionSpec};

/// How to calibrate.
#[derive(Clone, Debug, PartialEq)]
pub struct CalibrationOptions {
    /// Threshold method for activations.
    pub method: Method,
    /// Percentile for [`Method::Percentile`] (0–100].
    pub percentile: f64,
    /// Per-output-channel weight scales (else one per tensor).
    pub per_channel: bool,
    /// Histogram bins.
    pub bins: usize,
    /// Mixed-precision list: layers (node, output or input names) kept in floating point.
    pub exclude: Vec<String>,
    /// `NV_TENSORRT_VERSION` written into the cache header.
    pub trt_version: String,
    /// CPU threads for the runs (0 = one per core).
    pub threads: usize,
}

impl Default for CalibrationOptions {
    fn default() -> Self {
        CalibrationOptions {
            method: Method::Entropy,
            percentile: 99.99,
            per_channel: true,
            bins: DEFAULT_BINS,
            exclude: Vec::new(),
            trt_version: DEFAULT_TRT_VERSION.to_string(),
            threads: 0,
        }
    }
}

/// sha256 of the model bytes as lower-case hex. A cryptographic hash (not std's unstable
/// `DefaultHasher`) so keys are stable across builds, platforms and Rust versions.
pub fn model_hash(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Paths of the calibration artefacts of one model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Artefacts {
    /// `<stem>.int8.<hash8>.qdq.onnx`: the explicitly quantized model.
    pub qdq_onnx: PathBuf,
    /// `<stem>.int8.<hash8>.calib`: the TensorRT calibration cache.
    pub trt_cache: PathBuf,
    /// `<stem>.int8.<hash8>.report.json`: the report.
    pub report: PathBuf,
}

impl Artefacts {
    /// Whether all three files exist.
    pub fn exist(&self) -> bool {
        self.qdq_onnx.is_file() && self.trt_cache.is_file() && self.report.is_file()
    }
}

/// Where the artefacts of the model at `model_path` with hash `hash` (full or first 8 hex
/// digits of [`model_hash`]) live: next to the model, keyed by the hash's first 8 digits.
pub fn artefacts_for(model_path: &Path, hash: &str) -> Artefacts {
    let dir = model_path.parent().unwrap_or(Path::new(""));
    let stem = model_path
        .file_stem()
        .map_or_else(|| "model".to_string(), |s| s.to_string_lossy().into_owned());
    let h: String = hash.chars().take(8).collect();
    let file = |ext: &str| dir.join(format!("{stem}.int8.{h}.{ext}"));
    Artefacts {
        qdq_onnx: file("qdq.onnx"),
        trt_cache: file("calib"),
        report: file("report.json"),
    }
}

/// The cached artefacts of the model file at `model_path`, if a calibration of exactly these
/// bytes exists next to it.
pub fn find_artefacts(model_path: &Path) -> Result<Option<Artefacts>> {
    let bytes = std::fs::read(model_path)?;
    let a = artefacts_for(model_path, &model_hash(&bytes));
    Ok(a.exist().then_some(a))
}

/// Image files (jpg, jpeg, png, bmp, webp) in `dir`, sorted by name.
pub fn list_images(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        let ext = p
            .extension()
            .map(|e| e.to_string_lossy().to_ascii_lowercase())
            .unwrap_or_default();
        if p.is_file() && matches!(ext.as_str(), "jpg" | "jpeg" | "png" | "bmp" | "webp") {
            v.push(p);
        }
    }
    v.sort();
    Ok(v)
}

/// Decodes and preprocesses one image file with the model's own recipe.
pub fn load_input(path: &Path, spec: &VisionSpec) -> Result<(Tensor, ImageTransform)> {
    let bytes = std::fs::read(path)?;
    let img = vision::decode_image(&bytes, &DecodeLimits::default())
        .map_err(|e| Error::Image(format!("{}: {e}", path.display())))?;
    vision::preprocess(&img, &spec.preprocess)
}

/// Collects activation histograms over FP32 runs.
pub struct Calibrator {
    qg: QuantGraph,
    observer: observe::Observer,
    hists: Vec<Histogram>,
    images: usize,
    opts: CalibrationOptions,
    model_bytes: Vec<u8>,
}

fn model_options(threads: usize) -> ModelOptions {
    ModelOptions {
        threads,
        ..ModelOptions::default()
    }
}

impl Calibrator {
    /// Imports the model (batch 1) and builds the observer.
    pub fn new(model_bytes: &[u8], opts: CalibrationOptions) -> Result<Calibrator> {
        let graph = crate::onnx::load_model(model_bytes)?;
        let qg = QuantGraph::new(graph, 1)?;
        if qg.layers.is_empty() {
            return Err(Error::Unsupported(
                "the model has no Conv/Gemm/MatMul with constant weights to quantize".into(),
            ));
        }
        let observer = qg.observer(&model_options(opts.threads))?;
        let hists = (0..qg.activations.len())
            .map(|_| Histogram::new(opts.bins))
            .collect::<Result<Vec<_>>>()?;
        Ok(Calibrator {
            qg,
            observer,
            hists,
            images: 0,
            opts,
            model_bytes: model_bytes.to_vec(),
        })
    }

    /// The graph being calibrated.
    pub fn graph(&self) -> &QuantGraph {
        &self.qg
    }

    /// Runs one input batch and adds every activation to its histogram.
    pub fn add(&mut self, inputs: &[&Tensor]) -> Result<()> {
        let acts = self.observer.observe_all(inputs)?;
        self.hists
            .par_iter_mut()
            .zip(acts.par_iter())
            .for_each(|(h, a)| h.add(a));
        self.images += 1;
        Ok(())
    }

    /// The histograms, in [`QuantGraph::activations`] order.
    pub fn histograms(&self) -> &[Histogram] {
        &self.hists
    }

    /// Chooses thresholds and quantizes the weights.
    pub fn finish(self) -> Result<Calibration> {
        if self.images == 0 {
            return Err(Error::BadInput("no calibration images were run".into()));
        }
        let (method, pct) = (self.opts.method, self.opts.percentile);
        let amax = self
            .hists
            .par_iter()
            .map(|h| compute_amax(h, method, pct))
            .collect::<Result<Vec<_>>>()?;
        let weights = self.qg.quantize_weights(self.opts.per_channel)?;
        let excluded = self.qg.excluded(&self.opts.exclude);
        Ok(Calibration {
            model_sha256: model_hash(&self.model_bytes),
            qg: self.qg,
            amax,
            weights,
            excluded,
            images: self.images,
            opts: self.opts,
            model_bytes: self.model_bytes,
        })
    }
}

/// Progress stages reported to a caller's callback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// FP32 runs over the calibration images.
    Calibrate,
    /// FP32 and INT8 runs over the evaluation images.
    Evaluate,
}

/// Calibrated thresholds and quantized weights of one model.
pub struct Calibration {
    /// The FP32 graph (ONNX names).
    pub qg: QuantGraph,
    /// `amax` per activation, in [`QuantGraph::activations`] order.
    pub amax: Vec<f32>,
    /// Quantized weights per layer.
    pub weights: Vec<QuantizedWeights>,
    /// Per layer: kept in floating point by the mixed-precision list.
    pub excluded: Vec<bool>,
    /// Number of calibration inputs run.
    pub images: usize,
    /// The options used.
    pub opts: CalibrationOptions,
    /// sha256 of the model file.
    pub model_sha256: String,
    model_bytes: Vec<u8>,
}

impl Calibration {
    /// `(tensor name, amax)` of every activation, in execution order.
    pub fn activation_amax(&self) -> Vec<(String, f32)> {
        self.qg
            .activations
            .iter()
            .zip(&self.amax)
            .map(|(&v, &a)| (self.qg.name(v).to_string(), a))
            .collect()
    }

    /// The TensorRT calibration cache: `amax / 127` for every activation, in execution order,
    /// except activations read only by layers the mixed-precision list keeps in float.
    pub fn trt_cache(&self) -> TrtCache {
        let mut scales = Vec::new();
        for (&v, &a) in self.qg.activations.iter().zip(&self.amax) {
            let readers: Vec<bool> = self
                .qg
                .layers
                .iter()
                .zip(&self.excluded)
                .filter(|(l, _)| l.input == v)
                .map(|(_, &e)| e)
                .collect();
            if !readers.is_empty() && readers.iter().all(|&e| e) {
                continue;
            }
            scales.push((self.qg.name(v).to_string(), a / 127.0));
        }
        TrtCache::new(&self.opts.trt_version, scales)
    }

    /// The QDQ ONNX model (serialized).
    pub fn qdq_model(&self) -> Result<Vec<u8>> {
        let mut layers = Vec::new();
        for ((l, q), &ex) in self.qg.layers.iter().zip(&self.weights).zip(&self.excluded) {
            if ex {
                continue;
            }
            let i = self.qg.activation_index(l.input).ok_or_else(|| {
                Error::InvalidModel(format!("input of layer '{}' is not an activation", l.name))
            })?;
            layers.push(qdq::QdqLayer {
                node_output: self.qg.name(l.output),
                input: self.qg.name(l.input),
                input_scale: scale_for(self.amax[i]),
                weight: self.qg.name(l.weight),
                weights: q,
            });
        }
        qdq::write_qdq_model(&self.model_bytes, &layers)
    }

    /// The engine model computing exactly what the QDQ model computes, in f32.
    pub fn fake_quant_model(&self, opts: &ModelOptions) -> Result<Model> {
        let g = self
            .qg
            .fake_quant_graph(&self.amax, &self.weights, &self.excluded)?;
        Model::from_graph(g, opts)
    }

    /// The FP32 model (the calibrated graph as is).
    pub fn fp32_model(&self, opts: &ModelOptions) -> Result<Model> {
        Model::from_graph(self.qg.graph.clone(), opts)
    }

    /// Runs the evaluation images through FP32, the per-layer shadows and the fake-quant model
    /// and builds the report. `progress(done, total)` is called after each image.
    pub fn evaluate(
        &self,
        spec: &VisionSpec,
        images: &[PathBuf],
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Report> {
        let opts = model_options(self.opts.threads);
        let shadow = self.qg.shadow_graph(&self.amax, &self.weights)?;
        let shadow_model = Model::from_graph(shadow.graph.clone(), &opts)?;
        let mut shadow_ctx = shadow_model.new_context()?;
        let fq = self.fake_quant_model(&opts)?;
        let mut fq_ctx = fq.new_context()?;
        let n_out = shadow.model_outputs;
        let mut layer_sqnr = vec![report::Sqnr::default(); self.qg.layers.len()];
        let mut out_sqnr = vec![report::Sqnr::default(); n_out];
        let mut agree = report::AgreementAcc::default();
        for (k, path) in images.iter().enumerate() {
            let (input, transform) = load_input(path, spec)?;
            let outs = shadow_ctx.run_ref(&[&input])?;
            let fp32: Vec<Tensor> = outs[..n_out].to_vec();
            for (i, s) in layer_sqnr.iter_mut().enumerate() {
                s.add(
                    outs[shadow.reference[i]].as_f32()?,
                    outs[shadow.shadow[i]].as_f32()?,
                );
            }
            let int8 = fq_ctx.run_ref(&[&input])?;
            for (i, s) in out_sqnr.iter_mut().enumerate() {
                s.add(fp32[i].as_f32()?, int8[i].as_f32()?);
            }
            match &spec.task {
                Task::Classification { .. } => {
                    let (a, b) = (fp32.first(), int8.first());
                    let (Some(a), Some(b)) = (a, b) else {
                        return Err(Error::BadInput("classifier has no outputs".into()));
                    };
                    agree.add_classification(a.as_f32()?, b.as_f32()?);
                }
                Task::Detection { .. } => {
                    let o = Overrides::default();
                    let a = vision::postprocess(spec, &fp32, &transform, &o)?;
                    let b = vision::postprocess(spec, int8, &transform, &o)?;
                    if let (Results::Detections(a), Results::Detections(b)) = (a, b) {
                        agree.add_detections(&a, &b);
                    }
                }
            }
            progress(k + 1, images.len());
        }
        let layers = self
            .qg
            .layers
            .iter()
            .zip(&layer_sqnr)
            .zip(&self.weights)
            .zip(&self.excluded)
            .map(|(((l, s), w), &ex)| {
                let amax = self
                    .qg
                    .activation_index(l.input)
                    .map_or(0.0, |i| self.amax[i]);
                LayerReport {
                    name: l.name.clone(),
                    op: l.op.to_string(),
                    input: self.qg.name(l.input).to_string(),
                    output: self.qg.name(l.output).to_string(),
                    input_amax: amax,
                    input_scale: scale_for(amax),
                    weight_scales: w.scales.len(),
                    sqnr_db: s.db(),
                    excluded: ex,
                }
            })
            .collect();
        let outputs = shadow_model
            .outputs()
            .iter()
            .take(n_out)
            .zip(&out_sqnr)
            .map(|(o, s)| report::OutputSqnr {
                name: o.name.clone(),
                sqnr_db: s.db(),
            })
            .collect();
        let mut r = Report {
            model_sha256: self.model_sha256.clone(),
            method: self.opts.method.name().to_string(),
            per_channel: self.opts.per_channel,
            calibration_images: self.images,
            evaluation_images: images.len(),
            int8_path: "fake quantization in the Vigil CPU engine: the QDQ model's arithmetic \
                        (QuantizeLinear/DequantizeLinear as f32 Div/Round/Clip/Mul, int8-rounded \
                        weights) on FP32 kernels"
                .to_string(),
            agreement: agree.finish(),
            outputs,
            layers,
            sensitivity: Vec::new(),
            suggested_exclude: Vec::new(),
            excluded: Vec::new(),
        };
        r.rank();
        Ok(r)
    }
}

/// Calibrates `model_bytes` on `calib` images and evaluates on `eval` images, both preprocessed
/// with `spec`. `progress(stage, done, total)` is called after each image.
pub fn calibrate_images(
    model_bytes: &[u8],
    spec: &VisionSpec,
    calib: &[PathBuf],
    eval: &[PathBuf],
    opts: &CalibrationOptions,
    progress: &mut dyn FnMut(Stage, usize, usize),
) -> Result<(Calibration, Report)> {
    if calib.is_empty() {
        return Err(Error::BadInput("no calibration images".into()));
    }
    let mut c = Calibrator::new(model_bytes, opts.clone())?;
    for (k, p) in calib.iter().enumerate() {
        let (input, _) = load_input(p, spec)?;
        c.add(&[&input])?;
        progress(Stage::Calibrate, k + 1, calib.len());
    }
    let cal = c.finish()?;
    let report = cal.evaluate(spec, eval, &mut |d, t| progress(Stage::Evaluate, d, t))?;
    Ok((cal, report))
}

/// Writes the QDQ model, the TensorRT cache and the report next to `model_path`.
pub fn write_artefacts(model_path: &Path, cal: &Calibration, report: &Report) -> Result<Artefacts> {
    let a = artefacts_for(model_path, &cal.model_sha256);
    std::fs::write(&a.qdq_onnx, cal.qdq_model()?)?;
    std::fs::write(&a.trt_cache, cal.trt_cache().to_text())?;
    let json = serde_json::to_string_pretty(report)
        .map_err(|e| Error::BadInput(format!("cannot encode the report: {e}")))?;
    std::fs::write(&a.report, json)?;
    Ok(a)
}
