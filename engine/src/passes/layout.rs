//! NHWC layout rewrite: convolution regions run channels-last, which the conv, pooling and resize
//! kernels vectorise over C. Spatial ops become `Layout::Nhwc`, layout-agnostic ops in between
//! follow along (axes, pads and constant operands re-laid-out), and explicit Transpose nodes convert
//! at the region borders. Per-dimension inputs (Resize scales/sizes/roi, Pad pads, Slice axes) are
//! rewritten to index the physical NHWC dims; Conv weights stay OIHW, and graph outputs keep
//! their NCHW shape and ValueId.

use std::collections::HashMap;

use super::util::{add_const, add_value, is_output, permute_tensor};
use crate::error::Result;
use crate::ir::{Graph, Layout, Node, Op, Tensor, ValueId};

/// NCHW → NHWC permutation (`Transpose` perm and shape mapping).
pub const TO_NHWC: [usize; 4] = [0, 2, 3, 1];
/// NHWC → NCHW permutation.
pub const TO_NCHW: [usize; 4] = [0, 3, 1, 2];
/// Where logical NCHW axis `a` sits in an NHWC tensor.
const AXIS_TO_NHWC: [i64; 4] = [0, 3, 1, 2];

/// Rewrites convolution regions to NHWC; returns the number of nodes switched to NHWC.
///
/// Runs only when the graph has a 2-D Conv and no node is NHWC yet (so it is idempotent).
pub fn layout(graph: &mut Graph) -> Result<usize> {
    let has_conv = graph.nodes.iter().any(|n| {
        matches!(n.op, Op::Conv(_) | Op::QConv(_))
            && n.input(1).is_some_and(|w| rank(graph, w) == Some(4))
    });
    if !has_conv || graph.nodes.iter().any(is_nhwc_node) {
        return Ok(0);
    }
    let (nhwc_node, nhwc_val) = decide(graph);
    let count = nhwc_node.iter().filter(|&&b| b).count();
    if count == 0 {
        return Ok(0);
    }
    rewrite(graph, &nhwc_node, &nhwc_val)?;
    Ok(count)
}

fn is_nhwc_node(n: &Node) -> bool {
    match &n.op {
        Op::Conv(a) => a.layout == Layout::Nhwc,
        Op::QConv(q) => q.conv.layout == Layout::Nhwc,
        Op::MaxPool(a) | Op::AveragePool(a) => a.layout == Layout::Nhwc,
        Op::GlobalAveragePool { layout } | Op::GlobalMaxPool { layout } => *layout == Layout::Nhwc,
        Op::Resize(a) => a.layout == Layout::Nhwc,
        _ => false,
    }
}

fn rank(graph: &Graph, v: ValueId) -> Option<usize> {
    graph.values[v].shape.as_ref().map(|s| s.len())
}

fn is4(graph: &Graph, v: ValueId) -> bool {
    rank(graph, v) == Some(4)
}

fn const_i64(graph: &Graph, v: Option<ValueId>) -> Option<Vec<i64>> {
    graph.constant(v?)?.to_i64_vec().ok()
}

fn norm_axis(axis: i64) -> Option<usize> {
    let a = if axis < 0 { axis + 4 } else { axis };
    (0..4).contains(&a).then_some(a as usize)
}

/// Whether input slot `k` of `node` carries a 4-D activation that follows the node's layout.
fn data_slot(op: &Op, k: usize) -> bool {
    match op {
        Op::Binary(_) | Op::Elementwise(_) | Op::Concat { .. } | Op::QAdd(_) => true,
        Op::Conv(_)
        | Op::QConv(_)
        | Op::QLut { .. }
        | Op::QuantizeLinear { .. }
        | Op::DequantizeLinear { .. }
        | Op::MaxPool(_)
        | Op::AveragePool(_)
        | Op::GlobalAveragePool { .. }
        | Op::GlobalMaxPool { .. }
        | Op::Resize(_)
        | Op::Unary(_)
        | Op::Clip
        | Op::Split { .. }
        | Op::Softmax { .. }
        | Op::Slice
        | Op::Pad { .. } => k == 0,
        _ => false,
    }
}

