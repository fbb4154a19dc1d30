//! Compiles a graph for one CUDA device (weights uploaded once, kernels generated and compiled
//! once, convolution algorithms chosen once per shape) and runs it in contexts that each own a
//! stream, one planned activation arena, pinned staging buffers and a captured CUDA graph.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::cudnn::{result as dnn, sys as dnn_sys};
use cudarc::driver::{result as drv, sys, CudaContext, CudaEvent, CudaGraph, CudaStream};

use super::codegen::{
    b2b_fits, b2b_smem, dequantize_pool_quantize_fits, halo_fits, igemm_fits, igemm_smem,
    multicast_versions, narrow_dequantize_fits, narrow_gemm_fits, probe_variant,
    quantize_transpose_fits, serial_tilings, space_to_depth_bytes, stem_pool_fits, stem_pool_smem,
    tma_fits, Arg, B2bShape, Gen, GenKernel, Im2col, LaunchDims, Probe, QConvParts, StemPool,
    TensorMap2d, Tiling, B2B_SHAPES, DEEP_HALO_TILINGS, DEEP_WG_TILINGS, HALO_TILINGS, TILINGS,
    WG_TILINGS,
};
use super::device::{
    alloc_arena, drv_err, igemm_capable, programmatic_launch_capable, upload_tensor_maps, Arena,
    DeviceBuffer, Function, Module, PinnedBuffer, TensorMaps,
};
use super::dnn::{
    blas_err, choose_algo, dnn_err, time_warm, AlgoChoice, BlasHandle, ConvDescs, ConvGeom,
    DnnHandle,
};
use super::lt::{Epilogue, LtHandle, LtMatmul, PointwiseShape, SearchBuffers};
use super::timing_cache;
use crate::backend::cpu::kernels::QEpilogue;
use crate::backend::{BackendContext, DeviceOutput, Executable};
use crate::error::{Error, Result};
use crate::ir::{Activation, DataType, Graph, Layout, Node, Op, Tensor, ValueId};
use crate::plan::{self, MemoryPlan, ALIGNMENT};

mod build;
mod lanes;
mod rewrite;
mod run;

use build::*;
pub use build::{back_to_back_kernels, multicast_kernels, serial_split_kernels, stem_pool_kernels};
pub use lanes::LanedExecutable;
use rewrite::*;
pub use run::last_device_ms;
use run::*;

/// Launches of one kernel in the graph that [`Builder::graph_ms`] times.
const PROBE_GRAPH_REPS: usize = 16;

/// Bytes of the arena's tail reserved for cuBLAS's workspace.
const BLAS_WS: usize = 32 << 20;
/// Largest im2col patch matrix a convolution may unfold into its scratch slot, as a fraction
/// of the device's L2 cache: the unfold is timed in isolation with the matrix L2-resident, and
/// only while it stays so (with the input and output) does that timing hold inside the whole
/// graph (ResNet-50 fp16 batch 32 unfolds of 29-58 MB were 15% slower in the graph than cuDNN).
const IM2COL_L2_FRACTION: usize = 3;
/// Largest cuDNN workspace an algorithm may use.
const DNN_WS_LIMIT: usize = 256 << 20;
const BLOCK: u32 = 256;

struct ConvStep {
    node: usize,
    x: Arg,
    y: ValueId,
    w: DeviceBuffer,
    bias: Option<Arg>,
    /// Residual input added before the activation (same shape as y).
    z: Option<Arg>,
    /// cuDNN applies bias, residual and activation itself (cudnnConvolutionBiasActivationForward).
    fused: bool,
    /// What each context builds its own cuDNN descriptors from (see [`ConvStep::descs`]).
    geom: ConvGeom,
    /// The activation cuDNN applies when `fused`.
    act: Option<(dnn_sys::cudnnActivationMode_t, f64)>,
    algo: AlgoChoice,
    /// Byte offset of the workspace inside the node's scratch slot.
    ws_offset: usize,
}

impl ConvStep {
    /// This step's cuDNN descriptors for one execution context: cuDNN may keep state in a
    /// descriptor, so contexts running concurrently never share one (as with cuBLASLt's).
    fn descs(&self) -> Result<ConvDescs> {
        let d = ConvDescs::new(&self.geom)?;
        if let Some((mode, coef)) = self.act {
            d.set_activation(mode, coef)?;
        }
        d.set_math(self.algo.math)?;
        Ok(d)
    }
}

