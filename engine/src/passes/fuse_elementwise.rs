//! Elementwise fusion: a maximal chain of f32 pointwise ops (unary, arithmetic binary, constant
//! Clip) whose intermediates each have a single reader becomes one `Op::Elementwise` node, so the
//! chain reads and writes memory once. The running value keeps the chain's output shape throughout;
//! other operands may broadcast into it but never enlarge it.

use super::util::{broadcast, remove_nodes, scalar_f32, sole_consumer};
use crate::error::Result;
use crate::ir::{Activation, BinaryOp, ChainStep, DataType, Graph, Node, Op, UnaryOp, ValueId};

/// Fuses chains of two or more elementwise nodes; returns the number of fused nodes created.
pub fn fuse_elementwise(graph: &mut Graph) -> Result<usize> {
    let consumers = graph.consumers();
    let mut used = vec![false; graph.nodes.len()];
    let mut chains: Vec<Vec<usize>> = Vec::new();
    for i in 0..graph.nodes.len() {
        if used[i] || head_member(graph, i).is_none() {
            continue;
        }
        let mut chain = vec![i];
        let mut last = i;
        while let Some(next) = next_member(graph, &consumers, last) {
            if used[next] {
                break;
            }
            chain.push(next);
            last = next;
        }
        if chain.len() >= 2 {
            for &k in &chain {
                used[k] = true;
            }
            chains.push(chain);
        }
    }
    let mut dead = Vec::new();
    let mut n = 0;
    for chain in &chains {
        let Some(fused) = build(graph, chain) else {
            continue;
        };
        let Some((&last, rest)) = chain.split_last() else {
            continue;
        };
        graph.nodes[last] = fused;
        dead.extend_from_slice(rest);
        n += 1;
    }
    remove_nodes(graph, &dead);
    Ok(n)
}

/// One node's contribution: local inputs (index 0 is the running value) and steps over them.
struct Member {
    inputs: Vec<ValueId>,
    steps: Vec<ChainStep>,
}

fn f32_known(graph: &Graph, v: ValueId) -> Option<&[usize]> {
    let val = &graph.values[v];
    (val.dtype == DataType::F32).then_some(())?;
    val.shape.as_deref()
}

fn fusable_binary(op: BinaryOp) -> bool {
    matches!(
        op,
        BinaryOp::Add
            | BinaryOp::Sub
            | BinaryOp::Mul
            | BinaryOp::Div
            | BinaryOp::Pow
            | BinaryOp::Max
            | BinaryOp::Min
    )
}

/// Describes node `i` as a chain member whose running value is `run`, checking shapes: `run` and
/// the output share one shape and every other operand broadcasts into it.
fn member(graph: &Graph, i: usize, run: ValueId, head: bool) -> Option<Member> {
    let node = &graph.nodes[i];
    let [out] = node.outputs.as_slice() else {
        return None;
    };
    let out_shape = f32_known(graph, *out)?;
    if f32_known(graph, run)? != out_shape {
        return None;
    }
    let m = match &node.op {
        Op::Unary(u)
            if *u != UnaryOp::Not && node.inputs.len() == 1 && node.input(0) == Some(run) =>
        {
            Member {
                inputs: vec![run],
                steps: vec![ChainStep::Unary(*u)],
            }
        }
        Op::Clip if node.input(0) == Some(run) => {
            let bound = |k: usize, d: f32| match node.input(k) {
                None => Some(d),
                Some(v) => graph.constant(v).and_then(scalar_f32),
            };
            let act = Activation::Clip {
                min: bound(1, f32::NEG_INFINITY)?,
                max: bound(2, f32::INFINITY)?,
            };
            Member {
                inputs: vec![run],
                steps: vec![ChainStep::Unary(UnaryOp::Act(act))],
            }
        }
        Op::Binary(op) if fusable_binary(*op) && node.inputs.len() == 2 => {
            let (a, b) = (node.input(0)?, node.input(1)?);
            let (other, acc_on_right) = if a == run { (b, false) } else { (a, true) };
            if (acc_on_right && b != run) || (!head && other == run) {
                return None;
            }
            let os = f32_known(graph, other)?;
            if broadcast(os, out_shape)? != out_shape {
                return None;
            }
            Member {
                inputs: vec![run, other],
                steps: vec![ChainStep::Binary {
                    op: *op,
                    operand: 1,
                    acc_on_right,
                }],
            }
        }
        Op::Elementwise(steps) if node.input(0) == Some(run) => {
            let inputs: Vec<ValueId> = node.inputs.iter().copied().collect::<Option<Vec<_>>>()?;
            let refs_start = steps
                .iter()
                .any(|s| matches!(s, ChainStep::Binary { operand: 0, .. }));
            if !head && (refs_start || inputs[1..].contains(&run)) {
                return None;
            }
            for &v in &inputs[1..] {
                if broadcast(f32_known(graph, v)?, out_shape)? != out_shape {
                    return None;
                }
            }
            Member {
                inputs,
                steps: steps.clone(),
            }
        }
        _ => return None,
    };
    Some(m)
}

/// Node `i` as the first member of a chain (its running value chosen to have the output shape).
fn head_member(graph: &Graph, i: usize) -> Option<Member> {
    let node = &graph.nodes[i];
    let mut candidates: Vec<ValueId> = node.present_inputs().take(2).collect();
    if !matches!(node.op, Op::Binary(_)) {
        candidates.truncate(1);
    }
    // Prefer a non-constant running value.
    candidates.sort_by_key(|&v| graph.values[v].constant.is_some());
    candidates
        .into_iter()
        .find_map(|run| member(graph, i, run, true))
}

/// The node continuing the chain that currently ends at node `last`, if any.
fn next_member(graph: &Graph, consumers: &[Vec<usize>], last: usize) -> Option<usize> {
    let [out] = graph.nodes[last].outputs.as_slice() else {
        return None;
    };
    let c = sole_consumer(graph, consumers, *out)?;
    let reads = graph.nodes[c]
        .present_inputs()
        .filter(|&v| v == *out)
        .count();
    (reads == 1 && member(graph, c, *out, false).is_some()).then_some(c)
}

/// Builds the fused node for a chain of member node indices.
fn build(graph: &Graph, chain: &[usize]) -> Option<Node> {
    let head = head_member(graph, chain[0])?;
    let mut inputs = vec![head.inputs[0]];
    let mut steps = Vec::new();
    let mut members = vec![head];
    for w in chain.windows(2) {
        let run = *graph.nodes[w[0]].outputs.first()?;
        members.push(member(graph, w[1], run, false)?);
    }
    for m in members {
        // Map local input indices to fused input indices (deduplicating operands).
        let map: Vec<usize> = m
            .inputs
            .iter()
            .enumerate()
            .map(|(k, &v)| {
                if k == 0 {
                    return 0;
                }
                match inputs.iter().position(|&x| x == v) {
                    Some(p) => p,
                    None => {
                        inputs.push(v);
                        inputs.len() - 1
                    }
                }
            })
            .collect();
        for s in m.steps {
            steps.push(match s {
                ChainStep::Binary {
                    op,
                    operand,
                    acc_on_right,
                } => ChainStep::Binary {
                    op,
                    operand: *map.get(operand)?,
                    acc_on_right,
                },
                u => u,
            });
        }
    }
    let last = &graph.nodes[*chain.last()?];
    Some(Node {
        name: format!("{}_fused", graph.nodes[chain[0]].name),
        op: Op::Elementwise(steps),
        inputs: inputs.into_iter().map(Some).collect(),
        outputs: last.outputs.clone(),
    })
}
