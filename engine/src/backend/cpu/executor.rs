//! Runs a compiled graph: copies inputs into the arena, runs each node's kernel on views into
//! the arena, copies outputs out. Nothing is allocated per inference.

use std::sync::Arc;

use super::kernels::{build_kernel, Kernel, TensorMut, TensorRef};
use crate::backend::{Backend, BackendContext, Executable};
use crate::error::{Error, Result};
use crate::ir::{shape, Graph, Node, Tensor};
use crate::memory::{Block, HostPool, HostRegion, Region, StreamId};
use crate::plan::{MemoryPlan, PlanCache, Slot, ALIGNMENT};

/// The CPU backend with its thread count (0 = one per core).
pub struct CpuBackend {
    /// Worker threads for the kernels (0 = one per core).
    pub threads: usize,
}

/// A graph compiled for the CPU: kernels (with prepacked weights) and the arena plan.
pub struct CpuExecutable {
    graph: Arc<Graph>,
    kernels: Vec<Box<dyn Kernel>>,
    plan: Arc<MemoryPlan>,
    pool: Arc<rayon::ThreadPool>,
    /// Whether elementwise nodes may run in place (kept for [`Executable::specialise`]).
    in_place: bool,
}

impl Backend for CpuBackend {
    fn compile(&self, graph: Arc<Graph>) -> Result<Arc<dyn Executable>> {
        Ok(Arc::new(CpuExecutable::new(graph, self.threads)?))
    }
}

impl CpuExecutable {
    /// Compiles every node (failing on the first unsupported one) and plans the arena, with
    /// elementwise nodes written in place over inputs that die there.
    pub fn new(graph: Arc<Graph>, threads: usize) -> Result<Self> {
        Self::with_in_place(graph, threads, true)
    }

    /// Like [`new`](Self::new); `in_place = false` gives every value its own buffer (for
    /// checking the in-place plan against). Plans come from [`PlanCache::global`], so a graph
    /// compiled again for shapes seen before reuses its plan.
    pub fn with_in_place(graph: Arc<Graph>, threads: usize, in_place: bool) -> Result<Self> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("vigil-cpu-{i}"))
            .build()
            .map_err(|e| Error::Unsupported(format!("cannot start CPU worker threads: {e}")))?;
        Self::on_pool(graph, Arc::new(pool), in_place)
    }

    /// Compiles `graph` (the same model prepared for another input shape) on this executable's
    /// worker pool and in-place setting: no new threads; the plan comes from the
    /// [`PlanCache::global`], so a shape planned before (by any model) is not planned again.
    pub fn specialised(&self, graph: Arc<Graph>) -> Result<Self> {
        Self::on_pool(graph, Arc::clone(&self.pool), self.in_place)
    }

    /// Builds the kernels (in `pool`, whose size they read) and takes the plan from the cache.
    fn on_pool(graph: Arc<Graph>, pool: Arc<rayon::ThreadPool>, in_place: bool) -> Result<Self> {
        // Kernels size their per-thread scratch from the pool they are built in.
        let kernels = pool.install(|| {
            graph
                .nodes
                .iter()
                .map(|n| build_kernel(&graph, n))
                .collect::<Result<Vec<_>>>()
        })?;
        let scratch: Vec<usize> = kernels.iter().map(|k| k.scratch_bytes()).collect();
        let in_place_ok: Vec<Option<usize>> = if in_place {
            kernels.iter().map(|k| k.in_place_input()).collect()
        } else {
            Vec::new()
        };
        let plan = PlanCache::global().get_or_plan(&graph, &scratch, &in_place_ok)?;
        Ok(CpuExecutable {
            graph,
            kernels,
            plan,
            pool,
            in_place,
        })
    }

    /// The arena plan (for reports: size against the lower bound).
    pub fn plan(&self) -> &MemoryPlan {
        &self.plan
    }

    /// The shared plan (the same `Arc` for every executable with the same planning inputs).
    pub fn shared_plan(&self) -> &Arc<MemoryPlan> {
        &self.plan
    }
}