/// A spatial op that runs in NHWC whatever its neighbours do.
fn is_anchor(graph: &Graph, node: &Node) -> bool {
    let Some(x) = node.input(0) else {
        return false;
    };
    if !is4(graph, x) || !node.outputs.iter().all(|&o| is4(graph, o)) {
        return false;
    }
    let len_in = |k: usize, ok: &[usize]| match node.input(k) {
        None => true,
        Some(v) => graph.constant(v).is_some_and(|t| ok.contains(&t.len())),
    };
    match &node.op {
        Op::Conv(a) => a.kernel_shape.len() <= 2 && node.input(1).is_some_and(|w| is4(graph, w)),
        Op::QConv(_) => node.input(1).is_some_and(|w| is4(graph, w)),
        Op::MaxPool(a) | Op::AveragePool(a) => node.outputs.len() == 1 && a.kernel_shape.len() == 2,
        Op::GlobalAveragePool { .. } | Op::GlobalMaxPool { .. } => true,
        Op::Resize(_) => len_in(1, &[0, 8]) && len_in(2, &[0, 4]) && len_in(3, &[0, 4]),
        _ => false,
    }
}

/// A layout-agnostic op all of whose activation inputs are already NHWC.
fn can_follow(graph: &Graph, node: &Node, nhwc_val: &[bool]) -> bool {
    if node.outputs.is_empty() || !node.outputs.iter().all(|&o| is4(graph, o)) {
        return false;
    }
    let op = &node.op;
    let mut any_nhwc = false;
    for (k, slot) in node.inputs.iter().enumerate() {
        let Some(v) = *slot else { continue };
        if data_slot(op, k) {
            if let Some(t) = graph.constant(v) {
                let ok = match op {
                    Op::Binary(_) | Op::Elementwise(_) => t.shape.len() <= 4,
                    Op::Concat { .. } => t.shape.len() == 4,
                    _ => false,
                };
                if !ok {
                    return false;
                }
            } else if is4(graph, v) && nhwc_val[v] {
                any_nhwc = true;
            } else {
                return false;
            }
        } else if nhwc_val[v] {
            return false;
        }
    }
    if !any_nhwc {
        return false;
    }
    match op {
        Op::Unary(_) | Op::Binary(_) | Op::Elementwise(_) | Op::Concat { .. } => true,
        // Per-tensor quantization only (a per-axis axis would need remapping).
        Op::QLut { .. } | Op::QAdd(_) => true,
        Op::QuantizeLinear { .. } | Op::DequantizeLinear { .. } => {
            (1..3).all(|k| match node.input(k) {
                None => true,
                Some(v) => graph.values[v]
                    .shape
                    .as_ref()
                    .is_some_and(|s| s.iter().product::<usize>() == 1),
            })
        }
        Op::Split { axis, .. } => norm_axis(*axis).is_some(),
        Op::Softmax { axis } => graph.opset >= 13 && norm_axis(*axis).is_some(),
        Op::Clip => (1..3).all(|k| match node.input(k) {
            None => true,
            Some(v) => graph.values[v]
                .shape
                .as_ref()
                .is_some_and(|s| s.iter().product::<usize>() == 1),
        }),
        Op::Slice => {
            let axes = match node.input(3) {
                Some(_) => const_i64(graph, node.input(3)),
                None => node
                    .input(1)
                    .and_then(|s| graph.values[s].shape.clone())
                    .map(|s| (0..s.iter().product::<usize>() as i64).collect()),
            };
            axes.is_some_and(|a| a.iter().all(|&x| norm_axis(x).is_some()))
        }
        Op::Pad { .. } => {
            let pads_ok = const_i64(graph, node.input(1)).is_some();
            let axes_ok = match node.input(3) {
                None => const_i64(graph, node.input(1)).is_some_and(|p| p.len() == 8),
                Some(_) => const_i64(graph, node.input(3))
                    .is_some_and(|a| a.iter().all(|&x| norm_axis(x).is_some())),
            };
            pads_ok && axes_ok
        }
        _ => false,
    }
}

