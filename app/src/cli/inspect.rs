//! `vigil inspect`: op histogram, node count, parameters and FLOPs of a model as loaded and after
//! optimization.

use std::path::PathBuf;

use serde::Serialize;
use vigil_engine::ir::{Graph, Op};

/// Arguments of `vigil inspect`.
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// Model name (from --config or the defaults) or path to an .onnx file.
    pub model: String,
    /// Batch size pinned by the optimizer.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// TOML configuration file to resolve the model name against.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Directory holding the default models.
    #[arg(long)]
    pub models_dir: Option<PathBuf>,
    /// Also list every node of the optimized graph in execution order (text output).
    #[arg(long)]
    pub nodes: bool,
}

/// Summary of one graph.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InspectReport {
    /// Node counts by op name, sorted by name.
    pub ops: Vec<(String, usize)>,
    /// Total node count.
    pub nodes: usize,
    /// Elements of all constants read by nodes.
    pub parameters: usize,
    /// Estimated floating-point operations (multiply-add = 2) over nodes with known shapes.
    pub flops: u64,
    /// Nodes whose FLOPs could not be estimated because a shape is unknown.
    pub nodes_without_shapes: usize,
}

fn numel(s: &[usize]) -> u64 {
    s.iter().map(|&d| d as u64).product()
}

/// FLOPs of one node, or None when a needed shape is unknown.
fn node_flops(g: &Graph, n: &vigil_engine::ir::Node) -> Option<u64> {
    let out = |i: usize| n.outputs.get(i).and_then(|&v| g.values[v].shape.as_deref());
    let inp = |i: usize| n.input(i).and_then(|v| g.values[v].shape.as_deref());
    Some(match &n.op {
        Op::Conv(_) => {
            // 2 * outputs * (Cin/group * prod(kernel)); bias and activation ignored.
            let w = inp(1)?;
            let per_out: u64 = w.iter().skip(1).map(|&d| d as u64).product();
            2 * numel(out(0)?) * per_out
        }
        Op::ConvTranspose(_) => {
            let w = inp(1)?;
            let x = inp(0)?;
            // Each input element scatters into Cout/group * prod(kernel) outputs.
            let per_in: u64 = w.iter().skip(1).map(|&d| d as u64).product();
            2 * numel(x) * per_in
        }
        Op::Gemm { trans_a, .. } => {
            let a = inp(0)?;
            let k = if *trans_a { *a.first()? } else { *a.get(1)? } as u64;
            2 * numel(out(0)?) * k
        }
        Op::MatMul => {
            let a = inp(0)?;
            2 * numel(out(0)?) * *a.last()? as u64
        }
        Op::MaxPool(p) | Op::AveragePool(p) => {
            numel(out(0)?) * p.kernel_shape.iter().map(|&k| k as u64).product::<u64>()
        }
        Op::GlobalAveragePool { .. } | Op::GlobalMaxPool { .. } | Op::ReduceMean { .. } => {
            numel(inp(0)?)
        }
        Op::Elementwise(steps) => numel(out(0)?) * steps.len().max(1) as u64,
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Clip
        | Op::BatchNormalization { .. }
        | Op::Softmax { .. }
        | Op::Resize(_)
        | Op::Where => numel(out(0)?),
        // Data movement and shape ops do no arithmetic.
        _ => 0,
    })
}

/// Summarises a graph: op histogram, node total, parameters and estimated FLOPs.
pub fn report(graph: &Graph) -> InspectReport {
    let mut flops = 0u64;
    let mut unknown = 0usize;
    for n in &graph.nodes {
        match node_flops(graph, n) {
            Some(f) => flops = flops.saturating_add(f),
            None => unknown += 1,
        }
    }
    InspectReport {
        ops: graph
            .op_histogram()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        nodes: graph.nodes.len(),
        parameters: graph.parameter_count(),
        flops,
        nodes_without_shapes: unknown,
    }
}

fn print_report(title: &str, r: &InspectReport) {
    println!("== {title} ==");
    println!("nodes:      {}", r.nodes);
    println!(
        "parameters: {} ({:.2} M)",
        r.parameters,
        r.parameters as f64 / 1e6
    );
    if r.nodes_without_shapes > 0 {
        println!(
            "FLOPs:      {:.3} G (partial: {} nodes without shapes)",
            r.flops as f64 / 1e9,
            r.nodes_without_shapes
        );
    } else {
        println!("FLOPs:      {:.3} G", r.flops as f64 / 1e9);
    }
    for (op, count) in &r.ops {
        println!("  {op:<20} {count}");
    }
}

