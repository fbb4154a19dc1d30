//! QDQ folding: turns explicit QuantizeLinear/DequantizeLinear patterns (ONNX Runtime's QDQ
//! format, or any exporter's) into integer ops, before constant folding dequantizes the weights.
//!
//! - `DQ(x) → Conv(DQ(w int8, per-channel), [DQ(b int32) | f32 b]) [→ activation] → Q` becomes
//!   [`Op::QConv`] (int8 weights kept, bias as i32 at scale `x·w`, requantization fused);
//! - the same around Gemm (alpha = beta = 1, A not transposed) becomes [`Op::QGemm`];
//! - `DQ(x) → unary activation → Q` (per-tensor) becomes a 256-entry [`Op::QLut`];
//! - `Q(DQ(x))` with equal parameters becomes `x`.
//!
//! Everything else stays as DQ → f32 op → Q, which the reference Q/DQ kernels run. Weights must be
//! symmetric (zero point 0), as ONNX Runtime and most tools quantize them.

use super::util::{bypass, remove_nodes, sole_consumer};
use crate::error::Result;
use crate::ir::{
    Activation, DataType, Graph, Node, Op, QConvAttrs, QGemmAttrs, QParams, Tensor, TensorData,
    UnaryOp, ValueId,
};

/// Folds QDQ patterns into integer ops; returns the number of rewrites.
pub fn quant_fold(graph: &mut Graph) -> Result<usize> {
    if !graph
        .nodes
        .iter()
        .any(|n| matches!(n.op, Op::DequantizeLinear { .. }))
    {
        return Ok(0);
    }
    let mut count = 0;
    loop {
        let mut changed = false;
        for i in 0..graph.nodes.len() {
            let done = match graph.nodes[i].op {
                Op::Conv(_) | Op::Gemm { .. } => fold_linear(graph, i)?,
                Op::Unary(UnaryOp::Act(_)) | Op::Clip => fold_lut(graph, i)?,
                Op::QuantizeLinear { .. } => fold_requant(graph, i),
                _ => false,
            };
            if done {
                count += 1;
                changed = true;
                break;
            }
        }
        if !changed {
            break;
        }
    }
    if count > 0 {
        super::cleanup(graph)?;
    }
    Ok(count)
}

/// A one-element constant as f32.
fn scalar(graph: &Graph, v: Option<ValueId>) -> Option<f32> {
    let t = graph.constant(v?)?;
    (t.len() == 1).then(|| t.to_f32_vec()[0])
}

/// Per-tensor parameters of a QuantizeLinear node (constant scale and zero point).
pub(super) fn q_params(graph: &Graph, node: &Node) -> Option<QParams> {
    let Op::QuantizeLinear { dtype, .. } = node.op else {
        return None;
    };
    let scale = scalar(graph, node.input(1))?;
    let (zero_point, dtype) = match node.input(2) {
        Some(z) => {
            let t = graph.constant(z)?;
            (t.len() == 1).then_some(())?;
            (t.to_i64_vec().ok()?[0] as i32, t.dtype())
        }
        None => (0, dtype.unwrap_or(DataType::U8)),
    };
    valid(QParams {
        scale,
        zero_point,
        dtype,
    })
}

fn valid(p: QParams) -> Option<QParams> {
    let (lo, hi) = p.range();
    (matches!(p.dtype, DataType::U8 | DataType::I8)
        && p.scale.is_finite()
        && p.scale > 0.0
        && (lo..=hi).contains(&p.zero_point))
    .then_some(p)
}