/// Picks the layout of every node and value: anchors are NHWC, agnostic ops follow their inputs.
fn decide(graph: &Graph) -> (Vec<bool>, Vec<bool>) {
    let mut nhwc_node = vec![false; graph.nodes.len()];
    let mut nhwc_val = vec![false; graph.values.len()];
    for (i, node) in graph.nodes.iter().enumerate() {
        if is_anchor(graph, node) || can_follow(graph, node, &nhwc_val) {
            nhwc_node[i] = true;
            for &o in &node.outputs {
                nhwc_val[o] = true;
            }
        }
    }
    (nhwc_node, nhwc_val)
}

fn nhwc_shape(s: &[usize]) -> Vec<usize> {
    TO_NHWC.iter().map(|&p| s[p]).collect()
}

fn transpose_node(name: String, perm: &[usize], input: ValueId, output: ValueId) -> Node {
    Node {
        name,
        op: Op::Transpose {
            perm: perm.to_vec(),
        },
        inputs: vec![Some(input)],
        outputs: vec![output],
    }
}

/// A constant broadcast operand re-laid-out for an NHWC rank-4 result: rank-aligned to 4 with
/// leading 1s, then permuted; one-element constants are returned unchanged.
fn relayout_broadcast(t: &Tensor) -> Result<Option<Tensor>> {
    if t.len() == 1 || t.shape.len() > 4 {
        return Ok(None);
    }
    let mut shape = vec![1; 4 - t.shape.len()];
    shape.extend_from_slice(&t.shape);
    let t4 = Tensor::new(shape, t.data.clone())?;
    Ok(Some(permute_tensor(&t4, &TO_NHWC)?))
}

/// Reorders a per-dimension list (`[d0..d3]`) or begins/ends list (`[b0..b3, e0..e3]`) to NHWC.
fn reorder_dims(v: &[i64]) -> Vec<i64> {
    v.chunks(4)
        .flat_map(|c| TO_NHWC.iter().map(move |&p| c.get(p).copied().unwrap_or(0)))
        .collect()
}

fn reorder_dims_f32(v: &[f32]) -> Vec<f32> {
    v.chunks(4)
        .flat_map(|c| {
            TO_NHWC
                .iter()
                .map(move |&p| c.get(p).copied().unwrap_or(0.0))
        })
        .collect()
}

/// Same-typed copy of an integer constant with new contents.
fn int_const_like(t: &Tensor, data: Vec<i64>) -> Result<Tensor> {
    let shape = vec![data.len()];
    match t.dtype() {
        crate::ir::DataType::I32 => Tensor::new(
            shape,
            crate::ir::TensorData::I32(data.iter().map(|&x| x as i32).collect()),
        ),
        _ => Tensor::from_i64(shape, data),
    }
}

struct Rewriter {
    /// For each re-laid-out value, the id NHWC readers use.
    to_h: HashMap<ValueId, ValueId>,
    /// For each re-laid-out value, the id NCHW readers use (created on demand).
    to_c: HashMap<ValueId, ValueId>,
    /// Converters NCHW → NHWC of values that stay NCHW.
    conv_h: HashMap<ValueId, ValueId>,
    /// Re-laid-out constants.
    consts: HashMap<ValueId, ValueId>,
    /// Nodes to insert before everything / after node i.
    front: Vec<Node>,
    after: Vec<Vec<Node>>,
}

