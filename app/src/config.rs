//! Daemon configuration: the TOML file format, its defaults, and how a model entry becomes a
//! [`VisionSpec`].

use std::path::{Path, PathBuf};

use serde::Deserialize;
use vigil_engine::memory::PoolSize;
use vigil_engine::vision::{DetectionHead, ResizeMode, Task, VisionSpec};

/// Default address the daemon listens on.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// A configuration problem (unreadable file, bad TOML, unknown key, invalid value).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
    Read {
        /// The config file.
        path: PathBuf,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// The TOML did not parse or did not match the schema (unknown keys included).
    #[error("invalid config {path}: {message}")]
    Parse {
        /// The config file (or the name the text was given under).
        path: PathBuf,
        /// The TOML parser's message (it usually points at the line at fault).
        message: String,
    },
    /// A value is out of range or inconsistent.
    #[error("invalid config: {0}")]
    Invalid(String),
    /// No models directory could be found.
    #[error("{0}")]
    ModelsDir(String),
}

/// The whole configuration file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Listen address, e.g. `127.0.0.1:8080`.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Request and resource limits.
    #[serde(default)]
    pub limits: Limits,
    /// The models to serve.
    #[serde(default)]
    pub models: Vec<ModelConfig>,
    /// Cameras to capture from and run models on (`[[cameras]]`).
    #[serde(default)]
    pub cameras: Vec<crate::camera::CameraConfig>,
    /// Memory pools (`[memory]`).
    #[serde(default)]
    pub memory: MemoryConfig,
}

/// Memory pools (`[memory]`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryConfig {
    /// Host pool reserved at start-up for every CPU execution context's activation arena, in
    /// MiB. Unset (and no `pool_fraction`): each context reserves its own arena. Too small a
    /// pool fails start-up with an out-of-memory error stating the pool's state.
    pub pool_mb: Option<usize>,
    /// The host pool as a fraction in (0, 1] of the memory available at start-up
    /// (`MemAvailable`); instead of `pool_mb`.
    pub pool_fraction: Option<f64>,
    /// Each GPU's activation pool, in MiB (unset: a quarter of the free device memory).
    pub cuda_pool_mb: Option<usize>,
    /// Each GPU's activation pool as a fraction in (0, 1] of its free memory when the first
    /// CUDA model loads (on a Jetson, of the DRAM the CPU shares); instead of `cuda_pool_mb`.
    pub cuda_pool_fraction: Option<f64>,
}

impl MemoryConfig {
    /// The host pool's size, if one is configured.
    pub fn host_pool_size(&self) -> Result<Option<PoolSize>, ConfigError> {
        pool_size(
            ("pool_mb", self.pool_mb),
            ("pool_fraction", self.pool_fraction),
        )
    }

    /// The CUDA activation pool's size, if configured.
    pub fn cuda_pool_size(&self) -> Result<Option<PoolSize>, ConfigError> {
        pool_size(
            ("cuda_pool_mb", self.cuda_pool_mb),
            ("cuda_pool_fraction", self.cuda_pool_fraction),
        )
    }
}

/// One pool's size from its MiB key and its fraction key (at most one of them set).
fn pool_size(
    (mb_key, mb): (&str, Option<usize>),
    (fraction_key, fraction): (&str, Option<f64>),
) -> Result<Option<PoolSize>, ConfigError> {
    let invalid = |e: vigil_engine::Error| ConfigError::Invalid(format!("memory: {e}"));
    match (mb, fraction) {
        (Some(_), Some(_)) => Err(ConfigError::Invalid(format!(
            "memory.{mb_key} and memory.{fraction_key} both size one pool: set one of them"
        ))),
        (Some(0), None) => Err(ConfigError::Invalid(format!(
            "memory.{mb_key} must be at least 1 (leave it unset for the default)"
        ))),
        (Some(mb), None) => PoolSize::mib(mb).map(Some).map_err(invalid),
        (None, Some(f)) => PoolSize::fraction(f)
            .map(Some)
            .map_err(|e| ConfigError::Invalid(format!("memory.{fraction_key}: {e}"))),
        (None, None) => Ok(None),
    }
}

fn default_listen() -> String {
    DEFAULT_LISTEN.to_string()
}

