//! CUDA C source generation for every op that is not a convolution or a GEMM: one kernel per
//! node with its shapes baked in (index arithmetic on constants), all compiled by NVRTC into one
//! module per executable. Elementwise chains from the fusion pass become one kernel.

use std::fmt::Write;

use crate::error::{Error, Result};
use crate::ir::{
    Activation, BinaryOp, ChainStep, DataType, Graph, Layout, Node, Op, PadMode, ResizeMode,
    UnaryOp, ValueId,
};

use crate::backend::resize_taps::{taps, Tap};

mod b2b;
#[cfg(test)]
mod compile_check;
mod halo;
mod igemm;
mod narrow_gemm;
mod probe;
mod quant;
mod space_to_depth;
mod stem_pool;
pub use b2b::{b2b_fits, b2b_smem, B2bShape, B2B_SHAPES};
pub use halo::{halo_fits, DEEP_HALO_TILINGS, HALO_TILINGS};
pub use igemm::{
    igemm_fits, igemm_smem, multicast_versions, serial_tilings, tma_fits, Tiling, DEEP_WG_TILINGS,
    TILINGS, WG_TILINGS,
};
pub use narrow_gemm::{narrow_dequantize_fits, narrow_gemm_fits};
pub use probe::{probe_variant, Probe};
pub use quant::QConvParts;
pub use space_to_depth::space_to_depth_bytes;
pub use stem_pool::{stem_pool_fits, stem_pool_smem, StemPool};

/// The fields of a CUDA 4-vector (`uint4`, `float4`), as member accesses.
const VECTOR_LANES: [&str; 4] = [".x", ".y", ".z", ".w"];

/// Where a kernel argument points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    /// A graph value: its arena slot, or its uploaded constant.
    Val(ValueId),
    /// An extra constant table made by code generation (index into [`Gen::extras`]).
    Extra(usize),
    /// The node's scratch slot in the arena.
    Scratch,
    /// A byte offset into the node's scratch slot.
    ScratchAt(usize),
    /// A byte offset into the context's f32 input/output area (fp16 mode).
    Io(usize),
    /// A TMA tensor map made by code generation (index into [`Gen::maps`]), encoded per
    /// context over its buffers and passed as a pointer to its 128 bytes in device memory.
    Map(usize),
    /// A byte offset into the context's tile counters ([`Gen::counter_bytes`]): zeroed once
    /// when the context is made, and left zero again by every kernel that counts in them.
    Counters(usize),
}

/// A 2-D tensor of bytes that TMA (`cp.async.bulk.tensor`, sm_90) copies tiles of: `rows`
/// rows of `row_bytes` at `base`, in boxes of 64 bytes by `box_rows` rows stored with the
/// 64-byte swizzle (the rings' XOR pattern); reads past the tensor fill zeros.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorMap2d {
    /// The tensor's first byte.
    pub base: Arg,
    /// The node whose scratch slot a scratch `base` is in (set by the executable's builder).
    pub node: usize,
    pub rows: usize,
    pub row_bytes: usize,
    pub box_rows: usize,
}

/// Geometry of an NHWC im2col (see [`Gen::im2col_into_scratch`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Im2col {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub oh: usize,
    pub ow: usize,
    pub kh: usize,
    pub kw: usize,
    pub stride: [usize; 2],
    pub pad: [usize; 2],
    pub dilation: [usize; 2],
}

impl Im2col {
    /// Rows of the patch matrix (output pixels).
    pub fn rows(&self) -> usize {
        self.n * self.oh * self.ow
    }
    /// Columns of the patch matrix (the GEMM's reduction length).
    pub fn cols(&self) -> usize {
        self.kh * self.kw * self.c
    }
}

/// One generated kernel launch: a flat 1-D grid over `threads` threads.
#[derive(Clone, Debug)]
pub struct GenKernel {
    pub name: String,
    pub threads: usize,
    pub args: Vec<Arg>,
    /// An explicit launch for tiled kernels; `None`: one thread per item.
    pub launch: Option<LaunchDims>,
}

/// A kernel launch's shape: grid, threads per block, and dynamic shared-memory bytes (kernels
/// over 48 KiB get their limit raised when loaded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchDims {
    pub grid: (u32, u32, u32),
    pub block: u32,
    pub smem: u32,
}

/// Accumulates the module source and the constant tables it needs.
pub struct Gen {
    pub src: String,
    pub extras: Vec<Vec<u8>>,
    /// The TMA tensor maps the kernels read ([`Arg::Map`]).
    pub maps: Vec<TensorMap2d>,
    /// Bytes of tile counters the kernels claimed ([`Arg::Counters`]), each kernel its own.
    pub counter_bytes: usize,
    count: usize,
    /// Activations stored as half.
    fp16: bool,
}

const PRELUDE: &str = r#"
typedef long long i64;
typedef unsigned char u8;
// IEEE half storage without cuda_fp16.h (NVRTC needs no include path): converts to and from
// float only, so all arithmetic happens in float.
struct alignas(2) half_t {
  unsigned short x;
  half_t() = default;
  __device__ half_t(float f) { asm("cvt.rn.f16.f32 %0, %1;" : "=h"(x) : "f"(f)); }
  __device__ operator float() const { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x)); return f; }
};
__device__ __forceinline__ float v_sigmoid(float x) { return 1.f / (1.f + expf(-x)); }
// Every kernel calls this before touching activations. Launched as a programmatic dependent
// (sm_90+) it waits until the previous kernel's writes are visible, then lets the next kernel
// launch; launched plainly both instructions return at once.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GRID_SYNC() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define GRID_SYNC()
#endif
"#;

/// The CUDA C storage type of a data type (`F` is float or half, per the module's precision).
pub fn ctype(dt: DataType) -> &'static str {
    match dt {
        DataType::F32 => "F",
        DataType::I64 => "i64",
        DataType::I32 => "int",
        DataType::I8 => "signed char",
        DataType::U8 | DataType::Bool => "u8",
    }
}

/// The CUDA C type a value is loaded into for arithmetic (float for float activations, whatever
/// their storage type).
pub fn ltype(dt: DataType) -> &'static str {
    match dt {
        DataType::F32 => "float",
        other => ctype(other),
    }
}

/// A float literal that NVRTC parses exactly (infinities and NaN as bit patterns).
pub fn flit(x: f32) -> String {
    if x.is_finite() {
        format!("{:.9e}f", x)
    } else {
        format!("__int_as_float({})", x.to_bits() as i32)
    }
}

/// Whether QuantizeLinear `q` may run inside the Transpose `t` that reads its output
/// ([`Gen::quantize_to_nhwc`]): a per-tensor quantization of a computed float NCHW image (at
/// most 4 channels) to bytes, reordered NCHW → NHWC. The caller checks that `t` is the only reader
/// and that `q`'s output is not a graph output.
pub fn quantize_transpose_fits(g: &Graph, q: &Node, t: &Node) -> bool {
    let (Op::QuantizeLinear { .. }, Op::Transpose { perm }) = (&q.op, &t.op) else {
        return false;
    };
    let (Some(x), Some(sv), Some(&qy)) = (q.input(0), q.input(1), q.outputs.first()) else {
        return false;
    };
    let shape = |v: ValueId| g.values[v].shape.clone().unwrap_or_default();
    let per_tensor = shape(sv).iter().product::<usize>() == 1
        && q.input(2)
            .is_none_or(|z| shape(z).iter().product::<usize>() == 1);
    let xs = shape(x);
    t.input(0) == Some(qy)
        && g.constant(x).is_none()
        && perm.as_slice() == [0, 2, 3, 1]
        && per_tensor
        && g.values[sv].dtype == DataType::F32
        && g.values[x].dtype == DataType::F32
        && matches!(g.values[qy].dtype, DataType::U8 | DataType::I8)
        && xs.len() == 4
        && (1..=4).contains(&xs[1])
}

/// Whether DequantizeLinear `dq` → GlobalAveragePool `gap` → QuantizeLinear `q` (each the
/// only reader of the one before) may run as one kernel ([`Gen::dequantize_pool_quantize`]):
/// per-tensor 8-bit codes in and out (computed ones: constants fold on the host), an NHWC pool,
/// f32 in between. The caller checks the
/// single readers and that no intermediate is a graph output.
pub fn dequantize_pool_quantize_fits(g: &Graph, dq: &Node, gap: &Node, q: &Node) -> bool {
    let (
        Op::DequantizeLinear { .. },
        Op::GlobalAveragePool {
            layout: Layout::Nhwc,
        },
        Op::QuantizeLinear { .. },
    ) = (&dq.op, &gap.op, &q.op)
    else {
        return false;
    };
    let shape = |v: ValueId| g.values[v].shape.clone().unwrap_or_default();
    let one = |v: Option<ValueId>| v.is_none_or(|v| shape(v).iter().product::<usize>() == 1);
    let f32_scale = |n: &Node| {
        n.input(1)
            .is_some_and(|s| g.values[s].dtype == DataType::F32)
    };
    let bytes = |v: Option<ValueId>| {
        v.is_some_and(|v| matches!(g.values[v].dtype, DataType::U8 | DataType::I8))
    };
    let float = |v: Option<ValueId>| v.is_some_and(|v| g.values[v].dtype == DataType::F32);
    let (x, d, p) = (
        dq.input(0),
        dq.outputs.first().copied(),
        gap.outputs.first().copied(),
    );
    gap.input(0) == d
        && q.input(0) == p
        && x.is_some_and(|x| g.constant(x).is_none())
        && bytes(x)
        && float(d)
        && float(p)
        && bytes(q.outputs.first().copied())
        && x.is_some_and(|x| shape(x).len() == 4)
        && f32_scale(dq)
        && f32_scale(q)
        && [dq.input(1), dq.input(2), q.input(1), q.input(2)]
            .into_iter()
            .all(one)
}

/// The NHWC global reduction of the pool kernels: a 256-thread block per (image, 32
/// channels), 32 coalesced lanes by 8 row groups, then the groups combined in order by the
/// first warp. One generator, so a fused kernel adds up in the pool's order exactly. Over
/// 8-bit codes whose channels come in fours (`quad`), a lane takes four neighbouring channels
/// with one 4-byte load (128 channels a block), each summed in the same order.
struct NhwcReduce<'a> {
    c: usize,
    hw: usize,
    /// The element type `x` points to.
    xc: &'a str,
    /// The float value of element `e` (of type `xc`) of the channel's column.
    read: String,
    init: &'a str,
    /// Folds `v` into `acc`.
    comb: &'a str,
    /// Four channels a lane (8-bit `xc`, `c` a multiple of 4).
    quad: bool,
}

