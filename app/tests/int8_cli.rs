//! `precision = "int8"` end to end through the real binary: without calibration artefacts the
//! CLI fails with a message naming `vigil calibrate`; after `vigil calibrate` (on a copy of the
//! model in a temp dir, 8 calibration photos) `vigil infer --precision int8` loads the cached
//! QDQ model and agrees with FP32 on the espresso photo.

use std::path::{Path, PathBuf};
use std::process::Command;

fn shared() -> PathBuf {
    let p = std::env::var_os("VIGIL_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared")));
    assert!(
        p.join("images/calib").is_dir(),
        "shared data not found at {} (set VIGIL_SHARED)",
        p.display()
    );
    p
}

fn vigil(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(args)
        .output()
        .expect("run vigil");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn top1(json: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"));
    v["results"]["classes"][0]["label"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn int8_needs_calibration_then_uses_the_cached_qdq_model() {
    let dir = std::env::temp_dir().join(format!("vigil-int8-{}", std::process::id()));
    let calib = dir.join("calib");
    std::fs::create_dir_all(&calib).expect("temp dir");
    let model = dir.join("efficientnet-lite0.onnx");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/efficientnet-lite0.onnx");
    std::fs::copy(&src, &model).expect("copy model");
    std::fs::copy(
        src.with_file_name("imagenet-labels.txt"),
        dir.join("imagenet-labels.txt"),
    )
    .expect("copy labels");
    let mut photos: Vec<PathBuf> = std::fs::read_dir(shared().join("images/calib"))
        .expect("calib dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("jpg" | "jpeg" | "png")
            )
        })
        .collect();
    photos.sort();
    for p in photos.iter().take(8) {
        std::fs::copy(p, calib.join(p.file_name().expect("name"))).expect("copy photo");
    }
    let photo = shared().join("images/eval/coffee.png");
    let (m, ph) = (model.to_str().unwrap(), photo.to_str().unwrap());

    let (code, _, err) = vigil(&["infer", "--model", m, "--precision", "int8", ph]);
    assert_ne!(code, 0);
    assert!(err.contains("vigil calibrate"), "{err}");

    let (code, _, err) = vigil(&[
        "calibrate",
        "--model",
        m,
        "--images",
        calib.to_str().unwrap(),
        "--method",
        "minmax",
    ]);
    assert_eq!(code, 0, "{err}");

    let (code, fp32, err) = vigil(&["infer", "--model", m, ph]);
    assert_eq!(code, 0, "{err}");
    let (code, int8, err) = vigil(&["infer", "--model", m, "--precision", "int8", ph]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("int8: using the calibrated QDQ model"),
        "{err}"
    );
    assert_eq!(top1(&fp32), "espresso");
    assert_eq!(top1(&int8), top1(&fp32));
    let _ = std::fs::remove_dir_all(&dir);
}
