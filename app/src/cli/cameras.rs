//! `vigil cameras` lists V4L2 devices with their formats, sizes and rates; `vigil camera-bench`
//! measures the camera pipeline on an MJPEG recording.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::camera::config::{CameraConfig, SourceKind};
use crate::camera::convert::Converter;
use crate::camera::pipeline::{start_camera, CameraState, FrameInfer, FrameTimings, Transform};
use crate::camera::source::mjpeg_file::MjpegReader;
use crate::camera::source::{factory_for, PixelFormat, RawFrame};
use crate::config::Limits;
use crate::registry::{load_model, model_options};

/// Arguments of `vigil cameras`.
#[derive(Debug, clap::Args)]
pub struct CamerasArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Lists capture devices.
#[cfg(target_os = "linux")]
pub fn run(args: CamerasArgs) -> Result<(), String> {
    use crate::camera::negotiate::FrameSizes;
    let devices = crate::camera::source::v4l2::list_devices();
    if args.json {
        let text = serde_json::to_string_pretty(&devices).map_err(|e| e.to_string())?;
        println!("{text}");
        return Ok(());
    }
    if devices.is_empty() {
        println!("no /dev/video* devices found");
        return Ok(());
    }
    for d in devices {
        println!("{}", d.path.display());
        for a in &d.by_id {
            println!("  alias {}", a.display());
        }
        if let Some(e) = &d.error {
            println!("  cannot query: {e}");
            continue;
        }
        if let Some(c) = &d.caps {
            println!(
                "  {} (driver {}, bus {}), capture: {}, streaming: {}",
                c.card, c.driver, c.bus_info, c.capture, c.streaming
            );
        }
        for f in &d.formats {
            let usable = if f.format.is_some() {
                ""
            } else {
                " (not convertible)"
            };
            println!("  {} {}{}", f.fourcc, f.description, usable);
            match &f.sizes {
                FrameSizes::Discrete(sizes) => {
                    for s in sizes {
                        let rates: Vec<String> = s.fps.iter().map(|r| format!("{r:.1}")).collect();
                        println!("    {}x{} @ {} fps", s.width, s.height, rates.join(", "));
                    }
                }
                FrameSizes::Stepwise {
                    min_width,
                    max_width,
                    step_width,
                    min_height,
                    max_height,
                    step_height,
                    fps,
                } => {
                    println!("    {min_width}..{max_width} step {step_width} x {min_height}..{max_height} step {step_height}, fps {fps:?}");
                }
            }
        }
    }
    Ok(())
}

/// Lists capture devices (V4L2 exists only on Linux).
#[cfg(not(target_os = "linux"))]
pub fn run(_args: CamerasArgs) -> Result<(), String> {
    println!("V4L2 capture is only available on Linux");
    Ok(())
}

/// Arguments of `vigil camera-bench`.
#[derive(Debug, clap::Args)]
pub struct CameraBenchArgs {
    /// MJPEG recording (concatenated JPEGs).
    pub source: PathBuf,
    /// Model name (from --config or the defaults) or path to an .onnx file.
    #[arg(long, default_value = "nanodet-m-416")]
    pub model: String,
    /// TOML configuration file to resolve the model name against.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Directory holding the default models.
    #[arg(long)]
    pub models_dir: Option<PathBuf>,
    /// CPU threads for the engine (0 = one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Frames to time stage by stage.
    #[arg(long, default_value_t = 100)]
    pub frames: usize,
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// Stage-by-stage timing on the recording, then the real pipeline at full speed.
pub fn bench(args: CameraBenchArgs) -> Result<(), String> {
    let mut cfg = super::resolve_model(
        &args.model,
        args.config.as_deref(),
        args.models_dir.as_deref(),
    )?;
    if let Some(t) = args.threads {
        cfg.threads = Some(t);
    }
    let (model, spec) = load_model(&cfg, &model_options(&cfg))?;
    let max_pixels = Limits::default().max_pixels;
    let file = std::fs::File::open(&args.source)
        .map_err(|e| format!("cannot open {}: {e}", args.source.display()))?;
    let mut reader = MjpegReader::new(file);
    let mut jpegs = Vec::new();
    while let Some(j) = reader.next_jpeg().map_err(|e| e.to_string())? {
        jpegs.push(j);
    }
    if jpegs.is_empty() {
        return Err(format!("{} holds no JPEG frames", args.source.display()));
    }
    // 1. Serial: every stage of every frame, one after the other.
    let mut ctx = model.new_context().map_err(|e| e.to_string())?;
    let mut conv = Converter::new(Default::default(), Default::default(), max_pixels);
    let overrides = Default::default();
    let (mut convert, mut pre, mut inf, mut post) = (vec![], vec![], vec![], vec![]);
    let n = args.frames.clamp(1, 100_000);
    for i in 0..n {
        let f = RawFrame::new(PixelFormat::Mjpeg, 0, 0, jpegs[i % jpegs.len()].clone());
        let s = Instant::now();
        let img = conv.to_rgb(&f)?;
        convert.push(s.elapsed().as_secs_f64() * 1e3);
        let mut t = FrameTimings::default();
        ctx.infer_rgb(&img, &spec, &overrides, &mut t)
            .map_err(|e| e.to_string())?;
        pre.push(t.preprocess_ms);
        inf.push(t.inference_ms);
        post.push(t.postprocess_ms);
        conv.recycle(img);
    }
    let (c, p, i, q) = (mean(&convert), mean(&pre), mean(&inf), mean(&post));
    println!(
        "model {} on {} ({} frames timed, backend {})",
        cfg.name,
        args.source.display(),
        n,
        model.backend()
    );
    println!("per frame (mean ms): decode+convert {c:.2}, preprocess {p:.2}, inference {i:.2}, postprocess {q:.2}");
    println!(
        "overhead (decode+convert+pre+post) / inference: {:.1}%",
        100.0 * (c + p + q) / i.max(1e-9)
    );

    // 2. The real pipeline: the file at full speed, once through.
    let mut cam = CameraConfig::new("bench", SourceKind::MjpegFile, &cfg.name);
    cam.path = Some(args.source.clone());
    cam.realtime = false;
    cam.looping = false;
    let transform = Transform {
        infer: Box::new(model.new_context().map_err(|e| e.to_string())?),
        spec,
        max_pixels,
    };
    let started = Instant::now();
    let handle = start_camera(cam.clone(), factory_for(&cam, max_pixels), transform)?;
    loop {
        let st = handle.status().state;
        if st == CameraState::Finished || st == CameraState::Stopped {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    handle.stop();
    let secs = started.elapsed().as_secs_f64();
    let s = handle.summary();
    println!(
        "pipeline at full speed: {} frames in {:.2} s: captured {:.1} fps, inferred {} ({:.1} fps), dropped {}, failed {}",
        s.frames_captured,
        secs,
        s.frames_captured as f64 / secs,
        s.frames_inferred,
        s.frames_inferred as f64 / secs,
        s.frames_dropped,
        s.frames_failed
    );
    Ok(())
}
