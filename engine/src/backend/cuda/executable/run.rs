//! One execution context (`CudaRun`): its stream, arena, handles and staging, the steps
//! resolved against its arena, and the captured CUDA graph it replays.

use super::*;
/// A step with every pointer resolved against this context's arena.
pub(super) enum Resolved {
    Launch {
        f: Function,
        dims: LaunchDims,
        args: Vec<u64>,
    },
    Conv {
        step: usize,
        /// This context's own descriptors for the step.
        descs: Box<ConvDescs>,
        x: u64,
        y: u64,
        bias: u64,
        z: u64,
        ws: u64,
    },
    Pointwise {
        /// This context's own copy of the step's matmul.
        mm: Box<LtMatmul>,
        x: u64,
        w: u64,
        y: u64,
        z: u64,
        ws: u64,
    },
    Gemm {
        step: usize,
        a: u64,
        b: u64,
        y: u64,
    },
    Copy {
        dst: u64,
        src: u64,
        bytes: usize,
    },
}

thread_local! {
    pub(super) static LAST_DEVICE_MS: std::cell::Cell<Option<f64>> = const { std::cell::Cell::new(None) };
}

/// Device time in ms (CUDA events) of the last inference this thread ran on a CUDA context,
/// from after the input upload to before the output download (what framework benchmarks time
/// with inputs already on the device); `None` before any or where the events failed.
pub fn last_device_ms() -> Option<f64> {
    LAST_DEVICE_MS.with(|c| c.get())
}

/// Captures what `enqueue` puts on `stream` (and on streams it forks off it) as a CUDA graph;
/// the capture is ended even when `enqueue` fails.
pub(super) fn capture(
    stream: &Arc<CudaStream>,
    enqueue: impl FnOnce() -> Result<()>,
) -> Result<CudaGraph> {
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(drv_err("begin capture"))?;
    let r = enqueue();
    let captured = stream
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .map_err(drv_err("end capture"));
    r?;
    captured?.ok_or_else(|| Error::Unsupported("CUDA graph capture produced nothing".into()))
}

/// Records `ev` on `s`; as an event node of the graph while the stream is being captured.
pub(super) fn record(ev: &CudaEvent, s: sys::CUstream, capturing: bool) -> Result<()> {
    // SAFETY: a live event and stream of the same context.
    unsafe {
        if capturing {
            sys::cuEventRecordWithFlags(
                ev.cu_event(),
                s,
                sys::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as u32,
            )
            .result()
        } else {
            drv::event::record(ev.cu_event(), s)
        }
    }
    .map_err(drv_err("event record"))
}

/// One execution context: its own stream, arena, handles, staging and captured graph.
pub(super) struct CudaRun {
    pub(super) exe: Arc<CudaExecutable>,
    pub(super) stream: Arc<CudaStream>,
    pub(super) arena: Arena,
    /// The kernels' TMA tensor maps over this context's arena ([`Arg::Map`]).
    pub(super) _maps: TensorMaps,
    pub(super) dnn: DnnHandle,
    pub(super) blas: BlasHandle,
    pub(super) lt: LtHandle,
    pub(super) staging_in: PinnedBuffer,
    pub(super) staging_out: PinnedBuffer,
    /// (arena address, staging offset, bytes) per graph input / output.
    pub(super) ins: Vec<(u64, usize, usize)>,
    pub(super) outs: Vec<Option<(u64, usize, usize)>>,
    pub(super) resolved: Vec<Resolved>,
    /// The captured inference: with the output download, and without it (outputs left on
    /// the device for device postprocessing).
    pub(super) graph: Option<CudaGraph>,
    pub(super) graph_device: Option<CudaGraph>,
    pub(super) runs: usize,
    pub(super) use_graph: bool,
    /// Timing events around the compute part of each inference.
    pub(super) events: (CudaEvent, CudaEvent),
    /// `VIGIL_CUDA_PROFILE`: an event before every step (inside the captured graph too).
    pub(super) prof: Option<Prof>,
    /// Generated kernels that follow one another overlap the next one's launch with the
    /// previous one's tail (programmatic dependent launch: sm_90+, not while profiling,
    /// `VIGIL_CUDA_PDL=0` turns it off).
    pub(super) overlap: bool,
    /// Per step, whether its launch is plain even where `overlap` holds
    /// ([`plain_launches`]: after a TMA-fed kernel by default, and the placement experiment's
    /// `VIGIL_CUDA_PDL_PLAIN*`).
    pub(super) plain: Vec<bool>,
}

