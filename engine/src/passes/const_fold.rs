//! Constant folding, interleaved with shape inference: nodes are visited in order, each node's
//! output shapes are inferred, and a node whose inputs are all constant (or a Shape of a tensor
//! whose shape is now static) is evaluated once with the CPU kernels and replaced by its result.
//! This is what turns exporter noise (Shape/Slice/Concat/ConstantOfShape/Cast chains computing
//! "SAME" pads at run time) into constants that later passes fold into Conv padding.

use std::sync::Arc;

use crate::backend::cpu::eval_node;
use crate::error::Result;
use crate::ir::{shape, Graph, Op, Tensor};

/// Outputs larger than this many elements are not materialised as constants.
const MAX_FOLDED_ELEMENTS: usize = 1 << 24;

/// Folds every constant-computable node; returns how many nodes were removed.
pub fn fold_constants(graph: &mut Graph) -> Result<usize> {
    let nodes = std::mem::take(&mut graph.nodes);
    let mut kept = Vec::with_capacity(nodes.len());
    let mut folded = 0;
    for node in nodes {
        let types = shape::infer_node(graph, &node)?;
        for (&o, (dt, s)) in node.outputs.iter().zip(&types) {
            graph.values[o].dtype = *dt;
            graph.values[o].shape = Some(s.clone());
        }
        let small = types
            .iter()
            .all(|(_, s)| s.iter().product::<usize>() <= MAX_FOLDED_ELEMENTS);
        let results = match &node.op {
            Op::Shape { start, end } => {
                let Some(input) = node.input(0) else {
                    kept.push(node);
                    continue;
                };
                let dims = graph.shape(input)?;
                let rank = dims.len() as i64;
                let clamp = |i: i64| (if i < 0 { i + rank } else { i }).clamp(0, rank) as usize;
                let (s, e) = (clamp(*start), clamp(end.unwrap_or(rank)));
                let v: Vec<i64> = dims[s..e.max(s)].iter().map(|&d| d as i64).collect();
                Some(vec![Tensor::from_i64(vec![v.len()], v)?])
            }
            _ if small
                && node.inputs.iter().flatten().count() > 0
                && node
                    .present_inputs()
                    .all(|v| graph.values[v].constant.is_some()) =>
            {
                Some(eval_node(graph, &node)?)
            }
            _ => None,
        };
        match results {
            Some(ts) => {
                for (&o, t) in node.outputs.iter().zip(ts) {
                    graph.values[o].dtype = t.dtype();
                    graph.values[o].shape = Some(t.shape.clone());
                    graph.values[o].constant = Some(Arc::new(t));
                }
                folded += 1;
            }
            None => kept.push(node),
        }
    }
    graph.nodes = kept;
    Ok(folded)
}
