//! Pad folding: a constant-mode Pad that only pads spatial dims and feeds a single Conv,
//! MaxPool or AveragePool is merged into that op's `pads`, saving a full copy of the activation.
//! Zero pads fold into Conv and (count_include_pad) AveragePool; MaxPool takes -inf-like pads, or
//! zero pads when its input is provably non-negative (Relu/ReLU6 producers).

use super::util::{produces_non_negative, remove_nodes, scalar_f32, sole_consumer};
use crate::error::Result;
use crate::ir::{AutoPad, Graph, Layout, Op, PadMode};

/// Folds eligible Pad nodes into the following Conv / pooling op; returns the number folded.
pub fn pad_fold(graph: &mut Graph) -> Result<usize> {
    let mut count = 0;
    let mut i = 0;
    while i < graph.nodes.len() {
        if try_fold(graph, i)? {
            count += 1;
        } else {
            i += 1;
        }
    }
    Ok(count)
}

/// The full `[begins..., ends...]` pads of a Pad node, if constant and well-formed.
fn full_pads(graph: &Graph, i: usize) -> Option<Vec<i64>> {
    let node = &graph.nodes[i];
    let pads = graph.const_input(node, 1)?.to_i64_vec().ok()?;
    let data = node.input(0)?;
    let rank = match &graph.values[data].shape {
        Some(s) => s.len(),
        None if node.input(3).is_none() && pads.len() % 2 == 0 => pads.len() / 2,
        None => return None,
    };
    match node.input(3) {
        None => (pads.len() == 2 * rank).then_some(pads),
        Some(a) => {
            let axes = graph.constant(a)?.to_i64_vec().ok()?;
            if pads.len() != 2 * axes.len() {
                return None;
            }
            let mut full = vec![0i64; 2 * rank];
            for (k, &ax) in axes.iter().enumerate() {
                let ax = if ax < 0 { ax + rank as i64 } else { ax };
                if ax < 0 || ax as usize >= rank {
                    return None;
                }
                full[ax as usize] = pads[k];
                full[rank + ax as usize] = pads[axes.len() + k];
            }
            Some(full)
        }
    }
}

fn try_fold(graph: &mut Graph, i: usize) -> Result<bool> {
    let node = &graph.nodes[i];
    if node.op
        != (Op::Pad {
            mode: PadMode::Constant,
        })
        || node.outputs.len() != 1
    {
        return Ok(false);
    }
    let (Some(data), out) = (node.input(0), node.outputs[0]) else {
        return Ok(false);
    };
    let Some(pads) = full_pads(graph, i) else {
        return Ok(false);
    };
    let value = match node.input(2) {
        None => 0.0,
        Some(v) => match graph.constant(v).and_then(scalar_f32) {
            Some(x) => x,
            None => return Ok(false),
        },
    };
    let consumers = graph.consumers();
    let Some(c) = sole_consumer(graph, &consumers, out) else {
        return Ok(false);
    };
    let cnode = &graph.nodes[c];
    if cnode.input(0) != Some(out) || cnode.inputs.iter().skip(1).any(|&x| x == Some(out)) {
        return Ok(false);
    }
    let rank = pads.len() / 2;
    if rank < 3 || pads.iter().any(|&p| p < 0) {
        return Ok(false);
    }
    let layout = match &cnode.op {
        Op::Conv(a) => a.layout,
        Op::MaxPool(a) | Op::AveragePool(a) => a.layout,
        _ => return Ok(false),
    };
    let spatial: Vec<usize> = match layout {
        Layout::Nchw => (2..rank).collect(),
        Layout::Nhwc => (1..rank - 1).collect(),
    };
    let non_spatial_padded =
        (0..rank).any(|d| !spatial.contains(&d) && (pads[d] != 0 || pads[rank + d] != 0));
    if non_spatial_padded {
        return Ok(false);
    }
    let nsp = spatial.len();
    let extra: Vec<usize> = spatial
        .iter()
        .map(|&d| pads[d] as usize)
        .chain(spatial.iter().map(|&d| pads[rank + d] as usize))
        .collect();
    let producer_non_negative =
        graph.producers()[data].is_some_and(|p| produces_non_negative(graph, &graph.nodes[p]));
    let merge = |old: &[usize]| -> Option<Vec<usize>> {
        match old.len() {
            0 => Some(extra.clone()),
            n if n == 2 * nsp => Some(old.iter().zip(&extra).map(|(a, b)| a + b).collect()),
            _ => None,
        }
    };
    let new_op = match &cnode.op {
        Op::Conv(a) => {
            if value != 0.0 || a.auto_pad != AutoPad::NotSet {
                return Ok(false);
            }
            let Some(p) = merge(&a.pads) else {
                return Ok(false);
            };
            let mut a = a.clone();
            a.pads = p;
            Op::Conv(a)
        }
        Op::MaxPool(a) => {
            let neg_inf_like = value <= -3.4e38;
            if !(neg_inf_like || (value == 0.0 && producer_non_negative))
                || a.ceil_mode
                || a.auto_pad != AutoPad::NotSet
                || a.kernel_shape.len() != nsp
                || cnode.outputs.len() != 1
            {
                return Ok(false);
            }
            // Every window must still see at least one real element.
            let window_ok = (0..nsp).all(|k| {
                let d = a.dilations.get(k).copied().unwrap_or(1).max(1);
                let eff = (a.kernel_shape[k].saturating_sub(1)) * d + 1;
                let old_b = a.pads.get(k).copied().unwrap_or(0);
                let old_e = a.pads.get(nsp + k).copied().unwrap_or(0);
                old_b + extra[k] < eff && old_e + extra[nsp + k] < eff
            });
            let Some(p) = merge(&a.pads) else {
                return Ok(false);
            };
            if !window_ok {
                return Ok(false);
            }
            let mut a = a.clone();
            a.pads = p;
            Op::MaxPool(a)
        }
        Op::AveragePool(a) => {
            let old_zero = a.pads.iter().all(|&p| p == 0);
            if value != 0.0
                || a.ceil_mode
                || a.auto_pad != AutoPad::NotSet
                || !(a.count_include_pad || old_zero)
            {
                return Ok(false);
            }
            let Some(p) = merge(&a.pads) else {
                return Ok(false);
            };
            let mut a = a.clone();
            a.pads = p;
            a.count_include_pad = true;
            Op::AveragePool(a)
        }
        _ => return Ok(false),
    };
    let cnode = &mut graph.nodes[c];
    cnode.op = new_op;
    cnode.inputs[0] = Some(data);
    remove_nodes(graph, &[i]);
    Ok(true)
}