/// A per-tensor DequantizeLinear producing `v`: (node index, quantized input, parameters).
pub(super) fn dq_activation(
    graph: &Graph,
    producers: &[Option<usize>],
    v: ValueId,
) -> Option<(usize, ValueId, QParams)> {
    let p = producers[v]?;
    let node = &graph.nodes[p];
    let Op::DequantizeLinear { .. } = node.op else {
        return None;
    };
    let x = node.input(0)?;
    let scale = scalar(graph, node.input(1))?;
    let params = match node.input(2) {
        Some(z) => {
            let t = graph.constant(z)?;
            (t.len() == 1).then_some(())?;
            QParams {
                scale,
                zero_point: t.to_i64_vec().ok()?[0] as i32,
                dtype: t.dtype(),
            }
        }
        None => {
            // The element type comes from the producing Q node (or a typed graph input).
            let dtype = match producers[x].map(|q| &graph.nodes[q]) {
                Some(qn) => q_params(graph, qn)?.dtype,
                None => graph.values[x].dtype,
            };
            QParams {
                scale,
                zero_point: 0,
                dtype,
            }
        }
    };
    Some((p, x, valid(params)?))
}

/// Constant int8 weights behind a DequantizeLinear producing `v`, with one scale per index of
/// dimension `axis` (`n` of them); the zero points must all be 0.
fn dq_weights(
    graph: &Graph,
    producers: &[Option<usize>],
    v: ValueId,
    axis: usize,
    n: usize,
) -> Option<(Tensor, Vec<f32>)> {
    let node = &graph.nodes[producers[v]?];
    let Op::DequantizeLinear { axis: dq_axis } = node.op else {
        return None;
    };
    let w = graph.constant(node.input(0)?)?;
    if w.dtype() != DataType::I8 || w.shape.len() <= axis || w.shape[axis] != n {
        return None;
    }
    let s = graph.constant(node.input(1)?)?.to_f32_vec();
    if let Some(z) = node.input(2) {
        if graph
            .constant(z)?
            .to_i64_vec()
            .ok()?
            .iter()
            .any(|&z| z != 0)
        {
            return None;
        }
    }
    let r = w.shape.len() as i64;
    let dq_axis = if dq_axis < 0 { dq_axis + r } else { dq_axis };
    let scales = match s.len() {
        1 => vec![s[0]; n],
        k if k == n && dq_axis == axis as i64 => s,
        _ => return None,
    };
    scales
        .iter()
        .all(|s| s.is_finite() && *s > 0.0)
        .then(|| (w.clone(), scales))
}

/// The bias behind `v` in i32 at scale `x_scale * w_scales[k]`: a DequantizeLinear of an i32
/// constant at exactly that scale is taken as is; otherwise (other scales, f32 constants) the
/// real values are requantized. None when absent in either form or out of i32 range.
fn int_bias(
    graph: &Graph,
    producers: &[Option<usize>],
    v: ValueId,
    x_scale: f32,
    w_scales: &[f32],
) -> Option<Vec<i32>> {
    let n = w_scales.len();
    let real: Vec<f64> = if let Some(t) = graph.constant(v) {
        let b = t.as_f32().ok()?;
        (b.len() == n).then_some(())?;
        b.iter().map(|&x| x as f64).collect()
    } else {
        let node = &graph.nodes[producers[v]?];
        let Op::DequantizeLinear { .. } = node.op else {
            return None;
        };
        let b = graph.constant(node.input(0)?)?;
        let s = graph.constant(node.input(1)?)?.to_f32_vec();
        let z = match node.input(2) {
            Some(z) => graph.constant(z)?.to_i64_vec().ok()?,
            None => vec![0],
        };
        let bv = b.to_i64_vec().ok()?;
        if bv.len() != n || !(s.len() == 1 || s.len() == n) || !(z.len() == 1 || z.len() == n) {
            return None;
        }
        let exact = b.dtype() == DataType::I32
            && z.iter().all(|&z| z == 0)
            && (0..n).all(|k| {
                let want = x_scale * w_scales[k];
                (s[k % s.len()] - want).abs() <= 1e-6 * want
            });
        if exact {
            return Some(bv.iter().map(|&x| x as i32).collect());
        }
        (0..n)
            .map(|k| (bv[k] - z[k % z.len()]) as f64 * s[k % s.len()] as f64)
            .collect()
    };
    real.iter()
        .zip(w_scales)
        .map(|(&r, &ws)| {
            let q = (r / (x_scale as f64 * ws as f64)).round();
            (q.is_finite() && q.abs() <= i32::MAX as f64).then_some(q as i32)
        })
        .collect()
}

