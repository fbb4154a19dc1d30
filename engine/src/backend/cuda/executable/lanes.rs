//! Laned execution: a batch split into equal parts ("lanes") that run at once, each on its own
//! stream with its own arena, fork-joined inside one captured CUDA graph.
//!
//! One batch-32 chain of small-M kernels leaves SMs idle in every kernel's ramp and tail; two
//! batch-16 chains fill each other's gaps. Every lane shares the one compiled executable (its
//! weights, kernels and timing choices, made for the lane's batch); only activations are per
//! lane. Inputs and outputs must be batch-major, so that lane `k` owns the `k`-th slice of each.

use std::sync::Arc;

use cudarc::driver::{result as drv, sys, CudaEvent, CudaGraph};

use super::{capture, drv_err, record, CudaExecutable, CudaRun, LAST_DEVICE_MS};
use crate::backend::{check_signature, BackendContext, Executable};
use crate::error::{Error, Result};
use crate::ir::{Graph, Tensor};

/// A model compiled at its lane batch, run as `lanes` lanes that together take the full batch.
pub struct LanedExecutable {
    lane: Arc<CudaExecutable>,
    /// The model at its full batch: the signature callers see.
    graph: Arc<Graph>,
    lanes: usize,
}

impl LanedExecutable {
    /// Wraps `lane` (compiled for `graph`'s batch divided by `lanes`); fails unless every input
    /// and output of `graph` is the lane's, `lanes` times as long in its leading dimension.
    pub fn new(lane: Arc<CudaExecutable>, graph: Arc<Graph>, lanes: usize) -> Result<Self> {
        if lanes < 2 {
            return Err(Error::BadInput(format!(
                "lanes must be at least 2, got {lanes}"
            )));
        }
        let pairs = graph
            .inputs
            .iter()
            .zip(&lane.graph.inputs)
            .chain(graph.outputs.iter().zip(&lane.graph.outputs));
        for (&full, &part) in pairs {
            let (f, p) = (graph.shape(full)?, lane.graph.shape(part)?);
            let split =
                !f.is_empty() && f.len() == p.len() && f[0] == p[0] * lanes && f[1..] == p[1..];
            if !split {
                return Err(Error::Unsupported(format!(
                    "lanes split the batch, so every input and output must lead with it: \
                     '{}' is {f:?} at the full batch and {p:?} in a lane",
                    graph.values[full].name
                )));
            }
        }
        Ok(LanedExecutable { lane, graph, lanes })
    }
}

impl Executable for LanedExecutable {
    fn backend(&self) -> &'static str {
        "cuda"
    }

    fn new_context(self: Arc<Self>) -> Result<Box<dyn BackendContext>> {
        Ok(Box::new(LanedRun::new(&self)?))
    }

    fn arena_bytes(&self) -> usize {
        self.lane.plan.arena_bytes * self.lanes
    }

    fn arena_lower_bound(&self) -> usize {
        self.lane.plan.lower_bound * self.lanes
    }
}

/// One laned execution context: a [`CudaRun`] per lane, and the events that fork the lanes
/// off the first lane's stream and join them back.
struct LanedRun {
    /// The captured inference (declared first, so it is destroyed before the events and
    /// lanes it refers to).
    captured: Option<CudaGraph>,
    lanes: Vec<CudaRun>,
    graph: Arc<Graph>,
    fork: CudaEvent,
    /// One per lane after the first, recorded on that lane's stream when its steps end.
    joins: Vec<CudaEvent>,
    runs: usize,
    use_graph: bool,
}

// SAFETY: as for `CudaRun`: every handle is used only through `&mut self`, with the context
// bound to the calling thread first.
unsafe impl Send for LanedRun {}

impl LanedRun {
    fn new(exe: &LanedExecutable) -> Result<Self> {
        let lanes = (0..exe.lanes)
            .map(|_| CudaRun::new(Arc::clone(&exe.lane)))
            .collect::<Result<Vec<_>>>()?;
        let ctx = &exe.lane.ctx;
        let ev = || {
            ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                .map_err(drv_err("event creation"))
        };
        let joins = (1..exe.lanes).map(|_| ev()).collect::<Result<_>>()?;
        Ok(LanedRun {
            fork: ev()?,
            joins,
            graph: Arc::clone(&exe.graph),
            use_graph: lanes[0].use_graph,
            lanes,
            captured: None,
            runs: 0,
        })
    }