/// The tilings whose next kernel launches plainly when `VIGIL_CUDA_PDL_PLAIN_AFTER` is unset
/// (set it empty to launch every kernel as a programmatic dependent). With the TMA tilings,
/// ResNet-50 s8 at batch 32 ran 1.8% faster on the H200 this way than with the kernel after
/// each TMA kernel launched early beside it, and within 0.3% on the H100 (docs/benchmarks.md,
/// thirty-sixth and thirty-seventh sessions).
pub(super) const PLAIN_AFTER_DEFAULT: &str = "tma";

/// Per step, whether a generated kernel launches plainly (not as a programmatic dependent)
/// although programmatic launch is on: its step's tiling names one of the words in `own`
/// (`VIGIL_CUDA_PDL_PLAIN`, e.g. `persistent`), or the step before's names one in `after`
/// (`VIGIL_CUDA_PDL_PLAIN_AFTER`, e.g. `tma`). A step's tiling is its description up to the
/// chosen time, so the candidates it was measured against do not count. Both are A/B knobs for
/// whether blocks launched early beside their predecessor's are placed worse (docs/cuda.md);
/// `after` defaults to [`PLAIN_AFTER_DEFAULT`].
pub(super) fn plain_launches(descs: &[String], own: &str, after: &str) -> Vec<bool> {
    let words =
        |list: &str| -> Vec<String> { list.split(',').map(|w| w.trim().to_string()).collect() };
    let (own, after) = (words(own), words(after));
    let names = |d: &String, ws: &[String]| {
        let tiling = d.split(" ms (").next().unwrap_or("");
        tiling.split_whitespace().any(|t| ws.iter().any(|w| w == t))
    };
    (0..descs.len())
        .map(|k| names(&descs[k], &own) || (k > 0 && names(&descs[k - 1], &after)))
        .collect()
}

/// Per-step device times accumulated over replays (`VIGIL_CUDA_PROFILE=1`).
pub(super) struct Prof {
    pub(super) events: Vec<CudaEvent>,
    pub(super) sum_ms: Vec<f64>,
    pub(super) runs: usize,
}

// SAFETY: every handle inside is used only through `&mut self` (one thread at a time), with
// the context bound to the calling thread first.
unsafe impl Send for CudaRun {}

