//! Small graph-editing helpers shared by the passes: value bypassing, node removal, tensor
//! permutation and broadcasting arithmetic. Nothing here changes numerical results.

use crate::error::{Error, Result};
use crate::ir::{DataType, Graph, Node, Op, Tensor, TensorData, ValueId};

/// Makes every reader of `out` read `src` instead, so the node writing `out` can be dropped.
///
/// When `out` is a graph output its id must survive: the node producing `src` is then made to
/// write `out` directly (possible only when `src` is produced by a node and is not itself a graph
/// output). Returns false, changing nothing, when neither is possible.
pub(crate) fn bypass(graph: &mut Graph, out: ValueId, src: ValueId) -> bool {
    if out == src {
        return true;
    }
    if !graph.outputs.contains(&out) {
        graph.replace_uses(out, src);
        return true;
    }
    if graph.outputs.contains(&src)
        || graph.inputs.contains(&src)
        || graph.values[src].constant.is_some()
    {
        return false;
    }
    let Some(p) = graph.producers()[src] else {
        return false;
    };
    for o in graph.nodes[p].outputs.iter_mut() {
        if *o == src {
            *o = out;
        }
    }
    graph.replace_uses(src, out);
    if graph.values[out].shape.is_none() {
        graph.values[out].shape = graph.values[src].shape.clone();
    }
    true
}

/// Whether value `v` is one of the graph's outputs.
pub(crate) fn is_output(graph: &Graph, v: ValueId) -> bool {
    graph.outputs.contains(&v)
}

/// The node index of the single reader of `v`, when exactly one node reads it and it is not a
/// graph output.
pub(crate) fn sole_consumer(graph: &Graph, consumers: &[Vec<usize>], v: ValueId) -> Option<usize> {
    match consumers[v].as_slice() {
        [c] if !is_output(graph, v) => Some(*c),
        _ => None,
    }
}

/// Adds a constant value with a name derived from `base`.
pub(crate) fn add_const(graph: &mut Graph, base: &str, t: Tensor) -> ValueId {
    let name = format!("{base}__{}", graph.values.len());
    graph.add_constant(name, t)
}

/// Adds a non-constant value of the given type and shape with a name derived from `base`.
pub(crate) fn add_value(
    graph: &mut Graph,
    base: &str,
    dtype: DataType,
    shape: Option<Vec<usize>>,
) -> ValueId {
    let name = format!("{base}__{}", graph.values.len());
    let v = graph.add_value(name, dtype);
    graph.values[v].shape = shape;
    v
}

/// Removes the nodes at the given indices (order preserved for the rest).
pub(crate) fn remove_nodes(graph: &mut Graph, dead: &[usize]) {
    if dead.is_empty() {
        return;
    }
    let mut keep = vec![true; graph.nodes.len()];
    for &d in dead {
        if d < keep.len() {
            keep[d] = false;
        }
    }
    let mut i = 0;
    graph.nodes.retain(|_| {
        let k = keep[i];
        i += 1;
        k
    });
}

/// Row-major strides of a shape.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

fn permute_vec<T: Copy>(src: &[T], shape: &[usize], perm: &[usize]) -> Vec<T> {
    let in_strides = strides(shape);
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let n: usize = out_shape.iter().product();
    let mut out = Vec::with_capacity(n);
    let mut idx = vec![0usize; out_shape.len()];
    for _ in 0..n {
        let off: usize = idx.iter().zip(perm).map(|(&i, &p)| i * in_strides[p]).sum();
        out.push(src[off]);
        for d in (0..idx.len()).rev() {
            idx[d] += 1;
            if idx[d] < out_shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

/// Whether `perm` is a permutation of `0..rank`.
pub(crate) fn is_perm(perm: &[usize], rank: usize) -> bool {
    if perm.len() != rank {
        return false;
    }
    let mut seen = vec![false; rank];
    for &p in perm {
        if p >= rank || seen[p] {
            return false;
        }
        seen[p] = true;
    }
    true
}

/// Transposes a tensor: output dim `i` is input dim `perm[i]` (ONNX Transpose semantics).
pub(crate) fn permute_tensor(t: &Tensor, perm: &[usize]) -> Result<Tensor> {
    if !is_perm(perm, t.shape.len()) {
        return Err(Error::Shape(format!(
            "perm {perm:?} does not fit a tensor of shape {:?}",
            t.shape
        )));
    }
    let s = &t.shape;
    let data = match &t.data {
        TensorData::F32(v) => TensorData::F32(permute_vec(v, s, perm)),
        TensorData::I64(v) => TensorData::I64(permute_vec(v, s, perm)),
        TensorData::I32(v) => TensorData::I32(permute_vec(v, s, perm)),
        TensorData::I8(v) => TensorData::I8(permute_vec(v, s, perm)),
        TensorData::U8(v) => TensorData::U8(permute_vec(v, s, perm)),
        TensorData::Bool(v) => TensorData::Bool(permute_vec(v, s, perm)),
    };
    Tensor::new(perm.iter().map(|&p| s[p]).collect(), data)
}

/// Numpy broadcast of two shapes, or None when they are incompatible.
pub(crate) fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let r = a.len().max(b.len());
    let mut out = vec![0; r];
    for i in 0..r {
        let da = if i + a.len() >= r {
            a[i + a.len() - r]
        } else {
            1
        };
        let db = if i + b.len() >= r {
            b[i + b.len() - r]
        } else {
            1
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return None;
        };
    }
    Some(out)
}

/// A single f32 read from a one-element constant.
pub(crate) fn scalar_f32(t: &Tensor) -> Option<f32> {
    if t.len() == 1 {
        t.to_f32_vec().first().copied()
    } else {
        None
    }
}

/// Whether the op is a pointwise activation-like producer whose output is never negative.
pub(crate) fn produces_non_negative(graph: &Graph, node: &Node) -> bool {
    use crate::ir::{Activation, UnaryOp};
    let act_ok = |a: Option<Activation>| match a {
        Some(Activation::Relu)
        | Some(Activation::Sigmoid)
        | Some(Activation::HardSigmoid { .. }) => true,
        Some(Activation::Clip { min, .. }) => min >= 0.0,
        _ => false,
    };
    match &node.op {
        Op::Unary(UnaryOp::Act(a)) => act_ok(Some(*a)),
        Op::Unary(UnaryOp::Abs) | Op::Unary(UnaryOp::Exp) => true,
        Op::Conv(c) => act_ok(c.activation),
        Op::Gemm { activation, .. } => act_ok(*activation),
        Op::Clip => graph
            .const_input(node, 1)
            .and_then(scalar_f32)
            .is_some_and(|m| m >= 0.0),
        _ => false,
    }
}