/// The activation applied by node `i` (Unary activation, or Clip with constant bounds).
fn activation_of(graph: &Graph, node: &Node) -> Option<Activation> {
    match &node.op {
        Op::Unary(UnaryOp::Act(a)) => Some(*a),
        Op::Clip => {
            let bound = |k: usize, d: f32| match node.input(k) {
                None => Some(d),
                Some(_) => scalar(graph, node.input(k)),
            };
            Some(Activation::Clip {
                min: bound(1, f32::NEG_INFINITY)?,
                max: bound(2, f32::INFINITY)?,
            })
        }
        _ => None,
    }
}

/// From the output `y` of node `i`: `[activation →] Q`, each the sole reader. Returns the Q
/// parameters, its output, the activation and the nodes to remove.
pub(super) fn requant_tail(
    graph: &Graph,
    consumers: &[Vec<usize>],
    y: ValueId,
) -> Option<(QParams, ValueId, Option<Activation>, Vec<usize>)> {
    let c = sole_consumer(graph, consumers, y)?;
    let node = &graph.nodes[c];
    if let Some(p) = q_params(graph, node) {
        return Some((p, *node.outputs.first()?, None, vec![c]));
    }
    let act = activation_of(graph, node)?;
    let y2 = *node.outputs.first()?;
    let c2 = sole_consumer(graph, consumers, y2)?;
    let qn = &graph.nodes[c2];
    let p = q_params(graph, qn)?;
    Some((p, *qn.outputs.first()?, Some(act), vec![c, c2]))
}

/// Folds a Conv or Gemm at node `i` with DQ inputs and a Q after it.
fn fold_linear(graph: &mut Graph, i: usize) -> Result<bool> {
    let producers = graph.producers();
    let consumers = graph.consumers();
    let node = &graph.nodes[i];
    let (Some(x), Some(wv), [y]) = (node.input(0), node.input(1), node.outputs.as_slice()) else {
        return Ok(false);
    };
    let Some((_, xq, xp)) = dq_activation(graph, &producers, x) else {
        return Ok(false);
    };
    let Some((qp, out, act, dead)) = requant_tail(graph, &consumers, *y) else {
        return Ok(false);
    };
    let (n, w_axis, trans_b) = match &node.op {
        Op::Conv(a) if a.activation.is_none() => {
            let Some(w) = producers[wv]
                .and_then(|p| graph.nodes[p].input(0))
                .and_then(|v| graph.constant(v))
            else {
                return Ok(false);
            };
            if w.shape.len() != 4 {
                return Ok(false);
            }
            (w.shape[0], 0, false)
        }
        Op::Gemm {
            alpha,
            beta,
            trans_a: false,
            trans_b,
            activation: None,
        } if *alpha == 1.0 && *beta == 1.0 => {
            let Some(w) = producers[wv]
                .and_then(|p| graph.nodes[p].input(0))
                .and_then(|v| graph.constant(v))
            else {
                return Ok(false);
            };
            if w.shape.len() != 2 {
                return Ok(false);
            }
            if *trans_b {
                (w.shape[0], 0, true)
            } else {
                (w.shape[1], 1, false)
            }
        }
        _ => return Ok(false),
    };
    let Some((w, w_scales)) = dq_weights(graph, &producers, wv, w_axis, n) else {
        return Ok(false);
    };
    let bias = match node.input(2) {
        None => vec![0i32; n],
        Some(b) => match int_bias(graph, &producers, b, xp.scale, &w_scales) {
            Some(q) => q,
            None => return Ok(false),
        },
    };
    let name = node.name.clone();
    let op = match &node.op {
        Op::Conv(a) => {
            let mut conv = a.clone();
            if conv.kernel_shape.is_empty() {
                conv.kernel_shape = w.shape[2..].to_vec();
            }
            conv.activation = act;
            Op::QConv(QConvAttrs {
                conv,
                x: xp,
                y: qp,
                w_scales,
                residual: None,
            })
        }
        _ => Op::QGemm(QGemmAttrs {
            trans_b,
            a: xp,
            y: qp,
            w_scales,
            activation: act,
        }),
    };
    let wc = super::util::add_const(graph, &format!("{name}_w_int8"), w);
    let bc = super::util::add_const(
        graph,
        &format!("{name}_b_int32"),
        Tensor::new(vec![n], TensorData::I32(bias))?,
    );
    let nd = &mut graph.nodes[i];
    nd.op = op;
    nd.inputs = vec![Some(xq), Some(wc), Some(bc)];
    nd.outputs = vec![out];
    graph.values[out].dtype = qp.dtype;
    remove_nodes(graph, &dead);
    Ok(true)
}