/// Resource limits (`[limits]`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Largest accepted request body in bytes.
    pub max_body_bytes: usize,
    /// Largest accepted image width*height.
    pub max_pixels: u64,
    /// Per model: most requests waiting plus executing; more get 503.
    pub queue_depth: usize,
    /// Per model: execution contexts, i.e. requests executing at once.
    pub workers: usize,
    /// Longest a request may wait and run before it gets 504.
    pub request_timeout_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 16 * 1024 * 1024,
            max_pixels: 40_000_000,
            queue_depth: 32,
            workers: 2,
            request_timeout_ms: 30_000,
        }
    }
}

/// What a model does (`task = "classification" | "detection"`).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TaskKind {
    /// Image classification.
    Classification,
    /// Object detection.
    Detection,
}

/// Detection head layout (`head = "nanodet" | "yolov8"`).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum HeadKind {
    /// NanoDet GFL head (per-stride scores and box distributions).
    Nanodet,
    /// YOLOv8 head ([1, 4 + C, N]).
    Yolov8,
}

/// How images are fitted to the input (`resize = "stretch" | "letterbox" | "short_side_center_crop"`).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ResizeKind {
    /// Scale x and y independently.
    Stretch,
    /// Keep aspect ratio and pad.
    Letterbox,
    /// Resize the short side to `short_side`, centre-crop.
    ShortSideCenterCrop,
}

/// One `[[models]]` entry. Unset fields take the defaults of the task/head preset.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Name used in URLs (`/v1/models/{name}/infer`).
    pub name: String,
    /// ONNX file (relative paths resolve against the config file's directory).
    pub path: PathBuf,
    /// Classification or detection; defaults by file name, else classification.
    pub task: Option<TaskKind>,
    /// Detection head; defaults to nanodet.
    pub head: Option<HeadKind>,
    /// Label file, one class name per line.
    pub labels: Option<PathBuf>,
    /// Model input width in pixels.
    pub input_width: Option<u32>,
    /// Model input height in pixels.
    pub input_height: Option<u32>,
    /// Resize mode.
    pub resize: Option<ResizeKind>,
    /// Short side for `short_side_center_crop`.
    pub short_side: Option<u32>,
    /// Padding value for `letterbox`.
    pub pad_value: Option<u8>,
    /// Per-channel mean (after `scale`).
    pub mean: Option<[f32; 3]>,
    /// Per-channel standard deviation.
    pub std: Option<[f32; 3]>,
    /// Pixel scale factor (e.g. 1/255).
    pub scale: Option<f32>,
    /// Feed BGR instead of RGB.
    pub bgr: Option<bool>,
    /// Apply softmax to classification outputs.
    pub softmax: Option<bool>,
    /// Default number of classes returned.
    pub top_k: Option<usize>,
    /// Default minimum score.
    pub score_threshold: Option<f32>,
    /// NMS IoU threshold.
    pub iou_threshold: Option<f32>,
    /// Most detections returned.
    pub max_detections: Option<usize>,
    /// Batch size pinned at load.
    pub batch: Option<usize>,
    /// CPU threads (0 = one per core).
    pub threads: Option<usize>,
    /// Backend: `cpu`, `cuda` or `auto` (CUDA when a GPU is usable, else CPU).
    pub device: Option<vigil_engine::Device>,
    /// Precision: `fp32`, `fp16` or `int8`.
    pub precision: Option<vigil_engine::Precision>,
    /// Equal parts of the batch run at once, each on its own CUDA stream (CUDA only; 1, the
    /// default, runs the batch as one chain of kernels).
    pub lanes: Option<usize>,
    /// Mixed precision for `precision = "int8"`: layers (node, output or input tensor names, as
    /// listed in the calibration report) kept in floating point.
    pub int8_exclude: Option<Vec<String>>,
}

/// Which built-in preset a model file name suggests.
fn preset_for(path: &Path) -> Option<(TaskKind, Option<HeadKind>)> {
    let stem = path.file_stem()?.to_string_lossy().to_ascii_lowercase();
    if stem.starts_with("efficientnet") {
        Some((TaskKind::Classification, None))
    } else if stem.starts_with("nanodet") {
        Some((TaskKind::Detection, Some(HeadKind::Nanodet)))
    } else if stem.starts_with("yolov8") {
        Some((TaskKind::Detection, Some(HeadKind::Yolov8)))
    } else {
        None
    }
}

