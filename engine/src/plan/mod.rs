//! Activation memory planning by tensor lifetime.
//!
//! Every runtime tensor (and every node's scratch buffer) lives from the node that writes it to
//! the last node that reads it. Buffers whose lifetimes do not overlap may share bytes; the plan
//! packs them into one arena with greedy-by-size placement (largest first, lowest fitting offset),
//! and reports the result against the lower bound: the largest total of bytes live at one step.
//!
//! An elementwise node whose kernel can run in place writes its output over an input that dies
//! there (same byte size, not a graph input or output, read only once by that node): the two
//! values share one buffer. Plans are memoised in a [`PlanCache`] keyed by everything planning
//! reads (lifetimes, sizes, scratch, in-place permissions), so a graph prepared again for an
//! input shape seen before is not planned twice.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{Error, Result};
use crate::ir::{Graph, ValueId};

/// Alignment of every buffer in the arena (cache line; also enough for SIMD loads).
pub const ALIGNMENT: usize = 64;

/// Where one buffer lives in the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// Byte offset from the start of the arena (a multiple of [`ALIGNMENT`]).
    pub offset: usize,
    /// Bytes reserved: the value's size rounded up to [`ALIGNMENT`].
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
    /// Per node: the input whose buffer output 0 overwrites (in place), if any.
    pub in_place: Vec<Option<usize>>,
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
/// No buffer is shared in place.
pub fn plan(graph: &Graph, scratch: &[usize]) -> Result<MemoryPlan> {
    plan_with(graph, scratch, &[])
}

/// Byte size of value `v` (unaligned).
fn value_bytes(graph: &Graph, v: usize) -> Result<usize> {
    let value = &graph.values[v];
    graph
        .shape(v)?
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .and_then(|e| e.max(1).checked_mul(value.dtype.size()))
        .ok_or_else(|| Error::Shape(format!("tensor '{}' is too large", value.name)))
}

/// Like [`plan_with`], for a backend whose kernels read some values later than the graph
/// says: `late_reads` holds `(value, node)` pairs, and each value stays live through its node
/// (a fused kernel emitted at a later node than the one it absorbed).
pub fn plan_with_late_reads(
    graph: &Graph,
    scratch: &[usize],
    in_place_ok: &[Option<usize>],
    late_reads: &[(ValueId, usize)],
) -> Result<MemoryPlan> {
    plan_impl(graph, scratch, in_place_ok, late_reads)
}

/// Like [`plan`], with in-place sharing: `in_place_ok[i] = Some(k)` says node i's kernel may
/// write output 0 over input k (read element by element before it is written). The planner
/// uses it when that input dies at node i, is no graph input or output, appears once among
/// the node's inputs and has output 0's byte size. An empty slice allows nothing.
pub fn plan_with(
    graph: &Graph,
    scratch: &[usize],
    in_place_ok: &[Option<usize>],
) -> Result<MemoryPlan> {
    plan_impl(graph, scratch, in_place_ok, &[])
}

