//! BatchNormalization folding: Conv → BatchNormalization (all constant) becomes one Conv with
//! rescaled weights and bias, W' = W·s, B' = (B − mean)·s + beta with s = scale/√(var+eps).
//! A BatchNormalization after anything else becomes Mul + Add by per-channel constants, which the
//! elementwise fusion then merges with its neighbours.

use super::util::{add_const, add_value, remove_nodes, sole_consumer};
use crate::error::Result;
use crate::ir::{Graph, Node, Op, Tensor};

/// Folds BatchNormalization into a preceding Conv, or lowers it to Mul+Add; returns rewrites.
pub fn bn_fold(graph: &mut Graph) -> Result<usize> {
    let mut count = 0;
    let mut i = 0;
    while i < graph.nodes.len() {
        if matches!(graph.nodes[i].op, Op::BatchNormalization { .. })
            && (fold_into_conv(graph, i)? || lower(graph, i)?)
        {
            count += 1;
            // Re-examine from the start of the rewritten region.
            i = i.saturating_sub(1);
            continue;
        }
        i += 1;
    }
    Ok(count)
}

/// Per-channel (scale, shift) of a BatchNormalization with constant parameters of length `c`.
fn bn_affine(graph: &Graph, bn: &Node, eps: f32) -> Option<(Vec<f32>, Vec<f32>)> {
    let get = |k| {
        graph
            .const_input(bn, k)
            .and_then(|t| t.as_f32().ok().map(|s| s.to_vec()))
    };
    let (scale, beta, mean, var) = (get(1)?, get(2)?, get(3)?, get(4)?);
    let c = scale.len();
    if beta.len() != c || mean.len() != c || var.len() != c {
        return None;
    }
    let s: Vec<f32> = scale
        .iter()
        .zip(&var)
        .map(|(g, v)| g / (v + eps).sqrt())
        .collect();
    let shift: Vec<f32> = (0..c).map(|k| beta[k] - mean[k] * s[k]).collect();
    Some((s, shift))
}

fn bn_parts(graph: &Graph, i: usize) -> Option<(f32, usize, usize)> {
    let bn = &graph.nodes[i];
    let Op::BatchNormalization { epsilon } = bn.op else {
        return None;
    };
    // Training-mode BatchNormalization (extra outputs) is left alone.
    let [out] = bn.outputs.as_slice() else {
        return None;
    };
    Some((epsilon, bn.input(0)?, *out))
}

fn fold_into_conv(graph: &mut Graph, i: usize) -> Result<bool> {
    let Some((eps, x, out)) = bn_parts(graph, i) else {
        return Ok(false);
    };
    let producers = graph.producers();
    let Some(p) = producers[x] else {
        return Ok(false);
    };
    let consumers = graph.consumers();
    if sole_consumer(graph, &consumers, x) != Some(i) {
        return Ok(false);
    }
    let conv = &graph.nodes[p];
    let Op::Conv(attrs) = &conv.op else {
        return Ok(false);
    };
    if attrs.activation.is_some() || conv.outputs.len() != 1 {
        return Ok(false);
    }
    let Some(w) = graph.const_input(conv, 1) else {
        return Ok(false);
    };
    let Ok(wd) = w.as_f32() else {
        return Ok(false);
    };
    let cout = w.shape.first().copied().unwrap_or(0);
    let Some((s, shift)) = bn_affine(graph, &graph.nodes[i], eps) else {
        return Ok(false);
    };
    if cout == 0 || s.len() != cout || wd.len() % cout != 0 {
        return Ok(false);
    }
    let bias: Vec<f32> = match conv.input(2) {
        None => vec![0.0; cout],
        Some(b) => match graph.constant(b).and_then(|t| t.as_f32().ok()) {
            Some(b) if b.len() == cout => b.to_vec(),
            _ => return Ok(false),
        },
    };
    let per = wd.len() / cout;
    let new_w: Vec<f32> = wd
        .iter()
        .enumerate()
        .map(|(k, &v)| v * s[k / per])
        .collect();
    let new_b: Vec<f32> = (0..cout).map(|o| bias[o] * s[o] + shift[o]).collect();
    let w_shape = w.shape.clone();
    let conv_name = conv.name.clone();
    let wv = add_const(
        graph,
        &format!("{conv_name}_W_bn"),
        Tensor::from_f32(w_shape, new_w)?,
    );
    let bv = add_const(
        graph,
        &format!("{conv_name}_B_bn"),
        Tensor::from_f32(vec![cout], new_b)?,
    );
    let conv = &mut graph.nodes[p];
    conv.inputs.resize(3, None);
    conv.inputs[1] = Some(wv);
    conv.inputs[2] = Some(bv);
    conv.outputs[0] = out;
    if graph.values[out].shape.is_none() {
        graph.values[out].shape = graph.values[x].shape.clone();
    }
    remove_nodes(graph, &[i]);
    Ok(true)
}

/// Lowers a standalone BatchNormalization over an NC... input to `Mul(x, s) → Add(·, shift)`.
fn lower(graph: &mut Graph, i: usize) -> Result<bool> {
    let Some((eps, x, out)) = bn_parts(graph, i) else {
        return Ok(false);
    };
    let Some(shape) = graph.values[x].shape.clone() else {
        return Ok(false);
    };
    let Some((s, shift)) = bn_affine(graph, &graph.nodes[i], eps) else {
        return Ok(false);
    };
    if shape.len() < 2 || shape[1] != s.len() {
        return Ok(false);
    }
    let mut cshape = vec![s.len()];
    cshape.resize(shape.len() - 1, 1);
    let name = graph.nodes[i].name.clone();
    let dtype = graph.values[x].dtype;
    let sv = add_const(
        graph,
        &format!("{name}_scale"),
        Tensor::from_f32(cshape.clone(), s)?,
    );
    let bv = add_const(
        graph,
        &format!("{name}_shift"),
        Tensor::from_f32(cshape, shift)?,
    );
    let mid = add_value(graph, &format!("{name}_scaled"), dtype, Some(shape.clone()));
    if graph.values[out].shape.is_none() {
        graph.values[out].shape = Some(shape);
    }
    let mul = Node {
        name: format!("{name}_mul"),
        op: Op::Binary(crate::ir::BinaryOp::Mul),
        inputs: vec![Some(x), Some(sv)],
        outputs: vec![mid],
    };
    let add = Node {
        name: format!("{name}_add"),
        op: Op::Binary(crate::ir::BinaryOp::Add),
        inputs: vec![Some(mid), Some(bv)],
        outputs: vec![out],
    };
    graph.nodes[i] = mul;
    graph.nodes.insert(i + 1, add);
    Ok(true)
}