impl ModelConfig {
    /// A model entry for an ONNX file with defaults chosen by file name (efficientnet*, nanodet*,
    /// yolov8*), else classification; labels are looked up next to the file for known presets.
    pub fn from_path(path: &Path) -> ModelConfig {
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into());
        let dir = path.parent().unwrap_or(Path::new("."));
        let (task, head) = preset_for(path)
            .map_or((Some(TaskKind::Classification), None), |(t, h)| {
                (Some(t), h)
            });
        let labels = match preset_for(path) {
            Some((TaskKind::Classification, _)) => Some(dir.join("imagenet-labels.txt")),
            Some((TaskKind::Detection, _)) => Some(dir.join("coco-labels.txt")),
            None => None,
        }
        .filter(|p| p.is_file());
        ModelConfig {
            name,
            path: path.to_path_buf(),
            task,
            head,
            labels,
            ..ModelConfig::default()
        }
    }

    /// The task, falling back to the file-name preset, then classification.
    pub fn task_kind(&self) -> TaskKind {
        self.task
            .or_else(|| preset_for(&self.path).map(|p| p.0))
            .unwrap_or(TaskKind::Classification)
    }

    /// Builds the vision spec: preset defaults for the task/head, then this entry's overrides.
    /// `input_hw` is the model's declared (height, width), used when the config gives none.
    pub fn vision_spec(
        &self,
        labels: Vec<String>,
        input_hw: Option<(u32, u32)>,
    ) -> Result<VisionSpec, ConfigError> {
        let mut spec = match self.task_kind() {
            TaskKind::Classification => VisionSpec::efficientnet_lite0(labels),
            TaskKind::Detection => {
                let head = self
                    .head
                    .or_else(|| preset_for(&self.path).and_then(|p| p.1))
                    .unwrap_or(HeadKind::Nanodet);
                match head {
                    HeadKind::Nanodet => VisionSpec::nanodet_m_416(labels),
                    HeadKind::Yolov8 => {
                        let mut s = VisionSpec::nanodet_m_416(labels);
                        s.task = Task::Detection {
                            head: DetectionHead::Yolov8,
                        };
                        s.preprocess.width = 640;
                        s.preprocess.height = 640;
                        s.preprocess.resize = ResizeMode::Letterbox { pad_value: 114 };
                        s.score_threshold = 0.25;
                        s.iou_threshold = 0.45;
                        s
                    }
                }
            }
        };
        let p = &mut spec.preprocess;
        let (default_w, default_h) = (p.width, p.height);
        if let Some((h, w)) = input_hw {
            p.width = w;
            p.height = h;
        }
        if let Some(w) = self.input_width {
            p.width = w;
        }
        if let Some(h) = self.input_height {
            p.height = h;
        }
        if p.width == 0 || p.height == 0 {
            return Err(ConfigError::Invalid(format!(
                "model '{}': input size must be positive",
                self.name
            )));
        }
        // Keep the preset's crop ratio when the input size differs from the preset.
        if let ResizeMode::ShortSideCenterCrop { short_side } = &mut p.resize {
            if (p.width, p.height) != (default_w, default_h) {
                let side = p.width.max(p.height) as u64 * *short_side as u64
                    / default_w.max(default_h).max(1) as u64;
                *short_side = side as u32;
            }
        }
        if let Some(kind) = self.resize {
            p.resize = match kind {
                ResizeKind::Stretch => ResizeMode::Stretch,
                ResizeKind::Letterbox => ResizeMode::Letterbox {
                    pad_value: self.pad_value.unwrap_or(114),
                },
                ResizeKind::ShortSideCenterCrop => {
                    let default_side = match p.resize {
                        ResizeMode::ShortSideCenterCrop { short_side } => short_side,
                        _ => p.width.max(p.height) * 8 / 7,
                    };
                    ResizeMode::ShortSideCenterCrop {
                        short_side: self.short_side.unwrap_or(default_side),
                    }
                }
            };
        } else if let (Some(side), ResizeMode::ShortSideCenterCrop { short_side }) =
            (self.short_side, &mut p.resize)
        {
            *short_side = side;
        }
        if let ResizeMode::ShortSideCenterCrop { short_side } = p.resize {
            if short_side < p.width.max(p.height) {
                return Err(ConfigError::Invalid(format!(
                    "model '{}': short_side {short_side} is smaller than the input size {}x{}",
                    self.name, p.width, p.height
                )));
            }
        }
        if let Some(m) = self.mean {
            p.mean = m;
        }
        if let Some(s) = self.std {
            if s.iter().any(|&v| v == 0.0 || !v.is_finite()) {
                return Err(ConfigError::Invalid(format!(
                    "model '{}': std values must be finite and non-zero",
                    self.name
                )));
            }
            p.std = s;
        }
        if let Some(s) = self.scale {
            p.scale = s;
        }
        if let Some(b) = self.bgr {
            p.bgr = b;
        }
        if let (Some(sm), Task::Classification { softmax }) = (self.softmax, &mut spec.task) {
            *softmax = sm;
        }
        if let Some(k) = self.top_k {
            spec.top_k = k;
        }
        if let Some(t) = self.score_threshold {
            spec.score_threshold = t;
        }
        if let Some(t) = self.iou_threshold {
            spec.iou_threshold = t;
        }
        if let Some(m) = self.max_detections {
            spec.max_detections = m;
        }
        Ok(spec)
    }
}