impl CudaRun {
    pub(super) fn new(exe: Arc<CudaExecutable>) -> Result<Self> {
        let ctx = &exe.ctx;
        ctx.bind_to_thread().map_err(drv_err("bind context"))?;
        let stream = ctx.new_stream().map_err(drv_err("stream creation"))?;
        let io_base = alit(exe.plan.arena_bytes);
        // The cuBLAS(Lt) workspace starts 256-byte aligned (cuBLAS's requirement).
        let ws_off = (io_base + exe.io_bytes).div_ceil(256) * 256;
        // The tile counters after the workspace, zeroed before any kernel counts in them.
        let counters_off = ws_off + BLAS_WS;
        let arena_bytes = counters_off + exe.counter_bytes;
        let arena = alloc_arena(ctx, &stream, arena_bytes)?;
        let base = arena.ptr();
        if exe.counter_bytes > 0 {
            // SAFETY: the counters lie inside the arena just taken, on its stream; the stream
            // is synchronized so that lanes' other streams see them zeroed too.
            unsafe {
                drv::memset_d8_async(
                    base + counters_off as u64,
                    0,
                    exe.counter_bytes,
                    stream.cu_stream(),
                )
            }
            .map_err(drv_err("counter reset"))?;
            stream.synchronize().map_err(drv_err("counter reset"))?;
        }
        let blas_ws = base + ws_off as u64;
        let blas = BlasHandle::new(stream.cu_stream(), blas_ws, BLAS_WS)?;
        let dnn = DnnHandle::new(stream.cu_stream())?;
        let lt = LtHandle::new()?;
        let g = &exe.graph;
        let slot = |v: ValueId| -> Result<u64> {
            exe.plan.values[v]
                .map(|s| base + s.offset as u64)
                .ok_or_else(|| {
                    Error::InvalidModel(format!("value '{}' has no arena slot", g.values[v].name))
                })
        };
        let resolve_base = |a: Arg, node: usize| -> Result<u64> {
            match a {
                Arg::Val(v) => match exe.consts.get(&v) {
                    Some(b) => Ok(b.ptr()),
                    None => slot(v),
                },
                Arg::Extra(k) => exe
                    .extras
                    .get(k)
                    .map(|b| b.ptr())
                    .ok_or_else(|| Error::InvalidModel("missing constant table".into())),
                Arg::Scratch => exe.plan.scratch[node]
                    .map(|s| base + s.offset as u64)
                    .ok_or_else(|| Error::InvalidModel("missing scratch slot".into())),
                Arg::ScratchAt(off) => exe.plan.scratch[node]
                    .map(|s| base + (s.offset + off) as u64)
                    .ok_or_else(|| Error::InvalidModel("missing scratch slot".into())),
                Arg::Io(off) => Ok(base + (io_base + off) as u64),
                Arg::Counters(off) => Ok(base + (counters_off + off) as u64),
                Arg::Map(_) => Err(Error::InvalidModel("a tensor map over a tensor map".into())),
            }
        };
        // The TMA tensor maps over this context's buffers.
        let based = exe
            .maps
            .iter()
            .map(|m| Ok((resolve_base(m.base, m.node)?, *m)))
            .collect::<Result<Vec<_>>>()?;
        let maps = upload_tensor_maps(ctx, &based)?;
        let resolve = |a: Arg, node: usize| -> Result<u64> {
            match a {
                Arg::Map(k) => maps
                    .ptr(k)
                    .ok_or_else(|| Error::InvalidModel("missing tensor map".into())),
                _ => resolve_base(a, node),
            }
        };
        let mut ins = Vec::new();
        let mut off = 0;
        for (&v, &a) in g.inputs.iter().zip(&exe.in_args) {
            let n = value_bytes(g, v)?;
            ins.push((resolve(a, 0)?, off, n));
            off += alit(n);
        }
        let staging_in = PinnedBuffer::alloc(ctx, off)?;
        let mut outs = Vec::new();
        let mut off = 0;
        for (&v, a) in g.outputs.iter().zip(&exe.out_args) {
            let Some(a) = a else {
                outs.push(None);
                continue;
            };
            let n = value_bytes(g, v)?;
            outs.push(Some((resolve(*a, 0)?, off, n)));
            off += alit(n);
        }
        let staging_out = PinnedBuffer::alloc(ctx, off)?;
        let mut resolved = Vec::with_capacity(exe.steps.len());
        for (i, s) in exe.steps.iter().enumerate() {
            resolved.push(match s {
                Step::Launch {
                    node,
                    f,
                    dims,
                    args,
                } => Resolved::Launch {
                    f: exe.functions[*f],
                    dims: *dims,
                    args: args
                        .iter()
                        .map(|&a| resolve(a, *node))
                        .collect::<Result<_>>()?,
                },
                Step::Conv(c) => Resolved::Conv {
                    step: i,
                    descs: Box::new(c.descs()?),
                    x: resolve(c.x, c.node)?,
                    y: slot(c.y)?,
                    bias: c.bias.map(|b| resolve(b, c.node)).transpose()?.unwrap_or(0),
                    z: c.z.map(|b| resolve(b, c.node)).transpose()?.unwrap_or(0),
                    ws: exe.plan.scratch[c.node]
                        .map(|s| base + (s.offset + c.ws_offset) as u64)
                        .unwrap_or(0),
                },
                Step::Pointwise(p) => Resolved::Pointwise {
                    mm: Box::new(p.mm.instance()?),
                    x: resolve(p.x, p.node)?,
                    w: p.w.ptr(),
                    y: resolve(p.y, p.node)?,
                    z: p.z.map(|z| resolve(z, p.node)).transpose()?.unwrap_or(0),
                    ws: blas_ws,
                },
                Step::Gemm(gm) => Resolved::Gemm {
                    step: i,
                    a: resolve(gm.a, gm.node)?,
                    b: resolve(gm.b, gm.node)?,
                    y: slot(gm.y)?,
                },
                Step::Copy { dst, src, bytes } => Resolved::Copy {
                    dst: slot(*dst)?,
                    src: resolve(*src, 0)?,
                    bytes: *bytes,
                },
            });
        }
        let use_graph = std::env::var("VIGIL_CUDA_GRAPH").map_or(true, |v| v != "0");
        let overlap = exe.programmatic && programmatic_launch_allowed();
        let ev = || {
            ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(drv_err("event creation"))
        };
        let events = (ev()?, ev()?);
        let prof = if std::env::var("VIGIL_CUDA_PROFILE").is_ok_and(|v| v == "1") {
            Some(Prof {
                events: (0..=resolved.len()).map(|_| ev()).collect::<Result<_>>()?,
                sum_ms: vec![0.0; resolved.len()],
                runs: 0,
            })
        } else {
            None
        };
        let plain = plain_launches(
            &exe.descs,
            &std::env::var("VIGIL_CUDA_PDL_PLAIN").unwrap_or_default(),
            &std::env::var("VIGIL_CUDA_PDL_PLAIN_AFTER")
                .unwrap_or_else(|_| PLAIN_AFTER_DEFAULT.to_string()),
        );
        Ok(CudaRun {
            exe,
            stream,
            arena,
            _maps: maps,
            dnn,
            blas,
            lt,
            staging_in,
            staging_out,
            ins,
            outs,
            resolved,
            graph: None,
            graph_device: None,
            runs: 0,
            use_graph,
            events,
            overlap: prof.is_none() && overlap,
            plain,
            prof,
        })
    }

