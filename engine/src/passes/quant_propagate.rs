//! QDQ propagation: ops that only move or select values run on the 8-bit codes instead of on
//! dequantized floats, so a QDQ model does not widen every activation to f32 and back around
//! its Transposes, Reshapes, Splits, Concats and MaxPools.
//!
//! Dequantization is monotone and elementwise, so for an op that only picks input elements
//! (or their maximum) `op(DQ(x)) = DQ(op(x))` exactly, and `Q(DQ(x))` is a 256-entry table:
//! - `DQ(x) → T` (Transpose, Reshape, Flatten, Squeeze, Unsqueeze, Slice, Split, Identity,
//!   MaxPool) becomes `T(x) → DQ` (one DQ per output);
//! - `DQ(a), DQ(b), … → Concat` becomes `Concat(a, b, …) → DQ` when all share parameters, or,
//!   followed by a Q, `Concat(LUT_a(a), LUT_b(b), …)` requantized to the Q's parameters;
//! - `Q(DQ(x))` with different parameters becomes a requantizing [`Op::QLut`];
//! - `DQ(a), DQ(b) → Add [→ activation] → Q` on equal shapes becomes one [`Op::QAdd`] (the
//!   residual sums of quantized ResNets and EfficientNets), computed in f32 exactly as the
//!   three ops would be;
//! - a ReLU table (`QLut` computing `max(x, zero point)`) after a `QConv`, `QGemm` or `QAdd` with
//!   the same parameters and no activation becomes that op's activation (symmetric-int8 models
//!   keep `DQ → Relu → Q` apart from the conv).
//!
//! Results are bit-identical to the unpropagated graph. Runs before constant folding (with
//! `quant_fold`) and again after the layout pass, whose Transposes it then moves onto codes.

use super::quant_fold::{dq_activation, fold_requant, lut_table, q_params, requant_tail};
use super::util::{add_value, remove_nodes, sole_consumer};
use crate::error::Result;
use crate::ir::{BinaryOp, DataType, Graph, Node, Op, QAddAttrs, QParams, ValueId};

/// Moves dequantization past value-selecting ops; returns the number of rewrites.
pub fn quant_propagate(graph: &mut Graph) -> Result<usize> {
    let mut count = 0;
    loop {
        if !graph
            .nodes
            .iter()
            .any(|n| matches!(n.op, Op::DequantizeLinear { .. }))
        {
            return Ok(count);
        }
        let producers = graph.producers();
        let consumers = graph.consumers();
        let mut done = false;
        for i in 0..graph.nodes.len() {
            done = match graph.nodes[i].op {
                Op::Transpose { .. }
                | Op::Reshape { .. }
                | Op::Flatten { .. }
                | Op::Squeeze { .. }
                | Op::Unsqueeze { .. }
                | Op::Slice
                | Op::Split { .. }
                | Op::Identity
                | Op::MaxPool(_) => sink(graph, &producers, i),
                Op::Concat { .. } => concat(graph, &producers, &consumers, i),
                Op::QuantizeLinear { .. } => requantize(graph, &producers, i),
                Op::Binary(BinaryOp::Add) => quantized_add(graph, &producers, &consumers, i),
                Op::QLut { .. } => relu_into_producer(graph, &producers, &consumers, i),
                _ => false,
            };
            if done {
                count += 1;
                break;
            }
        }
        if !done {
            return Ok(count);
        }
    }
}

/// Whether every input after the first is absent or constant (shape, axes, split sizes).
fn static_rest(graph: &Graph, node: &Node) -> bool {
    node.inputs
        .iter()
        .skip(1)
        .flatten()
        .all(|&v| graph.constant(v).is_some())
}