impl CpuExecutable {
    fn context_over(self: Arc<Self>, arena: Arena) -> Box<dyn BackendContext> {
        let profile = std::env::var_os("VIGIL_PROFILE")
            .map(|_| vec![std::time::Duration::ZERO; self.kernels.len()]);
        Box::new(CpuContext {
            exe: self,
            arena,
            profile,
        })
    }
}

/// A context's activation memory: a block of a shared host pool, or a region of its own.
enum Arena {
    Pooled(Block<HostRegion>),
    Own(HostRegion),
}

impl Arena {
    /// First byte and length (the block's or region's bytes, 256-byte aligned).
    fn bytes(&self) -> (*mut u8, usize) {
        match self {
            // SAFETY: the block lies inside its pool's region, which the block keeps alive.
            Arena::Pooled(b) => (
                unsafe { b.pool().region().as_mut_ptr().add(b.offset()) },
                b.size(),
            ),
            Arena::Own(r) => (r.as_mut_ptr(), r.len()),
        }
    }
}

impl Executable for CpuExecutable {
    fn backend(&self) -> &'static str {
        "cpu"
    }

    fn new_context(self: Arc<Self>) -> Result<Box<dyn BackendContext>> {
        let arena = Arena::Own(HostRegion::try_new(self.plan.arena_bytes)?);
        Ok(self.context_over(arena))
    }

    fn new_context_in(self: Arc<Self>, pool: &Arc<HostPool>) -> Result<Box<dyn BackendContext>> {
        let block = pool.alloc(self.plan.arena_bytes, StreamId::DEFAULT)?;
        Ok(self.context_over(Arena::Pooled(block)))
    }

    fn arena_bytes(&self) -> usize {
        self.plan.arena_bytes
    }

    fn arena_lower_bound(&self) -> usize {
        self.plan.lower_bound
    }

    fn specialise(&self, graph: Arc<Graph>) -> Result<Arc<dyn Executable>> {
        Ok(Arc::new(self.specialised(graph)?))
    }
}

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct AlignedBlock([u8; ALIGNMENT]);

/// One CPU execution context: a 256-byte-aligned arena laid out by the plan.
struct CpuContext {
    exe: Arc<CpuExecutable>,
    arena: Arena,
    /// Per-node accumulated time, when `VIGIL_PROFILE` is set; printed when the context drops.
    profile: Option<Vec<std::time::Duration>>,
}

impl Drop for CpuContext {
    fn drop(&mut self) {
        let Some(p) = &self.profile else { return };
        let total: f64 = p.iter().map(|d| d.as_secs_f64()).sum();
        let mut rows: Vec<(usize, f64)> = p.iter().map(|d| d.as_secs_f64()).enumerate().collect();
        rows.sort_by(|a, b| b.1.total_cmp(&a.1));
        eprintln!("node profile (total {:.3} s):", total);
        // `VIGIL_PROFILE=all` lists every node; any other value the 40 slowest.
        let all = std::env::var("VIGIL_PROFILE").is_ok_and(|v| v == "all");
        for (i, t) in rows.iter().take(if all { usize::MAX } else { 40 }) {
            let n = &self.exe.graph.nodes[*i];
            let shape = n
                .outputs
                .first()
                .and_then(|&o| self.exe.graph.values[o].shape.clone())
                .unwrap_or_default();
            eprintln!(
                "{:6.2}% {:9.3} ms  {:<18} {:?} {}",
                t / total * 100.0,
                t * 1e3,
                n.op.name(),
                shape,
                n.name
            );
        }
        let mut by_op: Vec<(&str, f64, usize)> = Vec::new();
        for (i, t) in &rows {
            let name = self.exe.graph.nodes[*i].op.name();
            match by_op.iter_mut().find(|r| r.0 == name) {
                Some(r) => (r.1, r.2) = (r.1 + t, r.2 + 1),
                None => by_op.push((name, *t, 1)),
            }
        }
        by_op.sort_by(|a, b| b.1.total_cmp(&a.1));
        eprintln!("by op:");
        for (name, t, n) in by_op {
            eprintln!("{:6.2}% {:9.3} ms  {name} x{n}", t / total * 100.0, t * 1e3);
        }
    }
}