    /// Enqueues one whole inference on the stream (what a CUDA graph captures); `download`
    /// adds the copy of the outputs to the pinned staging buffer.
    pub(super) fn enqueue(&self, capturing: bool, download: bool) -> Result<()> {
        let s = self.stream.cu_stream();
        self.enqueue_upload(s)?;
        record(&self.events.0, s, capturing)?;
        self.enqueue_steps(capturing)?;
        record(&self.events.1, s, capturing)?;
        if download {
            self.enqueue_download(s)?;
        }
        Ok(())
    }

    /// Enqueues the copy of every input from the pinned staging buffer to its slot, on `s`
    /// (this context's stream, or the stream a laned run uploads all its lanes on).
    pub(super) fn enqueue_upload(&self, s: sys::CUstream) -> Result<()> {
        let sin = self.staging_in.bytes();
        for &(dst, off, n) in &self.ins {
            // SAFETY: the slot holds n bytes; the pinned staging buffer outlives the stream work.
            unsafe { drv::memcpy_htod_async(dst, &sin[off..off + n], s) }
                .map_err(drv_err("input copy"))?;
        }
        Ok(())
    }

    /// Enqueues the inference's steps on this context's stream (the one its library handles
    /// are bound to), with the profile's events when profiling.
    pub(super) fn enqueue_steps(&self, capturing: bool) -> Result<()> {
        let s = self.stream.cu_stream();
        // Whether the stream's last operation is one of the generated kernels (which a
        // programmatic launch may overlap; it must not overlap a copy or a library call).
        let mut after_kernel = false;
        for (k, r) in self.resolved.iter().enumerate() {
            if let Some(p) = &self.prof {
                record(&p.events[k], s, capturing)?;
            }
            match r {
                Resolved::Launch { f, dims, args } => {
                    let LaunchDims { grid, block, smem } = *dims;
                    if grid.0 == 0 || grid.1 == 0 {
                        continue;
                    }
                    let mut ptrs = [std::ptr::null_mut::<c_void>(); 64];
                    if args.len() > ptrs.len() {
                        return Err(Error::Unsupported("kernel with over 64 arguments".into()));
                    }
                    for (p, a) in ptrs.iter_mut().zip(args) {
                        *p = a as *const u64 as *mut c_void;
                    }
                    // SAFETY: the generated kernel takes exactly these pointer arguments, each
                    // into a live buffer sized by the plan.
                    unsafe {
                        f.launch(
                            (grid, block, smem),
                            s,
                            &mut ptrs[..args.len()],
                            self.overlap
                                && after_kernel
                                && !self.plain.get(k).copied().unwrap_or(false),
                        )
                    }?;
                    after_kernel = true;
                    continue;
                }
                Resolved::Conv {
                    step,
                    descs,
                    x,
                    y,
                    bias,
                    z,
                    ws,
                } => {
                    let Step::Conv(c) = &self.exe.steps[*step] else {
                        continue;
                    };
                    let (one, zero) = (1f32, 0f32);
                    let (alpha2, zp) = if *z != 0 { (1f32, *z) } else { (0f32, *y) };
                    let d = descs;
                    // SAFETY: descriptors match the buffers, which the plan sized.
                    unsafe {
                        if c.fused {
                            dnn::convolution_bias_activation_forward(
                                self.dnn.0,
                                &one as *const f32 as *const c_void,
                                d.x,
                                *x as *const c_void,
                                d.w,
                                c.w.ptr() as *const c_void,
                                d.conv,
                                c.algo.algo,
                                *ws as *mut c_void,
                                c.algo.workspace,
                                &alpha2 as *const f32 as *const c_void,
                                d.y,
                                zp as *const c_void,
                                d.bias,
                                *bias as *const c_void,
                                d.act,
                                d.y,
                                *y as *mut c_void,
                            )
                        } else {
                            dnn::convolution_forward(
                                self.dnn.0,
                                &one as *const f32 as *const c_void,
                                d.x,
                                *x as *const c_void,
                                d.w,
                                c.w.ptr() as *const c_void,
                                d.conv,
                                c.algo.algo,
                                *ws as *mut c_void,
                                c.algo.workspace,
                                &zero as *const f32 as *const c_void,
                                d.y,
                                *y as *mut c_void,
                            )
                        }
                    }
                    .map_err(dnn_err("convolution"))?;
                }
                Resolved::Pointwise { mm, x, w, y, z, ws } => {
                    mm.run(&self.lt, s, *x, *w, *z, *y, *ws)?;
                }
                Resolved::Gemm { step, a, b, y } => {
                    let Step::Gemm(gm) = &self.exe.steps[*step] else {
                        continue;
                    };
                    let op = |t: bool| {
                        if t {
                            blas_sys::cublasOperation_t::CUBLAS_OP_T
                        } else {
                            blas_sys::cublasOperation_t::CUBLAS_OP_N
                        }
                    };
                    let lda = if gm.ta { gm.m } else { gm.k } as i32;
                    let ldb = if gm.tb { gm.k } else { gm.n } as i32;
                    let zero = 0f32;
                    // Row-major Y = A·B is column-major Yᵀ = Bᵀ·Aᵀ.
                    if self.exe.fp16 {
                        let h = blas_sys::cudaDataType_t::CUDA_R_16F;
                        // SAFETY: half operands sized by the inferred shapes; float scalars
                        // for the float compute type.
                        unsafe {
                            blas::gemm_strided_batched_ex(
                                self.blas.0,
                                op(gm.tb),
                                op(gm.ta),
                                gm.n as i32,
                                gm.m as i32,
                                gm.k as i32,
                                &gm.alpha as *const f32 as *const c_void,
                                *b as *const c_void,
                                h,
                                ldb,
                                gm.stride[1],
                                *a as *const c_void,
                                h,
                                lda,
                                gm.stride[0],
                                &zero as *const f32 as *const c_void,
                                *y as *mut c_void,
                                h,
                                gm.n as i32,
                                gm.stride[2],
                                gm.batch as i32,
                                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT_TENSOR_OP,
                            )
                        }
                        .map_err(blas_err("half gemm"))?;
                        continue;
                    }
                    // SAFETY: operand sizes follow from the inferred shapes.
                    unsafe {
                        blas::sgemm_strided_batched(
                            self.blas.0,
                            op(gm.tb),
                            op(gm.ta),
                            gm.n as i32,
                            gm.m as i32,
                            gm.k as i32,
                            &gm.alpha,
                            *b as *const f32,
                            ldb,
                            gm.stride[1],
                            *a as *const f32,
                            lda,
                            gm.stride[0],
                            &zero,
                            *y as *mut f32,
                            gm.n as i32,
                            gm.stride[2],
                            gm.batch as i32,
                        )
                    }
                    .map_err(blas_err("gemm"))?;
                }
                Resolved::Copy { dst, src, bytes } => {
                    // A reshape planned in place (same address) has nothing to copy.
                    if *bytes == 0 || dst == src {
                        continue;
                    }
                    // SAFETY: both ranges hold `bytes` bytes.
                    unsafe { drv::memcpy_dtod_async(*dst, *src, *bytes, s) }
                        .map_err(drv_err("device copy"))?;
                }
            }
            after_kernel = false;
        }
        if let Some(p) = &self.prof {
            record(&p.events[self.resolved.len()], s, capturing)?;
        }
        Ok(())
    }

