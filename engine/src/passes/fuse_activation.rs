//! Activation fusion: an activation (Relu, Clip/ReLU6, LeakyRelu, Sigmoid, SiLU, HardSwish, ...)
//! that is the only reader of a Conv or Gemm output becomes that op's fused epilogue, so the
//! activation costs no extra pass over memory. `Mul(x, Sigmoid(x))` and `x·HardSigmoid(x)` are
//! first recognised as SiLU / HardSwish, and a per-channel constant Add after a Conv joins its bias.

use super::util::{add_const, remove_nodes, scalar_f32, sole_consumer};
use crate::error::Result;
use crate::ir::{Activation, BinaryOp, Graph, Layout, Op, Tensor, UnaryOp};

/// Fuses activations (and per-channel bias adds) into Conv/Gemm; returns the number of rewrites.
pub fn fuse_activation(graph: &mut Graph) -> Result<usize> {
    let mut count = 0;
    let mut i = 0;
    while i < graph.nodes.len() {
        if canonicalize_gated(graph, i) || fuse_into_producer(graph, i) || fold_bias_add(graph, i)?
        {
            count += 1;
            i = i.saturating_sub(1);
            continue;
        }
        i += 1;
    }
    Ok(count)
}

/// The activation a node applies to its input 0, if it is a plain activation.
fn as_activation(graph: &Graph, i: usize) -> Option<Activation> {
    let node = &graph.nodes[i];
    match &node.op {
        Op::Unary(UnaryOp::Act(a)) => Some(*a),
        Op::Clip => {
            let bound = |k: usize, default: f32| match node.input(k) {
                None => Some(default),
                Some(v) => graph.constant(v).and_then(scalar_f32),
            };
            Some(Activation::Clip {
                min: bound(1, f32::NEG_INFINITY)?,
                max: bound(2, f32::INFINITY)?,
            })
        }
        _ => None,
    }
}

/// Rewrites `Mul(x, Sigmoid(x))` into `Silu(x)` and `Mul(x, HardSigmoid(x; 1/6, 0.5))` into
/// `HardSwish(x)`, at the Mul node `i`.
fn canonicalize_gated(graph: &mut Graph, i: usize) -> bool {
    let m = &graph.nodes[i];
    if m.op != Op::Binary(BinaryOp::Mul) || m.inputs.len() != 2 {
        return false;
    }
    let (Some(a), Some(b)) = (m.input(0), m.input(1)) else {
        return false;
    };
    let producers = graph.producers();
    let consumers = graph.consumers();
    for (x, g) in [(a, b), (b, a)] {
        let Some(s) = producers[g] else { continue };
        let sn = &graph.nodes[s];
        if sn.input(0) != Some(x) || sole_consumer(graph, &consumers, g) != Some(i) {
            continue;
        }
        let act = match sn.op {
            Op::Unary(UnaryOp::Act(Activation::Sigmoid)) => Activation::Silu,
            Op::Unary(UnaryOp::Act(Activation::HardSigmoid { alpha, beta }))
                if (alpha - 1.0 / 6.0).abs() < 1e-6 && (beta - 0.5).abs() < 1e-6 =>
            {
                Activation::HardSwish
            }
            _ => continue,
        };
        let m = &mut graph.nodes[i];
        m.op = Op::Unary(UnaryOp::Act(act));
        m.inputs = vec![Some(x)];
        remove_nodes(graph, &[s]);
        return true;
    }
    false
}

/// Fuses activation node `i` into the Conv/Gemm producing its input, when that is its only reader.
fn fuse_into_producer(graph: &mut Graph, i: usize) -> bool {
    let Some(act) = as_activation(graph, i) else {
        return false;
    };
    let node = &graph.nodes[i];
    let (Some(y), [out]) = (node.input(0), node.outputs.as_slice()) else {
        return false;
    };
    let out = *out;
    let Some(p) = graph.producers()[y] else {
        return false;
    };
    if sole_consumer(graph, &graph.consumers(), y) != Some(i) || graph.nodes[p].outputs.len() != 1 {
        return false;
    }
    let pn = &mut graph.nodes[p];
    match &mut pn.op {
        Op::Conv(a) if a.activation.is_none() => a.activation = Some(act),
        Op::Gemm { activation, .. } if activation.is_none() => *activation = Some(act),
        _ => return false,
    }
    pn.outputs[0] = out;
    remove_nodes(graph, &[i]);
    true
}

/// Folds `Add(conv_out, c)` with a per-channel constant `c` into the Conv's bias.
fn fold_bias_add(graph: &mut Graph, i: usize) -> Result<bool> {
    let node = &graph.nodes[i];
    if node.op != Op::Binary(BinaryOp::Add) || node.outputs.len() != 1 {
        return Ok(false);
    }
    let out = node.outputs[0];
    let (Some(a), Some(b)) = (node.input(0), node.input(1)) else {
        return Ok(false);
    };
    let producers = graph.producers();
    let consumers = graph.consumers();
    for (y, c) in [(a, b), (b, a)] {
        let (Some(p), Some(ct)) = (producers[y], graph.constant(c)) else {
            continue;
        };
        let pn = &graph.nodes[p];
        let Op::Conv(attrs) = &pn.op else { continue };
        if attrs.activation.is_some() || sole_consumer(graph, &consumers, y) != Some(i) {
            continue;
        }
        let (Some(yshape), Some(w)) = (graph.values[y].shape.as_ref(), graph.const_input(pn, 1))
        else {
            continue;
        };
        let Some(&cout) = w.shape.first() else {
            continue;
        };
        let r = yshape.len();
        let ch = match attrs.layout {
            Layout::Nchw => 1,
            Layout::Nhwc => r.saturating_sub(1),
        };
        let Ok(cdata) = ct.as_f32() else { continue };
        if r < 3 || ct.shape.len() > r || yshape.get(ch) != Some(&cout) {
            continue;
        }
        // Align the constant's shape to rank r and check it varies along the channel axis only.
        let off = r - ct.shape.len();
        let per_channel = ct
            .shape
            .iter()
            .enumerate()
            .all(|(k, &d)| d == 1 || (k + off == ch && d == cout));
        if !per_channel {
            continue;
        }
        let add: Vec<f32> = if cdata.len() == 1 {
            vec![cdata[0]; cout]
        } else {
            cdata.to_vec()
        };
        let bias: Vec<f32> = match pn.input(2) {
            None => add,
            Some(bv) => match graph.constant(bv).and_then(|t| t.as_f32().ok()) {
                Some(old) if old.len() == cout => {
                    old.iter().zip(&add).map(|(o, a)| o + a).collect()
                }
                _ => continue,
            },
        };
        let name = pn.name.clone();
        let bv = add_const(
            graph,
            &format!("{name}_B_add"),
            Tensor::from_f32(vec![cout], bias)?,
        );
        let pn = &mut graph.nodes[p];
        pn.inputs.resize(3, None);
        pn.inputs[2] = Some(bv);
        pn.outputs[0] = out;
        remove_nodes(graph, &[i]);
        return Ok(true);
    }
    Ok(false)
}