    /// Enqueues one inference: every lane's upload on the first lane's stream, the lanes'
    /// steps each on its own stream between a fork and a join, then every download.
    fn enqueue(&self, capturing: bool) -> Result<()> {
        let first = &self.lanes[0];
        let s0 = first.stream.cu_stream();
        for lane in &self.lanes {
            lane.enqueue_upload(s0)?;
        }
        record(&first.events.0, s0, capturing)?;
        self.fork
            .record(&first.stream)
            .map_err(drv_err("lane fork"))?;
        for lane in &self.lanes[1..] {
            lane.stream.wait(&self.fork).map_err(drv_err("lane fork"))?;
        }
        for lane in &self.lanes {
            lane.enqueue_steps(capturing)?;
        }
        for (lane, join) in self.lanes[1..].iter().zip(&self.joins) {
            join.record(&lane.stream).map_err(drv_err("lane join"))?;
            first.stream.wait(join).map_err(drv_err("lane join"))?;
        }
        record(&first.events.1, s0, capturing)?;
        for lane in &self.lanes {
            lane.enqueue_download(s0)?;
        }
        Ok(())
    }

    /// Splits the inputs over the lanes' staging buffers and runs one inference to completion
    /// (eagerly the first time, then from the graph captured on the second run).
    fn execute(&mut self, inputs: &[&Tensor]) -> Result<()> {
        let count = self.lanes.len();
        self.lanes[0]
            .exe
            .ctx
            .bind_to_thread()
            .map_err(drv_err("bind context"))?;
        for (i, t) in inputs.iter().enumerate() {
            let bytes = t.as_bytes();
            let part = bytes.len() / count;
            for (k, lane) in self.lanes.iter_mut().enumerate() {
                let (_, off, n) = lane.ins[i];
                if n != part {
                    return Err(Error::BadInput(format!(
                        "input {i} holds {} bytes, not {count} lanes of {n}",
                        bytes.len()
                    )));
                }
                lane.staging_in.bytes_mut()[off..off + n]
                    .copy_from_slice(&bytes[k * part..(k + 1) * part]);
            }
        }
        if let Some(graph) = &self.captured {
            graph.launch().map_err(drv_err("graph launch"))?;
        } else if self.use_graph && self.runs > 0 {
            let graph = capture(&self.lanes[0].stream, || self.enqueue(true))?;
            graph.launch().map_err(drv_err("graph launch"))?;
            self.captured = Some(graph);
        } else {
            self.enqueue(false)?;
        }
        let first = &self.lanes[0];
        first
            .stream
            .synchronize()
            .map_err(drv_err("inference (stream synchronize)"))?;
        // SAFETY: both events were recorded by the work just synchronised.
        let ms =
            unsafe { drv::event::elapsed(first.events.0.cu_event(), first.events.1.cu_event()) };
        LAST_DEVICE_MS.with(|c| c.set(ms.ok().map(f64::from)));
        self.runs += 1;
        Ok(())
    }
}

impl BackendContext for LanedRun {
    fn run(&mut self, inputs: &[&Tensor], outputs: &mut [Tensor]) -> Result<()> {
        check_signature(&self.graph, inputs, outputs)?;
        self.execute(inputs)?;
        let count = self.lanes.len();
        for (j, (out, &v)) in outputs.iter_mut().zip(&self.graph.outputs).enumerate() {
            let value = &self.graph.values[v];
            let shape = self.graph.shape(v)?;
            if out.dtype() != value.dtype || out.shape != shape {
                *out = Tensor::zeros(value.dtype, shape.to_vec());
            }
            let dst = out.as_bytes_mut();
            let part = dst.len() / count;
            for (k, lane) in self.lanes.iter().enumerate() {
                let bytes = lane.output_bytes(j)?;
                if bytes.len() != part {
                    return Err(Error::InvalidModel(format!(
                        "output '{}': a lane gives {} bytes, not {part}",
                        value.name,
                        bytes.len()
                    )));
                }
                dst[k * part..(k + 1) * part].copy_from_slice(bytes);
            }
        }
        Ok(())
    }
}