impl NhwcReduce<'_> {
    /// Channels a block covers.
    fn block_channels(&self) -> usize {
        if self.quad {
            128
        } else {
            32
        }
    }

    /// The kernel body: `prelude` first, then the reduction, then `store` (with `acc` the
    /// channel's result, `nb` the image and `ch` the channel) for each channel in range.
    fn body(&self, prelude: &str, store: &str) -> String {
        let (c, hw, cb) = (self.c, self.hw, self.c.div_ceil(self.block_channels()));
        let (xc, read, init, comb) = (self.xc, &self.read, self.init, self.comb);
        if self.quad {
            let rows = self.rows(
                "unsigned int",
                "w",
                "*(const unsigned int*)(x + j*{c}LL)",
                "0u",
            );
            return format!(
                "__shared__ float sh[1024]; int t = threadIdx.x, lane = t & 31, grp = t >> 5; i64 blk = i / 256; i64 nb = blk / {cb}LL, ch0 = (blk % {cb}LL) * 128 + lane * 4;
  {prelude} float accs[4];
#pragma unroll
  for (int b = 0; b < 4; ++b) accs[b] = {init};
  if (ch0 < {c}LL) {{ const {xc}* x = p0 + nb*{hw}LL*{c}LL + ch0; {rows}
#pragma unroll
    for (int b = 0; b < 4; ++b) {{ float acc = accs[b]; {xc} e = ({xc})(w >> (8 * b)); float v = {read}; {comb} accs[b] = acc; }} }} }}
#pragma unroll
  for (int b = 0; b < 4; ++b) sh[b * 256 + t] = accs[b];
  __syncthreads();
  if (grp == 0) {{
#pragma unroll
    for (int b = 0; b < 4; ++b) {{ float acc = accs[b]; for (int k = 1; k < 8; ++k) {{ float v = sh[b * 256 + k*32 + lane]; {comb} }} i64 ch = ch0 + b; if (ch < {c}LL) {{ {store} }} }} }}"
            );
        }
        let rows = self.rows(xc, "e", "x[j*{c}LL]", &format!("({xc})0"));
        format!(
            "__shared__ float sh[256]; int t = threadIdx.x, lane = t & 31, grp = t >> 5; i64 blk = i / 256; i64 nb = blk / {cb}LL, ch = (blk % {cb}LL) * 32 + lane;
  {prelude} float acc = {init};
  if (ch < {c}LL) {{ const {xc}* x = p0 + nb*{hw}LL*{c}LL + ch; {rows} float v = {read}; {comb} }} }}
  sh[t] = acc; __syncthreads();
  if (grp == 0) {{ for (int k = 1; k < 8; ++k) {{ float v = sh[k*32 + lane]; {comb} }} if (ch < {c}LL) {{ {store} }} }}"
        )
    }

    /// The loop over a row group's elements `j` (`grp`, `grp + 8`, ...), declaring each as
    /// `name` (of `ty`, loaded by `load`, with `{c}` the channel count) for the block that
    /// follows it. Up to 16 rows a group, all loads are issued first (the reduction is
    /// latency-bound otherwise), then folded in the same order.
    fn rows(&self, ty: &str, name: &str, load: &str, zero: &str) -> String {
        let (c, hw) = (self.c, self.hw);
        let load = load.replace("{c}", &c.to_string());
        let r = hw.div_ceil(8);
        if r > 16 {
            return format!("for (i64 j = grp; j < {hw}LL; j += 8) {{ {ty} {name} = {load};");
        }
        format!(
            "{ty} rows_[{r}];
#pragma unroll
    for (int r = 0; r < {r}; ++r) {{ const i64 j = grp + r * 8; rows_[r] = j < {hw}LL ? {load} : {zero}; }}
#pragma unroll
    for (int r = 0; r < {r}; ++r) if (grp + r * 8 < {hw}LL) {{ {ty} {name} = rows_[r];"
        )
    }

    /// Threads for `n` images (a whole number of blocks, so none returns before the barrier).
    fn threads(&self, n: usize) -> usize {
        n * self.c.div_ceil(self.block_channels()) * 256
    }
}

/// Declares the per-tensor zero point `name` of Q/DQ `node` (its input 2, appended to
/// `params`, or 0 when absent) as a CUDA statement.
fn zero_point_param(g: &Graph, node: &Node, params: &mut Vec<(Arg, String)>, name: &str) -> String {
    match node.input(2) {
        Some(z) => {
            params.push((Arg::Val(z), format!("const {}", ctype(g.values[z].dtype))));
            format!("i64 {name} = (i64)p{}[0];", params.len() - 1)
        }
        None => format!("i64 {name} = 0;"),
    }
}

/// The codes an 8-bit type holds: 0..=255 for u8, -128..=127 for i8.
fn code_range(dt: DataType) -> (i64, i64) {
    if dt == DataType::U8 {
        (0, 255)
    } else {
        (-128, 127)
    }
}

/// QuantizeLinear of the float expression `x` into the code `q` (type `yt`, range `lo..=hi`),
/// with the scale `s` and zero point `z` (an 8-bit code held in an `i64`) in scope, as a CUDA
/// block (NaN quantizes to `z`). The clamped quotient fits an int, so it rounds with
/// `__float2int_rn` (half to even, as `rintf`) in 32 bits: 64-bit conversions run at a
/// fraction of the rate, and image quantization is made of little else.
fn quantize_code(x: &str, yt: DataType, lo: i64, hi: i64) -> String {
    format!(
        "{{ float v = {x} / s; if (v != v) v = 0.f; const int zi = (int)z; v = fminf(fmaxf(v, (float)({lo} - zi)), (float)({hi} - zi)); q = ({})(__float2int_rn(v) + zi); }}",
        ctype(yt)
    )
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        s[k] = s[k + 1] * shape[k + 1];
    }
    s
}

/// Code declaring `{p}0..{p}r-1` as the coordinates of linear index `i` in `shape`.
fn decompose(shape: &[usize], p: &str) -> String {
    // Below 2^32 elements the divisions run in 32 bits (a multiply-high each; 64-bit division
    // by a constant costs several times that); the coordinates stay i64 for the callers.
    let narrow = shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d as u64))
        .is_some_and(|n| n <= u32::MAX as u64);
    let (t, u) = if narrow {
        ("unsigned int", "u")
    } else {
        ("i64", "LL")
    };
    let mut s = format!("{t} r_ = ({t})i;");
    for k in (0..shape.len()).rev() {
        if k == 0 {
            let _ = write!(s, " i64 {p}{k} = (i64)r_;");
        } else {
            let d = shape[k];
            let _ = write!(s, " i64 {p}{k} = (i64)(r_ % {d}{u}); r_ /= {d}{u};");
        }
    }
    s.push_str(" (void)r_;");
    s
}

/// The offset into an input of shape `ins` broadcast to `out` (coordinates `{p}k` of `out`).
fn bcast_off(ins: &[usize], out: &[usize], p: &str) -> String {
    let n: usize = ins.iter().product();
    if n == 1 {
        return "0".into();
    }
    if ins == out {
        return "i".into();
    }
    let st = strides(ins);
    let lead = out.len() - ins.len();
    let mut terms = Vec::new();
    for (k, (&d, &s)) in ins.iter().zip(&st).enumerate() {
        if d != 1 {
            terms.push(format!("{p}{}*{s}LL", k + lead));
        }
    }
    if terms.is_empty() {
        "0".into()
    } else {
        terms.join("+")
    }
}

fn act_expr(a: Activation, x: &str) -> String {
    match a {
        Activation::Relu => format!("fmaxf({x}, 0.f)"),
        Activation::Clip { min, max } => format!("fminf(fmaxf({x}, {}), {})", flit(min), flit(max)),
        Activation::LeakyRelu { alpha } => format!("({x} >= 0.f ? {x} : {} * {x})", flit(alpha)),
        Activation::Sigmoid => format!("v_sigmoid({x})"),
        Activation::Silu => format!("({x} * v_sigmoid({x}))"),
        Activation::HardSwish => format!("({x} * fminf(fmaxf({x} / 6.f + 0.5f, 0.f), 1.f))"),
        Activation::HardSigmoid { alpha, beta } => format!(
            "fminf(fmaxf({} * {x} + {}, 0.f), 1.f)",
            flit(alpha),
            flit(beta)
        ),
        Activation::Tanh => format!("tanhf({x})"),
    }
}

fn unary_expr(u: UnaryOp, x: &str) -> String {
    match u {
        UnaryOp::Act(a) => act_expr(a, &format!("((float){x})")),
        UnaryOp::Neg => format!("(-{x})"),
        UnaryOp::Abs => format!("({x} < 0 ? -{x} : {x})"),
        UnaryOp::Exp => format!("expf({x})"),
        UnaryOp::Log => format!("logf({x})"),
        UnaryOp::Sqrt => format!("sqrtf({x})"),
        UnaryOp::Reciprocal => format!("(1.f / {x})"),
        UnaryOp::Floor => format!("floorf({x})"),
        UnaryOp::Ceil => format!("ceilf({x})"),
        UnaryOp::Round => format!("rintf({x})"),
        UnaryOp::Erf => format!("erff({x})"),
        UnaryOp::Not => format!("(u8)(!{x})"),
    }
}

fn binary_expr(op: BinaryOp, a: &str, b: &str) -> String {
    match op {
        BinaryOp::Add => format!("({a} + {b})"),
        BinaryOp::Sub => format!("({a} - {b})"),
        BinaryOp::Mul => format!("({a} * {b})"),
        BinaryOp::Div => format!("({a} / {b})"),
        BinaryOp::Pow => format!("powf((float){a}, (float){b})"),
        BinaryOp::Max => format!("({a} > {b} || {a} != {a} ? {a} : {b})"),
        BinaryOp::Min => format!("({a} < {b} || {a} != {a} ? {a} : {b})"),
        BinaryOp::Equal => format!("(u8)({a} == {b})"),
        BinaryOp::Less => format!("(u8)({a} < {b})"),
        BinaryOp::Greater => format!("(u8)({a} > {b})"),
        BinaryOp::And => format!("(u8)({a} && {b})"),
        BinaryOp::Or => format!("(u8)({a} || {b})"),
    }
}

fn shape_of(g: &Graph, v: ValueId) -> Result<&[usize]> {
    g.shape(v)
}

fn input(node: &Node, i: usize) -> Result<ValueId> {
    node.input(i).ok_or_else(|| {
        Error::InvalidModel(format!(
            "{} '{}' lacks input {i}",
            node.op.name(),
            node.name
        ))
    })
}

fn output(node: &Node, i: usize) -> Result<ValueId> {
    node.outputs.get(i).copied().ok_or_else(|| {
        Error::InvalidModel(format!(
            "{} '{}' lacks output {i}",
            node.op.name(),
            node.name
        ))
    })
}

fn unsupported(node: &Node, why: &str) -> Error {
    Error::Unsupported(format!(
        "CUDA backend: {} '{}': {why}",
        node.op.name(),
        node.name
    ))
}

fn norm_axis(axis: i64, rank: usize, node: &Node) -> Result<usize> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    if a < 0 || a as usize >= rank.max(1) {
        return Err(unsupported(node, &format!("axis {axis} out of range")));
    }
    Ok(a as usize)
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

impl Gen {
    /// A generator whose float activations (`F` in the source) are stored as `half_t` when
    /// `fp16`, else as `float`; arithmetic is float either way.
    pub fn new(fp16: bool) -> Self {
        let storage = if fp16 { "half_t" } else { "float" };
        Gen {
            src: format!("{PRELUDE}typedef {storage} F;\n"),
            extras: Vec::new(),
            maps: Vec::new(),
            counter_bytes: 0,
            count: 0,
            fp16,
        }
    }

    /// Converts `n` floats between the API's f32 and the activation storage type:
    /// `to_storage` reads f32 from `src` and writes `F` to `dst`, otherwise the reverse.
    pub fn convert(&mut self, src: Arg, dst: Arg, n: usize, to_storage: bool) -> GenKernel {
        let (a, b) = if to_storage {
            ("const float", "F")
        } else {
            ("const F", "float")
        };
        self.kernel(
            &[(src, a.into()), (dst, b.into())],
            n,
            "p1[i] = (float)p0[i];",
        )
    }

    /// Adds a constant table; returns its argument.
    pub fn extra(&mut self, bytes: Vec<u8>) -> Arg {
        self.extras.push(bytes);
        Arg::Extra(self.extras.len() - 1)
    }

    /// Adds a TMA tensor map; returns its argument.
    pub fn map(&mut self, spec: TensorMap2d) -> Arg {
        self.maps.push(spec);
        Arg::Map(self.maps.len() - 1)
    }

    /// Emits one kernel with parameters `(arg, C type)` named p0, p1, ... over `n` threads.
    pub fn kernel(&mut self, params: &[(Arg, String)], n: usize, body: &str) -> GenKernel {
        let name = self.next_name();
        let _ = write!(
            self.src,
            "\nextern \"C\" __global__ void {name}({}) {{\n  GRID_SYNC();\n  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;\n  if (i >= {n}LL) return;\n  {body}\n}}\n",
            Self::param_list(params)
        );
        GenKernel {
            name,
            threads: n,
            args: params.iter().map(|(a, _)| *a).collect(),
            launch: None,
        }
    }

    /// The C parameter list `T0* __restrict__ p0, ...` of `(arg, C type)` pairs.
    fn param_list<T: AsRef<str>>(params: &[(Arg, T)]) -> String {
        let list: Vec<String> = params
            .iter()
            .enumerate()
            .map(|(k, (_, t))| format!("{}* __restrict__ p{k}", t.as_ref()))
            .collect();
        list.join(", ")
    }

