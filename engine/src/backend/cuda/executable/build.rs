//! Compiling a graph for one device: each node becomes a step (a generated kernel, a cuDNN or
//! cuBLAS(Lt) call), its algorithm or tiling chosen by timing where there is a choice.

use super::*;
pub(super) struct Builder<'a> {
    pub(super) ctx: &'a Arc<CudaContext>,
    pub(super) g: &'a Graph,
    /// Per value, the nodes that read it and the node that writes it (for cross-node fusions).
    pub(super) readers: Vec<Vec<usize>>,
    pub(super) writers: Vec<Option<usize>>,
    /// Values read by a fused kernel at a later node than the graph's last reader, with that
    /// node (the memory plan keeps them live until then).
    pub(super) late_reads: Vec<(ValueId, usize)>,
    /// Per node, the input its output may share a buffer with (`plan_with`'s in-place rule):
    /// reshapes, whose copy then has nothing to move.
    pub(super) in_place_ok: Vec<Option<usize>>,
    /// While a stem QConv is emitted: the QuantizeLinear and Transpose of the image it reads,
    /// which emitted nothing ([`Self::quantize_stem`]). Its space-to-depth copy quantizes the
    /// image itself; any other path runs their kernel first.
    pub(super) stem_input: Option<(usize, usize)>,
    pub(super) gen: Gen,
    pub(super) kernels: Vec<GenKernel>,
    pub(super) steps: Vec<Step>,
    pub(super) scratch: Vec<usize>,
    pub(super) consts: HashMap<ValueId, DeviceBuffer>,
    pub(super) dnn: DnnHandle,
    pub(super) lt: &'a LtHandle,
    /// The stream algorithm searches run on.
    pub(super) stream: sys::CUstream,
    pub(super) tmp: Option<DeviceBuffer>,
    pub(super) fp16: bool,
    /// Fuse bias/residual/activation into cuDNN calls and pick algorithms for it.
    pub(super) fuse: bool,
    pub(super) descs: Vec<String>,
    /// Extra description of the current node's conv (algorithm, workspace).
    pub(super) note: String,
    /// The device's L2 cache size in bytes (bounds the im2col patch matrix).
    pub(super) l2_bytes: usize,
    /// When convolutions may run through cuBLASLt (`VIGIL_CUDA_LT`).
    pub(super) lt_mode: PathMode,
    /// Whether non-pointwise convolutions may unfold into a GEMM (`VIGIL_CUDA_IM2COL`).
    pub(super) im2col: bool,
    /// Whether int8 GEMMs may requantize in cuBLASLt's epilogue (`VIGIL_CUDA_QFUSE`).
    pub(super) qfuse: bool,
    /// When int8 convolutions may run as the implicit-GEMM kernel (`VIGIL_CUDA_IGEMM`).
    pub(super) igemm: PathMode,
    /// Whether the implicit GEMM may take Hopper's wgmma tilings (compute capability 9.0 only;
    /// `VIGIL_CUDA_WGMMA`: `0` never, `force` only those).
    pub(super) wgmma: PathMode,
    /// Whether the implicit GEMM may split K across blocks (`VIGIL_CUDA_SPLITK`: `0` never,
    /// `force` only split tilings where they apply).
    pub(super) splitk: PathMode,
    /// Whether a K split may stay inside a thread-block cluster (Hopper; `VIGIL_CUDA_CLUSTER`:
    /// off unless `1` measures them or `force` takes only those where they apply; on
    /// ResNet-50 they beat the partial-sum split but never cuBLASLt, so they stay opt-in).
    pub(super) cluster: PathMode,
    /// The device's multiprocessor count (how many blocks fill it).
    pub(super) sms: usize,
    /// Shared memory per multiprocessor in bytes (how many persistent blocks fit on one).
    pub(super) smem_per_sm: usize,
    /// The most dynamic shared memory one block may opt into: implicit-GEMM tilings needing
    /// more are not tried (unbounded when the device does not say).
    pub(super) smem_per_block: usize,
    /// Whether stride-2 stems may run over a space-to-depth copy (`VIGIL_CUDA_S2D=0`: never).
    pub(super) s2d: bool,
    /// The device as the timing cache names it (model, compute capability, SM count).
    pub(super) device_id: String,
    /// Whether short-K implicit GEMMs may run as persistent blocks (`VIGIL_CUDA_PERSIST`: off
    /// by default, as no ResNet-50 convolution took them on the H200; `1` times them too,
    /// `force` only those where they apply).
    pub(super) persist: PathMode,
    /// Whether long-K wgmma tilings may also run warp-specialized, loader warps beside the
    /// math ones (`VIGIL_CUDA_WS`: off unless `1` measures them or `force` takes only those
    /// where they apply; on ResNet-50 they never beat the block-barrier loop on the H200).
    pub(super) ws: PathMode,
    /// Whether 3x3 convolutions that fit may run over halo tiles on Hopper (`VIGIL_CUDA_HALO`:
    /// `0` never, `force` only those where they apply).
    pub(super) halo: PathMode,
    /// Whether the implicit GEMM also times its workhorse tilings compiled for more resident
    /// blocks per SM (shallower rings, registers capped by `__launch_bounds__`), to hide load
    /// latency with more blocks (`VIGIL_CUDA_RESIDENT`: off unless `1` measures them or
    /// `force` takes only those; on ResNet-50 they tied the others on the H200).
    pub(super) resident: PathMode,
    /// Whether the implicit GEMM also times deeper rings: wgmma tilings over 8 slots and halo
    /// tilings over 6 (`VIGIL_CUDA_DEEP`: `0` never, `force` only those where they apply; on
    /// ResNet-50 s8 at batch 32 they won 5 of 24 geometries on the H200).
    pub(super) deep: PathMode,
    /// Whether the implicit GEMM also times TMA-fed tilings for the 1x1 stride-1 convolutions
    /// that fit ([`tma_fits`]): the wgmma tilings with one loader warp whose first lane copies
    /// each slot's tiles by tensor map (`VIGIL_CUDA_TMA`: measured unless `0`; `force` takes
    /// only those). With the launch after each one plain ([`super::run::PLAIN_AFTER_DEFAULT`])
    /// they took ResNet-50 s8 from 0.802 to 0.784 ms on the H200; the GPU suite passes with them.
    pub(super) tma: PathMode,
    /// Whether long-K implicit GEMMs with too few tiles to fill the SMs also time serial K
    /// splits (the last block of each tile adds up: [`Tiling::serial`]) with as many parts as
    /// fill whole waves (`VIGIL_CUDA_SERIAL`: off unless `1` measures them or `force` takes
    /// only those where they apply).
    pub(super) serial: PathMode,
    /// Whether TMA tilings are also timed in multicast clusters (blocks that share an A or a
    /// B tile copy half of it each into both rings: [`Tiling::multicast`],
    /// [`Tiling::multicast_b`]; `VIGIL_CUDA_MULTICAST`: off unless `1` measures them or
    /// `force` takes only those where they apply).
    pub(super) multicast: PathMode,
    /// What a library (cuBLASLt) step is charged against an implicit GEMM beyond their own
    /// timings, in ms, where programmatic launch is on (`VIGIL_CUDA_LIB_STEP_US`, negative
    /// favours cuBLASLt; 0 without programmatic launch).
    pub(super) library_step_ms: f32,
    /// Whether a bottleneck's last 1x1 int8 convolution and the next one's first may run as
    /// one back-to-back kernel (`VIGIL_CUDA_B2B`: off unless `1` measures it or `force` takes
    /// it wherever it fits; exact, but 1.3–1.7x the two kernels it replaces on the H200).
    pub(super) b2b: PathMode,
    /// Whether a stride-2 stem QConv and the max pool after it may run as one kernel after the
    /// stem's space-to-depth copy (`VIGIL_CUDA_STEM_POOL`: off unless `1` measures it or
    /// `force` takes it wherever it fits; exact, but 1.2x the two kernels it replaces on the
    /// H200).
    pub(super) stem_pool: PathMode,
    /// Per node, the index of its first step (where a back-to-back pair's steps start).
    pub(super) first_step: Vec<usize>,
    /// Per int8 convolution node, the measured milliseconds of the path it took, where known.
    pub(super) chosen_ms: Vec<Option<f32>>,
}

/// Back-to-back kernels built so far in this process ([`Builder::back_to_back`]).
pub(super) static BACK_TO_BACK: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// How many back-to-back kernels (two chained 1x1 int8 convolutions in one) executables of
/// this process have taken, for tests and reports.
pub fn back_to_back_kernels() -> usize {
    BACK_TO_BACK.load(std::sync::atomic::Ordering::Relaxed)
}