impl CpuContext {
    fn slot(&self, v: usize) -> Result<Slot> {
        self.exe.plan.values[v].ok_or_else(|| {
            Error::InvalidModel(format!(
                "value '{}' has no arena slot",
                self.exe.graph.values[v].name
            ))
        })
    }
}

impl BackendContext for CpuContext {
    fn run(&mut self, inputs: &[&Tensor], outputs: &mut [Tensor]) -> Result<()> {
        let exe = Arc::clone(&self.exe);
        let g = &exe.graph;
        crate::backend::check_signature(g, inputs, outputs)?;
        let (ptr, arena_len) = self.arena.bytes();
        let base = ArenaPtr(ptr);
        for (&v, t) in g.inputs.iter().zip(inputs) {
            let slot = self.slot(v)?;
            let src = t.as_bytes();
            // SAFETY: the slot lies inside the arena (the plan sized it) and holds src.len() bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr(), base.0.add(slot.offset), src.len())
            };
        }
        let profile = &mut self.profile;
        let result = exe.pool.install(|| {
            for (i, (node, kernel)) in g.nodes.iter().zip(&exe.kernels).enumerate() {
                let start = profile.is_some().then(std::time::Instant::now);
                run_node(
                    g,
                    &exe.plan,
                    node,
                    i,
                    kernel.as_ref(),
                    base.ptr(),
                    arena_len,
                )?;
                if let (Some(p), Some(t)) = (profile.as_mut(), start) {
                    p[i] += t.elapsed();
                }
            }
            Ok::<(), Error>(())
        });
        result?;
        for (&v, t) in g.outputs.iter().zip(outputs.iter_mut()) {
            let value = &g.values[v];
            let shape = g.shape(v)?;
            if t.dtype() != value.dtype || t.shape != shape {
                *t = Tensor::zeros(value.dtype, shape.to_vec());
            }
            let dst = t.as_bytes_mut();
            if let Some(c) = &value.constant {
                dst.copy_from_slice(c.as_bytes());
                continue;
            }
            let slot = self.slot(v)?;
            // SAFETY: the slot lies inside the arena and holds dst.len() bytes of this value.
            unsafe {
                std::ptr::copy_nonoverlapping(base.0.add(slot.offset), dst.as_mut_ptr(), dst.len())
            };
        }
        Ok(())
    }
}

/// The arena's base pointer, handed to the worker pool for the duration of one run.
#[derive(Clone, Copy)]
struct ArenaPtr(*mut u8);
// SAFETY: the pointer is only dereferenced inside `run`, while `&mut self` keeps the arena alive
// and exclusively borrowed; nodes run one after another.
unsafe impl Send for ArenaPtr {}
// SAFETY: as above.
unsafe impl Sync for ArenaPtr {}

impl ArenaPtr {
    /// The raw pointer (a method, so closures capture the Send/Sync wrapper, not the field).
    fn ptr(self) -> *mut u8 {
        self.0
    }
}