    /// A fresh kernel name in this module.
    fn next_name(&mut self) -> String {
        self.count += 1;
        format!("vk{}", self.count - 1)
    }

    /// Bias + residual + activation epilogue applied in place on `y` (channel `c` of each
    /// element from the layout); `bias` and `residual` (same shape as `y`) may be absent.
    pub fn epilogue(
        &mut self,
        y: ValueId,
        shape: &[usize],
        channel_axis: usize,
        bias: Option<Arg>,
        act: Option<Activation>,
        residual: Option<Arg>,
    ) -> GenKernel {
        let n: usize = shape.iter().product();
        let inner: usize = shape[channel_axis + 1..].iter().product();
        let c = shape[channel_axis];
        let mut params = vec![(Arg::Val(y), "F".to_string())];
        let mut body = String::from("float v = p0[i];");
        if let Some(b) = bias {
            params.push((b, "const F".into()));
            let k = params.len() - 1;
            if inner == 1 {
                let _ = write!(body, " v += p{k}[i % {c}LL];");
            } else {
                let _ = write!(body, " v += p{k}[(i / {inner}LL) % {c}LL];");
            }
        }
        if let Some(z) = residual {
            params.push((z, "const F".into()));
            let _ = write!(body, " v += (float)p{}[i];", params.len() - 1);
        }
        if let Some(a) = act {
            let _ = write!(body, " v = {};", act_expr(a, "v"));
        }
        body.push_str(" p0[i] = v;");
        self.kernel(&params, n, &body)
    }

    /// Gemm epilogue: `y = act(y + beta * C[broadcast])`.
    pub fn gemm_epilogue(
        &mut self,
        y: ValueId,
        yshape: &[usize],
        c: Option<(Arg, Vec<usize>, f32)>,
        act: Option<Activation>,
    ) -> GenKernel {
        let n: usize = yshape.iter().product();
        let mut params = vec![(Arg::Val(y), "F".to_string())];
        let mut body = decompose(yshape, "c");
        body.push_str(" float v = p0[i];");
        if let Some((arg, cs, beta)) = c {
            params.push((arg, "const F".into()));
            let _ = write!(
                body,
                " v += {} * p1[{}];",
                flit(beta),
                bcast_off(&cs, yshape, "c")
            );
        }
        if let Some(a) = act {
            let _ = write!(body, " v = {};", act_expr(a, "v"));
        }
        body.push_str(" p0[i] = v;");
        self.kernel(&params, n, &body)
    }

    /// Zero-pads an NCHW/NHWC activation into the node's scratch slot (for asymmetric conv pads).
    #[allow(clippy::too_many_arguments)]
    pub fn pad_into_scratch(
        &mut self,
        x: ValueId,
        nhwc: bool,
        (n, c, h, w): (usize, usize, usize, usize),
        (pt, pl): (usize, usize),
        (ph, pw): (usize, usize),
    ) -> GenKernel {
        let total = n * c * ph * pw;
        let (shape, hy, wx, cc) = if nhwc {
            (vec![n, ph, pw, c], 1, 2, 3)
        } else {
            (vec![n, c, ph, pw], 2, 3, 1)
        };
        let src = if nhwc {
            format!("((q0*{h}LL + y)*{w}LL + xx)*{c}LL + q{cc}")
        } else {
            format!("((q0*{c}LL + q{cc})*{h}LL + y)*{w}LL + xx")
        };
        let body = format!(
            "{} i64 y = q{hy} - {pt}LL; i64 xx = q{wx} - {pl}LL; p1[i] = (y >= 0 && y < {h}LL && xx >= 0 && xx < {w}LL) ? (float)p0[{src}] : 0.f;",
            decompose(&shape, "q")
        );
        self.kernel(
            &[(Arg::Val(x), "const F".into()), (Arg::Scratch, "F".into())],
            total,
            &body,
        )
    }

    /// Unfolds NHWC `x` into the node's scratch slot as the row-major `[N·OH·OW, KH·KW·C]`
    /// patch matrix (column order kh, kw, c: the OHWI weight order), zeros where the window
    /// falls in the padding, so that a convolution becomes one GEMM. Each thread copies the
    /// widest run of channels (up to 16 bytes) that divides C, as raw bits.
    pub fn im2col_into_scratch(&mut self, x: ValueId, geom: &Im2col) -> GenKernel {
        let Im2col {
            n,
            c,
            h,
            w,
            oh,
            ow,
            kh,
            kw,
            stride: [sh, sw],
            pad: [pt, pl],
            dilation: [dh, dw],
        } = *geom;
        let elem = if self.fp16 { 2 } else { 4 };
        let (unit, ty) = [
            (16, "uint4"),
            (8, "uint2"),
            (4, "unsigned int"),
            (2, "unsigned short"),
        ]
        .into_iter()
        .find(|&(u, _)| u >= elem && (c * elem) % u == 0)
        .unwrap_or((
            elem,
            if elem == 2 {
                "unsigned short"
            } else {
                "unsigned int"
            },
        ));
        let cu = c * elem / unit;
        let shape = [n, oh, ow, kh, kw, cu];
        let body = format!(
            "{} i64 y = q1*{sh}LL - {pt}LL + q3*{dh}LL; i64 xx = q2*{sw}LL - {pl}LL + q4*{dw}LL; typedef {ty} U; U v = U(); if (y >= 0 && y < {h}LL && xx >= 0 && xx < {w}LL) v = ((const U*)p0)[((q0*{h}LL + y)*{w}LL + xx)*{cu}LL + q5]; ((U*)p1)[i] = v;",
            decompose(&shape, "q")
        );
        self.kernel(
            &[(Arg::Val(x), "const F".into()), (Arg::Scratch, "F".into())],
            shape.iter().product(),
            &body,
        )
    }

    /// Generates the kernels for one node that is not a Conv, Gemm, MatMul or plain copy.
    pub fn node(&mut self, g: &Graph, node: &Node) -> Result<Vec<GenKernel>> {
        match &node.op {
            Op::Unary(_)
            | Op::Binary(_)
            | Op::Elementwise(_)
            | Op::Clip
            | Op::Where
            | Op::Cast { .. }
            | Op::BatchNormalization { .. } => self.elementwise(g, node).map(|k| vec![k]),
            Op::Softmax { axis } => self.softmax(g, node, *axis).map(|k| vec![k]),
            Op::ReduceMean { axes, keepdims } => self
                .reduce_mean(g, node, axes.as_deref(), *keepdims)
                .map(|k| vec![k]),
            Op::MaxPool(_) | Op::AveragePool(_) => self.pool(g, node).map(|k| vec![k]),
            Op::GlobalAveragePool { layout } | Op::GlobalMaxPool { layout } => {
                self.global_pool(g, node, *layout).map(|k| vec![k])
            }
            Op::Resize(_) => self.resize(g, node).map(|k| vec![k]),
            Op::Concat { axis } => self.concat(g, node, *axis).map(|k| vec![k]),
            Op::Split { axis, .. } => self.split(g, node, *axis).map(|k| vec![k]),
            Op::Slice => self.slice(g, node).map(|k| vec![k]),
            Op::Transpose { perm } => self.transpose(g, node, perm).map(|k| vec![k]),
            Op::Expand => self.expand(g, node).map(|k| vec![k]),
            Op::Gather { axis } => self.gather(g, node, *axis).map(|k| vec![k]),
            Op::Pad { mode } => self.pad(g, node, *mode).map(|k| vec![k]),
            Op::QuantizeLinear { axis, .. } => self.qdq(g, node, true, *axis).map(|k| vec![k]),
            Op::DequantizeLinear { axis } => self.qdq(g, node, false, *axis).map(|k| vec![k]),
            Op::QLut { table, dtype } => self.qlut(g, node, table, *dtype).map(|k| vec![k]),
            Op::QConv(q) => self.qconv(g, node, q).map(|k| vec![k]),
            Op::QGemm(q) => self.qgemm(g, node, q).map(|k| vec![k]),
            Op::QAdd(q) => self.qadd(g, node, q).map(|k| vec![k]),
            Op::ConvTranspose(a) => self.conv_transpose(g, node, a).map(|k| vec![k]),
            _ => Err(unsupported(node, "no CUDA kernel for this op")),
        }
    }