    /// Enqueues the copy of every output slot into the pinned staging buffer, on `s`.
    pub(super) fn enqueue_download(&self, s: sys::CUstream) -> Result<()> {
        let sout = self.staging_out.bytes();
        for &(src, off, n) in self.outs.iter().flatten() {
            // SAFETY: as for the inputs; the staging buffer is pinned and outlives the work.
            let dst =
                unsafe { std::slice::from_raw_parts_mut(sout.as_ptr().add(off) as *mut u8, n) };
            // SAFETY: the slot holds n bytes.
            unsafe { drv::memcpy_dtoh_async(dst, src, s) }.map_err(drv_err("output copy"))?;
        }
        Ok(())
    }

    /// Fills `outputs` (reshaped as needed) from the staging buffer, or from the graph for
    /// outputs that are constants.
    pub(super) fn staged_outputs(&self, outputs: &mut [Tensor]) -> Result<()> {
        let g = &self.exe.graph;
        if outputs.len() != g.outputs.len() {
            return Err(Error::BadInput(format!(
                "model gives {} outputs, got {} buffers",
                g.outputs.len(),
                outputs.len()
            )));
        }
        for (j, (&v, t)) in g.outputs.iter().zip(outputs.iter_mut()).enumerate() {
            let value = &g.values[v];
            let shape = g.shape(v)?;
            if t.dtype() != value.dtype || t.shape != shape {
                *t = Tensor::zeros(value.dtype, shape.to_vec());
            }
            t.as_bytes_mut().copy_from_slice(self.output_bytes(j)?);
        }
        Ok(())
    }