/// Serial K-split kernels built so far in this process ([`Builder::push_igemm`]).
pub(super) static SERIAL_SPLITS: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// How many implicit-GEMM kernels with a serial K split (the last block of each output tile
/// adds the others' sums) executables of this process have taken, for tests and reports.
pub fn serial_split_kernels() -> usize {
    SERIAL_SPLITS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Multicast TMA kernels built so far in this process ([`Builder::push_igemm`]).
pub(super) static MULTICASTS: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// How many implicit-GEMM kernels with A or B tiles multicast across a cluster executables of
/// this process have taken, for tests and reports.
pub fn multicast_kernels() -> usize {
    MULTICASTS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Fused stem-and-pool kernels built so far in this process ([`Builder::stem_pool`]).
pub(super) static STEM_POOLS: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// How many fused stem-and-pool kernels (a stride-2 stem and its max pool in one) executables
/// of this process have taken, for tests and reports.
pub fn stem_pool_kernels() -> usize {
    STEM_POOLS.load(std::sync::atomic::Ordering::Relaxed)
}

/// The default of [`Builder::library_step_ms`] in µs, where programmatic launch is on. A
/// generated kernel overlaps its neighbours' tails in the graph and a library call does not,
/// yet on the H200 charging cuBLASLt 1–3 µs for that made ResNet-50 INT8 2.5% slower.
pub(super) const LIBRARY_STEP_US: f32 = 0.0;

/// An optional kernel path's switch, from an environment variable (`VIGIL_CUDA_LT` for the
/// cuBLASLt convolutions, `VIGIL_CUDA_IGEMM` for the int8 implicit GEMM, `VIGIL_CUDA_WGMMA` and
/// `VIGIL_CUDA_SPLITK` for its Hopper and split-K tilings): `0` turns it off, `force` takes it
/// whenever it applies (A/B measurements and tests); otherwise it is taken when it measures
/// faster than the alternatives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PathMode {
    Off,
    Measured,
    Force,
}

/// Whether generated kernels may launch as programmatic dependents on a device that can
/// (`VIGIL_CUDA_PDL=0` turns it off).
pub(super) fn programmatic_launch_allowed() -> bool {
    std::env::var("VIGIL_CUDA_PDL").map_or(true, |v| v != "0")
}

/// [`Builder::library_step_ms`] for a device of compute capability `cc`: the graph's kernels
/// overlap only where programmatic launch is on.
pub(super) fn library_step_ms(cc: Option<(i32, i32)>) -> f32 {
    if !(cc.is_some_and(programmatic_launch_capable) && programmatic_launch_allowed()) {
        return 0.0;
    }
    let us = std::env::var("VIGIL_CUDA_LIB_STEP_US")
        .ok()
        .and_then(|v| v.parse::<f32>().ok())
        .filter(|v| v.is_finite())
        .unwrap_or(LIBRARY_STEP_US);
    us / 1000.0
}

impl PathMode {
    pub(super) fn from_var(name: &str) -> Self {
        match std::env::var(name).as_deref() {
            Ok("0") => PathMode::Off,
            Ok("force") => PathMode::Force,
            _ => PathMode::Measured,
        }
    }

    /// Adds this path's candidates `more` to `tilings`, or puts them in their place when the
    /// path is forced and has any (an empty list means it does not apply).
    pub(super) fn add_candidates(self, tilings: &mut Vec<Tiling>, more: Vec<Tiling>) {
        if self == PathMode::Force && !more.is_empty() {
            tilings.clear();
        }
        tilings.extend(more);
    }

    /// A path that is off unless asked for: `1` measures it, `force` takes it.
    pub(super) fn opt_in(name: &str) -> Self {
        match std::env::var(name).as_deref() {
            Ok("1") => PathMode::Measured,
            Ok("force") => PathMode::Force,
            _ => PathMode::Off,
        }
    }
}

impl Builder<'_> {
    pub(super) fn launch(&mut self, node: usize, k: GenKernel) {
        self.launch_at(self.steps.len(), node, k);
    }

    /// Inserts kernel `k`'s launch as step `at` (before steps the node already emitted).
    pub(super) fn launch_at(&mut self, at: usize, node: usize, k: GenKernel) {
        self.steps.insert(
            at,
            Step::Launch {
                node,
                f: self.kernels.len(),
                dims: launch_dims(&k),
                args: k.args.clone(),
            },
        );
        self.kernels.push(k);
    }

    pub(super) fn const_ptr(&self, v: ValueId) -> Option<u64> {
        self.consts.get(&v).map(|b| b.ptr())
    }

    /// A scratch device buffer of at least `n` bytes for algorithm search (compile time only).
    pub(super) fn tmp(&mut self, n: usize) -> Result<u64> {
        if self.tmp.as_ref().is_none_or(|t| t.len() < n) {
            self.tmp = None;
            self.tmp = Some(DeviceBuffer::alloc(self.ctx, n)?);
        }
        self.tmp
            .as_ref()
            .map(|t| t.ptr())
            .ok_or_else(|| Error::Unsupported("temporary buffer missing".into()))
    }

    pub(super) fn node(&mut self, idx: usize, node: &Node) -> Result<()> {
        self.note.clear();
        self.first_step[idx] = self.steps.len();
        let r = self.node_steps(idx, node);
        let d = format!("{} '{}'{}", node.op.name(), node.name, self.note);
        while self.descs.len() < self.steps.len() {
            self.descs.push(d.clone());
        }
        r
    }

    /// The Transpose that runs QuantizeLinear node `q` inside it, if it may
    /// ([`quantize_transpose_fits`], `q`'s output read by it alone and not a graph output).
    pub(super) fn quantize_transpose(&self, q: usize) -> Option<usize> {
        let g = self.g;
        let t = self.only_reader(*g.nodes[q].outputs.first()?)?;
        quantize_transpose_fits(g, &g.nodes[q], &g.nodes[t]).then_some(t)
    }

    /// The stem QConv whose space-to-depth copy runs Transpose `t` and the QuantizeLinear
    /// inside it ([`Self::quantize_transpose`]), if it may: the transposed image's only reader,
    /// NHWC, and a stem the implicit GEMM takes over its space-to-depth form.
    pub(super) fn quantize_stem(&self, t: usize) -> Option<usize> {
        let g = self.g;
        let q = self.writer_of_input(&g.nodes[t])?;
        if self.quantize_transpose(q) != Some(t) || !self.s2d || self.igemm == PathMode::Off {
            return None;
        }
        let conv = self.only_reader(*g.nodes[t].outputs.first()?)?;
        let Op::QConv(qa) = &g.nodes[conv].op else {
            return None;
        };
        let parts = QConvParts::new(g, &g.nodes[conv], qa).ok()?;
        let stem = qa.conv.layout == Layout::Nhwc
            && parts.geom.groups == 1
            && parts.space_to_depth().is_some_and(|s| igemm_fits(&s));
        stem.then_some(conv)
    }

    /// The value's only reader, if it has one and is not a graph output.
    pub(super) fn only_reader(&self, v: ValueId) -> Option<usize> {
        match self.readers[v][..] {
            [r] if !self.g.outputs.contains(&v) => Some(r),
            _ => None,
        }
    }

    /// The GlobalAveragePool and QuantizeLinear that run DequantizeLinear node `dq` inside
    /// one kernel with them, if they may ([`dequantize_pool_quantize_fits`], each the only
    /// reader of the one before, no intermediate a graph output, f32 floats between them).
    pub(super) fn dequantize_pool_quantize(&self, dq: usize) -> Option<(usize, usize)> {
        let g = self.g;
        let gap = self.only_reader(*g.nodes[dq].outputs.first()?)?;
        let q = self.only_reader(*g.nodes[gap].outputs.first()?)?;
        (!self.fp16 && dequantize_pool_quantize_fits(g, &g.nodes[dq], &g.nodes[gap], &g.nodes[q]))
            .then_some((gap, q))
    }

    /// The DequantizeLinear that runs inside QGemm node `qg`'s narrow kernel, if it may: the
    /// only reader of the codes (not a graph output), on an `mma.sync` device, f32 activations,
    /// [`narrow_gemm_fits`] and [`narrow_dequantize_fits`].
    pub(super) fn qgemm_dequantize(&self, qg: usize) -> Option<usize> {
        let g = self.g;
        let node = &g.nodes[qg];
        let Op::QGemm(q) = &node.op else {
            return None;
        };
        let dq = self.only_reader(*node.outputs.first()?)?;
        let fits = !self.fp16
            && self.igemm != PathMode::Off
            && narrow_dequantize_fits(g, node, &g.nodes[dq])
            && QConvParts::for_gemm(g, node, q).is_ok_and(|p| narrow_gemm_fits(&p));
        fits.then_some(dq)
    }

    /// The node that writes input 0 of `node`.
    pub(super) fn writer_of_input(&self, node: &Node) -> Option<usize> {
        node.input(0).and_then(|x| self.writers[x])
    }

    /// Emits nothing for nodes that run inside a later node's fused kernel, and that kernel
    /// at the later node; false for every other node.
    pub(super) fn fused_steps(&mut self, idx: usize, node: &Node) -> Result<bool> {
        let g = self.g;
        match node.op {
            Op::QuantizeLinear { .. } if self.quantize_transpose(idx).is_some() => {
                self.note = " (runs inside the transpose that reads it)".into();
                return Ok(true);
            }
            Op::DequantizeLinear { .. } if self.dequantize_pool_quantize(idx).is_some() => {
                self.note = " (runs inside the QuantizeLinear after the pool)".into();
                return Ok(true);
            }
            Op::QGemm(_) if self.qgemm_dequantize(idx).is_some() => {
                self.note = " (runs inside the DequantizeLinear after it)".into();
                return Ok(true);
            }
            Op::Transpose { .. } if self.quantize_stem(idx).is_some() => {
                self.note =
                    " (runs with the QuantizeLinear inside the stem's space-to-depth copy)".into();
                // The stem's kernel reads the float image.
                let x = self.writer_of_input(node).and_then(|q| g.nodes[q].input(0));
                if let (Some(x), Some(conv)) = (x, self.quantize_stem(idx)) {
                    self.late_reads.push((x, conv));
                }
                return Ok(true);
            }
            Op::GlobalAveragePool { .. } => {
                let dq = self.writer_of_input(node);
                if dq.is_some_and(|d| self.dequantize_pool_quantize(d).is_some_and(|f| f.0 == idx))
                {
                    self.note = " (runs inside the QuantizeLinear after it)".into();
                    return Ok(true);
                }
            }
            _ => {}
        }
        // The late node: its kernel reads the absorbed node's input, so the memory plan keeps
        // that alive until here.
        let writer = self.writer_of_input(node);
        let fused = match node.op {
            Op::Transpose { .. } => writer
                .filter(|&q| self.quantize_transpose(q) == Some(idx))
                .map(|q| {
                    self.note = " (with the QuantizeLinear before it)".into();
                    (q, self.gen.quantize_to_nhwc(g, &g.nodes[q], node))
                }),
            Op::QuantizeLinear { .. } => writer
                .and_then(|gap| self.writer_of_input(&g.nodes[gap]))
                .filter(|&dq| {
                    self.dequantize_pool_quantize(dq)
                        .is_some_and(|f| f.1 == idx)
                })
                .map(|dq| {
                    self.note = " (with the DequantizeLinear and pool before it)".into();
                    (dq, self.gen.dequantize_pool_quantize(g, &g.nodes[dq], node))
                }),
            Op::DequantizeLinear { .. } => writer
                .filter(|&qg| self.qgemm_dequantize(qg) == Some(idx))
                .and_then(|qg| match &g.nodes[qg].op {
                    Op::QGemm(q) => Some((qg, q)),
                    _ => None,
                })
                .map(|(qg, q)| {
                    self.note = " (narrow int8 GEMM with the QGemm before it)".into();
                    (
                        qg,
                        self.gen.narrow_qgemm_dequantize(g, &g.nodes[qg], q, node),
                    )
                }),
            _ => None,
        };
        let Some((first, k)) = fused else {
            return Ok(false);
        };
        if let Some(x) = g.nodes[first].input(0) {
            self.late_reads.push((x, idx));
        }
        self.launch(idx, k?);
        Ok(true)
    }

    /// A step copying the node's first input into its output (the whole output's bytes).
    fn copy_input(&mut self, node: &Node) -> Result<()> {
        let x = node
            .input(0)
            .ok_or_else(|| unsupported(node, "missing input"))?;
        let y = node.outputs[0];
        let bytes = stored_bytes(self.g, y, self.fp16)?;
        self.steps.push(Step::Copy {
            dst: y,
            src: Arg::Val(x),
            bytes,
        });
        Ok(())
    }

    pub(super) fn node_steps(&mut self, idx: usize, node: &Node) -> Result<()> {
        let g = self.g;
        if self.fused_steps(idx, node)? || self.stem_pool(idx, node)? {
            return Ok(());
        }
        match &node.op {
            Op::Conv(_) => self.conv(idx, node),
            Op::QConv(q) => self.qconv(idx, node, q),
            Op::QGemm(q) => self.qgemm(idx, node, q),
            Op::Gemm { .. } | Op::MatMul => self.gemm(idx, node),
            Op::Reshape { .. }
            | Op::Flatten { .. }
            | Op::Squeeze { .. }
            | Op::Unsqueeze { .. }
            | Op::Identity => {
                self.copy_input(node)?;
                // Where x dies here, the plan gives y x's buffer and the copy moves nothing.
                self.in_place_ok[idx] = Some(0);
                Ok(())
            }
            Op::Shape { .. } | Op::ConstantOfShape { .. } | Op::Range => self.host_eval(idx, node),
            _ if node.present_inputs().all(|v| g.constant(v).is_some())
                && !node.inputs.is_empty() =>
            {
                self.host_eval(idx, node)
            }
            Op::ScatterND => {
                // The output starts as a copy of the data; the updates are then scattered in.
                let k = self.gen.scatter_nd(g, node)?;
                self.copy_input(node)?;
                self.launch(idx, k);
                Ok(())
            }
            _ => {
                let ks = self.gen.node(g, node)?;
                for k in ks {
                    self.launch(idx, k);
                }
                Ok(())
            }
        }
    }

    /// Nodes whose outputs depend only on constants and static shapes: computed once here (this
    /// is constant folding, not a CPU fallback: nothing runs on the CPU per inference).
    pub(super) fn host_eval(&mut self, _idx: usize, node: &Node) -> Result<()> {
        let g = self.g;
        let outs: Vec<Tensor> = match &node.op {
            Op::Shape { .. } | Op::ConstantOfShape { .. } => {
                let mut tmp = g.clone();
                for v in tmp.values.iter_mut() {
                    if v.constant.is_none() {
                        if let Some(s) = &v.shape {
                            v.constant = Some(Arc::new(Tensor::zeros(v.dtype, s.clone())));
                        }
                    }
                }
                crate::backend::cpu::eval_node(&tmp, node)?
            }
            _ => crate::backend::cpu::eval_node(g, node)?,
        };
        for (&o, t) in node.outputs.iter().zip(outs) {
            let bytes = device_bytes(&t, self.fp16)?;
            let len = bytes.len();
            let a = self.gen.extra(bytes);
            self.steps.push(Step::Copy {
                dst: o,
                src: a,
                bytes: len,
            });
        }
        Ok(())
    }

    pub(super) fn conv(&mut self, idx: usize, node: &Node) -> Result<()> {
        let g = self.g;
        let Op::Conv(a) = &node.op else {
            return Err(unsupported(node, "not a conv"));
        };
        let x = node.input(0).ok_or_else(|| unsupported(node, "no input"))?;
        let wv = node
            .input(1)
            .ok_or_else(|| unsupported(node, "no weights"))?;
        let y = node.outputs[0];
        let wt = g
            .constant(wv)
            .ok_or_else(|| unsupported(node, "runtime weights"))?;
        let xs = g.shape(x)?.to_vec();
        let ys = g.shape(y)?.to_vec();
        let ws = wt.shape.clone();
        let nhwc = a.layout == Layout::Nhwc;
        // Logical (n, c, h, w) of x and y; 1-D convs run as H = 1.
        let dims = |s: &[usize]| -> Result<[usize; 4]> {
            Ok(match (s.len(), nhwc) {
                (4, false) => [s[0], s[1], s[2], s[3]],
                (4, true) => [s[0], s[3], s[1], s[2]],
                (3, false) => [s[0], s[1], 1, s[2]],
                (3, true) => [s[0], s[2], 1, s[1]],
                _ => return Err(unsupported(node, "only 1-D and 2-D convolutions")),
            })
        };
        let xd = dims(&xs)?;
        let yd = dims(&ys)?;
        let w4 = match ws.len() {
            4 => [ws[0], ws[1], ws[2], ws[3]],
            3 => [ws[0], ws[1], 1, ws[2]],
            _ => return Err(unsupported(node, "weights of unexpected rank")),
        };
        let two = |v: &[usize], d: usize| -> [usize; 2] {
            if v.len() == 1 {
                [d, v[0]]
            } else {
                [
                    v.first().copied().unwrap_or(d),
                    v.get(1).copied().unwrap_or(d),
                ]
            }
        };
        let stride = two(&a.strides, 1);
        let dil = two(&a.dilations, 1);
        let (pt, pl, pb, pr) = if a.pads.len() == 2 {
            (0, a.pads[0], 0, a.pads[1])
        } else {
            let p = |k: usize| a.pads.get(k).copied().unwrap_or(0);
            (p(0), p(1), p(2), p(3))
        };
        let symmetric = pt == pb && pl == pr;
        let mut scratch = 0usize;
        let (xarg, xdims, pad) = if symmetric {
            (Arg::Val(x), xd, [pt, pl])
        } else {
            let (ph, pw) = (xd[2] + pt + pb, xd[3] + pl + pr);
            let k = self.gen.pad_into_scratch(
                x,
                nhwc,
                (xd[0], xd[1], xd[2], xd[3]),
                (pt, pl),
                (ph, pw),
            );
            self.launch(idx, k);
            scratch = alit(xd[0] * xd[1] * ph * pw * 4);
            (Arg::Scratch, [xd[0], xd[1], ph, pw], [0, 0])
        };
        let i32s = |v: [usize; 4]| v.map(|d| d as i32);
        let geom = ConvGeom {
            nhwc,
            x: i32s(xdims),
            w: i32s(w4),
            y: i32s(yd),
            pad: pad.map(|d| d as i32),
            stride: stride.map(|d| d as i32),
            dilation: dil.map(|d| d as i32),
            group: a.group as i32,
            half: self.fp16,
        };
        let descs = ConvDescs::new(&geom)?;
        let wf = wt.as_f32()?;
        let wdata = if nhwc { ohwi(wf, &w4) } else { wf.to_vec() };
        let wbytes: Vec<u8> = if self.fp16 {
            half_bytes(&wdata)
        } else {
            wdata.iter().flat_map(|f| f.to_le_bytes()).collect()
        };
        let wbuf = DeviceBuffer::upload(self.ctx, &wbytes)?;
        // Algorithm search on temporary buffers.
        let xb = alit(xdims.iter().product::<usize>() * 4);
        let yb = alit(yd.iter().product::<usize>() * 4);
        let t = self.tmp(xb + yb + DNN_WS_LIMIT)?;
        let algos = choose_algo(
            &self.dnn,
            &geom,
            &descs,
            t,
            wbuf.ptr(),
            t + xb as u64,
            t + (xb + yb) as u64,
            DNN_WS_LIMIT,
        )?;
        let best = algos[0];
        let bias_ptr = node.input(2).and_then(|b| self.const_ptr(b));
        let bias = node.input(2).map(Arg::Val);
        let z = node.input(3).map(Arg::Val);
        use dnn_sys::cudnnActivationMode_t as Am;
        let mode = match (bias_ptr.is_some(), a.activation) {
            (true, Some(Activation::Relu)) => Some((Am::CUDNN_ACTIVATION_RELU, 0.0)),
            (true, None) if self.fuse => Some((Am::CUDNN_ACTIVATION_IDENTITY, 0.0)),
            (true, Some(Activation::Clip { min, max }))
                if self.fuse && min == 0.0 && max.is_finite() =>
            {
                Some((Am::CUDNN_ACTIVATION_CLIPPED_RELU, f64::from(max)))
            }
            _ => None,
        };
        let pg =
            dnn_sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
        // cuDNN fuses bias + residual + activation into the convolution kernel only with the
        // implicit precomputed GEMM; other algorithms run extra generic kernels. Use it when it
        // costs less than the best algorithm plus one epilogue pass.
        let ybytes = yd.iter().product::<usize>() * if self.fp16 { 2 } else { 4 };
        let epi_ms = 0.003 + 3.0 * ybytes as f32 / 3.0e9;
        let candidate = match mode {
            Some(_) if !self.fuse => Some(best),
            Some(_) => algos
                .iter()
                .find(|c| c.algo == pg && c.time_ms <= best.time_ms + epi_ms)
                .copied(),
            None => None,
        };
        let mut fused = None;
        if let (Some((m, coef)), Some(c), Some(bp)) = (mode, candidate, bias_ptr) {
            descs.set_activation(m, coef)?;
            descs.set_math(c.math)?;
            let (one, zero) = (1f32, 0f32);
            let alpha2 = if z.is_some() { 1f32 } else { 0f32 };
            let yp = t + xb as u64;
            // SAFETY: trial call on the search buffers (sized for this convolution in f32).
            let ok = unsafe {
                dnn::convolution_bias_activation_forward(
                    self.dnn.0,
                    &one as *const f32 as *const c_void,
                    descs.x,
                    t as *const c_void,
                    descs.w,
                    wbuf.ptr() as *const c_void,
                    descs.conv,
                    c.algo,
                    (t + (xb + yb) as u64) as *mut c_void,
                    c.workspace,
                    &alpha2 as *const f32 as *const c_void,
                    descs.y,
                    yp as *const c_void,
                    descs.bias,
                    bp as *const c_void,
                    descs.act,
                    descs.y,
                    yp as *mut c_void,
                )
            }
            .is_ok();
            let _ = zero;
            if ok {
                fused = Some(c);
            }
        }
        let fused_relu = fused.is_some();
        let algo = fused.unwrap_or(best);
        descs.set_math(algo.math)?;
        // A pointwise (1x1, stride 1, unpadded) NHWC convolution is a GEMM: run it through
        // cuBLASLt with bias, residual and ReLU in the GEMM's epilogue when that is faster.
        let needs_epi = bias.is_some() || a.activation.is_some() || z.is_some();
        let cudnn_ms = if fused_relu {
            algo.time_ms
        } else {
            best.time_ms + if needs_epi { epi_ms } else { 0.0 }
        };
        let (lt_on, lt_force) = (
            self.lt_mode != PathMode::Off,
            self.lt_mode == PathMode::Force,
        );
        let gemm_able =
            nhwc && symmetric && a.group == 1 && (bias.is_none() || bias_ptr.is_some()) && lt_on;
        let pointwise = gemm_able
            && w4[2] == 1
            && w4[3] == 1
            && stride == [1, 1]
            && dil == [1, 1]
            && pad == [0, 0];
        // Any other dense NHWC convolution may run as an im2col pass (into the node's scratch
        // slot) plus the same GEMM: at batch 1 with few output pixels cuDNN has only implicit
        // GEMMs that leave most of the GPU idle, while cuBLASLt can split the long reduction.
        let unfold = Im2col {
            n: xdims[0],
            c: xdims[1],
            h: xdims[2],
            w: xdims[3],
            oh: yd[2],
            ow: yd[3],
            kh: w4[2],
            kw: w4[3],
            stride,
            pad,
            dilation: dil,
        };
        let elem = if self.fp16 { 2 } else { 4 };
        let col_bytes = unfold.rows() * unfold.cols() * elem;
        let im2col = gemm_able
            && !pointwise
            && col_bytes <= self.l2_bytes / IM2COL_L2_FRACTION
            && self.im2col;
        if pointwise || im2col {
            let relu = a.activation == Some(Activation::Relu);
            let shape = PointwiseShape {
                m: yd[0] * yd[2] * yd[3],
                n: yd[1],
                k: if im2col { unfold.cols() } else { xd[1] },
                half: self.fp16,
                int8: false,
                requant: false,
                epilogue: Epilogue {
                    bias: bias_ptr.is_some(),
                    residual: z.is_some(),
                    relu,
                },
            };
            let rest = if relu { None } else { a.activation };
            let gb = if im2col { alit(col_bytes) } else { xb };
            // Offset by the plan's alignment so the search sees pointers aligned no better
            // than the arena's; x for the unfold's timing sits after everything else.
            let t = self.tmp(gb + 2 * yb + BLAS_WS + xb + 5 * ALIGNMENT + 256)? + ALIGNMENT as u64;
            let unfold_ms = if im2col {
                let xt = (t + (gb + 2 * yb + BLAS_WS + 4 * ALIGNMENT) as u64).div_ceil(256) * 256;
                self.im2col_ms(&unfold, xt, t)?
            } else {
                0.0
            };
            let bufs = SearchBuffers {
                x: t,
                w: wbuf.ptr(),
                y: t + (gb + ALIGNMENT) as u64,
                z: t + (gb + yb + 2 * ALIGNMENT) as u64,
                ws: (t + (gb + 2 * yb + 3 * ALIGNMENT) as u64).div_ceil(256) * 256,
                ws_limit: BLAS_WS,
            };
            let mm = LtMatmul::build(
                self.lt,
                shape,
                bias_ptr.unwrap_or(0),
                (0, 0.0),
                self.stream,
                &bufs,
            );
            let lt_ms =
                |mm: &LtMatmul| mm.time_ms + unfold_ms + if rest.is_some() { epi_ms } else { 0.0 };
            if let Some(mm) = mm.ok().filter(|mm| lt_force || lt_ms(mm) < cudnn_ms) {
                self.note = format!(
                    " cublasLt{} ws {} KiB {:.4} ms (cuDNN {:?} {:.4} ms) m{} n{} k{}{}",
                    if im2col { " im2col" } else { "" },
                    mm.workspace >> 10,
                    lt_ms(&mm),
                    algo.algo,
                    cudnn_ms,
                    shape.m,
                    shape.n,
                    shape.k,
                    if rest.is_some() { " +act" } else { "" },
                );
                let x_gemm = if im2col {
                    let k = self.gen.im2col_into_scratch(x, &unfold);
                    self.launch(idx, k);
                    self.scratch[idx] = alit(col_bytes);
                    Arg::Scratch
                } else {
                    xarg
                };
                self.steps.push(Step::Pointwise(Box::new(PointwiseStep {
                    node: idx,
                    x: x_gemm,
                    y: Arg::Val(y),
                    z,
                    w: wbuf,
                    mm,
                })));
                if rest.is_some() {
                    let k = self.gen.epilogue(y, &ys, ys.len() - 1, None, rest, None);
                    self.launch(idx, k);
                }
                return Ok(());
            }
        }
        self.note = format!(
            " algo {:?} ws {} KiB find {:.4} ms (best {:?} {:.4} ms) fused {} {}x{}x{}x{}{} k{}x{} g{} s{}",
            algo.algo,
            algo.workspace >> 10,
            algo.time_ms,
            best.algo,
            best.time_ms,
            fused_relu,
            yd[0],
            yd[1],
            yd[2],
            yd[3],
            if nhwc { " nhwc" } else { " nchw" },
            w4[2],
            w4[3],
            a.group,
            stride[0],
        );
        let ws_offset = scratch;
        scratch += alit(algo.workspace);
        self.scratch[idx] = scratch;
        self.steps.push(Step::Conv(Box::new(ConvStep {
            node: idx,
            x: xarg,
            y,
            w: wbuf,
            bias,
            z,
            fused: fused_relu,
            geom,
            act: mode.filter(|_| fused_relu),
            algo,
            ws_offset,
        })));
        if !fused_relu && (bias.is_some() || a.activation.is_some() || z.is_some()) {
            let caxis = if nhwc { ys.len() - 1 } else { 1 };
            let k = self.gen.epilogue(y, &ys, caxis, bias, a.activation, z);
            self.launch(idx, k);
        }
        Ok(())
    }

    /// An int8 convolution ([`Self::qconv_steps`]). A stem whose image's quantizing transpose
    /// emitted nothing ([`Self::quantize_stem`]) quantizes the image in its space-to-depth
    /// copy, or runs that transpose's kernel first when it takes another path.
    pub(super) fn qconv(
        &mut self,
        idx: usize,
        node: &Node,
        q: &crate::ir::QConvAttrs,
    ) -> Result<()> {
        let g = self.g;
        let first = self.steps.len();
        self.stem_input = self
            .writer_of_input(node)
            .filter(|&t| self.quantize_stem(t) == Some(idx))
            .and_then(|t| Some((self.writer_of_input(&g.nodes[t])?, t)));
        let r = self.qconv_steps(idx, node, q);
        if let Some((qn, t)) = self.stem_input.take() {
            // The stem took another path: the quantizing transpose runs first after all.
            let k = self.gen.quantize_to_nhwc(g, &g.nodes[qn], &g.nodes[t])?;
            self.launch_at(first, idx, k);
        }
        r?;
        self.back_to_back(idx)
    }

    /// Runs QConv `j` and the QConv just before it, whose output `j` reads, as one
    /// back-to-back kernel ([`b2b_fits`]) in place of both nodes' steps, when it measures
    /// faster than the two paths they took (or `VIGIL_CUDA_B2B=force`). The first node's
    /// inputs stay live until `j` in the memory plan.
    pub(super) fn back_to_back(&mut self, j: usize) -> Result<()> {
        let g = self.g;
        if self.b2b == PathMode::Off || self.igemm == PathMode::Off || j == 0 {
            return Ok(());
        }
        let i = j - 1;
        let (ni, nj) = (&g.nodes[i], &g.nodes[j]);
        let (Op::QConv(qi), Op::QConv(qj)) = (&ni.op, &nj.op) else {
            return Ok(());
        };
        let (Some(x), y1, y2) = (ni.input(0), ni.outputs[0], nj.outputs[0]) else {
            return Ok(());
        };
        let nhwc = qi.conv.layout == Layout::Nhwc && qj.conv.layout == Layout::Nhwc;
        let (Some(ms_i), Some(ms_j), true) = (self.chosen_ms[i], self.chosen_ms[j], nhwc) else {
            return Ok(());
        };
        if nj.input(0) != Some(y1) {
            return Ok(());
        }
        let (pi, pj) = (QConvParts::new(g, ni, qi)?, QConvParts::new(g, nj, qj)?);
        if !b2b_fits(&pi, &pj) {
            return Ok(());
        }
        let (shape, ms) = match self.b2b_best(&pi, &pj, x, (y1, y2)) {
            Ok(best) => best,
            Err(e) => {
                tracing::warn!("back-to-back kernel of '{}' left out: {e}", ni.name);
                return Ok(());
            }
        };
        let separate = ms_i + ms_j;
        if self.b2b != PathMode::Force && ms >= separate {
            self.note += &format!(" [back-to-back with '{}' {shape} {ms:.4} ms]", ni.name);
            return Ok(());
        }
        // Both nodes' steps give way to the one kernel, run at `j`.
        let first = self.first_step[i];
        self.steps.truncate(first);
        self.descs.truncate(first);
        self.scratch[i] = 0;
        self.scratch[j] = 0;
        self.late_reads.push((x, j));
        if let Some(r) = pi.residual {
            self.late_reads.push((r.z, j));
        }
        let k = self.gen.qb2b(Arg::Val(x), (y1, y2), (&pi, &pj), shape);
        self.launch(j, k);
        BACK_TO_BACK.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.note = format!(
            " back-to-back with '{}' {shape} {ms:.4} ms (separate {ms_i:.4} + {ms_j:.4} ms){}",
            ni.name,
            if ms >= separate { ", forced" } else { "" }
        );
        Ok(())
    }

    /// Runs MaxPool `j` and the stride-2 stem QConv just before it as the stem's
    /// space-to-depth copy (quantizing the image where the stem does, [`Self::quantize_stem`])
    /// and one kernel for the stem and the pool ([`stem_pool_fits`]), in place of the stem's
    /// steps and the pool's, when the two measure faster than the path the stem took (where
    /// that was measured) or `VIGIL_CUDA_STEM_POOL=force`; false when they do not run. The
    /// stem's input stays live until `j` in the memory plan.
    pub(super) fn stem_pool(&mut self, j: usize, node: &Node) -> Result<bool> {
        let g = self.g;
        let Op::MaxPool(a) = &node.op else {
            return Ok(false);
        };
        if self.stem_pool == PathMode::Off || j == 0 || node.outputs.len() != 1 {
            return Ok(false);
        }
        let i = j - 1;
        let stem = &g.nodes[i];
        let Op::QConv(qa) = &stem.op else {
            return Ok(false);
        };
        let (ys, y) = (stem.outputs[0], node.outputs[0]);
        if node.input(0) != Some(ys) || self.only_reader(ys) != Some(j) {
            return Ok(false);
        }
        let x = stem.input(0).ok_or_else(|| unsupported(stem, "no input"))?;
        // The image's QuantizeLinear, where the stem's copy runs it (its transpose emitted
        // nothing, so `x` is never written).
        let quant = self
            .writer_of_input(stem)
            .filter(|&t| self.quantize_stem(t) == Some(i))
            .and_then(|t| self.writer_of_input(&g.nodes[t]));
        let parts = QConvParts::new(g, stem, qa)?;
        let nhwc = qa.conv.layout == Layout::Nhwc && parts.geom.groups == 1;
        let (Some(pool), Some(s2d), true) = (
            stem_pool_fits(&parts, a, g.shape(y)?, g.values[ys].dtype),
            parts.space_to_depth().filter(|_| self.s2d),
            nhwc,
        ) else {
            return Ok(false);
        };
        if stem_pool_smem(&s2d) > self.smem_per_block {
            return Ok(false);
        }
        let blocks = 2 * self.sms;
        let ms = match self.stem_pool_ms(&s2d, (pool, y), blocks) {
            Ok(ms) => ms + self.space_to_depth_ms(&parts, &s2d)?,
            Err(e) => {
                tracing::warn!("fused stem kernel of '{}' left out: {e}", stem.name);
                return Ok(false);
            }
        };
        let separate = self.chosen_ms[i];
        let slower = separate.is_some_and(|s| ms >= s);
        if self.stem_pool != PathMode::Force && slower {
            self.note = format!(" [fused with the stem '{}' {ms:.4} ms]", stem.name);
            return Ok(false);
        }
        // The stem's steps give way to its copy and the one kernel, run here.
        let first = self.first_step[i];
        self.steps.truncate(first);
        self.descs.truncate(first);
        self.scratch[i] = 0;
        let copy = match quant {
            Some(qn) => {
                let q = &g.nodes[qn];
                let image = q.input(0).ok_or_else(|| unsupported(q, "no input"))?;
                self.late_reads.push((image, j));
                self.gen
                    .quantize_space_to_depth_into_scratch(g, q, &parts, &s2d, 0)?
            }
            None => {
                self.late_reads.push((x, j));
                self.gen.space_to_depth_into_scratch(x, &parts, &s2d, 0)
            }
        };
        self.launch(j, copy);
        let k = self
            .gen
            .stem_pool(Arg::ScratchAt(0), &s2d, (pool, y), blocks);
        self.launch(j, k);
        self.scratch[j] = alit(space_to_depth_bytes(&s2d));
        STEM_POOLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.note = format!(
            " with the stem '{}' {ms:.4} ms (stem {}){}",
            stem.name,
            separate.map_or("not timed".into(), |s| format!("{s:.4} ms")),
            if slower { ", forced" } else { "" }
        );
        Ok(true)
    }

    /// Measured milliseconds of the fused stem kernel ([`Gen::stem_pool`]) of `s2d` and
    /// `pool` into `y` over at most `blocks` blocks, without the copy (memoised per geometry,
    /// process-wide).
    pub(super) fn stem_pool_ms(
        &mut self,
        s2d: &QConvParts,
        (pool, y): (StemPool, ValueId),
        blocks: usize,
    ) -> Result<f32> {
        static CACHE: Memo<String, f32> = OnceLock::new();
        let key = format!("{:?} {pool:?} {blocks}", s2d.geom);
        memoised(&CACHE, key, || {
            let mut gen = Gen::new(false);
            let k = gen.stem_pool(Arg::ScratchAt(0), s2d, (pool, y), blocks);
            let c = &s2d.geom;
            let xb = alit(space_to_depth_bytes(s2d));
            let yb = alit(c.n * pool.oh * pool.ow * c.cout);
            let buf = self.tmp(xb + yb + 3 * ALIGNMENT)?.div_ceil(256) * 256;
            let place = |arg: Arg| match arg {
                Arg::ScratchAt(0) => Some(buf),
                Arg::Val(v) if v == y => Some(buf + xb as u64),
                _ => None,
            };
            // SAFETY: the kernel takes (blocks, pooled output, the stem's tables); the search
            // buffer holds the blocks and the output.
            unsafe { self.tabled_kernel_ms(&gen, &k, place, "fused stem") }
        })
    }

    /// Milliseconds of generated kernel `k` of `gen` (compiled on its own, its tables
    /// uploaded), warm: `Extra` arguments are the tables, the others where `place` puts them
    /// (an error names `what` when it puts one nowhere).
    ///
    /// # Safety
    /// `place` gives device buffers the kernel may read and write whole.
    pub(super) unsafe fn tabled_kernel_ms(
        &self,
        gen: &Gen,
        k: &GenKernel,
        place: impl Fn(Arg) -> Option<u64>,
        what: &str,
    ) -> Result<f32> {
        let module = Module::compile(self.ctx, &gen.src)?;
        let f = module.function(&k.name)?;
        let tables = upload_tables(self.ctx, &gen.extras)?;
        let args = k
            .args
            .iter()
            .map(|&arg| match arg {
                Arg::Extra(t) => tables
                    .get(t)
                    .map(|b| b.ptr())
                    .ok_or_else(|| Error::Unsupported(format!("{what} table missing"))),
                _ => place(arg).ok_or_else(|| Error::Unsupported(format!("{what} argument"))),
            })
            .collect::<Result<Vec<u64>>>()?;
        // SAFETY: as the caller vouches; the tables were uploaded.
        unsafe { self.function_ms(&f, k, &args) }
    }

    /// The fastest shape ([`B2B_SHAPES`]) of the back-to-back kernel of `p1` (input `x`) and
    /// `p2` that the device's shared memory allows, with its measured milliseconds (memoised
    /// per geometry, process-wide). A shape the device's compiler rejects is left out.
    pub(super) fn b2b_best(
        &mut self,
        p1: &QConvParts,
        p2: &QConvParts,
        x: ValueId,
        (y1, y2): (ValueId, ValueId),
    ) -> Result<(B2bShape, f32)> {
        static CACHE: Memo<String, (B2bShape, f32)> = OnceLock::new();
        let key = format!("{:?} {:?} {}", p1.geom, p2.geom, p1.residual.is_some());
        memoised(&CACHE, key, || {
            let mut best: Option<(B2bShape, f32)> = None;
            for shape in B2B_SHAPES {
                if b2b_smem(p1, p2, shape.stages) > self.smem_per_block {
                    continue;
                }
                match self.b2b_ms(p1, p2, x, (y1, y2), shape) {
                    Ok(ms) if best.is_none_or(|(_, b)| ms < b) => best = Some((shape, ms)),
                    Ok(_) => {}
                    Err(e) => tracing::warn!("back-to-back kernel {shape} left out: {e}"),
                }
            }
            best.ok_or_else(|| Error::Unsupported("no back-to-back kernel loaded".into()))
        })
    }

    /// Measured milliseconds of the back-to-back kernel of `p1` (input `x`) and `p2` in
    /// `shape`.
    pub(super) fn b2b_ms(
        &mut self,
        p1: &QConvParts,
        p2: &QConvParts,
        x: ValueId,
        (y1, y2): (ValueId, ValueId),
        shape: B2bShape,
    ) -> Result<f32> {
        let mut g = Gen::new(false);
        let k = g.qb2b(Arg::Val(x), (y1, y2), (p1, p2), shape);
        let (a, b) = (&p1.geom, &p2.geom);
        let px = a.n * a.h * a.w;
        let (xb, y1b, y2b) = (alit(px * a.cin), alit(px * a.cout), alit(px * b.cout));
        let buf = self.tmp(xb + 2 * y1b + y2b + 5 * ALIGNMENT)?.div_ceil(256) * 256;
        let z = p1.residual.map(|r| r.z);
        let place = |arg: Arg| match arg {
            Arg::Val(v) if v == x => Some(buf),
            Arg::Val(v) if v == y1 => Some(buf + xb as u64),
            Arg::Val(v) if v == y2 => Some(buf + (xb + y1b) as u64),
            Arg::Val(v) if Some(v) == z => Some(buf + (xb + y1b + y2b) as u64),
            _ => None,
        };
        // SAFETY: the kernel takes (x, y1, p1's tables, y2, p2's tables[, residual]); the
        // search buffer holds x, both outputs and the residual.
        unsafe { self.tabled_kernel_ms(&g, &k, place, "back-to-back") }
    }

    /// The steps of an int8 convolution: dense NHWC ones as the implicit GEMM or a signed
    /// im2col (channels padded to 4), one cuBLASLt int8 GEMM (int32 result in scratch) and a
    /// requantization pass, whichever measures faster; the rest (grouped, depthwise, NCHW, or
    /// when neither applies) as the direct dp4a kernel. All requantize exactly as the CPU
    /// backend does.
    pub(super) fn qconv_steps(
        &mut self,
        idx: usize,
        node: &Node,
        q: &crate::ir::QConvAttrs,
    ) -> Result<()> {
        let g = self.g;
        let parts = QConvParts::new(g, node, q)?;
        if q.conv.layout == Layout::Nhwc
            && parts.geom.groups == 1
            && self.q_gemm(idx, node, &parts)?
        {
            return Ok(());
        }
        if parts.residual.is_some() {
            return Err(unsupported(
                node,
                "a fused residual needs cuBLASLt's int8 GEMM, which found no algorithm",
            ));
        }
        let k = self.gen.qconv(g, node, q)?;
        self.launch(idx, k);
        Ok(())
    }

    /// An int8 Gemm: through cuBLASLt as a 1x1 convolution of M pixels (see [`Self::qconv`]),
    /// else the direct dp4a kernel.
    pub(super) fn qgemm(
        &mut self,
        idx: usize,
        node: &Node,
        q: &crate::ir::QGemmAttrs,
    ) -> Result<()> {
        let g = self.g;
        let parts = QConvParts::for_gemm(g, node, q)?;
        if self.q_gemm(idx, node, &parts)? {
            return Ok(());
        }
        let k = self.gen.qgemm(g, node, q)?;
        self.launch(idx, k);
        Ok(())
    }

    /// Emits a dense NHWC int8 convolution as the implicit-GEMM kernel or as im2col + cuBLASLt
    /// int8 GEMM + requantization, whichever measures faster; false (with the reason in the
    /// step's note) when neither applies.
    pub(super) fn q_gemm(&mut self, idx: usize, node: &Node, parts: &QConvParts) -> Result<bool> {
        let c = parts.geom;
        let x = node.input(0).ok_or_else(|| unsupported(node, "no input"))?;
        let y = node.outputs[0];
        // Stride-2 stems run over their space-to-depth copy: 16-byte copies, not byte gathers.
        let s2d = parts.space_to_depth().filter(|_| self.s2d);
        let ip = s2d.as_ref().unwrap_or(parts);
        let ig = match self.igemm {
            PathMode::Off => None,
            _ if !igemm_fits(ip) => None,
            _ => {
                let (t, ms) = self.igemm_best(ip, x, y)?;
                let copy = match &s2d {
                    Some(sp) => self.space_to_depth_ms(parts, sp)?,
                    None => 0.0,
                };
                Some((t, ms + copy))
            }
        };
        if let Some((t, ms)) =
            ig.filter(|_| self.igemm == PathMode::Force || self.lt_mode == PathMode::Off)
        {
            let why = if self.igemm == PathMode::Force {
                "forced"
            } else {
                "cuBLASLt off"
            };
            self.push_igemm(idx, (parts, s2d.as_ref()), (x, y), t, ms, why.into())?;
            return Ok(true);
        }
        if self.lt_mode == PathMode::Off {
            return Ok(false);
        }
        let (m, n, k) = (c.n * c.oh * c.ow, c.cout, c.kh * c.kw * parts.c4);
        // The GEMM reads a signed pointwise input itself (no patch matrix).
        let direct = parts.reads_input_in_place();
        let colb = if direct { 0 } else { alit(m * k) };
        let mut fallback = String::new();
        let mut fused = None;
        if let Some(relu) = fused_requant(&parts.epi).filter(|_| self.qfuse) {
            // The requantization in the GEMM's epilogue (int8 result, no int32 round trip):
            // weights, then the alpha vector, then the f32 bias, in one device buffer.
            let (alpha, bias) = requant_vectors(parts);
            let at = parts.packed.len().next_multiple_of(256);
            let bt = at + (4 * n).next_multiple_of(256);
            let mut bytes = parts.packed.clone();
            bytes.resize(at, 0);
            bytes.extend(alpha.iter().flat_map(|v| v.to_le_bytes()));
            bytes.resize(bt, 0);
            bytes.extend(bias.iter().flat_map(|v| v.to_le_bytes()));
            let wbuf = DeviceBuffer::upload(self.ctx, &bytes)?;
            let shape = PointwiseShape {
                m,
                n,
                k,
                half: false,
                int8: true,
                requant: true,
                epilogue: Epilogue {
                    bias: true,
                    residual: parts.residual.is_some(),
                    relu,
                },
            };
            let yb = alit(m * n);
            let t = self.tmp(colb + yb + BLAS_WS + 3 * ALIGNMENT + 256)? + ALIGNMENT as u64;
            let bufs = q_search_buffers(t, wbuf.ptr(), colb, yb);
            let (ap, bp) = (wbuf.ptr() + at as u64, wbuf.ptr() + bt as u64);
            let beta = parts.residual.map_or(0.0, |r| r.beta);
            match LtMatmul::build(self.lt, shape, bp, (ap, beta), self.stream, &bufs) {
                Ok(mm) => fused = Some((mm, wbuf)),
                Err(e) => fallback = format!(" (fused requantization: {e})"),
            }
        }
        let shape = PointwiseShape {
            m,
            n,
            k,
            half: false,
            int8: true,
            requant: false,
            epilogue: Epilogue {
                bias: false,
                residual: false,
                relu: false,
            },
        };
        let accb = alit(m * n * 4);
        let wbuf = DeviceBuffer::upload(self.ctx, &parts.packed)?;
        // After the workspace: the int8 output of the requantization kernel's timing.
        let t =
            self.tmp(colb + accb + BLAS_WS + alit(m * n) + 3 * ALIGNMENT + 512)? + ALIGNMENT as u64;
        let bufs = q_search_buffers(t, wbuf.ptr(), colb, accb);
        let split = LtMatmul::build(self.lt, shape, 0, (0, 0.0), self.stream, &bufs);
        // The fused GEMM against the int32 GEMM plus its requantization kernel, both measured:
        // small GEMMs (batch 1) can be faster split, as the alpha-vector kernels are fewer.
        let split_ms = match &split {
            Ok(mm) => {
                let yq = (bufs.ws + BLAS_WS as u64).div_ceil(256) * 256;
                mm.time_ms + self.requant_ms(parts, node.outputs[0], (bufs.y, 1), yq)?
            }
            Err(_) => f32::INFINITY,
        };
        let fused = fused.filter(|(mm, _)| mm.time_ms <= split_ms);
        if let Some((t, ms)) = ig {
            // Against the cuBLASLt path: its GEMM(s) plus the unfold when there is one.
            let unfold = if direct {
                0.0
            } else {
                self.qunfold_ms(parts, m * k)?
            };
            let lt = fused.as_ref().map_or(split_ms, |(mm, _)| mm.time_ms) + unfold;
            if ms < lt + self.library_step_ms {
                let why = format!("cublasLt {lt:.4} ms");
                self.push_igemm(idx, (parts, s2d.as_ref()), (x, y), t, ms, why)?;
                return Ok(true);
            }
        }
        let ig_note = ig.map_or(String::new(), |(t, ms)| format!(" [igemm {t} {ms:.4} ms]"));
        if let Some((mm, wbuf)) = fused {
            self.note = format!(
                " cublasLt int8 requant{} ws {} KiB {:.4} ms (split {split_ms:.4} ms) m{m} n{n} k{k}{ig_note}",
                if direct { "" } else { " im2col" },
                mm.workspace >> 10,
                mm.time_ms
            );
            let z = parts.residual.map(|r| Arg::Val(r.z));
            self.chosen_ms[idx] = direct.then_some(mm.time_ms);
            self.push_q_gemm(idx, parts, (x, direct), (Arg::Val(y), z), wbuf, mm);
            self.scratch[idx] = colb;
            return Ok(true);
        }
        match split {
            Ok(mm) => {
                self.note = format!(
                    " cublasLt int8 im2col ws {} KiB {:.4} ms (+ requantization, {split_ms:.4} ms) m{m} n{n} k{k}{fallback}{ig_note}",
                    mm.workspace >> 10,
                    mm.time_ms
                );
                self.push_q_gemm(
                    idx,
                    parts,
                    (x, direct),
                    (Arg::ScratchAt(colb), None),
                    wbuf,
                    mm,
                );
                let kr = self.gen.qrequant(y, colb, parts, 1);
                self.launch(idx, kr);
                self.scratch[idx] = colb + accb;
                self.chosen_ms[idx] = direct.then_some(split_ms);
                Ok(true)
            }
            Err(e) => {
                self.note = format!(" direct dp4a (cuBLASLt int8: {e}){fallback}");
                Ok(false)
            }
        }
    }

    /// Emits an int8 GEMM step reading `x` (in place when `direct`, else through the unfold
    /// into scratch) and writing `y` (with the residual `z` through cuBLASLt's C).
    pub(super) fn push_q_gemm(
        &mut self,
        idx: usize,
        parts: &QConvParts,
        (x, direct): (ValueId, bool),
        (y, z): (Arg, Option<Arg>),
        w: DeviceBuffer,
        mm: LtMatmul,
    ) {
        let a = if direct {
            Arg::Val(x)
        } else {
            let kc = self.gen.qim2col_into_scratch(x, parts);
            self.launch(idx, kc);
            Arg::ScratchAt(0)
        };
        self.steps.push(Step::Pointwise(Box::new(PointwiseStep {
            node: idx,
            x: a,
            y,
            z,
            w,
            mm,
        })));
    }

    /// Emits the implicit-GEMM kernel (tiling `t`, measured `ms`) for QConv `parts`, over the
    /// space-to-depth copy of its input when `s2d` (its stride-1 form) is given.
    pub(super) fn push_igemm(
        &mut self,
        idx: usize,
        (parts, s2d): (&QConvParts, Option<&QConvParts>),
        (x, y): (ValueId, ValueId),
        t: Tiling,
        ms: f32,
        against: String,
    ) -> Result<()> {
        let c = parts.geom;
        self.note = format!(
            " igemm {t}{} {ms:.4} ms ({against}) m{} n{} k{}",
            if s2d.is_some() { " space-to-depth" } else { "" },
            c.n * c.oh * c.ow,
            c.cout,
            c.kh * c.kw * c.cin
        );
        self.chosen_ms[idx] = Some(ms);
        let kp = s2d.unwrap_or(parts);
        // Scratch: the split K's partial sums, then the space-to-depth copy.
        let partials = partial_bytes(kp, &t);
        let xa = match s2d {
            Some(sp) => {
                let k = match self.stem_input.take() {
                    Some((q, _)) => self.gen.quantize_space_to_depth_into_scratch(
                        self.g,
                        &self.g.nodes[q],
                        parts,
                        sp,
                        partials,
                    )?,
                    None => self.gen.space_to_depth_into_scratch(x, parts, sp, partials),
                };
                self.launch(idx, k);
                Arg::ScratchAt(partials)
            }
            None => Arg::Val(x),
        };
        let maps = self.gen.maps.len();
        let k = self.gen.qigemm(xa, y, kp, t);
        // A tensor map over the space-to-depth copy addresses this node's scratch.
        for m in &mut self.gen.maps[maps..] {
            m.node = idx;
        }
        self.launch(idx, k);
        if t.serial {
            SERIAL_SPLITS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        if t.clustered() {
            MULTICASTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.scratch[idx] = partials + s2d.map_or(0, |sp| alit(space_to_depth_bytes(sp)));
        if t.partials() {
            let kr = self.gen.qrequant(y, 0, kp, t.splits);
            self.launch(idx, kr);
        }
        Ok(())
    }

    /// Split-K versions of the implicit GEMM worth timing for `parts`: long K (16 tiles of 64
    /// or more) whose 128×128 grid would leave SMs idle, with at most 16 MiB of partial sums.
    pub(super) fn split_tilings(&self, parts: &QConvParts) -> Vec<Tiling> {
        let c = parts.geom;
        let (m, n) = (c.n * c.oh * c.ow, c.cout);
        let kt = (c.kh * c.kw * parts.c4).div_ceil(64);
        let (gx, gy) = TILINGS[0].grid(m, n);
        if self.splitk == PathMode::Off || kt < 16 || gx * gy >= 2 * self.sms {
            return Vec::new();
        }
        let base = if self.wgmma == PathMode::Off {
            [TILINGS[0], TILINGS[2]]
        } else {
            [WG_TILINGS[1], WG_TILINGS[2]]
        };
        let mut split: Vec<Tiling> = base
            .iter()
            .flat_map(|t| [t.split(2), t.split(4)])
            .filter(|t| kt / t.splits >= 4 && partial_bytes(parts, t) <= 16 << 20)
            .collect();
        // On Hopper the split can also stay inside a cluster (no partial buffers, no
        // requantization pass): the 128×128 and 64×128 wgmma tilings over 2 or 4 blocks.
        if self.wgmma != PathMode::Off && self.cluster != PathMode::Off {
            if self.cluster == PathMode::Force {
                split.clear();
            }
            split.extend(
                [WG_TILINGS[1], WG_TILINGS[3]]
                    .iter()
                    .flat_map(|t| [t.split_in_cluster(2), t.split_in_cluster(4)])
                    .filter(|t| kt / t.splits >= 4),
            );
        }
        split
    }

    /// Persistent versions of the implicit GEMM worth timing for `parts`: short K (at most 8
    /// tiles of 64, the 1x1 convolutions whose time goes to moving activations), as many
    /// blocks as the SMs hold at once (estimated from shared memory, threads and registers).
    pub(super) fn persistent_tilings(&self, parts: &QConvParts) -> Vec<Tiling> {
        let c = parts.geom;
        let kt = (c.kh * c.kw * parts.c4).div_ceil(64);
        if self.persist == PathMode::Off || kt > 8 {
            return Vec::new();
        }
        let base: &[Tiling] = if self.wgmma == PathMode::Off {
            &[TILINGS[1], TILINGS[3]]
        } else {
            &[TILINGS[1], TILINGS[3], WG_TILINGS[1], WG_TILINGS[2]]
        };
        base.iter()
            .map(|t| {
                let by_smem = self.smem_blocks(t.persistent_smem(kt)).unwrap_or(0);
                let by_regs = if t.threads() > 128 { 2 } else { 4 };
                let per_sm = by_smem.min(2048 / t.threads()).min(by_regs).max(1);
                t.persistent(self.sms * per_sm)
            })
            .collect()
    }

    /// Warp-specialized versions of `tilings` worth timing for `parts`: the 128×128, 128×64
    /// and 64×128 wgmma tilings and their partial-sum K splits with two loader warps, and the
    /// 128×128 one with four, for K of 8 tiles of 64 or more (the 3x3 convolutions and the
    /// widest 1x1s), where the block barrier per K tile might hold up the tensor cores.
    pub(super) fn ws_tilings(&self, parts: &QConvParts, tilings: &[Tiling]) -> Vec<Tiling> {
        let c = parts.geom;
        let kt = (c.kh * c.kw * parts.c4).div_ceil(64);
        if self.ws == PathMode::Off || self.wgmma == PathMode::Off || kt < 8 {
            return Vec::new();
        }
        let base = [WG_TILINGS[1], WG_TILINGS[2], WG_TILINGS[3]];
        let splits = tilings
            .iter()
            .filter(|t| t.wgmma && t.partials() && base.contains(&t.split(1)));
        // Two loader warps keep two 128×128 blocks within an SM's registers; four load faster.
        let mut ws: Vec<Tiling> = base
            .iter()
            .chain(splits)
            .map(|t| t.warp_specialized(2))
            .collect();
        ws.push(WG_TILINGS[1].warp_specialized(4));
        ws
    }

    /// Halo tilings worth timing for `parts` (see [`super::codegen::halo_fits`]): those whose
    /// channel block divides its output channels, and the 64-channel ones as persistent
    /// blocks, as many as the SMs hold at once (by shared memory, threads and about 80
    /// registers a thread), which load a tile while they store the one before (only those
    /// with `VIGIL_CUDA_PERSIST=force`).
    pub(super) fn halo_tilings(&self, parts: &QConvParts) -> Vec<Tiling> {
        if self.halo == PathMode::Off || self.wgmma == PathMode::Off || !halo_fits(parts) {
            return Vec::new();
        }
        let fits = |t: &&Tiling| parts.geom.cout.is_multiple_of(t.bn());
        let persistent = [HALO_TILINGS[0], HALO_TILINGS[2]];
        let persistent = persistent
            .iter()
            .filter(fits)
            .map(|t| self.persistent_halo(parts, *t));
        if self.persist == PathMode::Force {
            return persistent.collect();
        }
        HALO_TILINGS
            .iter()
            .filter(fits)
            .copied()
            .chain(persistent)
            .collect()
    }

    /// Halo tiling `t` as persistent blocks for `parts`: as many as the SMs hold at once, by
    /// shared memory and by registers (about 80 a thread).
    pub(super) fn persistent_halo(&self, parts: &QConvParts, t: Tiling) -> Tiling {
        let by_smem = self.smem_blocks(igemm_smem(parts, t.persistent(1)));
        let by_regs = 65536 / (80 * t.threads());
        let per_sm = by_smem.unwrap_or(1).min(by_regs).max(1);
        t.persistent(self.sms * per_sm)
    }

    /// Deeper-ring tilings worth timing for `parts` (`VIGIL_CUDA_DEEP`): the wgmma ones,
    /// and where it fits the halo kernel, the halo ones, block per tile and persistent.
    pub(super) fn deep_tilings(&self, parts: &QConvParts) -> Vec<Tiling> {
        if self.deep == PathMode::Off || self.wgmma == PathMode::Off {
            return Vec::new();
        }
        let mut out = DEEP_WG_TILINGS.to_vec();
        if self.halo != PathMode::Off && halo_fits(parts) {
            let fits = |t: &&Tiling| parts.geom.cout.is_multiple_of(t.bn());
            for t in DEEP_HALO_TILINGS.iter().filter(fits) {
                out.extend([*t, self.persistent_halo(parts, *t)]);
            }
        }
        out
    }

    /// TMA-fed versions of the wgmma tilings (the deeper rings too, where those are timed)
    /// worth timing for `parts` (`VIGIL_CUDA_TMA`): 1x1 stride-1 convolutions only.
    pub(super) fn tma_tilings(&self, parts: &QConvParts) -> Vec<Tiling> {
        if self.tma == PathMode::Off || self.wgmma == PathMode::Off || !tma_fits(parts) {
            return Vec::new();
        }
        let deep = if self.deep == PathMode::Off {
            &[][..]
        } else {
            &DEEP_WG_TILINGS[..]
        };
        WG_TILINGS
            .iter()
            .chain(deep)
            .map(|t| t.with_tma())
            .collect()
    }

    /// Multicast versions of the TMA tilings among `tilings` worth timing for `parts`
    /// (`VIGIL_CUDA_MULTICAST`): [`multicast_versions`].
    pub(super) fn multicast_tilings(&self, parts: &QConvParts, tilings: &[Tiling]) -> Vec<Tiling> {
        if self.multicast == PathMode::Off {
            return Vec::new();
        }
        let (m, n) = (
            parts.geom.n * parts.geom.oh * parts.geom.ow,
            parts.geom.cout,
        );
        multicast_versions(tilings, m, n)
    }

    /// Serial K splits worth timing for `parts` ([`serial_tilings`]; TMA-fed too where
    /// `tilings` has those), on as many blocks of each as the SMs hold by shared memory (at
    /// most two an SM).
    pub(super) fn serial_tilings(&self, parts: &QConvParts, tilings: &[Tiling]) -> Vec<Tiling> {
        if self.serial == PathMode::Off || self.wgmma == PathMode::Off {
            return Vec::new();
        }
        let tma = tilings.iter().any(|t| t.tma);
        serial_tilings(parts, tma, |t| {
            let per_sm = self.smem_blocks(igemm_smem(parts, t)).unwrap_or(1);
            self.sms * per_sm.clamp(1, 2)
        })
    }

    /// Resident-block versions worth timing for `parts`: the 64×128 and 128×64 `mma.sync`
    /// tilings over 3-stage rings and the 128×64 wgmma one over 4 stages, each for 4 blocks
    /// per SM (at most 64 registers a thread: ptxas spills a few `mma.sync` ones, and rejects
    /// the wgmma tilings' caps below their accumulators, so 5 blocks and the 128×128 wgmma
    /// tiling are not tried); each only where its shared memory lets that many blocks in.
    pub(super) fn resident_tilings(&self, parts: &QConvParts) -> Vec<Tiling> {
        if self.resident == PathMode::Off {
            return Vec::new();
        }
        let mut base = vec![(TILINGS[1], 3, 4), (TILINGS[3], 3, 4)];
        if self.wgmma != PathMode::Off {
            base.push((WG_TILINGS[2], 4, 4));
        }
        base.into_iter()
            .map(|(t, stages, blocks)| Tiling { stages, ..t }.resident(blocks))
            .filter(|t| {
                self.smem_blocks(igemm_smem(parts, *t))
                    .is_none_or(|b| b >= t.min_blocks)
            })
            .collect()
    }

    /// Blocks of `bytes` dynamic shared memory one SM holds (each also costs 1 KiB the system
    /// reserves); None when the device does not say how much it has.
    pub(super) fn smem_blocks(&self, bytes: usize) -> Option<usize> {
        (self.smem_per_sm > 0).then(|| self.smem_per_sm / (bytes + 1024))
    }

    /// The fastest implicit-GEMM tiling for QConv `parts` and its measured milliseconds (each
    /// tiling compiled on its own thread, as NVRTC takes most of the time, then loaded and
    /// timed in turn; memoised per geometry, residual and tiling set, process-wide).
    pub(super) fn igemm_best(
        &mut self,
        parts: &QConvParts,
        x: ValueId,
        y: ValueId,
    ) -> Result<(Tiling, f32)> {
        static CACHE: Memo<String, (Tiling, f32)> = OnceLock::new();
        let c = parts.geom;
        let mut tilings: Vec<Tiling> = match self.wgmma {
            PathMode::Off => TILINGS.to_vec(),
            PathMode::Measured => TILINGS.iter().chain(&WG_TILINGS).copied().collect(),
            PathMode::Force => WG_TILINGS.to_vec(),
        };
        self.splitk
            .add_candidates(&mut tilings, self.split_tilings(parts));
        self.persist
            .add_candidates(&mut tilings, self.persistent_tilings(parts));
        self.deep
            .add_candidates(&mut tilings, self.deep_tilings(parts));
        let ws = self.ws_tilings(parts, &tilings);
        self.ws.add_candidates(&mut tilings, ws);
        self.halo
            .add_candidates(&mut tilings, self.halo_tilings(parts));
        self.resident
            .add_candidates(&mut tilings, self.resident_tilings(parts));
        self.tma
            .add_candidates(&mut tilings, self.tma_tilings(parts));
        let multicast = self.multicast_tilings(parts, &tilings);
        let multicast_timed = !multicast.is_empty();
        self.multicast.add_candidates(&mut tilings, multicast);
        let serial = self.serial_tilings(parts, &tilings);
        let serial_timed = !serial.is_empty();
        self.serial.add_candidates(&mut tilings, serial);
        tilings.retain(|&t| igemm_smem(parts, t) <= self.smem_per_block);
        let mut key = format!(
            "{c:?} {} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
            parts.residual.is_some(),
            self.wgmma,
            self.splitk,
            self.persist,
            self.cluster,
            self.ws,
            self.halo,
            self.resident
        );
        if self.deep != PathMode::Off {
            // Only then: with the knob off, timing caches written before it still hit.
            key.push_str(&format!(" deep {:?}", self.deep));
        }
        if self.tma != PathMode::Off && tma_fits(parts) {
            key.push_str(&format!(" tma {:?}", self.tma));
        }
        if serial_timed {
            // Only where it adds candidates: other convolutions keep their cached choices.
            key.push_str(&format!(" serial {:?}", self.serial));
        }
        if multicast_timed {
            key.push_str(&format!(" multicast {:?}", self.multicast));
        }
        memoised(&CACHE, key.clone(), || {
            // The disk cache's choice, where it is one of this convolution's candidates.
            let disk = timing_cache::process_cache();
            let cached = disk
                .and_then(|c| c.lock().ok()?.get(&self.device_id, &key))
                .filter(|(t, _)| tilings.contains(t));
            if let Some(hit) = cached {
                return Ok(hit);
            }
            let ctx = self.ctx;
            let gens: Vec<(Tiling, Gen, GenKernel)> = tilings
                .iter()
                .map(|&t| {
                    let mut g = Gen::new(false);
                    let k = g.qigemm(Arg::Val(x), y, parts, t);
                    (t, g, k)
                })
                .collect();
            let ptx = compile_all(ctx, gens.iter().map(|(_, g, _)| g.src.as_str()))?;
            let (xb, yb) = (
                alit(c.n * c.h * c.w * c.cin),
                alit(c.n * c.oh * c.ow * c.cout),
            );
            // After x: the output, or the split K's partial sums, then the int8 output of
            // their requantization.
            let pb = tilings.iter().map(|t| partial_bytes(parts, t)).max();
            let pb = pb.unwrap_or(0).max(yb);
            let buf = self.tmp(xb + pb + yb + 3 * ALIGNMENT)?.div_ceil(256) * 256;
            // A serial split's workspace after the output, and its tile counters (zeroed; each
            // run leaves them zero), only where one is timed.
            let ws = buf + (xb + yb) as u64;
            let (gx, gy) = TILINGS[2].grid(c.n * c.oh * c.ow, c.cout);
            let counters = if serial_timed {
                Some(DeviceBuffer::upload(ctx, &vec![0u8; 4 * gx * gy])?)
            } else {
                None
            };
            let counters = counters.as_ref().map_or(0, DeviceBuffer::ptr);
            let mut best: Option<(Tiling, f32)> = None;
            let log_timings = std::env::var("VIGIL_CUDA_TIMING_LOG").is_ok_and(|v| v == "1");
            for ((t, g, k), ptx) in gens.into_iter().zip(ptx) {
                // A candidate this device's compiler rejects (say, registers capped below
                // what its wgmma accumulators need) is left out, not fatal.
                let module = match ptx.and_then(|ptx| Module::load(ctx, &ptx)) {
                    Ok(module) => module,
                    Err(e) => {
                        tracing::warn!("implicit-GEMM tiling {t} left out: {e}");
                        continue;
                    }
                };
                let f = module.function(&k.name)?;
                // The kernel's tables are its three extras (weights, bias, multiplier).
                let tables = upload_tables(ctx, &g.extras)?;
                let (args, _maps) =
                    igemm_args(ctx, (&g, parts, &t), (buf, xb), &tables, (ws, counters))?;
                // SAFETY: the kernel takes (x, y or partial sums, weights, bias,
                // multiplier[, residual][, tensor maps of x and the weights]): the search
                // buffer holds x's bytes and the largest output, the tables and maps were
                // uploaded.
                let mut ms = unsafe { self.function_ms(&f, &k, &args) }?;
                if t.partials() {
                    let sums = (buf + xb as u64, t.splits);
                    ms += self.requant_ms(parts, y, sums, buf + (xb + pb) as u64)?;
                }
                if log_timings {
                    // A diagnostic (`VIGIL_CUDA_TIMING_LOG=1`): every candidate's time.
                    eprintln!(
                        "TIMING {}x{} s{} cin{} cout{} n{} {}res {t} {:.2} us",
                        c.kh,
                        c.kw,
                        c.sh,
                        c.cin,
                        c.cout,
                        c.n * c.oh * c.ow,
                        if parts.residual.is_some() { "" } else { "no " },
                        ms * 1000.0
                    );
                }
                if best.is_none_or(|(_, b)| ms < b) {
                    best = Some((t, ms));
                }
            }
            let best = best.ok_or_else(|| Error::Unsupported("no implicit-GEMM tiling".into()))?;
            if std::env::var("VIGIL_CUDA_WS_PROBE").is_ok_and(|v| v == "1") {
                // A diagnostic: its failure never fails the build.
                if let Err(e) = self.print_probes(parts, (x, y), best, buf, xb) {
                    eprintln!("WSPROBE {:?} failed: {e}", parts.geom);
                }
            }
            if let Some(Err(e)) = disk
                .and_then(|c| c.lock().ok())
                .map(|mut c| c.record(&self.device_id, &key, best))
            {
                tracing::warn!("CUDA timing cache not written: {e}");
            }
            Ok(best)
        })
    }

    /// `VIGIL_CUDA_WS_PROBE=1`: times `best`'s tiling of QConv `parts` (timed at `ms`) again
    /// as each [`Probe`] variant, on the search buffer `buf` (x's `xb` bytes, then the output),
    /// and prints a `WSPROBE` line to stderr: which side of the kernel bounds it. Diagnostics
    /// only; the plan keeps the real kernel.
    pub(super) fn print_probes(
        &mut self,
        parts: &QConvParts,
        (x, y): (ValueId, ValueId),
        (t, ms): (Tiling, f32),
        buf: u64,
        xb: usize,
    ) -> Result<()> {
        if t.partials() || t.serial || !t.wgmma {
            return Ok(());
        }
        let mut g = Gen::new(false);
        let k = g.qigemm(Arg::Val(x), y, parts, t);
        let tables = upload_tables(self.ctx, &g.extras)?;
        let (args, _maps) = igemm_args(self.ctx, (&g, parts, &t), (buf, xb), &tables, (0, 0))?;
        // SAFETY (both timings, each variant): it takes the real kernel's parameters, and
        // `args` are those (x and output in the search buffer, the uploaded tables, the
        // residual, the tensor maps).
        let gms = unsafe { self.graph_ms(&Module::compile(self.ctx, &g.src)?, &k, &args) }?;
        let mut line = format!("WSPROBE {:?} {t} full {:.4}/{gms:.4}", parts.geom, ms);
        for p in Probe::ALL {
            let Some(src) = probe_variant(&g.src, p) else {
                line.push_str(&format!(" {p:?} -"));
                continue;
            };
            let module = Module::compile(self.ctx, &src)?;
            let pms = unsafe { self.function_ms(&module.function(&k.name)?, &k, &args) }?;
            let gms = unsafe { self.graph_ms(&module, &k, &args) }?;
            line.push_str(&format!(" {p:?} {pms:.4}/{gms:.4}"));
        }
        eprintln!("{line}");
        Ok(())
    }

    /// Milliseconds of one launch of kernel `k` of `module`, on `args`, within a CUDA
    /// graph of [`PROBE_GRAPH_REPS`] launches back to back (as programmatic dependents where
    /// that is on) on a stream of its own (the builder's legacy stream cannot be captured):
    /// without the host's launch cost between them, which [`Self::function_ms`]'s separate
    /// launches pay (a kernel that returns at once measured 3–6 µs there on the H200 host).
    /// For the probe only.
    ///
    /// # Safety
    /// As for [`Self::kernel_ms`].
    pub(super) unsafe fn graph_ms(
        &self,
        module: &Module,
        k: &GenKernel,
        args: &[u64],
    ) -> Result<f32> {
        let f = module.function(&k.name)?;
        let d = launch_dims(k);
        allow_smem(&f, &d)?;
        let own = self.ctx.new_stream().map_err(drv_err("stream creation"))?;
        let s = own.cu_stream();
        let overlap = programmatic_launch_allowed();
        let mut ptrs: Vec<*mut c_void> = args
            .iter()
            .map(|a| a as *const u64 as *mut c_void)
            .collect();
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: a live stream of this thread's, captured on this thread only.
        unsafe { drv::stream::begin_capture(s, mode) }.map_err(drv_err("begin capture"))?;
        let mut launched = Ok(());
        for _ in 0..PROBE_GRAPH_REPS {
            // SAFETY: the caller vouches for `args`; the grid covers the kernel's items.
            launched = unsafe { f.launch((d.grid, d.block, d.smem), s, &mut ptrs, overlap) };
            if launched.is_err() {
                break;
            }
        }
        // SAFETY: ends the capture begun above (also after a failed launch).
        let graph = unsafe { drv::stream::end_capture(s) }.map_err(drv_err("end capture"))?;
        let timed = launched.and_then(|()| {
            let flags = sys::CUgraphInstantiate_flags(0);
            // SAFETY: the graph was just captured.
            let exec = unsafe { drv::graph::instantiate(graph, flags) }
                .map_err(drv_err("graph instantiate"))?;
            let ms = time_warm(s, || {
                // SAFETY: a live executable graph and stream.
                unsafe { drv::graph::launch(exec, s) }.map_err(drv_err("graph launch"))
            });
            // SAFETY: time_warm synchronised on its last event; destroyed once.
            let _ = unsafe { drv::graph::exec_destroy(exec) };
            ms
        });
        // SAFETY: destroyed once, after its executable.
        let _ = unsafe { drv::graph::destroy(graph) };
        Ok(timed? / PROBE_GRAPH_REPS as f32)
    }

    /// Measured milliseconds of the space-to-depth copy of QConv `parts`' input for `s2d`
    /// (memoised per geometry, process-wide).
    pub(super) fn space_to_depth_ms(
        &mut self,
        parts: &QConvParts,
        s2d: &QConvParts,
    ) -> Result<f32> {
        static CACHE: Memo<String, f32> = OnceLock::new();
        let c = parts.geom;
        memoised(&CACHE, format!("{c:?} {}", parts.flip), || {
            let mut g = Gen::new(false);
            let k = g.space_to_depth_into_scratch(0, parts, s2d, 0);
            let xb = alit(c.n * c.h * c.w * c.cin);
            let sb = alit(space_to_depth_bytes(s2d));
            let buf = self.tmp(xb + sb + 2 * ALIGNMENT)?.div_ceil(256) * 256;
            // SAFETY: the kernel takes (x, its copy): the search buffer holds both.
            unsafe { self.kernel_ms(&g, &k, &[buf, buf + xb as u64]) }
        })
    }

    /// Measured milliseconds of the int8 unfold of `parts` into a `col_bytes` patch matrix
    /// (memoised per geometry, process-wide).
    pub(super) fn qunfold_ms(&mut self, parts: &QConvParts, col_bytes: usize) -> Result<f32> {
        static CACHE: Memo<String, f32> = OnceLock::new();
        let c = parts.geom;
        memoised(&CACHE, format!("{c:?} {}", parts.flip), || {
            let mut g = Gen::new(false);
            let k = g.qim2col_into_scratch(0, parts);
            let xb = alit(c.n * c.h * c.w * c.cin);
            let buf = self
                .tmp(xb + alit(col_bytes) + 2 * ALIGNMENT)?
                .div_ceil(256)
                * 256;
            // SAFETY: the kernel takes (x, col): the search buffer holds both.
            unsafe { self.kernel_ms(&g, &k, &[buf, buf + xb as u64]) }
        })
    }

    /// Measured milliseconds of the requantization kernel of `parts` from int32 sums at `acc`
    /// (`splits` partial buffers) into int8 at `y` (compiled on its own; memoised per output
    /// shape, residual and split, process-wide).
    pub(super) fn requant_ms(
        &mut self,
        parts: &QConvParts,
        yv: ValueId,
        (acc, splits): (u64, usize),
        y: u64,
    ) -> Result<f32> {
        static CACHE: Memo<(usize, usize, bool, usize), f32> = OnceLock::new();
        let m = parts.geom.n * parts.geom.oh * parts.geom.ow;
        let key = (m, parts.geom.cout, parts.residual.is_some(), splits);
        memoised(&CACHE, key, || {
            let mut g = Gen::new(false);
            let k = g.qrequant(yv, 0, parts, splits);
            let tables = g
                .extras
                .iter()
                .map(|b| DeviceBuffer::upload(self.ctx, b))
                .collect::<Result<Vec<_>>>()?;
            let mut args = vec![acc, y];
            args.extend(tables.iter().map(|t| t.ptr()));
            if parts.residual.is_some() {
                // The residual's bytes: any int8 buffer of the output's size.
                args.push(y);
            }
            // SAFETY: the kernel takes (sums, output, bias table, multiplier table[, residual]):
            // the search buffer holds the int32 sums and the int8 output, the tables were uploaded.
            unsafe { self.kernel_ms(&g, &k, &args) }
        })
    }

    /// Measured milliseconds of the im2col kernel for `unfold` from `x` into `col` (compiled
    /// on its own for the measurement; memoised per geometry and precision, process-wide).
    pub(super) fn im2col_ms(&mut self, unfold: &Im2col, x: u64, col: u64) -> Result<f32> {
        static CACHE: Memo<(Im2col, bool), f32> = OnceLock::new();
        memoised(&CACHE, (*unfold, self.fp16), || {
            let mut g = Gen::new(self.fp16);
            let k = g.im2col_into_scratch(0, unfold);
            // SAFETY: the kernel takes (x, col); both search buffers hold the unfold's bytes.
            unsafe { self.kernel_ms(&g, &k, &[x, col]) }
        })
    }

    /// Milliseconds of generated kernel `k` of `g` (compiled on its own), warm, on `args`.
    ///
    /// # Safety
    /// `args` are `k`'s parameters in order: device buffers it may read and write whole.
    pub(super) unsafe fn kernel_ms(&self, g: &Gen, k: &GenKernel, args: &[u64]) -> Result<f32> {
        // SAFETY: as the caller vouches.
        unsafe { self.source_ms(&g.src, k, args) }
    }

    /// Milliseconds of kernel `k` compiled from module source `src`, warm, on `args`.
    ///
    /// # Safety
    /// As for [`Self::kernel_ms`].
    pub(super) unsafe fn source_ms(&self, src: &str, k: &GenKernel, args: &[u64]) -> Result<f32> {
        let module = Module::compile(self.ctx, src)?;
        let f = module.function(&k.name)?;
        // SAFETY: as the caller vouches.
        unsafe { self.function_ms(&f, k, args) }
    }

    /// Milliseconds of `f`, the compiled kernel `k`, warm, on `args`.
    ///
    /// # Safety
    /// As for [`Self::kernel_ms`].
    pub(super) unsafe fn function_ms(
        &self,
        f: &Function,
        k: &GenKernel,
        args: &[u64],
    ) -> Result<f32> {
        let d = launch_dims(k);
        allow_smem(f, &d)?;
        let s = self.stream;
        time_warm(s, || {
            let mut ptrs: Vec<*mut c_void> = args
                .iter()
                .map(|a| a as *const u64 as *mut c_void)
                .collect();
            // SAFETY: the caller vouches for `args`; the grid covers the kernel's items.
            unsafe { drv::launch_kernel(f.0, d.grid, (d.block, 1, 1), d.smem, s, &mut ptrs) }
                .map_err(drv_err("kernel launch"))
        })
    }

    pub(super) fn gemm(&mut self, idx: usize, node: &Node) -> Result<()> {
        let g = self.g;
        let a = node.input(0).ok_or_else(|| unsupported(node, "no A"))?;
        let b = node.input(1).ok_or_else(|| unsupported(node, "no B"))?;
        let y = node.outputs[0];
        let as_ = g.shape(a)?.to_vec();
        let bs = g.shape(b)?.to_vec();
        let ys = g.shape(y)?.to_vec();
        for v in [a, b] {
            if g.values[v].dtype != crate::ir::DataType::F32 {
                return Err(unsupported(node, "non-f32 operands"));
            }
        }
        match &node.op {
            Op::Gemm {
                alpha,
                beta,
                trans_a,
                trans_b,
                activation,
            } => {
                if as_.len() != 2 || bs.len() != 2 {
                    return Err(unsupported(node, "Gemm operands must be 2-D"));
                }
                let (m, k) = if *trans_a {
                    (as_[1], as_[0])
                } else {
                    (as_[0], as_[1])
                };
                let n = if *trans_b { bs[0] } else { bs[1] };
                self.steps.push(Step::Gemm(GemmStep {
                    node: idx,
                    a: Arg::Val(a),
                    b: Arg::Val(b),
                    y,
                    ta: *trans_a,
                    tb: *trans_b,
                    m,
                    n,
                    k,
                    alpha: *alpha,
                    batch: 1,
                    stride: [0; 3],
                }));
                let c = node
                    .input(2)
                    .map(|cv| g.shape(cv).map(|s| (Arg::Val(cv), s.to_vec(), *beta)))
                    .transpose()?;
                if c.is_some() || activation.is_some() {
                    let k = self.gen.gemm_epilogue(y, &ys, c, *activation);
                    self.launch(idx, k);
                }
                Ok(())
            }
            _ => {
                // numpy matmul: a 1-D A is a row [1, K], a 1-D B a column [K, 1] (the unit
                // axis is absent from Y, which does not change its layout).
                if as_.is_empty() || bs.is_empty() {
                    return Err(unsupported(node, "scalar MatMul operands"));
                }
                let mut a2 = as_.clone();
                let mut b2 = bs.clone();
                if a2.len() == 1 {
                    a2.insert(0, 1);
                }
                if b2.len() == 1 {
                    b2.push(1);
                }
                let (ra, rb) = (a2.len(), b2.len());
                let (m, k) = (a2[ra - 2], a2[ra - 1]);
                let n = b2[rb - 1];
                if b2[rb - 2] != k {
                    return Err(unsupported(node, "inner dimensions differ"));
                }
                let rank = (ra - 2).max(rb - 2);
                let lead = |v: &[usize]| -> Vec<usize> {
                    let mut out = vec![1; rank - v.len()];
                    out.extend_from_slice(v);
                    out
                };
                let (pa, pb) = (lead(&a2[..ra - 2]), lead(&b2[..rb - 2]));
                let mut ob = Vec::with_capacity(rank);
                for (&x, &z) in pa.iter().zip(&pb) {
                    ob.push(match (x, z) {
                        _ if x == z => x,
                        (1, _) => z,
                        (_, 1) => x,
                        _ => return Err(unsupported(node, "batch dimensions do not broadcast")),
                    });
                }
                let batch: usize = ob.iter().product();
                if ys.iter().product::<usize>() != batch * m * n {
                    return Err(unsupported(
                        node,
                        "output shape does not match the operands",
                    ));
                }
                let (ab, bb) = (pa.iter().product::<usize>(), pb.iter().product::<usize>());
                if bb == 1 {
                    // B shared by every batch: A's batch folds into M (one GEMM).
                    self.steps.push(Step::Gemm(GemmStep {
                        node: idx,
                        a: Arg::Val(a),
                        b: Arg::Val(b),
                        y,
                        ta: false,
                        tb: false,
                        m: ab * m,
                        n,
                        k,
                        alpha: 1.0,
                        batch: 1,
                        stride: [0; 3],
                    }));
                    return Ok(());
                }
                // Strided batched GEMM: an operand without batch dims has stride 0, one with
                // the full batch its matrix size; any other broadcast is expanded into the
                // node's scratch slot first.
                let esize = if self.fp16 { 2 } else { 4 };
                let mut scratch = 0usize;
                let mut operand = |this: &mut Self,
                                   v: ValueId,
                                   full: &[usize],
                                   pv: &[usize],
                                   nb: usize,
                                   rows: usize,
                                   cols: usize|
                 -> (Arg, i64) {
                    if nb == 1 {
                        (Arg::Val(v), 0)
                    } else if pv == ob.as_slice() {
                        (Arg::Val(v), (rows * cols) as i64)
                    } else {
                        let mut to = ob.clone();
                        to.extend_from_slice(&[rows, cols]);
                        let dst = Arg::ScratchAt(scratch);
                        let kern = this.gen.broadcast_into(v, full, &to, dst);
                        this.launch(idx, kern);
                        scratch += alit(batch * rows * cols * esize);
                        (dst, (rows * cols) as i64)
                    }
                };
                let (aa, sa) = operand(self, a, &a2, &pa, ab, m, k);
                let (ba, sb) = operand(self, b, &b2, &pb, bb, k, n);
                self.scratch[idx] = scratch;
                self.steps.push(Step::Gemm(GemmStep {
                    node: idx,
                    a: aa,
                    b: ba,
                    y,
                    ta: false,
                    tb: false,
                    m,
                    n,
                    k,
                    alpha: 1.0,
                    batch,
                    stride: [sa, sb, (m * n) as i64],
                }));
                Ok(())
            }
        }
    }
}
