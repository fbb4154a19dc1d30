//! CLI tests that need no inference: configuration errors and argument errors exit non-zero
//! with a clear message.

use std::process::Command;

fn vigil(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(args)
        .output()
        .expect("run vigil");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn temp_config(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("vigil-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("vigil.toml");
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn serve_rejects_unknown_config_key() {
    let p = temp_config(
        "unknown",
        "listen = \"127.0.0.1:0\"\n[limits]\nqueue_depht = 4\n",
    );
    let (code, err) = vigil(&["serve", "--config", p.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(err.contains("queue_depht"), "{err}");
    assert!(err.contains("vigil.toml"), "{err}");
}

#[test]
fn serve_rejects_bad_memory_pool_sizes() {
    for (name, text, says) in [
        (
            "fraction",
            "[memory]\npool_fraction = 1.5\n",
            "memory.pool_fraction",
        ),
        (
            "both",
            "[memory]\ncuda_pool_mb = 64\ncuda_pool_fraction = 0.5\n",
            "set one of them",
        ),
    ] {
        let p = temp_config(name, text);
        let (code, err) = vigil(&["serve", "--config", p.to_str().unwrap()]);
        assert_ne!(code, 0, "{name}: {err}");
        assert!(err.contains(says), "{name}: {err}");
        assert!(!err.contains("panicked"), "{name}: {err}");
    }
}

#[test]
fn serve_rejects_bad_toml_and_values() {
    let p = temp_config("syntax", "listen = \n");
    let (code, err) = vigil(&["serve", "--config", p.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(err.contains("invalid config"), "{err}");
    let p = temp_config("zero", "[limits]\nworkers = 0\n");
    let (code, err) = vigil(&["serve", "--config", p.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(err.contains("workers"), "{err}");
    let (code, err) = vigil(&["serve", "--config", "/nonexistent/vigil.toml"]);
    assert_ne!(code, 0);
    assert!(err.contains("cannot read config"), "{err}");
}

#[test]
fn serve_reports_missing_model_file() {
    let p = temp_config(
        "missing",
        "listen = \"127.0.0.1:0\"\n[[models]]\nname = \"m\"\npath = \"missing.onnx\"\n",
    );
    let (code, err) = vigil(&["serve", "--config", p.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(err.contains("missing.onnx"), "{err}");
}

#[test]
fn infer_unknown_model_and_missing_file() {
    let models = concat!(env!("CARGO_MANIFEST_DIR"), "/../models");
    let (code, err) = vigil(&["infer", "--models-dir", models, "--model", "nope", "x.png"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("unknown model 'nope'") && err.contains("efficientnet-lite0"),
        "{err}"
    );
    let (code, err) = vigil(&["infer", "--model", "/nonexistent/m.onnx", "x.png"]);
    assert_ne!(code, 0);
    assert!(err.contains("does not exist"), "{err}");
    let (code, _) = vigil(&["bench", "--models-dir", models, "nope"]);
    assert_ne!(code, 0);
}

#[test]
fn lanes_that_cannot_run_exit_with_a_clear_error() {
    let models = concat!(env!("CARGO_MANIFEST_DIR"), "/../models");
    let bench = |extra: &[&str]| {
        let mut args = vec![
            "bench",
            "--models-dir",
            models,
            "efficientnet-lite0",
            "--device",
            "cpu",
            "--iterations",
            "1",
            "--warmup",
            "0",
        ];
        args.extend_from_slice(extra);
        vigil(&args)
    };
    for (extra, says) in [
        (&["--lanes", "0"][..], "lanes must be at least 1"),
        (
            &["--lanes", "3", "--batch", "4"][..],
            "3 lanes must split the batch of 4 evenly",
        ),
        (
            &["--lanes", "2", "--batch", "4"][..],
            "2 lanes need the CUDA backend",
        ),
    ] {
        let (code, err) = bench(extra);
        assert_ne!(code, 0, "{extra:?}: {err}");
        assert!(err.contains(says), "{extra:?}: {err}");
        assert!(!err.contains("panicked"), "{extra:?}: {err}");
    }
    let p = temp_config(
        "lanes",
        &format!(
            "listen = \"127.0.0.1:0\"\n[[models]]\nname = \"m\"\n\
             path = \"{models}/efficientnet-lite0.onnx\"\nlanes = 0\n"
        ),
    );
    let (code, err) = vigil(&["serve", "--config", p.to_str().unwrap()]);
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains("model 'm'") && err.contains("lanes must be at least 1"),
        "{err}"
    );
}