fn rewrite(graph: &mut Graph, nhwc_node: &[bool], nhwc_val: &[bool]) -> Result<()> {
    let producers = graph.producers();
    let n_nodes = graph.nodes.len();
    let mut rw = Rewriter {
        to_h: HashMap::new(),
        to_c: HashMap::new(),
        conv_h: HashMap::new(),
        consts: HashMap::new(),
        front: Vec::new(),
        after: vec![Vec::new(); n_nodes],
    };
    // 1. Re-lay-out values written by NHWC nodes.
    for (p, &is_h) in nhwc_node.iter().enumerate() {
        if !is_h {
            continue;
        }
        for k in 0..graph.nodes[p].outputs.len() {
            let v = graph.nodes[p].outputs[k];
            let Some(shape) = graph.values[v].shape.clone() else {
                continue;
            };
            let hshape = nhwc_shape(&shape);
            if is_output(graph, v) {
                let base = format!("{}_nhwc", graph.values[v].name);
                let dtype = graph.values[v].dtype;
                let vh = add_value(graph, &base, dtype, Some(hshape));
                graph.nodes[p].outputs[k] = vh;
                rw.after[p].push(transpose_node(format!("{base}_to_nchw"), &TO_NCHW, vh, v));
                rw.to_h.insert(v, vh);
                rw.to_c.insert(v, v);
            } else {
                graph.values[v].shape = Some(hshape);
                rw.to_h.insert(v, v);
            }
        }
    }
    // 2. Rewire every input slot to the id holding the layout its reader expects.
    for (i, &node_h) in nhwc_node.iter().enumerate() {
        for k in 0..graph.nodes[i].inputs.len() {
            let Some(u) = graph.nodes[i].inputs[k] else {
                continue;
            };
            let wants_h = node_h && data_slot(&graph.nodes[i].op, k);
            let new = if wants_h {
                nhwc_input(graph, &mut rw, &producers, i, u)?
            } else if nhwc_val[u] {
                nchw_view(graph, &mut rw, &producers, u)
            } else {
                u
            };
            graph.nodes[i].inputs[k] = Some(new);
        }
    }
    // 3. Rewrite attributes and per-dimension inputs of NHWC nodes.
    for (i, &node_h) in nhwc_node.iter().enumerate() {
        if node_h {
            rewrite_node(graph, i)?;
        }
    }
    // 4. Splice the converters in.
    let old = std::mem::take(&mut graph.nodes);
    let mut nodes = std::mem::take(&mut rw.front);
    for (node, extra) in old.into_iter().zip(rw.after) {
        nodes.push(node);
        nodes.extend(extra);
    }
    graph.nodes = nodes;
    Ok(())
}

/// The NHWC id an NHWC reader should use for input `u`.
fn nhwc_input(
    graph: &mut Graph,
    rw: &mut Rewriter,
    producers: &[Option<usize>],
    i: usize,
    u: ValueId,
) -> Result<ValueId> {
    if let Some(&h) = rw.to_h.get(&u) {
        return Ok(h);
    }
    if let Some(t) = graph.values[u].constant.clone() {
        if let Some(&c) = rw.consts.get(&u) {
            return Ok(c);
        }
        let new = match &graph.nodes[i].op {
            Op::Binary(_) | Op::Elementwise(_) => relayout_broadcast(&t)?,
            _ if t.shape.len() == 4 => Some(permute_tensor(&t, &TO_NHWC)?),
            _ => None,
        };
        let Some(nt) = new else { return Ok(u) };
        let base = format!("{}_nhwc", graph.values[u].name);
        let c = add_const(graph, &base, nt);
        rw.consts.insert(u, c);
        return Ok(c);
    }
    if let Some(&h) = rw.conv_h.get(&u) {
        return Ok(h);
    }
    let Some(shape) = graph.values[u].shape.clone() else {
        return Ok(u);
    };
    let base = format!("{}_nhwc", graph.values[u].name);
    let dtype = graph.values[u].dtype;
    let uh = add_value(graph, &base, dtype, Some(nhwc_shape(&shape)));
    let t = transpose_node(format!("{base}_to_nhwc"), &TO_NHWC, u, uh);
    match producers.get(u).copied().flatten() {
        Some(p) => rw.after[p].push(t),
        None => rw.front.push(t),
    }
    rw.conv_h.insert(u, uh);
    Ok(uh)
}

