//! Transpose cleanup after the layout rewrite: folds Transposes of constants, drops identity
//! perms, composes back-to-back Transposes (inverse pairs vanish), and removes Transposes that do
//! not move memory (e.g. NHWC [N,1,1,C] → NCHW after GlobalAveragePool) when only
//! Reshape/Flatten read them, since those depend on memory order alone. `Transpose → Reshape →
//! Transpose` chains that merely regroup dims (NanoDet's NHWC head → [1, H·W, C]) become a Reshape.

use std::sync::Arc;

use super::util::{add_const, bypass, is_output, permute_tensor, remove_nodes};
use crate::error::Result;
use crate::ir::{Graph, Op, Tensor, ValueId};

/// Simplifies Transpose nodes; returns the number of rewrites.
pub fn transpose_cancel(graph: &mut Graph) -> Result<usize> {
    let mut count = 0;
    let mut i = 0;
    while i < graph.nodes.len() {
        if simplify(graph, i)? {
            count += 1;
            continue;
        }
        i += 1;
    }
    Ok(count)
}

fn simplify(graph: &mut Graph, i: usize) -> Result<bool> {
    let node = &graph.nodes[i];
    let Op::Transpose { perm } = &node.op else {
        return Ok(false);
    };
    let perm = perm.clone();
    let (Some(x), [y]) = (node.input(0), node.outputs.as_slice()) else {
        return Ok(false);
    };
    let y = *y;
    // Constant input: fold.
    if let Some(t) = graph.values[x].constant.clone() {
        if is_output(graph, y) {
            return Ok(false);
        }
        let pt = permute_tensor(&t, &perm)?;
        graph.values[y].shape = Some(pt.shape.clone());
        graph.values[y].constant = Some(Arc::new(pt));
        remove_nodes(graph, &[i]);
        return Ok(true);
    }
    // Identity permutation: drop.
    if perm.iter().enumerate().all(|(k, &p)| k == p) {
        if bypass(graph, y, x) {
            remove_nodes(graph, &[i]);
            return Ok(true);
        }
        return Ok(false);
    }
    // Transpose of a Transpose: compose (the inner one dies if nobody else reads it).
    if let Some(p) = graph.producers()[x] {
        if let Op::Transpose { perm: inner } = &graph.nodes[p].op {
            if let (Some(x0), true) = (graph.nodes[p].input(0), inner.len() == perm.len()) {
                let composed: Vec<usize> = perm
                    .iter()
                    .map(|&k| inner.get(k).copied().unwrap_or(k))
                    .collect();
                let node = &mut graph.nodes[i];
                node.inputs = vec![Some(x0)];
                node.op = Op::Transpose { perm: composed };
                return Ok(true);
            }
        }
    }
    // Transpose → Reshape → Transpose that only regroups dims in memory order: one Reshape.
    if reshape_sandwich(graph, i, x, y, &perm)? {
        return Ok(true);
    }
    // Memory-order no-op read only by Reshape/Flatten: let them read the input directly.
    let Some(xs) = graph.values[x].shape.clone() else {
        return Ok(false);
    };
    let moved: Vec<usize> = perm
        .iter()
        .copied()
        .filter(|&p| xs.get(p).is_some_and(|&d| d != 1))
        .collect();
    if !moved.windows(2).all(|w| w[0] < w[1]) || is_output(graph, y) {
        return Ok(false);
    }
    let consumers = graph.consumers();
    let readers = &consumers[y];
    let all_reshapes = !readers.is_empty()
        && readers.iter().all(|&c| {
            let n = &graph.nodes[c];
            matches!(n.op, Op::Reshape { .. } | Op::Flatten { .. })
                && n.input(0) == Some(y)
                && n.outputs.len() == 1
                && graph.values[n.outputs[0]].shape.is_some()
        });
    if !all_reshapes {
        return Ok(false);
    }
    for &c in readers {
        let Some(shape) = graph.values[graph.nodes[c].outputs[0]].shape.clone() else {
            return Ok(false);
        };
        let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        let name = format!("{}_shape", graph.nodes[c].name);
        let sv = add_const(graph, &name, Tensor::from_i64(vec![dims.len()], dims)?);
        let n = &mut graph.nodes[c];
        n.op = Op::Reshape { allowzero: false };
        n.inputs = vec![Some(x), Some(sv)];
    }
    remove_nodes(graph, &[i]);
    Ok(true)
}

/// Rewrites `T2(Reshape(T1(x0)))` at node `i` (T2) into `Reshape(x0)` when the Reshape only
/// merges runs of T1's output dims that are contiguous in `x0` and T2 puts them back in `x0`'s order.
fn reshape_sandwich(
    graph: &mut Graph,
    i: usize,
    x: ValueId,
    y: ValueId,
    perm: &[usize],
) -> Result<bool> {
    let producers = graph.producers();
    let Some(r) = producers[x] else {
        return Ok(false);
    };
    let rn = &graph.nodes[r];
    if !matches!(rn.op, Op::Reshape { .. } | Op::Flatten { .. }) {
        return Ok(false);
    }
    let Some(ry) = rn.input(0) else {
        return Ok(false);
    };
    let Some(t1) = producers[ry] else {
        return Ok(false);
    };
    let Op::Transpose { perm: p1 } = &graph.nodes[t1].op else {
        return Ok(false);
    };
    let Some(x0) = graph.nodes[t1].input(0) else {
        return Ok(false);
    };
    let shape = |v: ValueId| graph.values[v].shape.clone();
    let (Some(xs), Some(ys), Some(zs), Some(outs)) = (shape(x0), shape(ry), shape(x), shape(y))
    else {
        return Ok(false);
    };
    if p1.len() != xs.len() || ys.len() != xs.len() || zs.len() != perm.len() {
        return Ok(false);
    }
    // Split T1's output dims into consecutive groups, one per Reshape output dim.
    let mut firsts = Vec::with_capacity(zs.len());
    let mut pos = 0;
    for &z in &zs {
        let start = pos;
        let mut prod = 1usize;
        while pos < ys.len() && (prod < z || pos == start) {
            prod *= ys[pos];
            pos += 1;
        }
        let run = &p1[start..pos];
        if prod != z || run.is_empty() || !run.windows(2).all(|w| w[1] == w[0] + 1) {
            return Ok(false);
        }
        firsts.push(run[0]);
    }
    if pos != ys.len() {
        return Ok(false);
    }
    // Each group's rank in x0's dim order; T2 must restore exactly that order.
    let rank_of = |j: usize| firsts.iter().filter(|&&f| f < firsts[j]).count();
    if !perm
        .iter()
        .enumerate()
        .all(|(k, &p)| p < firsts.len() && rank_of(p) == k)
    {
        return Ok(false);
    }
    let dims: Vec<i64> = outs.iter().map(|&d| d as i64).collect();
    let name = format!("{}_shape", graph.nodes[i].name);
    let sv = add_const(graph, &name, Tensor::from_i64(vec![dims.len()], dims)?);
    let node = &mut graph.nodes[i];
    node.op = Op::Reshape { allowzero: false };
    node.inputs = vec![Some(x0), Some(sv)];
    Ok(true)
}
