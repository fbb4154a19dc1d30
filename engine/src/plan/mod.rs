//! Activation memory planning by tensor lifetime.
//!
//! Every runtime tensor (and every node's scratch buffer) lives from the node that writes it to
//! the last node that reads it. Buffers whose lifetimes do not overlap may share bytes; the plan
//! packs them into one arena with greedy-by-size placement (largest first, lowest fitting offset),
//! and reports the result against the lower bound: the largest total of bytes live at one step.

use crate::error::{Error, Result};
use crate::ir::Graph;

/// Alignment of every buffer in the arena (cache line; also enough for SIMD loads).
pub const ALIGNMENT: usize = 64;

/// Where one buffer lives in the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    pub offset: usize,
    pub size: usize,
}

/// An arena layout for one graph and input shape.
#[derive(Clone, Debug)]
pub struct MemoryPlan {
    /// Per ValueId: the slot of a runtime value (None for constants and unused values).
    pub values: Vec<Option<Slot>>,
    /// Per node: its scratch slot (None when the kernel needs none).
    pub scratch: Vec<Option<Slot>>,
    /// Total arena size in bytes.
    pub arena_bytes: usize,
    /// Largest sum of (aligned) bytes live at one step: no plan can be smaller.
    pub lower_bound: usize,
}

impl MemoryPlan {
    /// arena_bytes / lower_bound (1.0 is optimal).
    pub fn ratio(&self) -> f64 {
        if self.lower_bound == 0 {
            1.0
        } else {
            self.arena_bytes as f64 / self.lower_bound as f64
        }
    }
}

/// One buffer to place: live over node steps `first..=last`.
#[derive(Clone, Copy, Debug)]
struct Request {
    first: usize,
    last: usize,
    size: usize,
}

fn align(n: usize) -> usize {
    n.div_ceil(ALIGNMENT) * ALIGNMENT
}

/// Plans the arena for `graph` (shapes must be inferred); `scratch[i]` is node i's scratch need.
pub fn plan(graph: &Graph, scratch: &[usize]) -> Result<MemoryPlan> {
    let n_nodes = graph.nodes.len();
    if scratch.len() != n_nodes {
        return Err(Error::InvalidModel(
            "scratch sizes do not match the node count".into(),
        ));
    }
    let end = n_nodes; // graph outputs stay live past the last node
    let mut first = vec![usize::MAX; graph.values.len()];
    let mut last = vec![0usize; graph.values.len()];
    for &v in &graph.inputs {
        first[v] = 0;
    }
    for (i, node) in graph.nodes.iter().enumerate() {
        for &o in &node.outputs {
            first[o] = first[o].min(i);
            last[o] = last[o].max(i);
        }
        for v in node.present_inputs() {
            last[v] = last[v].max(i);
        }
    }
    for &o in &graph.outputs {
        last[o] = end;
    }

    // Requests: values first (index = ValueId), then scratch (index = n_values + node).
    let mut requests: Vec<(usize, Request)> = Vec::new();
    for (v, value) in graph.values.iter().enumerate() {
        if value.constant.is_some() || first[v] == usize::MAX {
            continue;
        }
        let shape = graph.shape(v)?;
        let elems = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| Error::Shape(format!("tensor '{}' is too large", value.name)))?;
        let size = align(elems.max(1) * value.dtype.size());
        requests.push((
            v,
            Request {
                first: first[v],
                last: last[v].max(first[v]),
                size,
            },
        ));
    }
    for (i, &s) in scratch.iter().enumerate() {
        if s > 0 {
            requests.push((
                graph.values.len() + i,
                Request {
                    first: i,
                    last: i,
                    size: align(s),
                },
            ));
        }
    }

    // Lower bound: the most bytes live at any one step.
    let mut live = vec![0usize; end + 1];
    for (_, r) in &requests {
        for l in &mut live[r.first..=r.last] {
            *l += r.size;
        }
    }
    let lower_bound = live.iter().copied().max().unwrap_or(0);

    let (offsets, arena_bytes) =
        place_greedy_by_size(&requests.iter().map(|(_, r)| *r).collect::<Vec<_>>());

    let mut values = vec![None; graph.values.len()];
    let mut scratch_slots = vec![None; n_nodes];
    for ((id, r), off) in requests.iter().zip(offsets) {
        let slot = Slot {
            offset: off,
            size: r.size,
        };
        if *id < graph.values.len() {
            values[*id] = Some(slot);
        } else {
            scratch_slots[*id - graph.values.len()] = Some(slot);
        }
    }
    Ok(MemoryPlan {
        values,
        scratch: scratch_slots,
        arena_bytes,
        lower_bound,
    })
}