    fn elementwise(&mut self, g: &Graph, node: &Node) -> Result<GenKernel> {
        let y = output(node, 0)?;
        let ys = shape_of(g, y)?.to_vec();
        let yt = ctype(g.values[y].dtype);
        let ylt = ltype(g.values[y].dtype);
        let n: usize = ys.iter().product();
        let mut params = vec![(Arg::Val(y), yt.to_string())];
        let mut body = decompose(&ys, "c");
        // Loads each present input into v{k}.
        let mut load = |this: &mut Self, k: usize, v: ValueId, body: &mut String| -> Result<()> {
            let s = shape_of(g, v)?;
            if s.len() > ys.len() {
                return Err(unsupported(node, "input of higher rank than the output"));
            }
            params.push((Arg::Val(v), format!("const {}", ctype(g.values[v].dtype))));
            let _ = write!(
                body,
                " {} v{k} = p{}[{}];",
                ltype(g.values[v].dtype),
                params.len() - 1,
                bcast_off(s, &ys, "c")
            );
            let _ = this;
            Ok(())
        };
        let result = 'bn: {
            match &node.op {
                Op::Unary(u) => {
                    load(self, 0, input(node, 0)?, &mut body)?;
                    unary_expr(*u, "v0")
                }
                Op::Binary(b) => {
                    load(self, 0, input(node, 0)?, &mut body)?;
                    load(self, 1, input(node, 1)?, &mut body)?;
                    binary_expr(*b, "v0", "v1")
                }
                Op::Where => {
                    for k in 0..3 {
                        load(self, k, input(node, k)?, &mut body)?;
                    }
                    "(v0 ? v1 : v2)".to_string()
                }
                Op::Cast { to } => {
                    load(self, 0, input(node, 0)?, &mut body)?;
                    if *to == DataType::Bool {
                        "(u8)(v0 != 0)".into()
                    } else {
                        "v0".into()
                    }
                }
                Op::Clip => {
                    load(self, 0, input(node, 0)?, &mut body)?;
                    let bound = |i: usize| -> Result<Option<f32>> {
                        match node.input(i) {
                            None => Ok(None),
                            Some(v) => match g.constant(v) {
                                Some(t) => Ok(t.to_f32_vec().first().copied()),
                                None => Err(unsupported(node, "runtime Clip bounds")),
                            },
                        }
                    };
                    let mut e = "v0".to_string();
                    if let Some(lo) = bound(1)? {
                        e = format!("({e} < ({ylt}){} ? ({ylt}){} : {e})", flit(lo), flit(lo));
                    }
                    if let Some(hi) = bound(2)? {
                        e = format!("({e} > ({ylt}){} ? ({ylt}){} : {e})", flit(hi), flit(hi));
                    }
                    e
                }
                Op::BatchNormalization { epsilon } => {
                    load(self, 0, input(node, 0)?, &mut body)?;
                    if ys.len() < 2 || node.outputs.len() > 1 {
                        return Err(unsupported(node, "input rank below 2 or training outputs"));
                    }
                    let runtime = (1..5).any(|i| g.const_input(node, i).is_none());
                    if runtime {
                        // Parameters computed by the graph: folded per element from their slots.
                        for i in 1..5 {
                            let v = input(node, i)?;
                            if g.values[v].dtype != DataType::F32
                                || shape_of(g, v)?.iter().product::<usize>() != ys[1]
                            {
                                return Err(unsupported(
                                    node,
                                    "parameters do not match the channels",
                                ));
                            }
                            params.push((Arg::Val(v), "const F".into()));
                        }
                        let k = params.len() - 4;
                        let _ = write!(
                        body,
                        " float s_ = (float)p{k}[c1] / sqrtf((float)p{}[c1] + {}); float b_ = (float)p{}[c1] - (float)p{}[c1] * s_;",
                        k + 3,
                        flit(*epsilon),
                        k + 1,
                        k + 2
                    );
                        break 'bn "(v0 * s_ + b_)".to_string();
                    }
                    let get = |i: usize| -> Result<Vec<f32>> {
                        let v = input(node, i)?;
                        g.constant(v).map(|t| t.to_f32_vec()).ok_or_else(|| {
                            unsupported(node, "runtime BatchNormalization parameters")
                        })
                    };
                    let (sc, b, m, var) = (get(1)?, get(2)?, get(3)?, get(4)?);
                    if ys.len() < 2 || sc.len() != ys[1] {
                        return Err(unsupported(node, "parameters do not match the channels"));
                    }
                    let mul: Vec<f32> = sc
                        .iter()
                        .zip(&var)
                        .map(|(s, v)| s / (v + epsilon).sqrt())
                        .collect();
                    let add: Vec<f32> = b
                        .iter()
                        .zip(&m)
                        .zip(&mul)
                        .map(|((b, m), k)| b - m * k)
                        .collect();
                    let a1 = self.extra(f32_bytes(&mul));
                    let a2 = self.extra(f32_bytes(&add));
                    params.push((a1, "const float".into()));
                    params.push((a2, "const float".into()));
                    let k = params.len();
                    format!("(v0 * p{}[c1] + p{}[c1])", k - 2, k - 1)
                }
                Op::Elementwise(steps) => {
                    let present: Vec<ValueId> = node
                        .inputs
                        .iter()
                        .map(|i| i.unwrap_or(usize::MAX))
                        .collect();
                    for (k, &v) in present.iter().enumerate() {
                        if v == usize::MAX {
                            return Err(unsupported(node, "omitted chain input"));
                        }
                        load(self, k, v, &mut body)?;
                    }
                    body.push_str(" auto a0 = v0;");
                    let mut cur = 0;
                    for st in steps {
                        let e = match *st {
                            ChainStep::Unary(u) => unary_expr(u, &format!("a{cur}")),
                            ChainStep::Binary {
                                op,
                                operand,
                                acc_on_right,
                            } => {
                                if operand >= present.len() {
                                    return Err(unsupported(node, "chain operand out of range"));
                                }
                                let (a, b) = if acc_on_right {
                                    (format!("v{operand}"), format!("a{cur}"))
                                } else {
                                    (format!("a{cur}"), format!("v{operand}"))
                                };
                                binary_expr(op, &a, &b)
                            }
                        };
                        let _ = write!(body, " auto a{} = {e};", cur + 1);
                        cur += 1;
                    }
                    format!("a{cur}")
                }
                _ => return Err(unsupported(node, "not elementwise")),
            }
        };
        let _ = write!(body, " p0[i] = ({yt})({result});");
        Ok(self.kernel(&params, n, &body))
    }

    fn softmax(&mut self, g: &Graph, node: &Node, axis: i64) -> Result<GenKernel> {
        let x = input(node, 0)?;
        let y = output(node, 0)?;
        let s = shape_of(g, x)?.to_vec();
        if g.values[x].dtype != DataType::F32 {
            return Err(unsupported(node, "non-f32 input"));
        }
        let (outer, len, inner) = if s.is_empty() {
            (1, 1, 1)
        } else {
            let a = norm_axis(axis, s.len(), node)?;
            let outer: usize = s[..a].iter().product();
            if g.opset != 0 && g.opset < 13 {
                (outer, s[a..].iter().product(), 1)
            } else {
                (outer, s[a], s[a + 1..].iter().product::<usize>())
            }
        };
        if inner == 1 && len >= 32 {
            // One warp per row.
            let body = format!(
                "i64 row = i / 32; int lane = threadIdx.x & 31; const F* x = p0 + row*{len}LL; F* y = p1 + row*{len}LL;
  float m = -3.402823466e38f; for (i64 j = lane; j < {len}LL; j += 32) m = fmaxf(m, (float)x[j]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  float s = 0.f; for (i64 j = lane; j < {len}LL; j += 32) s += expf((float)x[j] - m);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  float r = 1.f / s; for (i64 j = lane; j < {len}LL; j += 32) y[j] = expf((float)x[j] - m) * r;"
            );
            return Ok(self.kernel(
                &[(Arg::Val(x), "const F".into()), (Arg::Val(y), "F".into())],
                outer * 32,
                &body,
            ));
        }
        let body = format!(
            "i64 o = i / {inner}LL, in_ = i % {inner}LL; const F* x = p0 + o*{len}LL*{inner}LL + in_; F* y = p1 + o*{len}LL*{inner}LL + in_;
  float m = x[0]; for (i64 j = 1; j < {len}LL; ++j) m = fmaxf(m, x[j*{inner}LL]);
  float s = 0.f; for (i64 j = 0; j < {len}LL; ++j) {{ float e = expf(x[j*{inner}LL] - m); y[j*{inner}LL] = e; s += e; }}
  float r = 1.f / s; for (i64 j = 0; j < {len}LL; ++j) y[j*{inner}LL] = r * (float)y[j*{inner}LL];"
        );
        Ok(self.kernel(
            &[(Arg::Val(x), "const F".into()), (Arg::Val(y), "F".into())],
            outer * inner,
            &body,
        ))
    }

    fn reduce_mean(
        &mut self,
        g: &Graph,
        node: &Node,
        axes: Option<&[i64]>,
        keepdims: bool,
    ) -> Result<GenKernel> {
        let x = input(node, 0)?;
        let y = output(node, 0)?;
        let xs = shape_of(g, x)?.to_vec();
        if g.values[x].dtype != DataType::F32 {
            return Err(unsupported(node, "non-f32 input"));
        }
        let axes: Vec<i64> = match axes {
            Some(a) => a.to_vec(),
            None => match node.input(1).and_then(|v| g.constant(v)) {
                Some(t) => t.to_i64_vec()?,
                None => (0..xs.len() as i64).collect(),
            },
        };
        let axes: Vec<i64> = if axes.is_empty() {
            (0..xs.len() as i64).collect()
        } else {
            axes
        };
        let mut red = vec![false; xs.len()];
        for &a in &axes {
            red[norm_axis(a, xs.len(), node)?] = true;
        }
        let _ = keepdims;
        let kept: Vec<usize> = (0..xs.len()).filter(|&k| !red[k]).collect();
        let rdims: Vec<usize> = (0..xs.len()).filter(|&k| red[k]).collect();
        let kshape: Vec<usize> = kept.iter().map(|&k| xs[k]).collect();
        let rshape: Vec<usize> = rdims.iter().map(|&k| xs[k]).collect();
        let st = strides(&xs);
        let n_out: usize = kshape.iter().product();
        let n_red: usize = rshape.iter().product();
        let mut body = decompose(&kshape, "c");
        let base: Vec<String> = kept
            .iter()
            .enumerate()
            .map(|(j, &k)| format!("c{j}*{}LL", st[k]))
            .chain(std::iter::once("0".to_string()))
            .collect();
        let _ = write!(
            body,
            " i64 base = {}; float s = 0.f; for (i64 j = 0; j < {n_red}LL; ++j) {{ i64 q = j; i64 off = 0;",
            base.join("+")
        );
        for (j, &k) in rdims.iter().enumerate().rev() {
            let _ = write!(
                body,
                " off += (q % {}LL) * {}LL; q /= {}LL;",
                rshape[j], st[k], rshape[j]
            );
        }
        let _ = write!(
            body,
            " s += p0[base + off]; }} p1[i] = s / {}.f;",
            n_red.max(1)
        );
        Ok(self.kernel(
            &[(Arg::Val(x), "const F".into()), (Arg::Val(y), "F".into())],
            n_out,
            &body,
        ))
    }

    fn pool(&mut self, g: &Graph, node: &Node) -> Result<GenKernel> {
        let (a, is_max) = match &node.op {
            Op::MaxPool(a) => (a, true),
            Op::AveragePool(a) => (a, false),
            _ => return Err(unsupported(node, "not a pool")),
        };
        if node.outputs.len() > 1 {
            return Err(unsupported(node, "MaxPool indices output"));
        }
        let x = input(node, 0)?;
        let y = output(node, 0)?;
        let nhwc = a.layout == Layout::Nhwc;
        // 1-D pooling runs as 2-D with H = 1 (a unit axis inserted before W).
        let lift = |s: &[usize]| -> Vec<usize> {
            match (s.len(), nhwc) {
                (3, false) => vec![s[0], s[1], 1, s[2]],
                (3, true) => vec![s[0], 1, s[1], s[2]],
                _ => s.to_vec(),
            }
        };
        let (xs0, ys0) = (shape_of(g, x)?, shape_of(g, y)?);
        let one_d = xs0.len() == 3 && a.kernel_shape.len() == 1;
        if !(one_d || xs0.len() == 4 && a.kernel_shape.len() == 2) || ys0.len() != xs0.len() {
            return Err(unsupported(node, "only 1-D and 2-D pooling"));
        }
        let (xs, ys) = (lift(xs0), lift(ys0));
        let (h, w) = if nhwc { (xs[1], xs[2]) } else { (xs[2], xs[3]) };
        let c = if nhwc { xs[3] } else { xs[1] };
        let pair = |v: &[usize], d: usize| -> (usize, usize) {
            if one_d {
                (d, v.first().copied().unwrap_or(d))
            } else {
                (
                    v.first().copied().unwrap_or(d),
                    v.get(1).copied().unwrap_or(d),
                )
            }
        };
        let (kh, kw) = pair(&a.kernel_shape, 1);
        let (sh, sw) = pair(&a.strides, 1);
        let (dh, dw) = pair(&a.dilations, 1);
        let p = |k: usize| a.pads.get(k).copied().unwrap_or(0);
        let (pt, pl, pb, pr) = if one_d {
            (0, p(0), 0, p(1))
        } else {
            (p(0), p(1), p(2), p(3))
        };
        let codes = matches!(g.values[x].dtype, DataType::U8 | DataType::I8);
        if codes && is_max && nhwc && c.is_multiple_of(4) {
            // NHWC 8-bit codes: 4 or 16 channels a thread, a byte-wise max per word (a window
            // with no valid tap keeps the lowest code, as the CPU kernel gives).
            let signed = g.values[x].dtype == DataType::I8;
            let (v, vt, lanes) = if c.is_multiple_of(16) {
                (16, "uint4", VECTOR_LANES.as_slice())
            } else {
                (4, "unsigned int", [""].as_slice())
            };
            let (max, lo) = if signed {
                ("__vmaxs4", "0x80808080u")
            } else {
                ("__vmaxu4", "0u")
            };
            let init: Vec<String> = lanes.iter().map(|l| format!("a{l} = {lo};")).collect();
            // A tap outside the image reads a valid address and counts as the lowest code.
            let comb: Vec<String> = lanes
                .iter()
                .map(|l| format!("a{l} = {max}(a{l}, ok ? t{l} : {lo});"))
                .collect();
            let cv = c / v;
            // Small windows unroll, so every tap's load is issued before the first max (a
            // branch around each load would leave it waiting on the one before).
            let unroll = if kh * kw <= 16 { "#pragma unroll" } else { "" };
            // Index arithmetic in 32 bits where the input's vectors number below 2^31.
            let ix_t = if xs[0] * h * w * cv < i32::MAX as usize {
                "int"
            } else {
                "i64"
            };
            let mut body = decompose(&[ys[0], ys[1], ys[2], cv], "q");
            let _ = write!(
                body,
                " {vt} a; {init}
{unroll}
  for (int ky = 0; ky < {kh}; ++ky) {{ const {ix_t} iy = ({ix_t})q1*{sh} - {pt} + ky*{dh}; const bool oky = iy >= 0 && iy < {h};
{unroll}
    for (int kx = 0; kx < {kw}; ++kx) {{ const {ix_t} ix = ({ix_t})q2*{sw} - {pl} + kx*{dw}; const bool ok = oky && ix >= 0 && ix < {w};
      {vt} t = ((const {vt}*)p0)[((({ix_t})q0*{h} + (ok ? iy : 0))*{w} + (ok ? ix : 0))*{cv} + ({ix_t})q3]; {comb} }} }}
  (({vt}*)p1)[i] = a;",
                init = init.join(" "),
                comb = comb.join(" "),
            );
            return Ok(self.kernel(
                &[(Arg::Val(x), "const u8".into()), (Arg::Val(y), "u8".into())],
                ys[0] * ys[1] * ys[2] * cv,
                &body,
            ));
        }
        let (cn, cc, cy, cx) = if nhwc { (0, 3, 1, 2) } else { (0, 1, 2, 3) };
        let idx = if nhwc {
            format!("((q{cn}*{h}LL + iy)*{w}LL + ix)*{c}LL + q{cc}")
        } else {
            format!("((q{cn}*{c}LL + q{cc})*{h}LL + iy)*{w}LL + ix")
        };
        let mut body = decompose(&ys, "q");
        let _ = write!(
            body,
            " float acc = {}; int cnt = 0, cntp = 0;
  for (int ky = 0; ky < {kh}; ++ky) {{ i64 iy = q{cy}*{sh}LL - {pt}LL + ky*{dh}LL;
    for (int kx = 0; kx < {kw}; ++kx) {{ i64 ix = q{cx}*{sw}LL - {pl}LL + kx*{dw}LL;
      if (iy >= -{pt}LL && iy < {h}LL + {pb}LL && ix >= -{pl}LL && ix < {w}LL + {pr}LL) ++cntp;
      if (iy < 0 || iy >= {h}LL || ix < 0 || ix >= {w}LL) continue;
      float v = p0[{idx}]; {} ++cnt; }} }}",
            if is_max { "-3.402823466e38f" } else { "0.f" },
            if is_max {
                "acc = fmaxf(acc, v);"
            } else {
                "acc += v;"
            }
        );
        if codes && !is_max {
            return Err(unsupported(node, "AveragePool on 8-bit codes"));
        }
        if codes {
            // QDQ propagation runs MaxPool on 8-bit codes: the max of codes is exact in float;
            // a window with no valid tap gives the lowest code (as the CPU kernel does).
            let lo = if g.values[x].dtype == DataType::I8 {
                -128
            } else {
                0
            };
            let _ = write!(body, " p1[i] = cnt > 0 ? acc : {lo}.f;");
        } else if is_max {
            body.push_str(" p1[i] = acc;");
        } else if a.count_include_pad {
            body.push_str(" p1[i] = cntp > 0 ? acc / (float)cntp : 0.f;");
        } else {
            body.push_str(" p1[i] = cnt > 0 ? acc / (float)cnt : 0.f;");
        }
        let t = ctype(g.values[x].dtype);
        Ok(self.kernel(
            &[(Arg::Val(x), format!("const {t}")), (Arg::Val(y), t.into())],
            ys.iter().product(),
            &body,
        ))
    }

    fn global_pool(&mut self, g: &Graph, node: &Node, layout: Layout) -> Result<GenKernel> {
        let x = input(node, 0)?;
        let y = output(node, 0)?;
        let xs = shape_of(g, x)?.to_vec();
        if xs.len() < 3 {
            return Err(unsupported(node, "rank below 3"));
        }
        let is_max = matches!(node.op, Op::GlobalMaxPool { .. });
        let nhwc = layout == Layout::Nhwc;
        let (n, c) = if nhwc {
            (xs[0], xs[xs.len() - 1])
        } else {
            (xs[0], xs[1])
        };
        let hw: usize = xs.iter().product::<usize>() / (n * c).max(1);
        let init = if is_max { "-3.402823466e38f" } else { "0.f" };
        let (comb, fin) = if is_max {
            ("acc = fmaxf(acc, v);", "acc".to_string())
        } else {
            ("acc += v;", format!("acc / {}.f", hw.max(1)))
        };
        // Block-level reductions (the launcher's blocks are 256 threads; the thread count is a
        // multiple of the block, so no thread returns before the barrier).
        let (body, threads) = if nhwc {
            let reduce = NhwcReduce {
                c,
                hw,
                xc: "F",
                read: "e".into(),
                init,
                comb,
                quad: false,
            };
            (
                reduce.body("", &format!("p1[nb*{c}LL + ch] = {fin};")),
                reduce.threads(n),
            )
        } else {
            // One warp per (image, channel) plane.
            (
                format!(
                    "i64 plane = i / 32; int lane = threadIdx.x & 31; const F* x = p0 + plane*{hw}LL;
  float acc = {init}; for (i64 j = lane; j < {hw}LL; j += 32) {{ float v = x[j]; {comb} }}
  for (int o = 16; o > 0; o >>= 1) {{ float v = __shfl_xor_sync(0xffffffffu, acc, o); {comb} }}
  if (lane == 0) p1[plane] = {fin};"
                ),
                n * c * 32,
            )
        };
        Ok(self.kernel(
            &[(Arg::Val(x), "const F".into()), (Arg::Val(y), "F".into())],
            threads,
            &body,
        ))
    }

    fn resize(&mut self, g: &Graph, node: &Node) -> Result<GenKernel> {
        let Op::Resize(a) = &node.op else {
            return Err(unsupported(node, "not a resize"));
        };
        let x = input(node, 0)?;
        let y = output(node, 0)?;
        let xs = shape_of(g, x)?.to_vec();
        let os = shape_of(g, y)?.to_vec();
        if xs.len() != 4 || os.len() != 4 {
            return Err(unsupported(node, "only 4-D inputs"));
        }
        let pos = if a.layout == Layout::Nhwc {
            [0, 3, 1, 2]
        } else {
            [0, 1, 2, 3]
        };
        let (n, c, h, w) = (xs[pos[0]], xs[pos[1]], xs[pos[2]], xs[pos[3]]);
        let (on, oc, oh, ow) = (os[pos[0]], os[pos[1]], os[pos[2]], os[pos[3]]);
        if on != n || oc != c || h == 0 || w == 0 {
            return Err(unsupported(node, "resizing batch or channels"));
        }
        let scales: Vec<f32> = g
            .const_input(node, 2)
            .map(|t| t.to_f32_vec())
            .unwrap_or_default();
        let pick = |inp: usize, out: usize, cands: &[usize]| -> f32 {
            for &i in cands {
                if let Some(&s) = scales.get(i) {
                    if s > 0.0 && ((inp as f32 * s).floor() as usize == out) {
                        return s;
                    }
                }
            }
            out as f32 / inp as f32
        };
        let ty = taps(a, pick(h, oh, &[2, pos[2]]), h, oh);
        let tx = taps(a, pick(w, ow, &[3, pos[3]]), w, ow);
        let table = |t: &[Tap]| -> Vec<u8> {
            let mut b = Vec::with_capacity(t.len() * 16);
            for tap in t {
                b.extend_from_slice(&(tap.i0 as i32).to_le_bytes());
                b.extend_from_slice(&(tap.i1 as i32).to_le_bytes());
                b.extend_from_slice(&tap.w0.to_le_bytes());
                b.extend_from_slice(&tap.w1.to_le_bytes());
            }
            b
        };
        let ay = self.extra(table(&ty));
        let ax = self.extra(table(&tx));
        let nearest = a.mode == ResizeMode::Nearest;
        let (cn, cc, cy, cx) = (pos[0], pos[1], pos[2], pos[3]);
        let at = |yy: &str, xx: &str| -> String {
            if a.layout == Layout::Nhwc {
                format!("p0[((q{cn}*{h}LL + {yy})*{w}LL + {xx})*{c}LL + q{cc}]")
            } else {
                format!("p0[((q{cn}*{c}LL + q{cc})*{h}LL + {yy})*{w}LL + {xx}]")
            }
        };
        let mut body = decompose(&os, "q");
        let _ = write!(
            body,
            " const int* ty = (const int*)p2 + 4*q{cy}; const int* tx = (const int*)p3 + 4*q{cx};
  int y0 = ty[0], y1 = ty[1], x0 = tx[0], x1 = tx[1];
  float wy0 = __int_as_float(ty[2]), wy1 = __int_as_float(ty[3]), wx0 = __int_as_float(tx[2]), wx1 = __int_as_float(tx[3]);"
        );
        if nearest {
            let _ = write!(
                body,
                " (void)y1; (void)x1; (void)wy0; (void)wy1; (void)wx0; (void)wx1; p1[i] = {};",
                at("y0", "x0")
            );
        } else {
            let _ = write!(
                body,
                " p1[i] = wy0 * (wx0 * {} + wx1 * {}) + wy1 * (wx0 * {} + wx1 * {});",
                at("y0", "x0"),
                at("y0", "x1"),
                at("y1", "x0"),
                at("y1", "x1")
            );
        }
        Ok(self.kernel(
            &[
                (Arg::Val(x), "const F".into()),
                (Arg::Val(y), "F".into()),
                (ay, "const float".into()),
                (ax, "const float".into()),
            ],
            os.iter().product(),
            &body,
        ))
    }

    fn concat(&mut self, g: &Graph, node: &Node, axis: i64) -> Result<GenKernel> {
        let y = output(node, 0)?;
        let ys = shape_of(g, y)?.to_vec();
        let a = norm_axis(axis, ys.len(), node)?;
        let t = ctype(g.values[y].dtype);
        let mut params = vec![(Arg::Val(y), t.to_string())];
        let mut body = decompose(&ys, "c");
        let mut start = 0usize;
        for v in node.present_inputs() {
            let s = shape_of(g, v)?.to_vec();
            if s.len() != ys.len() {
                return Err(unsupported(node, "inputs of different rank"));
            }
            let len = s[a];
            if len == 0 {
                continue;
            }
            params.push((Arg::Val(v), format!("const {t}")));
            let k = params.len() - 1;
            let st = strides(&s);
            let off: Vec<String> = (0..s.len())
                .map(|d| {
                    if d == a {
                        format!("(c{d}-{start}LL)*{}LL", st[d])
                    } else {
                        format!("c{d}*{}LL", st[d])
                    }
                })
                .collect();
            let _ = write!(
                body,
                " if (c{a} < {}LL) {{ p0[i] = p{k}[{}]; return; }}",
                start + len,
                off.join("+")
            );
            start += len;
        }
        Ok(self.kernel(&params, ys.iter().product(), &body))
    }

    fn split(&mut self, g: &Graph, node: &Node, axis: i64) -> Result<GenKernel> {
        let x = input(node, 0)?;
        let xs = shape_of(g, x)?.to_vec();
        let a = norm_axis(axis, xs.len(), node)?;
        let t = ctype(g.values[x].dtype);
        let mut params = vec![(Arg::Val(x), format!("const {t}"))];
        let mut body = decompose(&xs, "c");
        let mut start = 0usize;
        for &o in &node.outputs {
            let s = shape_of(g, o)?.to_vec();
            let len = s.get(a).copied().unwrap_or(0);
            if len == 0 {
                continue;
            }
            params.push((Arg::Val(o), t.to_string()));
            let k = params.len() - 1;
            let st = strides(&s);
            let off: Vec<String> = (0..s.len())
                .map(|d| {
                    if d == a {
                        format!("(c{d}-{start}LL)*{}LL", st[d])
                    } else {
                        format!("c{d}*{}LL", st[d])
                    }
                })
                .collect();
            let _ = write!(
                body,
                " if (c{a} < {}LL) {{ p{k}[{}] = p0[i]; return; }}",
                start + len,
                off.join("+")
            );
            start += len;
        }
        Ok(self.kernel(&params, xs.iter().product(), &body))
    }

    fn slice(&mut self, g: &Graph, node: &Node) -> Result<GenKernel> {
        let x = input(node, 0)?;
        let y = output(node, 0)?;
        let xs = shape_of(g, x)?.to_vec();
        let ys = shape_of(g, y)?.to_vec();
        let get = |i: usize| -> Result<Option<Vec<i64>>> {
            match node.input(i) {
                None => Ok(None),
                Some(v) => g
                    .constant(v)
                    .map(|t| t.to_i64_vec().map(Some))
                    .unwrap_or_else(|| Err(unsupported(node, "runtime slice bounds"))),
            }
        };
        let starts = get(1)?.unwrap_or_default();
        let axes: Vec<i64> = get(3)?.unwrap_or_else(|| (0..starts.len() as i64).collect());
        let steps: Vec<i64> = get(4)?.unwrap_or_else(|| vec![1; starts.len()]);
        let mut begin = vec![0i64; xs.len()];
        let mut step = vec![1i64; xs.len()];
        for (j, &ax) in axes.iter().enumerate() {
            let a = norm_axis(ax, xs.len(), node)?;
            let d = xs[a] as i64;
            let st = steps.get(j).copied().unwrap_or(1);
            if st == 0 {
                return Err(unsupported(node, "zero step"));
            }
            let mut s = starts.get(j).copied().unwrap_or(0);
            if s < 0 {
                s += d;
            }
            s = if st > 0 {
                s.clamp(0, d)
            } else {
                s.clamp(0, d - 1)
            };
            begin[a] = s;
            step[a] = st;
        }
        let t = ctype(g.values[x].dtype);
        let st = strides(&xs);
        let off: Vec<String> = (0..xs.len())
            .map(|d| format!("({}LL + c{d}*{}LL)*{}LL", begin[d], step[d], st[d]))
            .chain(std::iter::once("0".into()))
            .collect();
        let body = format!("{} p1[i] = p0[{}];", decompose(&ys, "c"), off.join("+"));
        Ok(self.kernel(
            &[
                (Arg::Val(x), format!("const {t}")),
                (Arg::Val(y), t.to_string()),
            ],
            ys.iter().product(),
            &body,
        ))
    }

    fn transpose(&mut self, g: &Graph, node: &Node, perm: &[usize]) -> Result<GenKernel> {
        let x = input(node, 0)?;
        let y = output(node, 0)?;
        let xs = shape_of(g, x)?.to_vec();
        let ys = shape_of(g, y)?.to_vec();
        let perm: Vec<usize> = if perm.is_empty() {
            (0..xs.len()).rev().collect()
        } else {
            perm.to_vec()
        };
        if perm.len() != xs.len() || perm.iter().any(|&p| p >= xs.len()) {
            return Err(unsupported(node, "bad permutation"));
        }
        let t = ctype(g.values[x].dtype);
        if perm == [0, 2, 3, 1] && xs[1] <= 4 && matches!(t, "u8" | "signed char") {
            // Bytes NCHW -> NHWC over a few channels (a quantized image): a thread per pixel
            // reads its channels from their planes and writes them side by side.
            let (c, hw) = (xs[1], xs[2] * xs[3]);
            let body = format!(
                "{} for (int c = 0; c < {c}; ++c) p1[(q0*{hw}LL + q1)*{c}LL + c] = p0[(q0*{c}LL + c)*{hw}LL + q1];",
                decompose(&[xs[0], hw], "q")
            );
            return Ok(self.kernel(
                &[
                    (Arg::Val(x), format!("const {t}")),
                    (Arg::Val(y), t.to_string()),
                ],
                xs[0] * hw,
                &body,
            ));
        }
        let st = strides(&xs);
        let off: Vec<String> = perm
            .iter()
            .enumerate()
            .map(|(k, &p)| format!("c{k}*{}LL", st[p]))
            .chain(std::iter::once("0".into()))
            .collect();
        let body = format!("{} p1[i] = p0[{}];", decompose(&ys, "c"), off.join("+"));
        Ok(self.kernel(
            &[
                (Arg::Val(x), format!("const {t}")),
                (Arg::Val(y), t.to_string()),
            ],
            ys.iter().product(),
            &body,
        ))
    }

    /// A Q/DQ scale as a kernel parameter: a constant stays exact f32 (also in fp16 mode), a
    /// computed one is read as stored.
    fn scale_param(&mut self, g: &Graph, sv: ValueId) -> (Arg, String) {
        match g.constant(sv) {
            Some(t) => (self.extra(f32_bytes(&t.to_f32_vec())), "const float".into()),
            None => (Arg::Val(sv), "const F".into()),
        }
    }

    /// QuantizeLinear `q` and the Transpose `t` that is its only reader as one kernel (see
    /// [`quantize_transpose_fits`]): a thread per pixel quantizes its channels from their
    /// float planes and writes their codes side by side, exactly as the two kernels would.
    pub fn quantize_to_nhwc(&mut self, g: &Graph, q: &Node, t: &Node) -> Result<GenKernel> {
        let x = input(q, 0)?;
        let sv = input(q, 1)?;
        let y = output(t, 0)?;
        let xs = shape_of(g, x)?.to_vec();
        let yt = g.values[y].dtype;
        let (c, hw) = (xs[1], xs[2] * xs[3]);
        let (lo, hi) = code_range(yt);
        let mut params = vec![
            (Arg::Val(x), format!("const {}", ctype(DataType::F32))),
            (Arg::Val(y), ctype(yt).to_string()),
        ];
        params.push(self.scale_param(g, sv));
        // Four pixels a thread where the planes split into float4s (f32 storage): one 16-byte
        // load per channel and `c` aligned 4-byte stores of their interleaved codes.
        let quad = !self.fp16 && hw.is_multiple_of(4);
        let px = if quad { 4 } else { 1 };
        let mut body = format!(
            "{} float s = (float)p2[0]; {}",
            decompose(&[xs[0], hw / px], "i"),
            zero_point_param(g, q, &mut params, "z")
        );
        let yc = ctype(yt);
        if quad {
            // codes[l * c + ch]: pixel l's channel ch, in the order NHWC stores them. All
            // channels' loads come first: the quantization's division has a slow-path branch,
            // which would otherwise leave each load waiting on the one before.
            let _ = write!(body, " {yc} codes[{}]; float4 f[{c}];", 4 * c);
            for ch in 0..c {
                let _ = write!(
                    body,
                    " f[{ch}] = ((const float4*)p0)[(i0 * {c}LL + {ch}) * {hw4}LL + i1];",
                    hw4 = hw / 4
                );
            }
            for ch in 0..c {
                for (l, lane) in VECTOR_LANES.iter().enumerate() {
                    let _ = write!(
                        body,
                        " {{ {yc} q; {} codes[{}] = q; }}",
                        quantize_code(&format!("f[{ch}]{lane}"), yt, lo, hi),
                        l * c + ch
                    );
                }
            }
            for w in 0..c {
                let bytes: Vec<String> = (0..4)
                    .map(|b| format!("((unsigned int)(u8)codes[{}] << {})", 4 * w + b, 8 * b))
                    .collect();
                let _ = write!(
                    body,
                    " ((unsigned int*)p1)[i * {c}LL + {w}] = {};",
                    bytes.join(" | ")
                );
            }
        } else {
            for ch in 0..c {
                let x = format!("(float)p0[(i0 * {c}LL + {ch}) * {hw}LL + i1]");
                let _ = write!(
                    body,
                    " {{ {yc} q; {} p1[i * {c}LL + {ch}] = q; }}",
                    quantize_code(&x, yt, lo, hi)
                );
            }
        }
        Ok(self.kernel(&params, xs[0] * hw / px, &body))
    }

    /// DequantizeLinear → NHWC GlobalAveragePool → QuantizeLinear as one kernel (see
    /// [`dequantize_pool_quantize_fits`]): the codes are dequantized as they are read and
    /// summed in the pool kernel's order, and the mean is quantized, so the result is the
    /// three kernels' byte for byte without the two float tensors between them.
    pub fn dequantize_pool_quantize(
        &mut self,
        g: &Graph,
        dq: &Node,
        q: &Node,
    ) -> Result<GenKernel> {
        let x = input(dq, 0)?;
        let y = output(q, 0)?;
        let xs = shape_of(g, x)?.to_vec();
        let (xt, yt) = (g.values[x].dtype, g.values[y].dtype);
        let (n, c) = (xs[0], xs[3]);
        let hw = xs[1] * xs[2];
        let (lo, hi) = code_range(yt);
        let mut params = vec![
            (Arg::Val(x), format!("const {}", ctype(xt))),
            (Arg::Val(y), ctype(yt).to_string()),
        ];
        for node in [dq, q] {
            let sv = input(node, 1)?;
            params.push(self.scale_param(g, sv));
        }
        let zd = zero_point_param(g, dq, &mut params, "zd");
        let zq = zero_point_param(g, q, &mut params, "z");
        // The NHWC pool's reduction, with each code dequantized as it is read (`__fmul_rn`
        // keeps that product rounded on its own, as the separate kernel stores it).
        let reduce = NhwcReduce {
            c,
            hw,
            xc: ctype(xt),
            read: "__fmul_rn((float)((i64)e - zd), sd)".into(),
            init: "0.f",
            comb: "acc += v;",
            quad: c.is_multiple_of(4),
        };
        let body = reduce.body(
            &format!("float sd = (float)p2[0]; {zd}"),
            &format!(
                "float s = (float)p3[0]; {zq} float mean = acc / {hw}.f; {} q; {} p1[nb*{c}LL + ch] = q;",
                ctype(yt),
                quantize_code("mean", yt, lo, hi)
            ),
        );
        Ok(self.kernel(&params, reduce.threads(n), &body))
    }

    fn expand(&mut self, g: &Graph, node: &Node) -> Result<GenKernel> {
        let x = input(node, 0)?;
        let y = output(node, 0)?;
        let xs = shape_of(g, x)?.to_vec();
        let ys = shape_of(g, y)?.to_vec();
        if xs.len() > ys.len() {
            return Err(unsupported(node, "input rank above output rank"));
        }
        let t = ctype(g.values[x].dtype);
        let body = format!(
            "{} p1[i] = p0[{}];",
            decompose(&ys, "c"),
            bcast_off(&xs, &ys, "c")
        );
        Ok(self.kernel(
            &[
                (Arg::Val(x), format!("const {t}")),
                (Arg::Val(y), t.to_string()),
            ],
            ys.iter().product(),
            &body,
        ))
    }

    fn gather(&mut self, g: &Graph, node: &Node, axis: i64) -> Result<GenKernel> {
        let x = input(node, 0)?;
        let idx = input(node, 1)?;
        let y = output(node, 0)?;
        let xs = shape_of(g, x)?.to_vec();
        let is = shape_of(g, idx)?.to_vec();
        let ys = shape_of(g, y)?.to_vec();
        let a = norm_axis(axis, xs.len(), node)?;
        let it = match g.values[idx].dtype {
            DataType::I64 => "const i64",
            DataType::I32 => "const int",
            _ => return Err(unsupported(node, "indices must be int32 or int64")),
        };
        let t = ctype(g.values[x].dtype);
        let st = strides(&xs);
        let ist = strides(&is);
        let ni = is.len();
        // Output coords: x[..a], idx[..], x[a+1..].
        let iof: Vec<String> = (0..ni)
            .map(|k| format!("c{}*{}LL", a + k, ist[k]))
            .chain(std::iter::once("0".into()))
            .collect();
        let mut xof: Vec<String> = (0..a).map(|k| format!("c{k}*{}LL", st[k])).collect();
        xof.push(format!("j*{}LL", st[a]));
        for (k, s) in st.iter().enumerate().skip(a + 1) {
            xof.push(format!("c{}*{}LL", k - 1 + ni, s));
        }
        let body = format!(
            "{} i64 j = (i64)p1[{}]; if (j < 0) j += {}LL; if (j < 0 || j >= {}LL) {{ p2[i] = 0; return; }} p2[i] = p0[{}];",
            decompose(&ys, "c"),
            iof.join("+"),
            xs[a],
            xs[a],
            xof.join("+")
        );
        Ok(self.kernel(
            &[
                (Arg::Val(x), format!("const {t}")),
                (Arg::Val(idx), it.into()),
                (Arg::Val(y), t.to_string()),
            ],
            ys.iter().product(),
            &body,
        ))
    }

    fn pad(&mut self, g: &Graph, node: &Node, mode: PadMode) -> Result<GenKernel> {
        let x = input(node, 0)?;
        let y = output(node, 0)?;
        let xs = shape_of(g, x)?.to_vec();
        let ys = shape_of(g, y)?.to_vec();
        let r = xs.len();
        let pads = g
            .const_input(node, 1)
            .ok_or_else(|| unsupported(node, "runtime pads"))?
            .to_i64_vec()?;
        let value = g
            .const_input(node, 2)
            .and_then(|t| t.to_f32_vec().first().copied())
            .unwrap_or(0.0);
        let axes: Vec<usize> = match g.const_input(node, 3) {
            Some(t) => t
                .to_i64_vec()?
                .iter()
                .map(|&a| norm_axis(a, r, node))
                .collect::<Result<_>>()?,
            None => (0..r).collect(),
        };
        if pads.len() != 2 * axes.len() {
            return Err(unsupported(node, "pads do not match the axes"));
        }
        let mut begin = vec![0i64; r];
        for (j, &a) in axes.iter().enumerate() {
            begin[a] = pads[j];
        }
        let t = ctype(g.values[x].dtype);
        let st = strides(&xs);
        let mut body = decompose(&ys, "c");
        body.push_str(" i64 off = 0; bool out = false;");
        for d in 0..r {
            let n = xs[d] as i64;
            let _ = write!(body, " {{ i64 s = c{d} - {}LL;", begin[d]);
            match mode {
                PadMode::Constant => {
                    let _ = write!(body, " if (s < 0 || s >= {n}LL) out = true;");
                }
                PadMode::Edge => {
                    let _ = write!(body, " s = s < 0 ? 0 : (s >= {n}LL ? {n}LL - 1 : s);");
                }
                PadMode::Reflect => {
                    let _ = write!(
                        body,
                        " if ({n}LL > 1) {{ i64 p = 2*({n}LL-1); s = s % p; if (s < 0) s += p; if (s >= {n}LL) s = p - s; }} else s = 0;"
                    );
                }
            }
            let _ = write!(body, " off += s*{}LL; }}", st[d]);
        }
        let _ = write!(body, " p1[i] = out ? ({t})({}) : p0[off];", flit(value));
        Ok(self.kernel(
            &[
                (Arg::Val(x), format!("const {t}")),
                (Arg::Val(y), t.to_string()),
            ],
            ys.iter().product(),
            &body,
        ))
    }

    /// Copies `x` (shape `xs`, numpy-broadcast to `ys`) into `dst` as a dense `ys` tensor of the
    /// activation storage type (broadcast MatMul operands for a strided batched GEMM).
    pub fn broadcast_into(
        &mut self,
        x: ValueId,
        xs: &[usize],
        ys: &[usize],
        dst: Arg,
    ) -> GenKernel {
        let body = format!(
            "{} p1[i] = p0[{}];",
            decompose(ys, "c"),
            bcast_off(xs, ys, "c")
        );
        self.kernel(
            &[(Arg::Val(x), "const F".into()), (dst, "F".into())],
            ys.iter().product(),
            &body,
        )
    }

    /// QuantizeLinear (f32 to int8/uint8, round half to even, saturating) or DequantizeLinear
    /// (int8/uint8/int32 to f32), per tensor or per axis, as the CPU's reference kernels.
    fn qdq(&mut self, g: &Graph, node: &Node, quantize: bool, axis: i64) -> Result<GenKernel> {
        let x = input(node, 0)?;
        let sv = input(node, 1)?;
        let y = output(node, 0)?;
        let xs = shape_of(g, x)?.to_vec();
        let (xt, yt) = (g.values[x].dtype, g.values[y].dtype);
        let scale_len: usize = shape_of(g, sv)?.iter().product();
        let per_axis = scale_len > 1;
        let (channels, inner) = if per_axis {
            let a = norm_axis(axis, xs.len(), node)?;
            (xs[a], xs[a + 1..].iter().product::<usize>())
        } else {
            (1, 1)
        };
        if scale_len != channels || g.values[sv].dtype != DataType::F32 {
            return Err(unsupported(node, "scale must be f32, one per channel"));
        }
        let zp = node.input(2);
        if let Some(z) = zp {
            let want = if quantize { yt } else { xt };
            if g.values[z].dtype != want || shape_of(g, z)?.iter().product::<usize>() != channels {
                return Err(unsupported(node, "zero point type or size"));
            }
        }
        let ok = if quantize {
            xt == DataType::F32 && matches!(yt, DataType::U8 | DataType::I8)
        } else {
            matches!(xt, DataType::U8 | DataType::I8 | DataType::I32) && yt == DataType::F32
        };
        if !ok {
            return Err(unsupported(node, &format!("{xt:?} to {yt:?}")));
        }
        let mut params = vec![
            (Arg::Val(x), format!("const {}", ctype(xt))),
            (Arg::Val(y), ctype(yt).to_string()),
        ];
        params.push(self.scale_param(g, sv));
        // Four elements a thread (one channel, 16-byte float and 4-byte code accesses) when
        // the float side is stored as f32 and channels come in runs of four.
        let total: usize = xs.iter().product();
        let quad = !self.fp16
            && xt != DataType::I32
            && total.is_multiple_of(4)
            && (!per_axis || inner.is_multiple_of(4));
        let e = if quad { "(i * 4)" } else { "i" };
        let ch = if per_axis {
            format!("({e} / {inner}LL) % {channels}LL")
        } else {
            "0".into()
        };
        let mut body = format!("i64 k = {ch}; float s = (float)p2[k];");
        match zp {
            Some(z) => {
                let zt = ctype(g.values[z].dtype);
                params.push((Arg::Val(z), format!("const {zt}")));
                body.push_str(" i64 z = (i64)p3[k];");
            }
            None => body.push_str(" i64 z = 0;"),
        }
        if quantize {
            let (lo, hi) = code_range(yt);
            let one = |x: &str| quantize_code(x, yt, lo, hi);
            if quad {
                let parts: Vec<String> = VECTOR_LANES
                    .iter()
                    .enumerate()
                    .map(|(b, l)| {
                        format!(
                            " {{ {} q; {} w |= (unsigned int)(u8)q << {}; }}",
                            ctype(yt),
                            one(&format!("f{l}")),
                            8 * b
                        )
                    })
                    .collect();
                let _ = write!(
                    body,
                    " float4 f = ((const float4*)p0)[i]; unsigned int w = 0u;{} ((unsigned int*)p1)[i] = w;",
                    parts.concat()
                );
            } else {
                let _ = write!(body, " {} q; {} p1[i] = q;", ctype(yt), one("(float)p0[i]"));
            }
        } else if quad {
            let _ = write!(
                body,
                " unsigned int w = ((const unsigned int*)p0)[i]; float4 f; {}",
                VECTOR_LANES
                    .iter()
                    .enumerate()
                    .map(|(b, l)| format!(
                        "f{l} = (float)((i64)({})(w >> {}) - z) * s; ",
                        ctype(xt),
                        8 * b
                    ))
                    .collect::<String>()
            );
            body.push_str("((float4*)p1)[i] = f;");
        } else {
            body.push_str(" p1[i] = (float)((i64)p0[i] - z) * s;");
        }
        let threads = if quad { total / 4 } else { total };
        Ok(self.kernel(&params, threads, &body))
    }

    /// A folded `DQ → unary → Q` chain: each 8-bit input byte maps through a 256-entry table.
    fn qlut(&mut self, g: &Graph, node: &Node, table: &[u8], dtype: DataType) -> Result<GenKernel> {
        let x = input(node, 0)?;
        let y = output(node, 0)?;
        let ok8 = |d: DataType| matches!(d, DataType::U8 | DataType::I8);
        if table.len() != 256 || !ok8(g.values[x].dtype) || !ok8(dtype) {
            return Err(unsupported(
                node,
                "needs a 256-entry table and 8-bit tensors",
            ));
        }
        let t = self.extra(table.to_vec());
        Ok(self.kernel(
            &[
                (Arg::Val(x), "const u8".into()),
                (Arg::Val(y), "u8".into()),
                (t, "const u8".into()),
            ],
            shape_of(g, x)?.iter().product(),
            "p1[i] = p2[p0[i]];",
        ))
    }

    /// ScatterND (reduction none) on `y`, which already holds a copy of the data: one thread
    /// per update element; index tuples out of range are skipped.
    pub fn scatter_nd(&mut self, g: &Graph, node: &Node) -> Result<GenKernel> {
        let d = input(node, 0)?;
        let ix = input(node, 1)?;
        let up = input(node, 2)?;
        let y = output(node, 0)?;
        let dt = g.values[d].dtype;
        if g.values[up].dtype != dt || g.values[y].dtype != dt {
            return Err(unsupported(node, "data, updates and output types differ"));
        }
        let it = match g.values[ix].dtype {
            DataType::I64 => "const i64",
            DataType::I32 => "const int",
            _ => return Err(unsupported(node, "indices must be int32 or int64")),
        };
        let (sd, si, su) = (shape_of(g, d)?, shape_of(g, ix)?, shape_of(g, up)?);
        let k = si.last().copied().unwrap_or(0);
        if k == 0 || k > sd.len() || shape_of(g, y)? != sd {
            return Err(unsupported(node, "index depth or output shape"));
        }
        let want: Vec<usize> = si[..si.len() - 1].iter().chain(&sd[k..]).copied().collect();
        if su != want.as_slice() {
            return Err(unsupported(node, "updates do not match indices and data"));
        }
        let slice: usize = sd[k..].iter().product();
        let st = strides(sd);
        let mut body = format!(
            "i64 t = i / {s}LL, j = i % {s}LL; {it}* ix = p0 + t*{k}LL; i64 off = j;",
            s = slice.max(1)
        );
        for (dd, (&dim, &stride)) in sd[..k].iter().zip(&st).enumerate() {
            let _ = write!(
                body,
                " {{ i64 v = (i64)ix[{dd}]; if (v < 0) v += {dim}LL; if (v < 0 || v >= {dim}LL) return; off += v*{stride}LL; }}"
            );
        }
        body.push_str(" p2[off] = p1[i];");
        let t = ctype(dt);
        Ok(self.kernel(
            &[
                (Arg::Val(ix), it.into()),
                (Arg::Val(up), format!("const {t}")),
                (Arg::Val(y), t.to_string()),
            ],
            su.iter().product(),
            &body,
        ))
    }

    /// ConvTranspose (1-D as H = 1, 2-D; groups, strides, pads, dilations, output padding and
    /// output shape as the CPU kernel) in gather form: one thread per output element sums the
    /// input pixels whose scatter reaches it; bias and the fused activation applied at the end.
    fn conv_transpose(
        &mut self,
        g: &Graph,
        node: &Node,
        a: &crate::ir::ConvTransposeAttrs,
    ) -> Result<GenKernel> {
        let c = &a.conv;
        let x = input(node, 0)?;
        let wv = input(node, 1)?;
        let y = output(node, 0)?;
        for v in [Some(x), Some(wv), node.input(2), Some(y)]
            .into_iter()
            .flatten()
        {
            if g.values[v].dtype != DataType::F32 {
                return Err(unsupported(node, "non-f32 tensors"));
            }
        }
        let nhwc = c.layout == Layout::Nhwc;
        let split = |s: &[usize]| -> Result<[usize; 4]> {
            Ok(match (s.len(), nhwc) {
                (3, false) => [s[0], s[1], 1, s[2]],
                (3, true) => [s[0], s[2], 1, s[1]],
                (4, false) => [s[0], s[1], s[2], s[3]],
                (4, true) => [s[0], s[3], s[1], s[2]],
                _ => {
                    return Err(unsupported(
                        node,
                        "only 1-D and 2-D transposed convolutions",
                    ))
                }
            })
        };
        let xs = shape_of(g, x)?;
        let spatial = xs.len() - 2;
        let [n, cin, h, w] = split(xs)?;
        let [on, cout, oh, ow] = split(shape_of(g, y)?)?;
        let ws = shape_of(g, wv)?;
        let groups = c.group.max(1);
        if ws.len() != xs.len() || ws[0] != cin || cin % groups != 0 {
            return Err(unsupported(node, "weights do not fit the input"));
        }
        let cout_g = ws[1];
        let (kh, kw) = if spatial == 1 {
            (1, ws[2])
        } else {
            (ws[2], ws[3])
        };
        let hw = |v: &[usize], d: usize| -> (usize, usize) {
            match (spatial, v.len()) {
                (1, 1) => (d, v[0]),
                (2, 2) => (v[0], v[1]),
                _ => (d, d),
            }
        };
        let (sh, sw) = hw(&c.strides, 1);
        let (dh, dw) = hw(&c.dilations, 1);
        if on != n || cout != cout_g * groups || sh == 0 || sw == 0 || dh == 0 || dw == 0 {
            return Err(unsupported(node, "output shape does not fit"));
        }
        let (pt, pl) = if a.output_shape.is_some() {
            let (oph, opw) = hw(&a.output_padding, 0);
            let begin = |inp: usize, s: usize, op: usize, k: usize, d: usize, out: usize| {
                let total = (s * (inp.max(1) - 1) + op + (k - 1) * d + 1).saturating_sub(out);
                if c.auto_pad == crate::ir::AutoPad::SameUpper {
                    total / 2
                } else {
                    total - total / 2
                }
            };
            (
                begin(h, sh, oph, kh.max(1), dh, oh),
                begin(w, sw, opw, kw.max(1), dw, ow),
            )
        } else {
            match (spatial, c.pads.len()) {
                (1, 2) => (0, c.pads[0]),
                (2, 4) => (c.pads[0], c.pads[1]),
                _ => (0, 0),
            }
        };
        let cin_g = cin / groups;
        let yshape = if nhwc {
            vec![n, oh, ow, cout]
        } else {
            vec![n, cout, oh, ow]
        };
        let (qc, qy, qx) = if nhwc { (3, 1, 2) } else { (1, 2, 3) };
        let xidx = if nhwc {
            format!("((q0*{h}LL + iy)*{w}LL + ix)*{cin}LL + ci")
        } else {
            format!("((q0*{cin}LL + ci)*{h}LL + iy)*{w}LL + ix")
        };
        let mut params = vec![
            (Arg::Val(x), "const F".to_string()),
            (Arg::Val(wv), "const F".to_string()),
            (Arg::Val(y), "F".to_string()),
        ];
        let mut body = decompose(&yshape, "q");
        let _ = write!(
            body,
            " i64 co = q{qc}, gi = co / {cout_g}LL, cg = co % {cout_g}LL; float acc = 0.f;
  for (int ky = 0; ky < {kh}; ++ky) {{ i64 ty = q{qy} + {pt}LL - (i64)ky*{dh}LL; if (ty < 0 || ty % {sh}LL) continue; i64 iy = ty / {sh}LL; if (iy >= {h}LL) continue;
    for (int kx = 0; kx < {kw}; ++kx) {{ i64 tx = q{qx} + {pl}LL - (i64)kx*{dw}LL; if (tx < 0 || tx % {sw}LL) continue; i64 ix = tx / {sw}LL; if (ix >= {w}LL) continue;
      for (i64 cl = 0; cl < {cin_g}LL; ++cl) {{ i64 ci = gi*{cin_g}LL + cl;
        acc += (float)p0[{xidx}] * (float)p1[((ci*{cout_g}LL + cg)*{kh}LL + ky)*{kw}LL + kx]; }} }} }}"
        );
        if let Some(b) = node.input(2) {
            if shape_of(g, b)?.iter().product::<usize>() != cout {
                return Err(unsupported(node, "bias does not match the channels"));
            }
            params.push((Arg::Val(b), "const F".into()));
            body.push_str(" acc += (float)p3[co];");
        }
        if let Some(act) = c.activation {
            let _ = write!(body, " acc = {};", act_expr(act, "acc"));
        }
        body.push_str(" p2[i] = acc;");
        Ok(self.kernel(&params, yshape.iter().product(), &body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Tensor;

    #[test]
    fn every_kernel_waits_for_its_predecessor_before_touching_memory() {
        // Programmatic dependent launch lets a kernel start while the previous one finishes:
        // its first statement must be the wait (a no-op below sm_90 and for plain launches).
        let mut g = Gen::new(false);
        let k = g.convert(Arg::Val(0), Arg::Val(1), 10, true);
        let body = &g.src[g.src.find(&k.name).expect("kernel")..];
        let open = body.find('{').expect("body");
        assert!(body[open + 1..].trim_start().starts_with("GRID_SYNC();"));
        assert!(g.src.contains("griddepcontrol.wait;"));
        assert!(g
            .src
            .contains("#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900"));
    }

    /// A one-node graph: `op` from an input of `dtype` and `shape` (plus `scales` f32 scales
    /// for Q/DQ) into an output of `out` and `out_shape`.
    fn one_node(
        op: Op,
        (dtype, shape): (DataType, &[usize]),
        (out, out_shape): (DataType, &[usize]),
        scales: usize,
    ) -> Graph {
        let mut g = Graph::default();
        let x = g.add_value("x", dtype);
        g.values[x].shape = Some(shape.to_vec());
        let mut inputs = vec![Some(x)];
        if scales > 0 {
            let t = Tensor::from_f32(vec![scales], vec![0.5; scales]).expect("scales");
            inputs.push(Some(g.add_constant("s", t)));
        }
        let y = g.add_value("y", out);
        g.values[y].shape = Some(out_shape.to_vec());
        g.nodes.push(Node {
            name: "n".into(),
            op,
            inputs,
            outputs: vec![y],
        });
        g
    }

    fn threads(g: &Graph, fp16: bool) -> usize {
        let ks = Gen::new(fp16).node(g, &g.nodes[0]).expect("kernel");
        ks[0].threads
    }

    #[test]
    fn quantize_and_dequantize_take_four_elements_a_thread_where_they_can() {
        let q = |axis| Op::QuantizeLinear { axis, dtype: None };
        let f32_to = |s: &[usize], n| one_node(q(1), (DataType::F32, s), (DataType::I8, s), n);
        // Per tensor, 48 elements: 12 threads; fp16 storage keeps one a thread.
        assert_eq!(threads(&f32_to(&[1, 3, 4, 4], 1), false), 12);
        assert_eq!(threads(&f32_to(&[1, 3, 4, 4], 1), true), 48);
        // Per channel: runs of 16 a channel split into fours, runs of 3 do not.
        assert_eq!(threads(&f32_to(&[1, 3, 4, 4], 3), false), 12);
        assert_eq!(threads(&f32_to(&[2, 3, 3], 3), false), 18);
        let dq = |s: &[usize], dt| {
            one_node(
                Op::DequantizeLinear { axis: 1 },
                (dt, s),
                (DataType::F32, s),
                1,
            )
        };
        assert_eq!(threads(&dq(&[2, 8], DataType::U8), false), 4);
        assert_eq!(threads(&dq(&[2, 8], DataType::I32), false), 16);
    }

    #[test]
    fn an_image_quantize_runs_inside_its_nhwc_transpose() {
        // x [2,3,5,5] f32 -> QuantizeLinear (per tensor) -> [2,3,5,5] i8 -> Transpose NHWC.
        let quantize = |scales, channels| {
            let mut g = one_node(
                Op::QuantizeLinear {
                    axis: 1,
                    dtype: None,
                },
                (DataType::F32, &[2, channels, 5, 5]),
                (DataType::I8, &[2, channels, 5, 5]),
                scales,
            );
            let q = g.nodes[0].outputs[0];
            let y = g.add_value("y_nhwc", DataType::I8);
            g.values[y].shape = Some(vec![2, 5, 5, channels]);
            g.nodes.push(Node {
                name: "t".into(),
                op: Op::Transpose {
                    perm: vec![0, 2, 3, 1],
                },
                inputs: vec![Some(q)],
                outputs: vec![y],
            });
            g
        };
        let g = quantize(1, 3);
        assert!(quantize_transpose_fits(&g, &g.nodes[0], &g.nodes[1]));
        let k = Gen::new(false)
            .quantize_to_nhwc(&g, &g.nodes[0], &g.nodes[1])
            .expect("fused kernel");
        // A thread per pixel (2 x 25: planes of 25 floats do not split into float4s), reading
        // the quantize's input and writing the transpose's output.
        assert_eq!(k.threads, 50);
        assert_eq!(k.args[0], Arg::Val(g.nodes[0].inputs[0].expect("x")));
        assert_eq!(k.args[1], Arg::Val(g.nodes[1].outputs[0]));
        // 4x4 planes: four pixels a thread, 3 words of codes each (2 x 16 / 4 threads); with
        // fp16 storage, a pixel a thread.
        let mut g = quantize(1, 3);
        for (v, shape) in [(0, [2, 3, 4, 4]), (2, [2, 3, 4, 4]), (3, [2, 4, 4, 3])] {
            g.values[v].shape = Some(shape.to_vec());
        }
        let mut gen = Gen::new(false);
        let k = gen
            .quantize_to_nhwc(&g, &g.nodes[0], &g.nodes[1])
            .expect("fused kernel");
        assert_eq!(k.threads, 8);
        assert!(gen.src.contains("((unsigned int*)p1)[i * 3LL + 2] ="));
        let k = Gen::new(true)
            .quantize_to_nhwc(&g, &g.nodes[0], &g.nodes[1])
            .expect("fused kernel");
        assert_eq!(k.threads, 32);
        // Per-channel scales, more than 4 channels, or another permutation: two kernels.
        let g = quantize(3, 3);
        assert!(!quantize_transpose_fits(&g, &g.nodes[0], &g.nodes[1]));
        let g = quantize(1, 8);
        assert!(!quantize_transpose_fits(&g, &g.nodes[0], &g.nodes[1]));
        let mut g = quantize(1, 3);
        g.nodes[1].op = Op::Transpose {
            perm: vec![0, 3, 1, 2],
        };
        assert!(!quantize_transpose_fits(&g, &g.nodes[0], &g.nodes[1]));
    }

    #[test]
    fn dequantize_pool_quantize_runs_as_one_kernel() {
        // codes [2,7,7,64] -> DequantizeLinear -> NHWC GlobalAveragePool -> QuantizeLinear.
        let chain = |layout, scales| {
            let mut g = one_node(
                Op::DequantizeLinear { axis: 1 },
                (DataType::I8, &[2, 7, 7, 64]),
                (DataType::F32, &[2, 7, 7, 64]),
                scales,
            );
            let s = g.nodes[0].inputs[1];
            let push = |g: &mut Graph, op, dtype, shape: &[usize]| {
                let x = *g.nodes.last().expect("node").outputs.first().expect("out");
                let y = g.add_value(format!("v{}", g.values.len()), dtype);
                g.values[y].shape = Some(shape.to_vec());
                let inputs = match op {
                    Op::QuantizeLinear { .. } => vec![Some(x), s],
                    _ => vec![Some(x)],
                };
                g.nodes.push(Node {
                    name: format!("n{y}"),
                    op,
                    inputs,
                    outputs: vec![y],
                });
            };
            push(
                &mut g,
                Op::GlobalAveragePool { layout },
                DataType::F32,
                &[2, 1, 1, 64],
            );
            push(
                &mut g,
                Op::QuantizeLinear {
                    axis: 1,
                    dtype: None,
                },
                DataType::I8,
                &[2, 1, 1, 64],
            );
            g
        };
        let fits =
            |g: &Graph| dequantize_pool_quantize_fits(g, &g.nodes[0], &g.nodes[1], &g.nodes[2]);
        let g = chain(Layout::Nhwc, 1);
        assert!(fits(&g));
        let k = Gen::new(false)
            .dequantize_pool_quantize(&g, &g.nodes[0], &g.nodes[2])
            .expect("fused kernel");
        // A 256-thread block per (image, 128 channels): 64 channels take four to a lane.
        assert_eq!(k.threads, 2 * 256);
        assert_eq!(k.args[0], Arg::Val(g.nodes[0].inputs[0].expect("codes")));
        assert_eq!(k.args[1], Arg::Val(g.nodes[2].outputs[0]));
        // An NCHW pool or per-channel scales: three kernels.
        assert!(!fits(&chain(Layout::Nchw, 1)));
        assert!(!fits(&chain(Layout::Nhwc, 64)));
    }

    #[test]
    fn byte_images_transpose_to_nhwc_a_pixel_a_thread() {
        let t = || Op::Transpose {
            perm: vec![0, 2, 3, 1],
        };
        let image = |dt| one_node(t(), (dt, &[2, 3, 5, 5]), (dt, &[2, 5, 5, 3]), 0);
        assert_eq!(threads(&image(DataType::U8), false), 50);
        assert_eq!(threads(&image(DataType::F32), false), 150);
        let wide = one_node(
            t(),
            (DataType::U8, &[1, 8, 2, 2]),
            (DataType::U8, &[1, 2, 2, 8]),
            0,
        );
        assert_eq!(threads(&wide, false), 32);
    }
}