impl Config {
    /// Parses TOML text; relative model and label paths resolve against `base_dir`.
    pub fn from_toml(text: &str, origin: &Path, base_dir: &Path) -> Result<Config, ConfigError> {
        let mut cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: origin.to_path_buf(),
            message: e.to_string(),
        })?;
        for m in &mut cfg.models {
            if m.path.is_relative() {
                m.path = base_dir.join(&m.path);
            }
            if let Some(l) = &mut m.labels {
                if l.is_relative() {
                    *l = base_dir.join(&*l);
                }
            }
        }
        for c in &mut cfg.cameras {
            c.resolve_paths(base_dir);
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads and parses a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let base = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        Config::from_toml(&text, path, base)
    }

    /// The built-in configuration: EfficientNet-Lite0 and NanoDet-m 416 from `models_dir`.
    pub fn defaults(models_dir: &Path) -> Config {
        Config {
            listen: default_listen(),
            limits: Limits::default(),
            models: default_models(models_dir),
            cameras: Vec::new(),
            memory: MemoryConfig::default(),
        }
    }

    /// Checks value ranges and name uniqueness.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.memory.host_pool_size()?;
        self.memory.cuda_pool_size()?;
        let l = &self.limits;
        if l.queue_depth == 0 || l.workers == 0 || l.max_body_bytes == 0 || l.max_pixels == 0 {
            return Err(ConfigError::Invalid(
                "limits.queue_depth, workers, max_body_bytes and max_pixels must be at least 1"
                    .into(),
            ));
        }
        if l.request_timeout_ms == 0 {
            return Err(ConfigError::Invalid(
                "limits.request_timeout_ms must be at least 1".into(),
            ));
        }
        let mut camera_ids = std::collections::HashSet::new();
        for c in &self.cameras {
            c.validate().map_err(ConfigError::Invalid)?;
            if !camera_ids.insert(c.id.as_str()) {
                return Err(ConfigError::Invalid(format!(
                    "camera id '{}' appears twice",
                    c.id
                )));
            }
        }
        let mut names = std::collections::HashSet::new();
        for m in &self.models {
            if m.name.is_empty()
                || !m
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            {
                return Err(ConfigError::Invalid(format!(
                    "model name '{}' must be non-empty and use only letters, digits, '-', '_' or '.'",
                    m.name
                )));
            }
            if !names.insert(m.name.as_str()) {
                return Err(ConfigError::Invalid(format!(
                    "model name '{}' appears twice",
                    m.name
                )));
            }
            if m.batch == Some(0) {
                return Err(ConfigError::Invalid(format!(
                    "model '{}': batch must be at least 1",
                    m.name
                )));
            }
            if m.head.is_some() && m.task_kind() != TaskKind::Detection {
                return Err(ConfigError::Invalid(format!(
                    "model '{}': head is only valid with task = \"detection\"",
                    m.name
                )));
            }
        }
        Ok(())
    }
}

/// The two default models shipped in `models/`.
pub fn default_models(dir: &Path) -> Vec<ModelConfig> {
    vec![
        ModelConfig {
            name: "efficientnet-lite0".into(),
            path: dir.join("efficientnet-lite0.onnx"),
            task: Some(TaskKind::Classification),
            labels: Some(dir.join("imagenet-labels.txt")),
            ..ModelConfig::default()
        },
        ModelConfig {
            name: "nanodet-m-416".into(),
            path: dir.join("nanodet-m-416.onnx"),
            task: Some(TaskKind::Detection),
            head: Some(HeadKind::Nanodet),
            labels: Some(dir.join("coco-labels.txt")),
            ..ModelConfig::default()
        },
    ]
}