/// Loads the model, reports it as loaded and after optimization.
pub fn run(args: InspectArgs) -> Result<(), String> {
    let cfg = super::resolve_model(
        &args.model,
        args.config.as_deref(),
        args.models_dir.as_deref(),
    )?;
    let graph = vigil_engine::onnx::load_file(&cfg.path)
        .map_err(|e| format!("cannot load {}: {e}", cfg.path.display()))?;
    let mut loaded_graph = graph.clone();
    vigil_engine::passes::annotate_shapes(&mut loaded_graph, args.batch)
        .map_err(|e| format!("shape inference failed: {e}"))?;
    let loaded = report(&loaded_graph);
    let opts = vigil_engine::ModelOptions {
        batch: args.batch,
        threads: 1,
        optimize: true,
        ..Default::default()
    };
    let model = vigil_engine::Model::from_graph(graph, &opts)
        .map_err(|e| format!("optimization failed: {e}"))?;
    let passes = model.optimize_report();
    let optimized = report(model.graph());
    let (arena, bound) = (model.arena_bytes(), model.arena_lower_bound());
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "model": cfg.name, "loaded": loaded, "optimized": optimized,
                "folded_nodes": passes.folded, "rewrites": passes.passes.rewrites,
                "arena_bytes": arena, "arena_lower_bound": bound,
            })
        );
    } else {
        println!("model: {} ({})", cfg.name, cfg.path.display());
        print_report("as loaded", &loaded);
        print_report("optimized", &optimized);
        println!("constant-folded nodes: {}", passes.folded);
        for (pass, n) in &passes.passes.rewrites {
            println!("  {pass:<20} {n} rewrites");
        }
        println!(
            "activation arena: {:.2} MB, lower bound {:.2} MB (plan / bound = {:.3})",
            arena as f64 / 1e6,
            bound as f64 / 1e6,
            arena as f64 / bound.max(1) as f64
        );
        if args.nodes {
            print_nodes(model.graph());
        }
    }
    Ok(())
}

/// One line per node: op, output element type and shape, name, and the ops producing its inputs.
fn print_nodes(g: &Graph) {
    let producers = g.producers();
    println!("nodes (execution order):");
    for n in &g.nodes {
        let out = n.outputs.first().map(|&o| &g.values[o]);
        let from: Vec<&str> = n
            .inputs
            .iter()
            .flatten()
            .filter(|&&v| g.constant(v).is_none())
            .map(|&v| producers[v].map_or("input", |p| g.nodes[p].op.name()))
            .collect();
        println!(
            "  {:<18} {:<4} {:<20} {} <- {}",
            n.op.name(),
            out.map_or("-".into(), |v| format!("{:?}", v.dtype)),
            out.and_then(|v| v.shape.as_ref())
                .map_or("?".into(), |s| format!("{s:?}")),
            n.name,
            from.join(", ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_engine::ir::{AutoPad, ConvAttrs, DataType, Layout, Node, Tensor};

    #[test]
    fn conv_gemm_report_matches_hand_count() {
        let mut g = Graph::default();
        let x = g.add_value("x", DataType::F32);
        g.values[x].shape = Some(vec![1, 4, 8, 8]);
        let w = g.add_constant("w", Tensor::zeros(DataType::F32, vec![6, 2, 3, 3]));
        let y = g.add_value("y", DataType::F32);
        g.values[y].shape = Some(vec![1, 6, 8, 8]);
        let conv = ConvAttrs {
            kernel_shape: vec![3, 3],
            strides: vec![1, 1],
            pads: vec![1, 1, 1, 1],
            dilations: vec![1, 1],
            group: 2,
            auto_pad: AutoPad::NotSet,
            activation: None,
            layout: Layout::Nchw,
        };
        g.nodes.push(Node {
            name: "c".into(),
            op: Op::Conv(conv),
            inputs: vec![Some(x), Some(w)],
            outputs: vec![y],
        });
        let z = g.add_value("z", DataType::F32);
        g.values[z].shape = Some(vec![1, 6, 8, 8]);
        g.nodes.push(Node {
            name: "r".into(),
            op: Op::Unary(vigil_engine::ir::UnaryOp::Act(
                vigil_engine::ir::Activation::Relu,
            )),
            inputs: vec![Some(y)],
            outputs: vec![z],
        });
        let u = g.add_value("u", DataType::F32); // shape unknown
        g.nodes.push(Node {
            name: "s".into(),
            op: Op::Softmax { axis: 1 },
            inputs: vec![Some(z)],
            outputs: vec![u],
        });
        g.inputs = vec![x];
        g.outputs = vec![u];
        let r = report(&g);
        assert_eq!(r.nodes, 3);
        assert_eq!(r.parameters, 6 * 2 * 3 * 3);
        // Naive: each of 1*6*8*8 outputs does 2*3*3 multiply-adds; ReLU one op per output.
        let conv_flops: u64 = (0..6 * 8 * 8).map(|_| 2 * (2 * 3 * 3) as u64).sum();
        assert_eq!(r.flops, conv_flops + 6 * 8 * 8);
        assert_eq!(r.nodes_without_shapes, 1);
        assert_eq!(
            r.ops,
            vec![
                ("Conv".to_string(), 1),
                ("Relu".to_string(), 1),
                ("Softmax".to_string(), 1)
            ]
        );
    }
}