/// A pointwise NHWC convolution run as one cuBLASLt GEMM with its epilogue fused.
struct PointwiseStep {
    /// The node (whose scratch slot holds the im2col patch matrix, if any).
    node: usize,
    x: Arg,
    y: Arg,
    /// Residual added through the GEMM's C operand.
    z: Option<Arg>,
    /// OHWI weights, i.e. a row-major [Cout, Cin] matrix.
    w: DeviceBuffer,
    mm: LtMatmul,
}

struct GemmStep {
    /// The node (whose scratch slot holds broadcast operands).
    node: usize,
    a: Arg,
    b: Arg,
    y: ValueId,
    ta: bool,
    tb: bool,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    batch: usize,
    stride: [i64; 3],
}

enum Step {
    Launch {
        node: usize,
        f: usize,
        /// Grid, block and dynamic shared-memory sizes.
        dims: LaunchDims,
        args: Vec<Arg>,
    },
    Conv(Box<ConvStep>),
    Pointwise(Box<PointwiseStep>),
    Gemm(GemmStep),
    Copy {
        dst: ValueId,
        src: Arg,
        bytes: usize,
    },
}

/// A graph compiled for one CUDA device. Shared (weights included) by all its contexts.
pub struct CudaExecutable {
    ctx: Arc<CudaContext>,
    graph: Arc<Graph>,
    plan: MemoryPlan,
    /// Float activations and weights stored as half (arithmetic in float).
    fp16: bool,
    /// Where each graph input is uploaded to / each output read from (the f32 staging area of
    /// the arena in fp16 mode, converted on the device; else the value's slot).
    in_args: Vec<Arg>,
    out_args: Vec<Option<Arg>>,
    /// Bytes of the f32 input/output area after the planned arena (fp16 only).
    io_bytes: usize,
    _module: Module,
    functions: Vec<Function>,
    consts: HashMap<ValueId, DeviceBuffer>,
    extras: Vec<DeviceBuffer>,
    /// The TMA tensor maps the kernels read, encoded per context over its arena.
    maps: Vec<TensorMap2d>,
    /// Bytes of tile counters each context keeps after its arena, zeroed ([`Arg::Counters`]).
    counter_bytes: usize,
    steps: Vec<Step>,
    /// What each step is (node, op, conv algorithm), for `VIGIL_CUDA_PROFILE`.
    descs: Vec<String>,
    /// Whether the generated kernels were compiled with a real `GRID_SYNC()` wait, so they
    /// may be launched as programmatic dependents (`device::programmatic_launch_capable`).
    programmatic: bool,
}

fn value_bytes(g: &Graph, v: ValueId) -> Result<usize> {
    Ok(g.shape(v)?.iter().product::<usize>() * g.values[v].dtype.size())
}

/// Bytes a value occupies on the device: float values take 2 bytes each in fp16 mode.
fn stored_bytes(g: &Graph, v: ValueId, fp16: bool) -> Result<usize> {
    let n = g.shape(v)?.iter().product::<usize>();
    Ok(match (fp16, g.values[v].dtype) {
        (true, DataType::F32) => n * 2,
        (_, dt) => n * dt.size(),
    })
}

/// IEEE half bytes of `v` (round to nearest even).
fn half_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
        .collect()
}

/// A tensor's bytes as stored on the device (float tensors as half in fp16 mode).
fn device_bytes(t: &Tensor, fp16: bool) -> Result<Vec<u8>> {
    if fp16 && t.dtype() == DataType::F32 {
        Ok(half_bytes(t.as_f32()?))
    } else {
        Ok(t.as_bytes().to_vec())
    }
}

fn unsupported(node: &Node, why: &str) -> Error {
    Error::Unsupported(format!(
        "CUDA backend: {} '{}': {why}",
        node.op.name(),
        node.name
    ))
}

/// Whether cuBLASLt's int8 epilogue (`sat(round(alpha·acc + bias))`, ReLU optional) can
/// requantize into `epi`'s output: `Some(relu)` for an int8 output whose clamp is the type's
/// range (or ReLU at a zero point of 0), with no other activation.
fn fused_requant(epi: &QEpilogue) -> Option<bool> {
    if !epi.signed || epi.general.is_some() || epi.slope != 1.0 || epi.hi < 127.0 {
        return None;
    }
    if epi.lo <= -128.0 {
        Some(false)
    } else if epi.lo == 0.0 && epi.zy == 0.0 {
        Some(true)
    } else {
        None
    }
}