/// Gives node `i` fresh code-typed outputs and dequantizes each into the old output value with
/// the parameters (scale and zero-point inputs) of DQ node `dq`, whose codes are `code_dtype`;
/// the new DQs follow node `i`.
fn dequantize_outputs(graph: &mut Graph, i: usize, dq: usize, code_dtype: DataType) {
    let dq_node = graph.nodes[dq].clone();
    let outs = graph.nodes[i].outputs.clone();
    let mut new_dqs = Vec::with_capacity(outs.len());
    for (k, &y) in outs.iter().enumerate() {
        let name = format!("{}_codes{k}", graph.nodes[i].name);
        let shape = graph.values[y].shape.clone();
        let yq = add_value(graph, &name, code_dtype, shape);
        graph.nodes[i].outputs[k] = yq;
        let mut inputs = dq_node.inputs.clone();
        inputs[0] = Some(yq);
        new_dqs.push(Node {
            name: format!("{name}_DequantizeLinear"),
            op: dq_node.op.clone(),
            inputs,
            outputs: vec![y],
        });
    }
    let at = i + 1;
    graph.nodes.splice(at..at, new_dqs);
}

/// `DQ(x) → T` becomes `T(x) → DQ` for a value-selecting op `T` at node `i`.
fn sink(graph: &mut Graph, producers: &[Option<usize>], i: usize) -> bool {
    let node = &graph.nodes[i];
    let Some(x) = node.input(0) else {
        return false;
    };
    if !static_rest(graph, node) || (matches!(node.op, Op::MaxPool(_)) && node.outputs.len() != 1) {
        return false;
    }
    let Some((dq, xq, p)) = dq_activation(graph, producers, x) else {
        return false;
    };
    graph.nodes[i].inputs[0] = Some(xq);
    dequantize_outputs(graph, i, dq, p.dtype);
    true
}

/// A node computing `Q_to(DQ_from(x))` by table, reading `x` and writing a new value; returned
/// with that value.
fn requant_node(
    graph: &mut Graph,
    base: &str,
    x: ValueId,
    from: QParams,
    to: QParams,
) -> (Node, ValueId) {
    let shape = graph.values[x].shape.clone();
    let y = add_value(graph, &format!("{base}_requantized"), to.dtype, shape);
    let node = Node {
        name: format!("{base}_requantize"),
        op: Op::QLut {
            table: lut_table(from, to, |v| v),
            dtype: to.dtype,
        },
        inputs: vec![Some(x)],
        outputs: vec![y],
    };
    (node, y)
}

/// Concat of dequantized inputs at node `i`: on the codes when all inputs share parameters, or
/// requantized to the parameters of the Q that is its sole reader.
fn concat(
    graph: &mut Graph,
    producers: &[Option<usize>],
    consumers: &[Vec<usize>],
    i: usize,
) -> bool {
    let node = &graph.nodes[i];
    let Some(ins) = node
        .inputs
        .iter()
        .map(|v| v.and_then(|v| dq_activation(graph, producers, v)))
        .collect::<Option<Vec<_>>>()
    else {
        return false;
    };
    let Some(&(dq0, _, p0)) = ins.first() else {
        return false;
    };
    if ins.iter().all(|&(_, _, p)| p == p0) {
        graph.nodes[i].inputs = ins.iter().map(|&(_, xq, _)| Some(xq)).collect();
        dequantize_outputs(graph, i, dq0, p0.dtype);
        return true;
    }
    let [y] = node.outputs.as_slice() else {
        return false;
    };
    let Some(q) = sole_consumer(graph, consumers, *y) else {
        return false;
    };
    let Some(qp) = q_params(graph, &graph.nodes[q]) else {
        return false;
    };
    let out = graph.nodes[q].outputs[0];
    let base = node.name.clone();
    let mut luts = Vec::new();
    let mut inputs = Vec::with_capacity(ins.len());
    for (k, &(_, xq, p)) in ins.iter().enumerate() {
        if p == qp {
            inputs.push(Some(xq));
        } else {
            let (lut, v) = requant_node(graph, &format!("{base}_in{k}"), xq, p, qp);
            luts.push(lut);
            inputs.push(Some(v));
        }
    }
    let nd = &mut graph.nodes[i];
    nd.inputs = inputs;
    nd.outputs = vec![out];
    remove_nodes(graph, &[q]);
    graph.nodes.splice(i..i, luts);
    true
}