/// Folds `DQ → activation → Q` at activation node `i` into a lookup table.
fn fold_lut(graph: &mut Graph, i: usize) -> Result<bool> {
    let producers = graph.producers();
    let consumers = graph.consumers();
    let node = &graph.nodes[i];
    let (Some(x), [y]) = (node.input(0), node.outputs.as_slice()) else {
        return Ok(false);
    };
    let Some(act) = activation_of(graph, node) else {
        return Ok(false);
    };
    let Some((_, xq, xp)) = dq_activation(graph, &producers, x) else {
        return Ok(false);
    };
    let Some(c) = sole_consumer(graph, &consumers, *y) else {
        return Ok(false);
    };
    let Some(qp) = q_params(graph, &graph.nodes[c]) else {
        return Ok(false);
    };
    let out = graph.nodes[c].outputs[0];
    let nd = &mut graph.nodes[i];
    nd.op = Op::QLut {
        table: lut_table(xp, qp, |x| act.apply(x)),
        dtype: qp.dtype,
    };
    nd.inputs = vec![Some(xq)];
    nd.outputs = vec![out];
    graph.values[out].dtype = qp.dtype;
    remove_nodes(graph, &[c]);
    Ok(true)
}

/// The 256-entry table of `Q_qp(f(DQ_xp(b)))` over every input byte `b` (as u8 bits), computed
/// with the same f32 arithmetic as the QuantizeLinear/DequantizeLinear kernels.
pub(super) fn lut_table(xp: QParams, qp: QParams, f: impl Fn(f32) -> f32) -> Vec<u8> {
    let (lo, hi) = qp.range();
    (0..=255u8)
        .map(|b| {
            let xi = if xp.dtype == DataType::I8 {
                b as i8 as i32
            } else {
                b as i32
            };
            let real = (xi - xp.zero_point) as f32 * xp.scale;
            let q = ((f(real) / qp.scale).round_ties_even() + qp.zero_point as f32)
                .clamp(lo as f32, hi as f32) as i32;
            if qp.dtype == DataType::I8 {
                q as i8 as u8
            } else {
                q as u8
            }
        })
        .collect()
}

/// `Q(DQ(x))` with the same parameters is `x`.
pub(super) fn fold_requant(graph: &mut Graph, i: usize) -> bool {
    let producers = graph.producers();
    let node = &graph.nodes[i];
    let (Some(qp), Some(v), [out]) = (
        q_params(graph, node),
        node.input(0),
        node.outputs.as_slice(),
    ) else {
        return false;
    };
    let Some((_, xq, xp)) = dq_activation(graph, &producers, v) else {
        return false;
    };
    if xp != qp {
        return false;
    }
    let out = *out;
    if bypass(graph, out, xq) {
        remove_nodes(graph, &[i]);
        return true;
    }
    false
}
