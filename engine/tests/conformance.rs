//! ONNX's own backend node tests (shipped by PyPI `onnx==1.22.0`, found through
//! `VIGIL_ONNX_NODE_TESTS`): every case whose ops Vigil supports is run and compared with the
//! expected outputs. The cases listed in `tests/conformance-passing.txt` must keep passing; the
//! totals are printed so the pass rate is visible in the test log.

use std::path::{Path, PathBuf};

use prost::Message;
use vigil_engine::onnx::proto::TensorProto;
use vigil_engine::{Error, Model, ModelOptions, Tensor, TensorData};

fn node_tests_dir() -> PathBuf {
    let dir = std::env::var_os("VIGIL_ONNX_NODE_TESTS").map(PathBuf::from).unwrap_or_else(|| {
        panic!("VIGIL_ONNX_NODE_TESTS is not set: run scripts/test.sh, which installs onnx==1.22.0 and sets it")
    });
    assert!(
        dir.is_dir(),
        "VIGIL_ONNX_NODE_TESTS={} is not a directory",
        dir.display()
    );
    dir
}

fn read_tensor(path: &Path) -> Result<Tensor, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let proto = TensorProto::decode(bytes.as_slice()).map_err(|e| e.to_string())?;
    vigil_engine::onnx::tensor_from_proto(&proto).map_err(|e| e.to_string())
}

fn close(got: &Tensor, want: &Tensor) -> Result<(), String> {
    if got.shape != want.shape {
        return Err(format!(
            "shape {:?} != expected {:?}",
            got.shape, want.shape
        ));
    }
    match (&got.data, &want.data) {
        (TensorData::F32(a), TensorData::F32(b)) => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                let ok =
                    (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= 1e-4 + 1e-3 * y.abs();
                if !ok {
                    return Err(format!("element {i}: {x} != expected {y}"));
                }
            }
            Ok(())
        }
        (a, b) if a == b => Ok(()),
        _ if got.dtype() != want.dtype() => Err(format!(
            "dtype {:?} != expected {:?}",
            got.dtype(),
            want.dtype()
        )),
        _ => Err("integer/bool values differ".into()),
    }
}

enum Outcome {
    NotApplicable,
    Pass,
    Fail(String),
}

fn run_case(dir: &Path) -> Outcome {
    let bytes = match std::fs::read(dir.join("model.onnx")) {
        Ok(b) => b,
        Err(e) => return Outcome::Fail(e.to_string()),
    };
    let graph = match vigil_engine::onnx::load_model(&bytes) {
        Ok(g) => g,
        Err(Error::Unsupported(_)) => return Outcome::NotApplicable,
        Err(e) => return Outcome::Fail(format!("import: {e}")),
    };
    let model = match Model::from_graph(
        graph,
        &ModelOptions {
            threads: 1,
            ..ModelOptions::default()
        },
    ) {
        Ok(m) => m,
        Err(Error::Unsupported(_)) => return Outcome::NotApplicable,
        Err(e) => return Outcome::Fail(format!("compile: {e}")),
    };
    let data = dir.join("test_data_set_0");
    let mut inputs = Vec::new();
    for i in 0..model.inputs().len() {
        match read_tensor(&data.join(format!("input_{i}.pb"))) {
            Ok(t) => inputs.push(t),
            Err(e) => return Outcome::Fail(format!("input {i}: {e}")),
        }
    }
    let outputs = match model.new_context().and_then(|mut c| c.run(&inputs)) {
        Ok(o) => o,
        Err(e) => return Outcome::Fail(format!("run: {e}")),
    };
    for (i, got) in outputs.iter().enumerate() {
        let want = match read_tensor(&data.join(format!("output_{i}.pb"))) {
            Ok(t) => t,
            Err(e) => return Outcome::Fail(format!("output {i}: {e}")),
        };
        if let Err(e) = close(got, &want) {
            return Outcome::Fail(format!("output {i}: {e}"));
        }
    }
    Outcome::Pass
}

#[test]
fn onnx_backend_node_tests() {
    let root = node_tests_dir();
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("read node tests")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    cases.sort();
    let (mut passed, mut applicable) = (0, 0);
    let mut passing = Vec::new();
    let mut failures = Vec::new();
    for case in &cases {
        let name = case
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        let outcome = std::panic::catch_unwind(|| run_case(case)).unwrap_or_else(|p| {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
            Outcome::Fail(format!("PANIC: {}", msg.unwrap_or_default()))
        });
        match outcome {
            Outcome::NotApplicable => {}
            Outcome::Pass => {
                applicable += 1;
                passed += 1;
                passing.push(name);
            }
            Outcome::Fail(why) => {
                applicable += 1;
                failures.push(format!("{name}: {why}"));
            }
        }
    }
    for f in &failures {
        println!("conformance FAIL {f}");
    }
    println!(
        "conformance: {passed} passed out of {applicable} applicable ({} cases in total)",
        cases.len()
    );
    if let Ok(out) = std::env::var("VIGIL_CONFORMANCE_WRITE") {
        std::fs::write(out, passing.join("\n") + "\n").expect("write passing list");
    }
    let expected = include_str!("conformance-passing.txt");
    let regressions: Vec<&str> = expected
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !passing.iter().any(|p| p == l))
        .collect();
    assert!(
        failures.iter().all(|f| !f.contains("PANIC")),
        "a conformance case panicked"
    );
    assert!(
        regressions.is_empty(),
        "cases that used to pass now fail: {regressions:?}"
    );
}
