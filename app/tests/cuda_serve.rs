//! The real `vigil serve --device cuda` binary answers like `--device cpu`: same top-1 class for
//! each photo and matching detections (same label, IoU >= 0.5) for every confident box.
//! Prints "SKIP: no CUDA device: <reason>" where no CUDA device is usable.
//! Photos: `VIGIL_EVAL_IMAGES` (a directory) or `shared/images/eval`; models: `VIGIL_MODELS`
//! or the repository's `models/`; binary: `VIGIL_BIN` or the one cargo built.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{get, pool_gauge, post};

fn models_dir() -> PathBuf {
    std::env::var_os("VIGIL_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models")))
}

fn photos_dir() -> PathBuf {
    std::env::var_os("VIGIL_EVAL_IMAGES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("VIGIL_SHARED")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared"))
                })
                .join("images/eval")
        })
}

/// A running `vigil serve` (killed on drop).
struct Server {
    child: Child,
    base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(device: &str) -> Server {
    let models = models_dir();
    start(
        &format!("--device {device}"),
        &[
            "--device".as_ref(),
            device.as_ref(),
            "--models-dir".as_ref(),
            models.as_os_str(),
        ],
        &[],
    )
}

/// Starts `vigil serve` with `args` (named `what` in messages) on a free port, once ready,
/// without the environment variables in `unset`.
fn start(what: &str, args: &[&std::ffi::OsStr], unset: &[&str]) -> Server {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    // VIGIL_BIN: the binary copied to another machine (the build path is baked in).
    let bin = std::env::var_os("VIGIL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_vigil")));
    let mut command = Command::new(bin);
    for var in unset {
        command.env_remove(var);
    }
    let child = command
        .arg("serve")
        .args(args)
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start vigil serve");
    let mut s = Server {
        child,
        base: format!("http://127.0.0.1:{port}"),
    };
    let t = Instant::now();
    loop {
        if let Ok(Some(st)) = s.child.try_wait() {
            panic!("vigil serve {what} exited early: {st}");
        }
        let ok = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
            && get(&format!("{}/v2/health/ready", s.base)).status == 200;
        if ok {
            return s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "vigil serve {what} not ready after 120 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn infer(base: &str, model: &str, path: &std::path::Path) -> serde_json::Value {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let ct = if path.extension().is_some_and(|e| e == "png") {
        "image/png"
    } else {
        "image/jpeg"
    };
    let r = post(&format!("{base}/v1/models/{model}/infer"), ct, &[], &bytes);
    assert_eq!(r.status, 200, "{model} {}: {}", path.display(), r.text());
    r.json()
}

type Det = (String, f64, [f64; 4]);

fn detections(v: &serde_json::Value) -> Vec<Det> {
    v["results"]["detections"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|d| {
                    let b = &d["bbox"];
                    let f = |k: &str| b[k].as_f64().unwrap_or(f64::NAN);
                    (
                        d["label"].as_str().unwrap_or("").to_string(),
                        d["score"].as_f64().unwrap_or(0.0),
                        [f("x1"), f("y1"), f("x2"), f("y2")],
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn iou(a: &[f64; 4], b: &[f64; 4]) -> f64 {
    let iw = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let ih = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let inter = iw * ih;
    let area = |r: &[f64; 4]| (r[2] - r[0]) * (r[3] - r[1]);
    inter / (area(a) + area(b) - inter).max(1e-9)
}

/// Confident (score >= 0.5) boxes of `a` with no same-label box of IoU >= 0.5 in `b`.
fn unmatched(a: &[Det], b: &[Det]) -> usize {
    a.iter()
        .filter(|d| d.1 >= 0.5)
        .filter(|d| !b.iter().any(|e| e.0 == d.0 && iou(&d.2, &e.2) >= 0.5))
        .count()
}

#[test]
fn cuda_serve_matches_cpu_serve() {
    if let Err(e) = vigil_engine::backend::cuda::probe(0) {
        println!("SKIP: no CUDA device: {e}");
        return;
    }
    let mut photos: Vec<PathBuf> = std::fs::read_dir(photos_dir())
        .unwrap_or_else(|e| panic!("photos at {}: {e}", photos_dir().display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "jpg" || e == "png"))
        .collect();
    photos.sort();
    photos.truncate(6);
    assert!(!photos.is_empty(), "no photos");
    let cpu = serve("cpu");
    let gpu = serve("cuda");
    let mut boxes = 0;
    for p in &photos {
        let (a, b) = (
            infer(&cpu.base, "efficientnet-lite0", p),
            infer(&gpu.base, "efficientnet-lite0", p),
        );
        let top = |v: &serde_json::Value| v["results"]["classes"][0]["label"].clone();
        assert!(top(&a).is_string(), "{a}");
        assert_eq!(top(&a), top(&b), "{}: cpu {a} cuda {b}", p.display());
        let label = top(&a);
        let (a, b) = (
            detections(&infer(&cpu.base, "nanodet-m-416", p)),
            detections(&infer(&gpu.base, "nanodet-m-416", p)),
        );
        assert_eq!(
            unmatched(&a, &b),
            0,
            "{}: cpu {a:?} cuda {b:?}",
            p.display()
        );
        assert_eq!(
            unmatched(&b, &a),
            0,
            "{}: cpu {a:?} cuda {b:?}",
            p.display()
        );
        boxes += a.len();
        println!(
            "{}: top-1 {} on both; {} cpu / {} cuda detections",
            p.display(),
            label,
            a.len(),
            b.len()
        );
    }
    println!(
        "cuda serve matches cpu serve on {} photos ({boxes} cpu boxes)",
        photos.len()
    );
}

#[test]
fn cuda_pool_is_sized_by_the_config_and_exported() {
    if let Err(e) = vigil_engine::backend::cuda::probe(0) {
        println!("SKIP: no CUDA device: {e}");
        return;
    }
    let dir = std::env::temp_dir().join(format!("vigil-cuda-pool-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let config = dir.join("vigil.toml");
    std::fs::write(
        &config,
        format!(
            "[memory]\ncuda_pool_mb = 384\n[limits]\nworkers = 2\n\
             [[models]]\nname = \"efficientnet-lite0\"\npath = \"{}\"\n\
             labels = \"{}\"\ndevice = \"cuda\"\n",
            models_dir().join("efficientnet-lite0.onnx").display(),
            models_dir().join("imagenet-labels.txt").display()
        ),
    )
    .expect("config");
    let server = start(
        "--config (cuda_pool_mb = 384)",
        &["--config".as_ref(), config.as_os_str()],
        // The scripts' override would win over the config.
        &["VIGIL_CUDA_POOL_MB"],
    );
    let photo = photos_dir().join("coffee.png");
    let v = infer(&server.base, "efficientnet-lite0", &photo);
    assert_eq!(v["results"]["classes"][0]["label"], "espresso", "{v}");
    let page = get(&format!("{}/metrics", server.base)).text();
    let bytes = |kind| pool_gauge(&page, "vigil_memory_pool_bytes", "cuda0", Some(kind));
    let reserved = bytes("reserved");
    let in_use = bytes("in_use").unwrap_or(0.0);
    println!("cuda0 pool on /metrics: reserved {reserved:?} B, in use {in_use} B");
    assert_eq!(reserved, Some((384u64 << 20) as f64), "{page}");
    // Two contexts' arenas live in it.
    assert!(in_use > 0.0, "{page}");
    assert_eq!(
        pool_gauge(&page, "vigil_memory_pool_blocks", "cuda0", None),
        Some(2.0),
        "{page}"
    );
}
