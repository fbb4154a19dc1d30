//! Times the stages of loading and running a model (diagnostics for slow targets).
//!
//! `cargo run --release --example stages -- MODEL.onnx [runs]`

use std::time::Instant;

use vigil_engine::{passes, DataType, Model, ModelOptions, Tensor};

fn main() -> vigil_engine::Result<()> {
    let path = std::env::args().nth(1).unwrap_or_default();
    let runs: usize = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let t = Instant::now();
    let bytes =
        std::fs::read(&path).map_err(|e| vigil_engine::Error::BadInput(format!("{path}: {e}")))?;
    let graph = vigil_engine::onnx::load_model(&bytes)?;
    eprintln!(
        "load_model: {:?} ({} nodes)",
        t.elapsed(),
        graph.nodes.len()
    );
    let t = Instant::now();
    let mut g2 = graph.clone();
    passes::annotate_shapes(&mut g2, 1)?;
    eprintln!("annotate_shapes: {:?}", t.elapsed());
    let t = Instant::now();
    let mut g3 = graph.clone();
    let rep = passes::prepare(&mut g3, 1, true)?;
    eprintln!("prepare: {:?} (folded {})", t.elapsed(), rep.folded);
    if std::env::var_os("STAGES_PER_NODE").is_some() {
        for n in &g3.nodes {
            let t = Instant::now();
            eprint!("build {} {:?} ... ", n.name, n.op);
            vigil_engine::backend::cpu::kernels::build_kernel(&g3, n)?;
            eprintln!("{:?}", t.elapsed());
        }
    }
    let opts = ModelOptions {
        threads: 1,
        ..Default::default()
    };
    let t = Instant::now();
    let model = Model::from_graph(graph, &opts)?;
    eprintln!("from_graph (prepare+compile): {:?}", t.elapsed());
    let mut ctx = model.new_context()?;
    let inputs: Vec<Tensor> = model
        .inputs()
        .iter()
        .map(|i| Tensor::zeros(DataType::F32, i.shape.clone()))
        .collect();
    for _ in 0..runs {
        let t = Instant::now();
        ctx.run(&inputs)?;
        eprintln!("run: {:?}", t.elapsed());
    }
    Ok(())
}