/// The NCHW id an NCHW reader should use for re-laid-out value `u` (converter made on demand).
fn nchw_view(
    graph: &mut Graph,
    rw: &mut Rewriter,
    producers: &[Option<usize>],
    u: ValueId,
) -> ValueId {
    if let Some(&c) = rw.to_c.get(&u) {
        return c;
    }
    let Some(hshape) = graph.values[u].shape.clone() else {
        return u;
    };
    let shape: Vec<usize> = TO_NCHW.iter().map(|&p| hshape[p]).collect();
    let base = format!("{}_nchw", graph.values[u].name);
    let dtype = graph.values[u].dtype;
    let uc = add_value(graph, &base, dtype, Some(shape));
    if let Some(p) = producers.get(u).copied().flatten() {
        rw.after[p].push(transpose_node(format!("{base}_to_nchw"), &TO_NCHW, u, uc));
    }
    rw.to_c.insert(u, uc);
    uc
}

fn map_axis(axis: i64) -> i64 {
    norm_axis(axis).map(|a| AXIS_TO_NHWC[a]).unwrap_or(axis)
}

/// Switches node `i` to NHWC: layout flags, axes, and per-dimension constant inputs.
fn rewrite_node(graph: &mut Graph, i: usize) -> Result<()> {
    let name = graph.nodes[i].name.clone();
    let set_input = |graph: &mut Graph, k: usize, t: Tensor| {
        let c = add_const(graph, &format!("{name}_nhwc_in{k}"), t);
        let node = &mut graph.nodes[i];
        if node.inputs.len() <= k {
            node.inputs.resize(k + 1, None);
        }
        node.inputs[k] = Some(c);
    };
    let node = graph.nodes[i].clone();
    let node = &node;
    match &node.op {
        Op::Resize(_) => {
            for (k, len) in [(1usize, 8usize), (2, 4), (3, 4)] {
                let Some(t) = graph
                    .const_input(node, k)
                    .filter(|t| t.len() == len)
                    .cloned()
                else {
                    continue;
                };
                let nt = match t.dtype() {
                    crate::ir::DataType::F32 => {
                        Tensor::from_f32(vec![len], reorder_dims_f32(t.as_f32()?))?
                    }
                    _ => int_const_like(&t, reorder_dims(&t.to_i64_vec()?))?,
                };
                set_input(graph, k, nt);
            }
        }
        Op::Slice => {
            let axes = match node.input(3) {
                Some(_) => const_i64(graph, node.input(3)),
                None => node
                    .input(1)
                    .and_then(|s| graph.values[s].shape.clone())
                    .map(|s| (0..s.iter().product::<usize>() as i64).collect()),
            };
            if let Some(axes) = axes {
                let mapped: Vec<i64> = axes.iter().map(|&a| map_axis(a)).collect();
                let t = match graph.const_input(node, 3) {
                    Some(t) => int_const_like(t, mapped)?,
                    None => Tensor::from_i64(vec![mapped.len()], mapped)?,
                };
                set_input(graph, 3, t);
            }
        }
        Op::Pad { .. } => {
            if let Some(axes_t) = graph.const_input(node, 3).cloned() {
                let mapped: Vec<i64> = axes_t.to_i64_vec()?.iter().map(|&a| map_axis(a)).collect();
                set_input(graph, 3, int_const_like(&axes_t, mapped)?);
            } else if let Some(pads_t) = graph.const_input(node, 1).cloned() {
                set_input(
                    graph,
                    1,
                    int_const_like(&pads_t, reorder_dims(&pads_t.to_i64_vec()?))?,
                );
            }
        }
        _ => {}
    }
    let node = &mut graph.nodes[i];
    match &mut node.op {
        Op::Conv(a) => a.layout = Layout::Nhwc,
        Op::QConv(q) => q.conv.layout = Layout::Nhwc,
        Op::MaxPool(a) | Op::AveragePool(a) => a.layout = Layout::Nhwc,
        Op::GlobalAveragePool { layout } | Op::GlobalMaxPool { layout } => *layout = Layout::Nhwc,
        Op::Resize(a) => a.layout = Layout::Nhwc,
        Op::Concat { axis } | Op::Split { axis, .. } | Op::Softmax { axis } => {
            *axis = map_axis(*axis)
        }
        _ => {}
    }
    Ok(())
}
