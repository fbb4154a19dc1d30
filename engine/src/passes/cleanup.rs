//! Cleanup: drops Identity nodes (ONNX Dropout is imported as Identity) by rewiring their readers,
//! and removes dead nodes whose outputs nobody reads and that produce no graph output. Values are
//! never renumbered; unused constants simply stay in `graph.values`.

use super::util::{bypass, remove_nodes};
use crate::error::Result;
use crate::ir::{Graph, Op};

/// Removes Identity nodes and dead nodes; returns the number of nodes removed.
pub fn cleanup(graph: &mut Graph) -> Result<usize> {
    let mut removed = 0;
    let mut i = 0;
    while i < graph.nodes.len() {
        let node = &graph.nodes[i];
        if let (Op::Identity, Some(src), [out]) = (&node.op, node.input(0), node.outputs.as_slice())
        {
            let out = *out;
            if bypass(graph, out, src) {
                graph.nodes.remove(i);
                removed += 1;
                continue;
            }
        }
        i += 1;
    }
    removed += remove_dead(graph);
    Ok(removed)
}

/// Removes nodes none of whose outputs is read by a live node or is a graph output.
fn remove_dead(graph: &mut Graph) -> usize {
    let mut used = vec![false; graph.values.len()];
    for &o in &graph.outputs {
        used[o] = true;
    }
    let mut dead = Vec::new();
    for (i, n) in graph.nodes.iter().enumerate().rev() {
        if n.outputs.iter().any(|&o| used[o]) {
            for v in n.present_inputs() {
                used[v] = true;
            }
        } else {
            dead.push(i);
        }
    }
    remove_nodes(graph, &dead);
    dead.len()
}