/// `Q(DQ(x))` at Q node `i` becomes `x` (same parameters) or a table lookup.
fn requantize(graph: &mut Graph, producers: &[Option<usize>], i: usize) -> bool {
    let node = &graph.nodes[i];
    let (Some(qp), Some(v)) = (q_params(graph, node), node.input(0)) else {
        return false;
    };
    let Some((_, xq, xp)) = dq_activation(graph, producers, v) else {
        return false;
    };
    if xp == qp {
        return fold_requant(graph, i);
    }
    let nd = &mut graph.nodes[i];
    nd.op = Op::QLut {
        table: lut_table(xp, qp, |x| x),
        dtype: qp.dtype,
    };
    nd.inputs = vec![Some(xq)];
    true
}

/// `DQ(a), DQ(b) → Add [→ activation] → Q` at Add node `i` (both inputs of the output's known
/// shape) becomes one [`Op::QAdd`].
fn quantized_add(
    graph: &mut Graph,
    producers: &[Option<usize>],
    consumers: &[Vec<usize>],
    i: usize,
) -> bool {
    let node = &graph.nodes[i];
    let (Some(a), Some(b), [y]) = (node.input(0), node.input(1), node.outputs.as_slice()) else {
        return false;
    };
    let (sa, sb) = (&graph.values[a].shape, &graph.values[b].shape);
    if sa.is_none() || sa != sb || sa != &graph.values[*y].shape {
        return false;
    }
    let (Some((_, aq, ap)), Some((_, bq, bp))) = (
        dq_activation(graph, producers, a),
        dq_activation(graph, producers, b),
    ) else {
        return false;
    };
    let Some((yp, out, activation, dead)) = requant_tail(graph, consumers, *y) else {
        return false;
    };
    let nd = &mut graph.nodes[i];
    nd.op = Op::QAdd(QAddAttrs {
        a: ap,
        b: bp,
        y: yp,
        activation,
    });
    nd.inputs = vec![Some(aq), Some(bq)];
    nd.outputs = vec![out];
    graph.values[out].dtype = yp.dtype;
    remove_nodes(graph, &dead);
    true
}

/// A ReLU table at QLut node `i` whose input comes (solely) from a `QConv`/`QGemm`/`QAdd`
/// without activation and with the same output parameters becomes that op's ReLU:
/// `max(requant(v), z) = requant(max(v, 0))` since rounding is monotone and 0 maps to `z`.
fn relu_into_producer(
    graph: &mut Graph,
    producers: &[Option<usize>],
    consumers: &[Vec<usize>],
    i: usize,
) -> bool {
    let node = &graph.nodes[i];
    let (Op::QLut { table, dtype }, Some(x), [out]) =
        (&node.op, node.input(0), node.outputs.as_slice())
    else {
        return false;
    };
    let (table, dtype, out) = (table.clone(), *dtype, *out);
    let Some(p) = producers[x] else {
        return false;
    };
    if sole_consumer(graph, consumers, x) != Some(i) {
        return false;
    }
    let (y, act) = match &mut graph.nodes[p].op {
        Op::QConv(q) => (q.y, &mut q.conv.activation),
        Op::QGemm(q) => (q.y, &mut q.activation),
        Op::QAdd(q) => (q.y, &mut q.activation),
        _ => return false,
    };
    if act.is_some() || y.dtype != dtype || table != lut_table(y, y, |v| v.max(0.0)) {
        return false;
    }
    *act = Some(crate::ir::Activation::Relu);
    graph.nodes[p].outputs = vec![out];
    remove_nodes(graph, &[i]);
    true
}