fn plan_impl(
    graph: &Graph,
    scratch: &[usize],
    in_place_ok: &[Option<usize>],
    late_reads: &[(ValueId, usize)],
) -> Result<MemoryPlan> {
    let n_nodes = graph.nodes.len();
    if scratch.len() != n_nodes {
        return Err(Error::InvalidModel(
            "scratch sizes do not match the node count".into(),
        ));
    }
    if !in_place_ok.is_empty() && in_place_ok.len() != n_nodes {
        return Err(Error::InvalidModel(
            "in-place permissions do not match the node count".into(),
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
    for &(v, i) in late_reads {
        if v < last.len() && i < n_nodes {
            last[v] = last[v].max(i);
        }
    }
    for &o in &graph.outputs {
        last[o] = end;
    }

    // In place: output 0 joins the buffer of an input that dies at its node (`root[v]` is the
    // value whose buffer v uses); the shared buffer lives until the output's last use.
    let mut root: Vec<usize> = (0..graph.values.len()).collect();
    let mut in_place = vec![None; n_nodes];
    for (i, node) in graph.nodes.iter().enumerate() {
        let Some(k) = in_place_ok.get(i).copied().flatten() else {
            continue;
        };
        let (Some(&Some(v)), [o]) = (node.inputs.get(k), node.outputs.as_slice()) else {
            continue;
        };
        let o = *o;
        let io = |x: usize| graph.inputs.contains(&x) || graph.outputs.contains(&x);
        if io(v)
            || graph.values[v].constant.is_some()
            || graph.values[o].constant.is_some()
            || first[v] == usize::MAX
            || last[v] != i
            || node.present_inputs().filter(|&x| x == v).count() != 1
            || value_bytes(graph, v)? != value_bytes(graph, o)?
        {
            continue;
        }
        let r = root[v];
        root[o] = r;
        last[r] = last[r].max(last[o]);
        in_place[i] = Some(k);
    }

    // Requests: values first (index = ValueId), then scratch (index = n_values + node).
    let mut requests: Vec<(usize, Request)> = Vec::new();
    for (v, value) in graph.values.iter().enumerate() {
        if value.constant.is_some() || first[v] == usize::MAX || root[v] != v {
            continue;
        }
        let size = align(value_bytes(graph, v)?);
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
    for v in 0..graph.values.len() {
        if root[v] != v {
            values[v] = values[root[v]];
        }
    }
    Ok(MemoryPlan {
        values,
        scratch: scratch_slots,
        arena_bytes,
        lower_bound,
        in_place,
    })
}

/// Memoised plans: one per distinct planning input (value lifetimes and sizes, scratch,
/// in-place permissions), shared as `Arc`s.
#[derive(Default)]
pub struct PlanCache {
    plans: Mutex<HashMap<Vec<u64>, Arc<MemoryPlan>>>,
    hits: AtomicUsize,
    misses: AtomicUsize,
}

impl PlanCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// The process-wide cache the CPU backend plans through.
    pub fn global() -> &'static PlanCache {
        static CACHE: OnceLock<PlanCache> = OnceLock::new();
        CACHE.get_or_init(PlanCache::new)
    }

    /// The plan for these inputs: from the cache, or planned once and cached.
    pub fn get_or_plan(
        &self,
        graph: &Graph,
        scratch: &[usize],
        in_place_ok: &[Option<usize>],
    ) -> Result<Arc<MemoryPlan>> {
        let key = Self::key(graph, scratch, in_place_ok);
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = plans.get(&key) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(Arc::clone(p));
        }
        let p = Arc::new(plan_with(graph, scratch, in_place_ok)?);
        plans.insert(key, Arc::clone(&p));
        self.misses.fetch_add(1, Ordering::Relaxed);
        Ok(p)
    }

    /// Lookups answered from the cache.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::Relaxed)
    }

    /// Lookups that planned.
    pub fn misses(&self) -> usize {
        self.misses.load(Ordering::Relaxed)
    }

    /// Distinct plans held (one per planning input: per graph and input shape).
    pub fn len(&self) -> usize {
        self.plans.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// True when no plan has been made yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Everything planning reads, as one exact key (no hash collisions can alias two plans).
    fn key(graph: &Graph, scratch: &[usize], in_place_ok: &[Option<usize>]) -> Vec<u64> {
        let mut k = Vec::with_capacity(graph.values.len() * 2 + graph.nodes.len() * 4);
        k.push(graph.values.len() as u64);
        for (v, value) in graph.values.iter().enumerate() {
            if value.constant.is_some() {
                k.push(u64::MAX);
            } else {
                k.push(value_bytes(graph, v).unwrap_or(0) as u64);
            }
        }
        for list in [&graph.inputs, &graph.outputs] {
            k.push(list.len() as u64);
            k.extend(list.iter().map(|&v| v as u64));
        }
        k.push(graph.nodes.len() as u64);
        for (i, node) in graph.nodes.iter().enumerate() {
            k.push(node.inputs.len() as u64);
            k.extend(node.inputs.iter().map(|x| x.map_or(u64::MAX, |v| v as u64)));
            k.push(node.outputs.len() as u64);
            k.extend(node.outputs.iter().map(|&v| v as u64));
            k.push(scratch.get(i).copied().unwrap_or(0) as u64);
            k.push(
                in_place_ok
                    .get(i)
                    .copied()
                    .flatten()
                    .map_or(u64::MAX, |x| x as u64),
            );
        }
        k
    }
}

impl std::fmt::Debug for PlanCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanCache")
            .field("hits", &self.hits())
            .field("misses", &self.misses())
            .finish()
    }
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

    /// x -> A -> a -> B -> b -> C(b, a) -> c: only B may write over its input (a is read
    /// again by C), A's input is a graph input, C's output is the graph output.
    #[test]
    fn in_place_only_where_the_input_dies() {
        use crate::ir::{Activation, BinaryOp, DataType, Node, Op, UnaryOp};
        let mut g = Graph::default();
        let val = |g: &mut Graph, name: &str| {
            let v = g.add_value(name, DataType::F32);
            g.values[v].shape = Some(vec![4, 100]);
            v
        };
        let (x, a, b, c, d) = (
            val(&mut g, "x"),
            val(&mut g, "a"),
            val(&mut g, "b"),
            val(&mut g, "c"),
            val(&mut g, "d"),
        );
        let relu = Op::Unary(UnaryOp::Act(Activation::Relu));
        let node = |op: Op, ins: Vec<usize>, out: usize| Node {
            name: format!("n{out}"),
            op,
            inputs: ins.into_iter().map(Some).collect(),
            outputs: vec![out],
        };
        g.nodes = vec![
            node(relu.clone(), vec![x], a),
            node(relu.clone(), vec![a], b),
            node(Op::Binary(BinaryOp::Add), vec![b, a], c),
            node(relu, vec![c], d),
        ];
        g.inputs = vec![x];
        g.outputs = vec![d];
        let ok = vec![Some(0); 4];
        let p = plan_with(&g, &[0; 4], &ok).unwrap();
        // n0: x is a graph input; n1: a is read again by n2; n2: b dies there; n3: c dies.
        assert_eq!(p.in_place, vec![None, None, Some(0), Some(0)]);
        assert_eq!(p.values[b], p.values[c]);
        assert_eq!(p.values[c], p.values[d]);
        assert_ne!(p.values[a], p.values[b]);
        // At most two 1600 B buffers live at once (x+a, a+b, a+b/c, c/d); without sharing,
        // n2 needs a, b and c at once.
        assert_eq!((p.arena_bytes, p.lower_bound), (2 * 1600, 2 * 1600));
        let plain = plan(&g, &[0; 4]).unwrap();
        assert!(plain.in_place.iter().all(|x| x.is_none()));
        assert_eq!((plain.arena_bytes, plain.lower_bound), (3 * 1600, 3 * 1600));
        // A size change forbids sharing.
        g.values[d].shape = Some(vec![4, 50]);
        let p = plan_with(&g, &[0; 4], &ok).unwrap();
        assert_eq!(p.in_place[3], None);
    }

    #[test]
    fn late_reads_keep_a_value_live_until_the_fused_kernel() {
        use crate::ir::{Activation, DataType, Node, Op, UnaryOp};
        // x -> n0 -> a -> n1 -> b -> n2 -> c: x dies at n0, so b or c may reuse its bytes,
        // unless a kernel at n2 still reads x.
        let mut g = Graph::default();
        let vals: Vec<usize> = ["x", "a", "b", "c"]
            .iter()
            .map(|name| {
                let v = g.add_value(*name, DataType::F32);
                g.values[v].shape = Some(vec![4, 100]);
                v
            })
            .collect();
        let relu = Op::Unary(UnaryOp::Act(Activation::Relu));
        g.nodes = (0..3)
            .map(|i| Node {
                name: format!("n{i}"),
                op: relu.clone(),
                inputs: vec![Some(vals[i])],
                outputs: vec![vals[i + 1]],
            })
            .collect();
        g.inputs = vec![vals[0]];
        g.outputs = vec![vals[3]];
        let slot = |p: &MemoryPlan, v: usize| p.values[v].expect("slot");
        let overlap = |p: &MemoryPlan, u: usize, v: usize| {
            let (a, b) = (slot(p, u), slot(p, v));
            a.offset < b.offset + b.size && b.offset < a.offset + a.size
        };
        let plain = plan(&g, &[0; 3]).unwrap();
        // Two slots hold the chain: x's bytes go to b or c once n0 has run.
        assert!(overlap(&plain, vals[0], vals[2]) || overlap(&plain, vals[0], vals[3]));
        let late = plan_with_late_reads(&g, &[0; 3], &[], &[(vals[0], 2)]).unwrap();
        assert!(!overlap(&late, vals[0], vals[3]));
        assert!(!overlap(&late, vals[0], vals[2]));
        assert!(late.arena_bytes > plain.arena_bytes);
    }

    #[test]
    fn cache_returns_the_same_plan_for_the_same_inputs() {
        use crate::ir::{DataType, Node, Op};
        let mut g = Graph::default();
        let x = g.add_value("x", DataType::F32);
        let y = g.add_value("y", DataType::F32);
        g.values[x].shape = Some(vec![1, 64]);
        g.values[y].shape = Some(vec![1, 64]);
        g.nodes = vec![Node {
            name: "id".into(),
            op: Op::Identity,
            inputs: vec![Some(x)],
            outputs: vec![y],
        }];
        g.inputs = vec![x];
        g.outputs = vec![y];
        let cache = PlanCache::new();
        let p1 = cache.get_or_plan(&g, &[0], &[]).unwrap();
        let p2 = cache.get_or_plan(&g.clone(), &[0], &[]).unwrap();
        assert!(Arc::ptr_eq(&p1, &p2));
        assert_eq!((cache.hits(), cache.misses()), (1, 1));
        // Another batch size is another plan, planned once.
        g.values[x].shape = Some(vec![2, 64]);
        g.values[y].shape = Some(vec![2, 64]);
        let p3 = cache.get_or_plan(&g, &[0], &[]).unwrap();
        assert!(!Arc::ptr_eq(&p1, &p3));
        assert_eq!(p3.arena_bytes, 2 * p1.arena_bytes);
        let p4 = cache.get_or_plan(&g, &[0], &[]).unwrap();
        assert!(Arc::ptr_eq(&p3, &p4));
        assert_eq!((cache.hits(), cache.misses()), (2, 2));
        assert_eq!(cache.len(), 2);
        assert!(PlanCache::new().is_empty());
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