/// Finds the models directory: `explicit`, else `$VIGIL_MODELS_DIR`, else `./models`, else
/// `<exe dir>/../../models`, else `/usr/share/vigil/models`.
pub fn find_models_dir(explicit: Option<&Path>) -> Result<PathBuf, ConfigError> {
    if let Some(p) = explicit {
        return if p.is_dir() {
            Ok(p.to_path_buf())
        } else {
            Err(ConfigError::ModelsDir(format!(
                "models directory {} does not exist",
                p.display()
            )))
        };
    }
    let mut candidates = Vec::new();
    if let Some(env) = std::env::var_os("VIGIL_MODELS_DIR") {
        let p = PathBuf::from(env);
        if !p.is_dir() {
            return Err(ConfigError::ModelsDir(format!(
                "VIGIL_MODELS_DIR={} is not a directory",
                p.display()
            )));
        }
        return Ok(p);
    }
    candidates.push(PathBuf::from("models"));
    if let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        candidates.push(exe_dir.join("../../models"));
    }
    candidates.push(PathBuf::from("/usr/share/vigil/models"));
    candidates
        .iter()
        .find(|p| p.is_dir())
        .cloned()
        .ok_or_else(|| {
            ConfigError::ModelsDir(format!(
                "no models directory found (tried --models-dir, $VIGIL_MODELS_DIR, {})",
                candidates
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

/// Reads a label file: one class name per line, trailing blank lines dropped.
pub fn read_labels(path: &Path) -> std::io::Result<Vec<String>> {
    let text = std::fs::read_to_string(path)?;
    let mut labels: Vec<String> = text
        .lines()
        .map(|l| l.trim_end_matches('\r').to_string())
        .collect();
    while labels.last().is_some_and(|l| l.trim().is_empty()) {
        labels.pop();
    }
    Ok(labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml(text, Path::new("test.toml"), Path::new("/etc/vigil"))
    }

    #[test]
    fn defaults_when_empty() {
        let c = parse("").unwrap();
        assert_eq!(c.listen, "127.0.0.1:8080");
        assert_eq!(c.limits.max_body_bytes, 16 * 1024 * 1024);
        assert_eq!(c.limits.queue_depth, 32);
        assert!(c.models.is_empty());
    }

    #[test]
    fn memory_pools_take_a_size_or_a_fraction_of_free_memory() {
        let c = parse("[memory]\npool_fraction = 0.25\ncuda_pool_mb = 512\n").unwrap();
        assert_eq!(
            c.memory.host_pool_size().unwrap(),
            Some(PoolSize::FractionOfFree(0.25))
        );
        assert_eq!(
            c.memory.cuda_pool_size().unwrap(),
            Some(PoolSize::Bytes(512 << 20))
        );
        let c = parse("[memory]\npool_mb = 64\ncuda_pool_fraction = 1.0\n").unwrap();
        assert_eq!(
            c.memory.host_pool_size().unwrap(),
            Some(PoolSize::Bytes(64 << 20))
        );
        assert_eq!(
            c.memory.cuda_pool_size().unwrap(),
            Some(PoolSize::FractionOfFree(1.0))
        );
        let c = parse("").unwrap();
        assert_eq!(c.memory.host_pool_size().unwrap(), None);
        assert_eq!(c.memory.cuda_pool_size().unwrap(), None);
        for (text, says) in [
            (
                "pool_mb = 64\npool_fraction = 0.5",
                "memory.pool_mb and memory.pool_fraction",
            ),
            ("pool_fraction = 0.0", "memory.pool_fraction"),
            ("pool_fraction = 1.5", "(0, 1]"),
            ("pool_fraction = -0.1", "memory.pool_fraction"),
            ("pool_fraction = nan", "memory.pool_fraction"),
            ("cuda_pool_fraction = 2", "memory.cuda_pool_fraction"),
            ("cuda_pool_mb = 0", "memory.cuda_pool_mb must be at least 1"),
            (
                "cuda_pool_mb = 8\ncuda_pool_fraction = 0.5",
                "set one of them",
            ),
            (
                "cuda_pool_mb = 17592186044416",
                "a pool of 17592186044416 MiB is too large",
            ),
        ] {
            let e = parse(&format!("[memory]\n{text}\n"))
                .expect_err(text)
                .to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let e = parse("listen = \"0.0.0.0:1\"\nbogus = 3\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("bogus"), "{e}");
        let e = parse("[limits]\nqueue_dept = 3\n").unwrap_err().to_string();
        assert!(e.contains("queue_dept"), "{e}");
        let e = parse("[[models]]\nname = \"a\"\npath = \"a.onnx\"\nlables = \"x\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("lables"), "{e}");
    }

    #[test]
    fn relative_paths_resolve_against_config_dir() {
        let c = parse("[[models]]\nname = \"m\"\npath = \"m/x.onnx\"\nlabels = \"/abs/l.txt\"\n")
            .unwrap();
        assert_eq!(c.models[0].path, PathBuf::from("/etc/vigil/m/x.onnx"));
        assert_eq!(c.models[0].labels.as_deref(), Some(Path::new("/abs/l.txt")));
    }

    #[test]
    fn model_overrides_build_spec() {
        let c = parse(
            "[[models]]\nname = \"y\"\npath = \"y.onnx\"\ntask = \"detection\"\nhead = \"yolov8\"\n\
             input_width = 320\ninput_height = 256\nresize = \"letterbox\"\nscore_threshold = 0.6\n\
             mean = [1.0, 2.0, 3.0]\n",
        )
        .unwrap();
        let s = c.models[0].vision_spec(vec!["a".into()], None).unwrap();
        assert_eq!(
            s.task,
            Task::Detection {
                head: DetectionHead::Yolov8
            }
        );
        assert_eq!((s.preprocess.width, s.preprocess.height), (320, 256));
        assert_eq!(
            s.preprocess.resize,
            ResizeMode::Letterbox { pad_value: 114 }
        );
        assert_eq!(s.score_threshold, 0.6);
        assert_eq!(s.preprocess.mean, [1.0, 2.0, 3.0]);
        assert_eq!(s.labels, vec!["a".to_string()]);
    }

    #[test]
    fn classification_crop_scales_with_input() {
        let m = ModelConfig {
            name: "c".into(),
            path: "c.onnx".into(),
            ..ModelConfig::default()
        };
        let s = m.vision_spec(vec![], Some((448, 448))).unwrap();
        assert_eq!(
            s.preprocess.resize,
            ResizeMode::ShortSideCenterCrop { short_side: 512 }
        );
        let s = m.vision_spec(vec![], None).unwrap();
        assert_eq!(s, VisionSpec::efficientnet_lite0(vec![]));
    }

    #[test]
    fn invalid_values_are_rejected() {
        assert!(parse("[limits]\nqueue_depth = 0\n").is_err());
        assert!(parse("[limits]\nqueue_depth = -1\n").is_err());
        assert!(parse("[[models]]\nname = \"a b\"\npath = \"x\"\n").is_err());
        assert!(parse(
            "[[models]]\nname = \"a\"\npath = \"x\"\n[[models]]\nname = \"a\"\npath = \"y\"\n"
        )
        .is_err());
        assert!(
            parse("[[models]]\nname = \"a\"\npath = \"x\"\ntask = \"segmentation\"\n").is_err()
        );
        let c = parse("[[models]]\nname = \"a\"\npath = \"x\"\nshort_side = 100\n").unwrap();
        assert!(c.models[0].vision_spec(vec![], None).is_err());
    }

    #[test]
    fn from_path_presets() {
        let m = ModelConfig::from_path(Path::new("/nowhere/nanodet-m-416.onnx"));
        assert_eq!(m.name, "nanodet-m-416");
        assert_eq!(m.task_kind(), TaskKind::Detection);
        let s = m.vision_spec(vec![], None).unwrap();
        assert_eq!(s, VisionSpec::nanodet_m_416(vec![]));
        let m = ModelConfig::from_path(Path::new("/nowhere/resnet.onnx"));
        assert_eq!(m.task_kind(), TaskKind::Classification);
        assert!(m.labels.is_none());
    }

    #[test]
    fn labels_reader_drops_trailing_blank_lines() {
        let dir = std::env::temp_dir().join(format!("vigil-labels-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("l.txt");
        std::fs::write(&p, "cat\r\ndog\n\n").unwrap();
        assert_eq!(
            read_labels(&p).unwrap(),
            vec!["cat".to_string(), "dog".to_string()]
        );
    }
}