    /// Output `j`'s bytes after a run: its slice of the staging buffer, or the constant it is.
    pub(super) fn output_bytes(&self, j: usize) -> Result<&[u8]> {
        let g = &self.exe.graph;
        let value = &g.values[g.outputs[j]];
        match (self.outs[j], &value.constant) {
            (Some((_, off, n)), _) => Ok(&self.staging_out.bytes()[off..off + n]),
            (None, Some(c)) => Ok(c.as_bytes()),
            (None, None) => Err(Error::InvalidModel(format!(
                "output '{}' has no source",
                value.name
            ))),
        }
    }
}

impl CudaRun {
    /// Uploads the inputs and runs one inference to completion (replaying the captured graph
    /// of this variant), with or without the output download.
    pub(super) fn execute(&mut self, inputs: &[&Tensor], download: bool) -> Result<()> {
        let exe = Arc::clone(&self.exe);
        exe.ctx.bind_to_thread().map_err(drv_err("bind context"))?;
        for (t, &(_, off, n)) in inputs.iter().zip(&self.ins) {
            self.staging_in.bytes_mut()[off..off + n].copy_from_slice(t.as_bytes());
        }
        let ncu = self.prof.is_some() && self.runs == 3;
        if ncu {
            // SAFETY: plain profiler range marker (for `ncu --profile-from-start off`).
            let _ = unsafe { sys::cuProfilerStart() };
        }
        let captured = if download {
            &self.graph
        } else {
            &self.graph_device
        };
        if let Some(graph) = captured {
            graph.launch().map_err(drv_err("graph launch"))?;
        } else if self.use_graph && self.runs > 0 {
            let graph = capture(&self.stream, || self.enqueue(true, download))?;
            graph.launch().map_err(drv_err("graph launch"))?;
            if download {
                self.graph = Some(graph);
            } else {
                self.graph_device = Some(graph);
            }
        } else {
            self.enqueue(false, download)?;
        }
        self.stream
            .synchronize()
            .map_err(drv_err("inference (stream synchronize)"))?;
        // SAFETY: both events were recorded by the work just synchronised.
        let ms = unsafe { drv::event::elapsed(self.events.0.cu_event(), self.events.1.cu_event()) };
        LAST_DEVICE_MS.with(|c| c.set(ms.ok().map(f64::from)));
        if ncu {
            // SAFETY: as above.
            let _ = unsafe { sys::cuProfilerStop() };
        }
        if let (Some(p), true) = (&mut self.prof, self.runs >= 2) {
            for k in 0..p.sum_ms.len() {
                // SAFETY: both events were recorded by the work just synchronised.
                let t = unsafe {
                    drv::event::elapsed(p.events[k].cu_event(), p.events[k + 1].cu_event())
                };
                p.sum_ms[k] += f64::from(t.unwrap_or(f32::NAN));
            }
            p.runs += 1;
        }
        self.runs += 1;
        Ok(())
    }
}