/// Runs one node on views into the arena.
fn run_node(
    g: &Graph,
    plan: &MemoryPlan,
    node: &Node,
    index: usize,
    kernel: &dyn Kernel,
    base: *mut u8,
    arena_len: usize,
) -> Result<()> {
    const MAX_IO: usize = 16;
    if node.inputs.len() > MAX_IO || node.outputs.len() > MAX_IO {
        return Err(Error::Unsupported(format!(
            "node '{}' has more than {MAX_IO} inputs or outputs",
            node.name
        )));
    }
    let view = |v: usize| -> Result<(&[usize], &[u8])> {
        let value = &g.values[v];
        let shape = g.shape(v)?;
        if let Some(c) = &value.constant {
            return Ok((shape, c.as_bytes()));
        }
        let slot = plan.values[v].ok_or_else(|| {
            Error::InvalidModel(format!("value '{}' has no arena slot", value.name))
        })?;
        let len = shape.iter().product::<usize>() * value.dtype.size();
        debug_assert!(slot.offset + len <= arena_len);
        // SAFETY: planned slots lie inside the arena; inputs and outputs of one node are live at
        // the same step, so the plan gives them disjoint bytes.
        Ok((shape, unsafe {
            std::slice::from_raw_parts(base.add(slot.offset), len)
        }))
    };
    // In place: that input's bytes are output 0's; the kernel reads them from the output.
    let aliased = plan.in_place.get(index).copied().flatten();
    let mut ins: [Option<TensorRef>; MAX_IO] = [None; MAX_IO];
    for (k, inp) in node.inputs.iter().enumerate() {
        if Some(k) == aliased {
            continue;
        }
        if let Some(v) = *inp {
            let (shape, bytes) = view(v)?;
            ins[k] = Some(TensorRef {
                dtype: g.values[v].dtype,
                shape,
                bytes,
            });
        }
    }
    let mut outs: [TensorMut; MAX_IO] = Default::default();
    for (k, &v) in node.outputs.iter().enumerate() {
        let value = &g.values[v];
        let shape = g.shape(v)?;
        let slot = plan.values[v].ok_or_else(|| {
            Error::InvalidModel(format!("value '{}' has no arena slot", value.name))
        })?;
        let len = shape.iter().product::<usize>() * value.dtype.size();
        debug_assert!(slot.offset + len <= arena_len);
        // SAFETY: as above; each output has its own disjoint slot (an in-place output shares
        // only the aliased input's, which gets no view).
        let bytes = unsafe { std::slice::from_raw_parts_mut(base.add(slot.offset), len) };
        outs[k] = TensorMut {
            dtype: value.dtype,
            shape,
            bytes,
        };
    }
    let scratch: &mut [u8] = match plan.scratch[index] {
        // SAFETY: the scratch slot is live only during this node and disjoint from its tensors.
        Some(s) => unsafe { std::slice::from_raw_parts_mut(base.add(s.offset), s.size) },
        None => &mut [],
    };
    if aliased.is_some() {
        return kernel.run_in_place(
            &ins[..node.inputs.len()],
            &mut outs[..node.outputs.len()],
            scratch,
        );
    }
    kernel.run(
        &ins[..node.inputs.len()],
        &mut outs[..node.outputs.len()],
        scratch,
    )
}

/// Evaluates one node whose inputs are all constants (used by constant folding).
pub fn eval_node(graph: &Graph, node: &Node) -> Result<Vec<Tensor>> {
    let out_types = shape::infer_node(graph, node)?;
    let kernel = build_kernel(graph, node)?;
    let mut outs: Vec<Tensor> = out_types
        .into_iter()
        .map(|(dt, s)| Tensor::zeros(dt, s))
        .collect();
    let ins: Vec<Option<TensorRef>> = node
        .inputs
        .iter()
        .map(|inp| {
            inp.map(|v| {
                let c = graph.constant(v).ok_or_else(|| {
                    Error::InvalidModel(format!(
                        "eval of node '{}' needs constant inputs",
                        node.name
                    ))
                })?;
                Ok(TensorRef {
                    dtype: c.dtype(),
                    shape: &c.shape,
                    bytes: c.as_bytes(),
                })
            })
            .transpose()
        })
        .collect::<Result<_>>()?;
    let mut scratch =
        vec![AlignedBlock([0; ALIGNMENT]); kernel.scratch_bytes().div_ceil(ALIGNMENT)];
    let scratch_bytes =
        // SAFETY: reinterpreting aligned plain bytes.
        unsafe { std::slice::from_raw_parts_mut(scratch.as_mut_ptr() as *mut u8, scratch.len() * ALIGNMENT) };
    let shapes: Vec<Vec<usize>> = outs.iter().map(|t| t.shape.clone()).collect();
    let mut views: Vec<TensorMut> = outs
        .iter_mut()
        .zip(&shapes)
        .map(|(t, s)| TensorMut {
            dtype: t.dtype(),
            shape: s,
            bytes: t.as_bytes_mut(),
        })
        .collect();
    kernel.run(&ins, &mut views, scratch_bytes)?;
    drop(views);
    Ok(outs)
}