/// The fused requantization's per-channel alpha (`mult`) and f32 bias (`bias · mult` plus the
/// output zero point, minus `beta ·` the residual's zero point): `alpha·acc + bias` is the
/// unfused `(acc + bias)·mult + zy` up to f32 rounding, so outputs agree with the CPU's to
/// one code.
fn requant_vectors(p: &QConvParts) -> (Vec<f32>, Vec<f32>) {
    let shift = p
        .residual
        .map_or(0.0, |r| r.beta as f64 * r.zero_point as f64);
    let bias = p
        .bias
        .iter()
        .zip(&p.mult)
        .map(|(&b, &m)| (b as f64 * m as f64 + p.epi.zy as f64 - shift) as f32)
        .collect();
    (p.mult.clone(), bias)
}

/// A process-wide memo of measured kernel times (they depend on the device and the shape only).
type Memo<K, V> = OnceLock<Mutex<HashMap<K, V>>>;

/// `memo`'s value for `key`, else `measure()`'s, stored (a poisoned lock measures again).
fn memoised<K: Eq + std::hash::Hash, V: Copy>(
    memo: &Memo<K, V>,
    key: K,
    measure: impl FnOnce() -> Result<V>,
) -> Result<V> {
    let map = memo.get_or_init(Default::default);
    if let Some(&v) = map.lock().ok().as_ref().and_then(|m| m.get(&key)) {
        return Ok(v);
    }
    let v = measure()?;
    if let Ok(mut m) = map.lock() {
        m.insert(key, v);
    }
    Ok(v)
}

/// Bytes of the int32 partial sums a split-K tiling `t` of `parts` writes: the requantization
/// pass's or a serial split's workspace (0 unsplit, or split within a cluster).
fn partial_bytes(parts: &QConvParts, t: &Tiling) -> usize {
    let c = parts.geom;
    let m = c.n * c.oh * c.ow;
    if t.partials() {
        alit(t.splits * m * c.cout * 4)
    } else {
        alit(t.serial_bytes(m, c.cout))
    }
}