impl BackendContext for CudaRun {
    fn run(&mut self, inputs: &[&Tensor], outputs: &mut [Tensor]) -> Result<()> {
        crate::backend::check_signature(&self.exe.graph, inputs, outputs)?;
        self.execute(inputs, true)?;
        self.staged_outputs(outputs)
    }

    fn run_on_device(&mut self, inputs: &[&Tensor]) -> Result<Option<Vec<DeviceOutput>>> {
        let exe = Arc::clone(&self.exe);
        let g = &exe.graph;
        crate::backend::check_inputs(g, inputs)?;
        // Outputs that are graph constants have no device slot: postprocess on the host.
        let mut outs = Vec::with_capacity(self.outs.len());
        for (&v, o) in g.outputs.iter().zip(&self.outs) {
            let Some((ptr, _, _)) = *o else {
                return Ok(None);
            };
            outs.push(DeviceOutput {
                ptr,
                dtype: g.values[v].dtype,
                shape: g.shape(v)?.to_vec(),
            });
        }
        self.execute(inputs, false)?;
        Ok(Some(outs))
    }

    fn download_outputs(&mut self, outputs: &mut [Tensor]) -> Result<()> {
        self.exe
            .ctx
            .bind_to_thread()
            .map_err(drv_err("bind context"))?;
        self.enqueue_download(self.stream.cu_stream())?;
        self.stream
            .synchronize()
            .map_err(drv_err("output download (stream synchronize)"))?;
        self.staged_outputs(outputs)
    }
}

impl CudaRun {
    /// Prints the per-step profile (`VIGIL_CUDA_PROFILE=1`) to stderr.
    pub(super) fn report(&self) {
        let Some(p) = &self.prof else { return };
        if p.runs == 0 {
            return;
        }
        let n = p.runs as f64;
        let total: f64 = p.sum_ms.iter().sum::<f64>() / n;
        let g = &self.exe.graph;
        let mut lines = vec![format!(
            "PROFILE {} steps, {} graph input(s) {:?}, fp16 {}, cuDNN {}, {} replays: {:.4} ms per inference",
            p.sum_ms.len(),
            g.inputs.len(),
            g.inputs.first().and_then(|&v| g.shape(v).ok()),
            self.exe.fp16,
            crate::backend::cuda::dnn::cudnn_version(),
            p.runs,
            total
        )];
        let mut by_kind: Vec<(String, f64, usize)> = Vec::new();
        for (k, d) in self.exe.descs.iter().enumerate() {
            let kind = d.split(' ').next().unwrap_or("?").to_string()
                + match self.resolved.get(k) {
                    Some(Resolved::Launch { .. }) => "/kernel",
                    Some(Resolved::Conv { .. }) => "/cudnn",
                    Some(Resolved::Gemm { .. }) => "/cublas",
                    Some(Resolved::Pointwise { .. }) => "/cublaslt",
                    Some(Resolved::Copy { .. }) => "/copy",
                    None => "",
                };
            let t = p.sum_ms[k] / n;
            match by_kind.iter_mut().find(|e| e.0 == kind) {
                Some(e) => {
                    e.1 += t;
                    e.2 += 1;
                }
                None => by_kind.push((kind, t, 1)),
            }
            lines.push(format!("PSTEP {k:3} {:8.1} us  {d}", t * 1e3));
        }
        by_kind.sort_by(|a, b| b.1.total_cmp(&a.1));
        for (kind, t, c) in by_kind {
            lines.push(format!("PKIND {kind:28} {c:4} steps {:9.1} us", t * 1e3));
        }
        eprintln!("{}", lines.join("\n"));
    }
}

impl Drop for CudaRun {
    fn drop(&mut self) {
        self.report();
        let _ = self.exe.ctx.bind_to_thread();
        let _ = self.stream.synchronize();
        let _ = &self.arena;
    }
}