/// Greedy by size: place the largest buffers first, each at the lowest offset where it does not
/// collide with an already placed buffer whose lifetime overlaps. Returns offsets and arena size.
fn place_greedy_by_size(reqs: &[Request]) -> (Vec<usize>, usize) {
    let mut order: Vec<usize> = (0..reqs.len()).collect();
    order.sort_by(|&a, &b| {
        reqs[b]
            .size
            .cmp(&reqs[a].size)
            .then((reqs[b].last - reqs[b].first).cmp(&(reqs[a].last - reqs[a].first)))
    });
    let mut offsets = vec![0usize; reqs.len()];
    let mut placed: Vec<usize> = Vec::with_capacity(reqs.len());
    let mut arena = 0usize;
    let mut conflicts: Vec<(usize, usize)> = Vec::new();
    for &i in &order {
        let r = reqs[i];
        conflicts.clear();
        for &j in &placed {
            let q = reqs[j];
            if q.first <= r.last && r.first <= q.last {
                conflicts.push((offsets[j], offsets[j] + q.size));
            }
        }
        conflicts.sort_unstable();
        // Best fit: the smallest gap that holds the buffer, else the end of the conflicts.
        let mut best: Option<(usize, usize)> = None; // (gap size, offset)
        let mut cursor = 0usize;
        for &(s, e) in &conflicts {
            if s > cursor {
                let gap = s - cursor;
                if gap >= r.size && best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, cursor));
                }
            }
            cursor = cursor.max(e);
        }
        let off = best.map(|(_, o)| o).unwrap_or(cursor);
        offsets[i] = off;
        arena = arena.max(off + r.size);
        placed.push(i);
    }
    (offsets, arena)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overlaps(a: (usize, usize), b: (usize, usize)) -> bool {
        a.0 < b.1 && b.0 < a.1
    }

    #[test]
    fn disjoint_lifetimes_share_memory_and_overlapping_do_not() {
        let reqs = [
            Request {
                first: 0,
                last: 1,
                size: 1024,
            },
            Request {
                first: 1,
                last: 2,
                size: 1024,
            },
            Request {
                first: 2,
                last: 3,
                size: 1024,
            },
        ];
        let (off, arena) = place_greedy_by_size(&reqs);
        // 0 and 2 do not overlap in time: they can share; 1 overlaps both.
        assert_eq!(arena, 2048);
        assert_ne!(off[0], off[1]);
        assert_ne!(off[1], off[2]);
    }

    #[test]
    fn random_requests_never_collide() {
        let mut seed = 12345u64;
        let mut rnd = |m: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % m as u64) as usize
        };
        for _ in 0..50 {
            let reqs: Vec<Request> = (0..40)
                .map(|_| {
                    let first = rnd(30);
                    Request {
                        first,
                        last: first + rnd(8),
                        size: align(1 + rnd(100_000)),
                    }
                })
                .collect();
            let (off, arena) = place_greedy_by_size(&reqs);
            for i in 0..reqs.len() {
                assert!(off[i] % ALIGNMENT == 0);
                assert!(off[i] + reqs[i].size <= arena);
                for j in 0..i {
                    let (a, b) = (reqs[i], reqs[j]);
                    if a.first <= b.last && b.first <= a.last {
                        assert!(
                            !overlaps((off[i], off[i] + a.size), (off[j], off[j] + b.size)),
                            "buffers {i} and {j} collide"
                        );
                    }
                }
            }
        }
    }
}