/// The PTX of each source, compiled with NVRTC on its own thread with a large stack; the
/// caller loads them (on the H200 host, compiling and loading on default 2 MiB threads
/// crashed). `VIGIL_CUDA_COMPILE_THREADS=1` compiles them one after another.
fn compile_all<'s>(
    ctx: &Arc<CudaContext>,
    srcs: impl Iterator<Item = &'s str>,
) -> Result<Vec<Result<String>>> {
    if std::env::var("VIGIL_CUDA_COMPILE_THREADS").is_ok_and(|v| v == "1") {
        return Ok(srcs.map(|s| Module::ptx(ctx, s)).collect());
    }
    std::thread::scope(|scope| {
        let jobs = srcs
            .map(|s| {
                std::thread::Builder::new()
                    .stack_size(256 << 20)
                    .spawn_scoped(scope, move || Module::ptx(ctx, s))
                    .map_err(|e| Error::Unsupported(format!("compile thread: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        jobs.into_iter()
            .map(|j| {
                j.join()
                    .map_err(|_| Error::Unsupported("compile thread panicked".into()))
            })
            .collect()
    })
}

/// Uploads a generated module's tables (its [`Gen::extras`]) to the device, in order.
fn upload_tables(ctx: &Arc<CudaContext>, tables: &[Vec<u8>]) -> Result<Vec<DeviceBuffer>> {
    tables
        .iter()
        .map(|b| DeviceBuffer::upload(ctx, b))
        .collect()
}

/// The arguments of implicit-GEMM tiling `t` of `parts`, generated alone into `g`, in a
/// timing: x at the search buffer's start (`xb` bytes), the output (or partial sums) after
/// it, the uploaded `tables`, a residual (any int8 buffer of the output's size) where the
/// kernel reads one, a serial split's workspace (`ws`) and zeroed tile counters
/// (`counters`), and its tensor maps (encoded over those, uploaded, returned to outlive the
/// timing) where it has any.
fn igemm_args(
    ctx: &Arc<CudaContext>,
    (g, parts, t): (&Gen, &QConvParts, &Tiling),
    (buf, xb): (u64, usize),
    tables: &[DeviceBuffer],
    (ws, counters): (u64, u64),
) -> Result<(Vec<u64>, TensorMaps)> {
    let mut args = vec![buf, buf + xb as u64];
    args.extend(tables.iter().map(|b| b.ptr()));
    if parts.residual.is_some() && !t.partials() {
        args.push(buf + xb as u64);
    }
    if t.serial {
        args.extend([ws, counters]);
    }
    let based = g
        .maps
        .iter()
        .map(|m| match m.base {
            Arg::Extra(i) => tables
                .get(i)
                .map(|b| (b.ptr(), *m))
                .ok_or_else(|| Error::InvalidModel("missing constant table".into())),
            _ => Ok((buf, *m)),
        })
        .collect::<Result<Vec<_>>>()?;
    let maps = upload_tensor_maps(ctx, &based)?;
    args.extend((0..based.len()).filter_map(|k| maps.ptr(k)));
    Ok((args, maps))
}

/// A generated kernel's launch: its own for tiled kernels, else one thread per item in blocks
/// of [`BLOCK`] (a grid beyond `u32` saturates; launching it fails).
fn launch_dims(k: &GenKernel) -> LaunchDims {
    k.launch.unwrap_or_else(|| {
        let blocks = k.threads.div_ceil(BLOCK as usize);
        LaunchDims {
            grid: (u32::try_from(blocks).unwrap_or(u32::MAX), 1, 1),
            block: BLOCK,
            smem: 0,
        }
    })
}

/// Raises `f`'s dynamic shared-memory limit to what launch `d` needs (above the default 48 KiB),
/// and sets its preferred shared-memory carveout where one is asked for ([`carveout`]).
fn allow_smem(f: &Function, d: &LaunchDims) -> Result<()> {
    if let Some(pct) = carveout() {
        let attr =
            sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT;
        // SAFETY: `f` is a loaded kernel; the value is a percentage the driver accepts.
        unsafe { drv::function::set_function_attribute(f.0, attr, pct) }
            .map_err(drv_err("shared-memory carveout"))?;
    }
    if d.smem <= 48 << 10 {
        return Ok(());
    }
    let attr = sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
    // SAFETY: `f` is a loaded kernel; the driver checks the value against the device's limit.
    unsafe { drv::function::set_function_attribute(f.0, attr, d.smem as i32) }
        .map_err(drv_err("shared-memory limit"))
}

/// The shared-memory carveout (percent of the unified L1/shared storage) every generated kernel
/// prefers, from `VIGIL_CUDA_CARVEOUT` (0 to 100); `None` leaves the driver's choice per kernel.
/// One carveout for all spares an SM the reconfiguration between kernels that differ, which
/// waits for the SM to drain (and so for the previous kernel, overlap or not).
fn carveout() -> Option<i32> {
    static PCT: OnceLock<Option<i32>> = OnceLock::new();
    *PCT.get_or_init(|| {
        std::env::var("VIGIL_CUDA_CARVEOUT")
            .ok()
            .and_then(|v| v.parse::<i32>().ok())
            .filter(|v| (0..=100).contains(v))
    })
}

/// An int8 GEMM's algorithm-search buffers in one temporary at `t`: the patch matrix
/// (`colb` bytes), then the output (`yb` bytes, also read as the residual), then the workspace.
fn q_search_buffers(t: u64, w: u64, colb: usize, yb: usize) -> SearchBuffers {
    let y = t + (colb + ALIGNMENT) as u64;
    SearchBuffers {
        x: t,
        w,
        y,
        z: y,
        ws: (t + (colb + yb + 2 * ALIGNMENT) as u64).div_ceil(256) * 256,
        ws_limit: BLAS_WS,
    }
}

fn alit(n: usize) -> usize {
    n.div_ceil(ALIGNMENT) * ALIGNMENT
}

/// Permutes OIHW conv weights to OHWI (cuDNN's NHWC filter layout).
fn ohwi(w: &[f32], s: &[usize]) -> Vec<f32> {
    let (o, i, h, ww) = (s[0], s[1], s[2], s[3]);
    let mut out = vec![0f32; w.len()];
    for a in 0..o {
        for b in 0..i {
            for c in 0..h {
                for d in 0..ww {
                    out[((a * h + c) * ww + d) * i + b] = w[((a * i + b) * h + c) * ww + d];
                }
            }
        }
    }
    out
}

impl CudaExecutable {
    /// Compiles `graph` for device `ordinal`; `fp16` stores float weights and activations as
    /// half (convolutions and GEMMs accumulate in float; inputs and outputs stay f32).
    pub fn new(graph: Arc<Graph>, ordinal: usize, fp16: bool) -> Result<Self> {
        let ctx = CudaContext::new(ordinal).map_err(drv_err("context creation"))?;
        let fuse = std::env::var("VIGIL_CUDA_FUSE").map_or(true, |v| v != "0");
        let (lt_mode, qfuse) = (
            PathMode::from_var("VIGIL_CUDA_LT"),
            std::env::var("VIGIL_CUDA_QFUSE").map_or(true, |v| v != "0"),
        );
        // Int8 residuals fold only where cuBLASLt runs the convs (the dp4a kernel adds none).
        let int8 = lt_mode != PathMode::Off && qfuse;
        let graph = if fuse {
            Arc::new(fuse_residual(&graph, int8)?)
        } else {
            graph
        };
        let g: &Graph = &graph;
        let stream = ctx.default_stream();
        let mut consts = HashMap::new();
        for n in &g.nodes {
            for v in n.present_inputs() {
                if let (Some(c), false) = (g.constant(v), consts.contains_key(&v)) {
                    consts.insert(v, DeviceBuffer::upload(&ctx, &device_bytes(c, fp16)?)?);
                }
            }
        }
        let lt = LtHandle::new()?;
        // The device's compute capability decides which int8 kernel paths exist (None: unknown).
        let cc = ctx.compute_capability().ok();
        let attr = |a| {
            ctx.attribute(a)
                .map_or(0, |v| usize::try_from(v).unwrap_or(0))
        };
        let sms = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).max(1);
        let mut b = Builder {
            ctx: &ctx,
            g,
            readers: g.consumers(),
            writers: g.producers(),
            late_reads: Vec::new(),
            in_place_ok: vec![None; g.nodes.len()],
            stem_input: None,
            gen: Gen::new(fp16),
            kernels: Vec::new(),
            steps: Vec::new(),
            scratch: vec![0; g.nodes.len()],
            consts,
            dnn: DnnHandle::new(stream.cu_stream())?,
            lt: &lt,
            stream: stream.cu_stream(),
            tmp: None,
            fp16,
            fuse,
            descs: Vec::new(),
            note: String::new(),
            l2_bytes: ctx
                .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
                .map_or(0, |v| usize::try_from(v).unwrap_or(0)),
            lt_mode,
            im2col: std::env::var("VIGIL_CUDA_IM2COL").map_or(true, |v| v != "0"),
            qfuse,
            igemm: match cc {
                Some(cc) if igemm_capable(cc) => PathMode::from_var("VIGIL_CUDA_IGEMM"),
                _ => PathMode::Off,
            },
            wgmma: match cc {
                Some((9, 0)) => PathMode::from_var("VIGIL_CUDA_WGMMA"),
                _ => PathMode::Off,
            },
            splitk: PathMode::from_var("VIGIL_CUDA_SPLITK"),
            cluster: PathMode::opt_in("VIGIL_CUDA_CLUSTER"),
            sms,
            smem_per_sm: attr(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
            ),
            smem_per_block: match attr(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            ) {
                0 => usize::MAX,
                v => v,
            },
            s2d: std::env::var("VIGIL_CUDA_S2D").map_or(true, |v| v != "0"),
            persist: PathMode::opt_in("VIGIL_CUDA_PERSIST"),
            ws: PathMode::opt_in("VIGIL_CUDA_WS"),
            halo: PathMode::from_var("VIGIL_CUDA_HALO"),
            resident: PathMode::opt_in("VIGIL_CUDA_RESIDENT"),
            deep: PathMode::from_var("VIGIL_CUDA_DEEP"),
            tma: PathMode::from_var("VIGIL_CUDA_TMA"),
            serial: PathMode::opt_in("VIGIL_CUDA_SERIAL"),
            multicast: PathMode::opt_in("VIGIL_CUDA_MULTICAST"),
            library_step_ms: library_step_ms(cc),
            b2b: PathMode::opt_in("VIGIL_CUDA_B2B"),
            stem_pool: PathMode::opt_in("VIGIL_CUDA_STEM_POOL"),
            first_step: vec![0; g.nodes.len()],
            chosen_ms: vec![None; g.nodes.len()],
            device_id: format!(
                "{} cc{} sms{sms}",
                ctx.name().unwrap_or_default(),
                cc.map_or("?".into(), |(major, minor)| format!("{major}.{minor}")),
            ),
        };
        for (i, n) in g.nodes.iter().enumerate() {
            b.node(i, n)?;
        }
        b.tmp = None;
        // fp16: inputs arrive as f32 in the io area and are converted into their slots first;
        // outputs are converted back into the io area last.
        let body = std::mem::take(&mut b.steps);
        let body_descs = std::mem::take(&mut b.descs);
        let mut io_bytes = 0usize;
        let mut in_args = Vec::new();
        for &v in &g.inputs {
            if fp16 && g.values[v].dtype == DataType::F32 {
                let n = g.shape(v)?.iter().product::<usize>();
                let k = b.gen.convert(Arg::Io(io_bytes), Arg::Val(v), n, true);
                b.launch(0, k);
                in_args.push(Arg::Io(io_bytes));
                io_bytes += alit(n * 4);
            } else {
                in_args.push(Arg::Val(v));
            }
        }
        b.descs = vec!["input conversion".to_string(); b.steps.len()];
        b.steps.extend(body);
        b.descs.extend(body_descs);
        let mut out_args = Vec::new();
        for &v in &g.outputs {
            if g.values[v].constant.is_some() {
                out_args.push(None);
            } else if fp16 && g.values[v].dtype == DataType::F32 {
                let n = g.shape(v)?.iter().product::<usize>();
                let k = b.gen.convert(Arg::Val(v), Arg::Io(io_bytes), n, false);
                b.launch(0, k);
                out_args.push(Some(Arg::Io(io_bytes)));
                io_bytes += alit(n * 4);
            } else {
                out_args.push(Some(Arg::Val(v)));
            }
        }
        while b.descs.len() < b.steps.len() {
            b.descs.push("output conversion".to_string());
        }
        let plan = plan::plan_with_late_reads(g, &b.scratch, &b.in_place_ok, &b.late_reads)?;
        let module = Module::compile(&ctx, &b.gen.src)?;
        let functions = b
            .kernels
            .iter()
            .map(|k| {
                let f = module.function(&k.name)?;
                allow_smem(&f, &launch_dims(k))?;
                Ok(f)
            })
            .collect::<Result<Vec<_>>>()?;
        let extras = upload_tables(&ctx, &b.gen.extras)?;
        let maps = b.gen.maps.clone();
        let counter_bytes = b.gen.counter_bytes;
        let Builder {
            steps,
            consts,
            descs,
            ..
        } = b;
        Ok(CudaExecutable {
            ctx,
            graph,
            plan,
            fp16,
            in_args,
            out_args,
            io_bytes,
            _module: module,
            functions,
            consts,
            extras,
            maps,
            counter_bytes,
            steps,
            descs,
            programmatic: cc.is_some_and(programmatic_launch_capable),
        })
    }

    /// Generated CUDA kernels in this executable (for reports).
    pub fn kernel_count(&self) -> usize {
        self.functions.len()
    }
}

impl Executable for CudaExecutable {
    fn backend(&self) -> &'static str {
        "cuda"
    }

    fn new_context(self: Arc<Self>) -> Result<Box<dyn BackendContext>> {
        Ok(Box::new(CudaRun::new(self)?))
    }

    fn arena_bytes(&self) -> usize {
        self.plan.arena_bytes
    }

    fn arena_lower_bound(&self) -> usize {
        self.plan.lower_bound
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{AutoPad, ConvAttrs, QAddAttrs, QConvAttrs, QParams, TensorData};

    fn q8(scale: f32, zero_point: i32) -> QParams {
        QParams {
            scale,
            zero_point,
            dtype: DataType::I8,
        }
    }

    /// `x → QConv(1x1) → a`, `QAdd(a, z) [→ ReLU] → y` on int8 NHWC tensors; `z` and `x`
    /// are graph inputs, `y` the output (and `a` too when `a_out`).
    fn conv_add(a_out: bool) -> Graph {
        let mut g = Graph {
            opset: 17,
            ..Default::default()
        };
        let shape = vec![1, 4, 4, 8];
        let value = |g: &mut Graph, name: &str| {
            let v = g.add_value(name, DataType::I8);
            g.values[v].shape = Some(shape.clone());
            v
        };
        let (x, z, a, y) = (
            value(&mut g, "x"),
            value(&mut g, "z"),
            value(&mut g, "a"),
            value(&mut g, "y"),
        );
        let w = g.add_constant(
            "w",
            Tensor::new(vec![8, 8, 1, 1], TensorData::I8(vec![1; 64])).expect("w"),
        );
        let b = g.add_constant(
            "b",
            Tensor::new(vec![8], TensorData::I32(vec![0; 8])).expect("b"),
        );
        g.nodes.push(Node {
            name: "conv".into(),
            op: Op::QConv(QConvAttrs {
                conv: ConvAttrs {
                    kernel_shape: vec![1, 1],
                    strides: vec![1, 1],
                    pads: vec![0; 4],
                    dilations: vec![1, 1],
                    group: 1,
                    auto_pad: AutoPad::NotSet,
                    activation: None,
                    layout: Layout::Nhwc,
                },
                x: q8(0.1, 0),
                y: q8(0.2, 3),
                w_scales: vec![0.01; 8],
                residual: None,
            }),
            inputs: vec![Some(x), Some(w), Some(b)],
            outputs: vec![a],
        });
        g.nodes.push(Node {
            name: "add".into(),
            op: Op::QAdd(QAddAttrs {
                a: q8(0.2, 3),
                b: q8(0.05, -2),
                y: q8(0.3, 0),
                activation: Some(Activation::Relu),
            }),
            inputs: vec![Some(a), Some(z)],
            outputs: vec![y],
        });
        g.inputs = vec![x, z];
        g.outputs = if a_out { vec![y, a] } else { vec![y] };
        g
    }

    #[test]
    fn int8_residual_add_folds_into_its_conv() {
        let g = conv_add(false);
        let f = fuse_residual(&g, true).expect("fuse");
        assert_eq!(f.nodes.len(), 1, "{:?}", f.nodes);
        let n = &f.nodes[0];
        let Op::QConv(q) = &n.op else {
            panic!("not a QConv: {:?}", n.op)
        };
        // The sum's parameters and activation; the residual keeps z's parameters.
        assert_eq!(q.y, q8(0.3, 0));
        assert_eq!(q.conv.activation, Some(Activation::Relu));
        assert_eq!(q.residual, Some(q8(0.05, -2)));
        let (x, w, b, z) = (
            g.inputs[0],
            g.nodes[0].inputs[1],
            g.nodes[0].inputs[2],
            g.inputs[1],
        );
        assert_eq!(n.inputs, vec![Some(x), w, b, Some(z)]);
        assert_eq!(n.outputs, g.outputs);
        // Off (cuBLASLt off or VIGIL_CUDA_QFUSE=0): untouched.
        assert_eq!(
            names(&fuse_residual(&g, false).expect("fuse")),
            ["conv", "add"]
        );
    }

    #[test]
    fn int8_residual_stays_when_the_conv_output_is_read_elsewhere() {
        let g = conv_add(true);
        assert_eq!(
            names(&fuse_residual(&g, true).expect("fuse")),
            ["conv", "add"]
        );
    }

    #[test]
    fn uint8_activations_between_int8_ops_become_int8() {
        // x (input) → conv → a → conv2 → y (output), all uint8.
        let mut g = conv_add(false);
        let u8q = |q: QParams| QParams {
            dtype: DataType::U8,
            zero_point: q.zero_point + 128,
            ..q
        };
        let (x, a, y) = (g.inputs[0], g.nodes[0].outputs[0], g.nodes[1].outputs[0]);
        let mut conv2 = g.nodes[0].clone();
        conv2.name = "conv2".into();
        conv2.inputs[0] = Some(a);
        conv2.outputs = vec![y];
        g.nodes[1] = conv2;
        g.outputs = vec![y];
        g.inputs = vec![x];
        for v in [x, a, y] {
            g.values[v].dtype = DataType::U8;
        }
        for n in &mut g.nodes {
            if let Op::QConv(q) = &mut n.op {
                q.x = u8q(q.x);
                q.y = u8q(q.y);
            }
        }
        let f = signed_activations(&g);
        let dt = |v: ValueId| f.values[v].dtype;
        assert_eq!(
            (dt(x), dt(a), dt(y)),
            (DataType::U8, DataType::I8, DataType::U8)
        );
        let q = |i: usize| match &f.nodes[i].op {
            Op::QConv(q) => (q.x, q.y),
            op => panic!("{op:?}"),
        };
        // `a`'s parameters in its producer (output) and consumer (input) go back to int8
        // (zero point - 128); the graph's input and output keep theirs.
        assert_eq!(q(0), (u8q(q8(0.1, 0)), q8(0.2, 3)));
        assert_eq!(q(1), (q8(0.1, 0), u8q(q8(0.2, 3))));
    }

    #[test]
    fn float_residual_add_and_relu_fold_into_their_conv() {
        use crate::ir::{BinaryOp, ChainStep, UnaryOp};
        // The int8 graph turned float: Conv → a, Relu(a + z) as one elementwise chain.
        let mut g = conv_add(false);
        for v in &mut g.values {
            if v.dtype == DataType::I8 {
                v.dtype = DataType::F32;
            }
        }
        if let Op::QConv(q) = &g.nodes[0].op {
            g.nodes[0].op = Op::Conv(q.conv.clone());
        }
        g.nodes[1].op = Op::Elementwise(vec![
            ChainStep::Binary {
                op: BinaryOp::Add,
                operand: 1,
                acc_on_right: false,
            },
            ChainStep::Unary(UnaryOp::Act(Activation::Relu)),
        ]);
        let f = fuse_residual(&g, true).expect("fuse");
        assert_eq!(names(&f), ["conv+add"]);
        let Op::Conv(c) = &f.nodes[0].op else {
            panic!("not a Conv: {:?}", f.nodes[0].op)
        };
        assert_eq!(c.activation, Some(Activation::Relu));
        let mut want = g.nodes[0].inputs.clone();
        want.push(Some(g.inputs[1]));
        assert_eq!(f.nodes[0].inputs, want);
        assert_eq!(f.nodes[0].outputs, g.outputs);
    }

    #[test]
    fn plain_launches_match_the_chosen_tiling_only() {
        let descs: Vec<String> = [
            "QConv 'a' igemm wg128x128/6 tma 0.0085 ms (cuBLASLt 0.0112 ms) m6272 n256 k1024",
            "QConv 'b' igemm halo256x64/4 persistent 132 0.0158 ms (wg128x64/6 persistent 8 0.0170 ms) m1 n2 k3",
            "QConv 'c' igemm wg128x64/6 0.0100 ms (wg128x64/6 tma 0.0120 ms) m1 n2 k3",
            "QAdd 'd'",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(plain_launches(&descs, "", ""), [false; 4]);
        // Only 'b' chose persistent blocks; 'c' merely measured tma against its choice.
        assert_eq!(
            plain_launches(&descs, "persistent", ""),
            [false, true, false, false]
        );
        assert_eq!(
            plain_launches(&descs, "", "tma"),
            [false, true, false, false]
        );
        assert_eq!(
            plain_launches(&descs, "tma", "persistent"),
            [true, false, true, false]
        );
        // Words are whole: "tm" names nothing, and a list may hold several.
        assert_eq!(plain_launches(&descs, "tm", ""), [false; 4]);
        assert_eq!(
            plain_launches(&descs, " tma , persistent ", ""),
            [true, true, false, false]
        );
    }

    #[test]
    fn by_default_the_kernel_after_a_tma_tiling_launches_plainly() {
        // Descriptions as the builder writes them, from the tilings' own names.
        let desc =
            |t: Tiling| format!("QConv 'x' igemm {t} 0.0100 ms (cublasLt 0.0110 ms) m1 n2 k3");
        let descs = vec![
            desc(WG_TILINGS[1].with_tma()),
            desc(WG_TILINGS[1]),
            desc(WG_TILINGS[2]),
        ];
        assert_eq!(
            plain_launches(&descs, "", PLAIN_AFTER_DEFAULT),
            [false, true, false]
        );
        // Set empty, the knob launches every kernel as a programmatic dependent.
        assert_eq!(plain_launches(&descs, "", ""), [false; 3]);
    }

    fn names(g: &Graph) -> Vec<&str> {
        g.nodes.iter().map(|n| n.name.as_str()).collect()
    }
}
