//! CPU kernels: elementwise math — Unary, Binary, fused chains, Clip and Where — with full numpy
//! multidirectional broadcasting compiled at build time into a collapsed stride plan.
//!
//! The plan merges adjacent dimensions that every input walks contiguously (or broadcasts
//! together), so the common cases (same shape, scalar operand, per-channel `[1,C,1,1]` or
//! trailing `[C]`) become a handful of long inner runs with stride 0 or 1. Big outputs are split
//! into fixed chunks across the rayon pool; a fused chain evaluates every step on one chunk (the
//! output slice itself is the accumulator) before moving on, so no temporaries are needed.
//!
//! This file also holds the small byte-view and shape helpers shared with `movement` and
//! `generate`.

use rayon::prelude::*;

use super::{Kernel, TensorMut, TensorRef};
use crate::error::{Error, Result};
use crate::ir::{
    Activation, BinaryOp, ChainStep, DataType, Graph, Node, Op, Tensor, UnaryOp, ValueId,
};

/// Outputs with at least this many elements are split across the rayon pool.
pub(super) const PAR_MIN: usize = 1 << 16;
/// Elements per work unit (keeps a fused chain's working set in cache).
pub(super) const CHUNK: usize = 1 << 13;
/// Most inputs one broadcast plan (and so one fused chain) may read.
const MAX_INPUTS: usize = 16;

// ------------------------------------------------------------------------------------------
// Shared helpers (also used by movement.rs and generate.rs)
// ------------------------------------------------------------------------------------------

/// Plain numeric element types that may be viewed from raw, naturally aligned arena bytes.
pub(super) trait Pod: Copy + Send + Sync + 'static {}
impl Pod for u8 {}
impl Pod for i8 {}
impl Pod for u16 {}
impl Pod for u32 {}
impl Pod for i32 {}
impl Pod for u64 {}
impl Pod for i64 {}
impl Pod for f32 {}

/// Views `b` as exactly `n` elements of `T`; errors (naming `node`) on a size or alignment mismatch.
pub(super) fn view<'a, T: Pod>(b: &'a [u8], n: usize, node: &str) -> Result<&'a [T]> {
    let sz = std::mem::size_of::<T>();
    if b.len() != n * sz {
        return Err(Error::Shape(format!(
            "node '{node}': tensor view holds {} bytes, expected {}",
            b.len(),
            n * sz
        )));
    }
    if n == 0 {
        return Ok(&[]);
    }
    if !(b.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()) {
        return Err(Error::Shape(format!(
            "node '{node}': misaligned tensor view"
        )));
    }
    // SAFETY: length and alignment checked above; T is plain old data valid for any bit pattern.
    Ok(unsafe { std::slice::from_raw_parts(b.as_ptr() as *const T, n) })
}

/// Mutable counterpart of [`view`].
pub(super) fn view_mut<'a, T: Pod>(b: &'a mut [u8], n: usize, node: &str) -> Result<&'a mut [T]> {
    let sz = std::mem::size_of::<T>();
    if b.len() != n * sz {
        return Err(Error::Shape(format!(
            "node '{node}': output view holds {} bytes, expected {}",
            b.len(),
            n * sz
        )));
    }
    if n == 0 {
        return Ok(&mut []);
    }
    if !(b.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()) {
        return Err(Error::Shape(format!(
            "node '{node}': misaligned output view"
        )));
    }
    // SAFETY: length and alignment checked above; T is plain old data valid for any bit pattern.
    Ok(unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr() as *mut T, n) })
}

/// Reads one `T` from the start of `b` (any alignment); `None` when `b` is too short.
pub(super) fn pod_from_bytes<T: Pod>(b: &[u8]) -> Option<T> {
    if b.len() < std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: length checked; T is plain old data valid for any bit pattern; unaligned read.
    Some(unsafe { std::ptr::read_unaligned(b.as_ptr() as *const T) })
}

/// Run-time input `i`, or an error naming the node when it was not supplied.
pub(super) fn input<'a>(
    inputs: &[Option<TensorRef<'a>>],
    i: usize,
    node: &str,
) -> Result<TensorRef<'a>> {
    inputs
        .get(i)
        .copied()
        .flatten()
        .ok_or_else(|| Error::BadInput(format!("node '{node}': input {i} missing at run time")))
}

/// Run-time output `i`, or an error naming the node.
pub(super) fn output<'o, 'a>(
    outputs: &'o mut [TensorMut<'a>],
    i: usize,
    node: &str,
) -> Result<&'o mut TensorMut<'a>> {
    outputs
        .get_mut(i)
        .ok_or_else(|| Error::BadInput(format!("node '{node}': output {i} missing at run time")))
}

/// The value id of required input `i` of `node`.
pub(super) fn in_id(node: &Node, i: usize) -> Result<ValueId> {
    node.input(i).ok_or_else(|| {
        Error::InvalidModel(format!(
            "{} node '{}' lacks required input {i}",
            node.op.name(),
            node.name
        ))
    })
}

/// The value id of output `i` of `node`.
pub(super) fn out_id(node: &Node, i: usize) -> Result<ValueId> {
    node.outputs.get(i).copied().ok_or_else(|| {
        Error::InvalidModel(format!(
            "{} node '{}' lacks output {i}",
            node.op.name(),
            node.name
        ))
    })
}

/// The static shape of value `v` (owned).
pub(super) fn shape_of(graph: &Graph, v: ValueId) -> Result<Vec<usize>> {
    graph
        .values
        .get(v)
        .ok_or_else(|| Error::InvalidModel(format!("value id {v} out of range")))?;
    Ok(graph.shape(v)?.to_vec())
}

/// Number of elements of a shape.
pub(super) fn numel(s: &[usize]) -> usize {
    s.iter().product()
}

/// Row-major element strides of a shape.
pub(super) fn strides_of(s: &[usize]) -> Vec<usize> {
    let mut st = vec![1; s.len()];
    for d in (0..s.len().saturating_sub(1)).rev() {
        st[d] = st[d + 1] * s[d + 1];
    }
    st
}

/// An `Error::Unsupported` naming the node and its op.
pub(super) fn unsupported(node: &Node, what: impl std::fmt::Display) -> Error {
    Error::Unsupported(format!("{} node '{}': {what}", node.op.name(), node.name))
}

/// An `Error::Shape` naming the node and its op.
pub(super) fn shape_err(node: &Node, what: impl std::fmt::Display) -> Error {
    Error::Shape(format!("{} node '{}': {what}", node.op.name(), node.name))
}

/// Normalises a possibly negative axis against `rank`.
pub(super) fn norm_axis(node: &Node, axis: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r {
        return Err(shape_err(
            node,
            format_args!("axis {axis} out of range for rank {rank}"),
        ));
    }
    Ok(a as usize)
}

/// Runs `f(start, chunk)` over `out` in [`CHUNK`]-sized pieces, in parallel when `out` is big.
pub(super) fn drive<T: Send>(out: &mut [T], f: impl Fn(usize, &mut [T]) + Sync + Send) {
    if out.len() >= PAR_MIN {
        out.par_chunks_mut(CHUNK)
            .enumerate()
            .for_each(|(i, c)| f(i * CHUNK, c));
    } else {
        for (i, c) in out.chunks_mut(CHUNK).enumerate() {
            f(i * CHUNK, c);
        }
    }
}

/// A broadcast of several inputs to one output, with dimensions collapsed where possible.
#[derive(Clone, Debug)]
pub(super) struct Bcast {
    /// Collapsed output dims (at least one).
    dims: Vec<usize>,
    /// `strides[k * rank + d]`: element stride of input `k` along collapsed dim `d` (0 = broadcast).
    strides: Vec<usize>,
    n_inputs: usize,
    /// Output element count.
    len: usize,
}

impl Bcast {
    /// Plans reading each of `ins` broadcast (numpy rules) to `out`.
    pub(super) fn new(node: &Node, out: &[usize], ins: &[&[usize]]) -> Result<Self> {
        if ins.len() > MAX_INPUTS {
            return Err(unsupported(
                node,
                format_args!("more than {MAX_INPUTS} broadcast inputs"),
            ));
        }
        let r = out.len();
        let n = ins.len();
        let mut full = vec![0usize; n * r];
        for (k, s) in ins.iter().enumerate() {
            if s.len() > r {
                return Err(shape_err(
                    node,
                    format_args!("input shape {s:?} has higher rank than output {out:?}"),
                ));
            }
            let off = r - s.len();
            let cs = strides_of(s);
            for (j, &dim) in s.iter().enumerate() {
                let d = off + j;
                if dim == out[d] {
                    full[k * r + d] = if dim == 1 { 0 } else { cs[j] };
                } else if dim != 1 {
                    return Err(shape_err(
                        node,
                        format_args!("input shape {s:?} does not broadcast to {out:?}"),
                    ));
                }
            }
        }
        let mut dims: Vec<usize> = Vec::new();
        let mut cols: Vec<Vec<usize>> = Vec::new(); // per collapsed dim, the strides of each input
        for d in 0..r {
            if out[d] == 1 {
                continue;
            }
            let col: Vec<usize> = (0..n).map(|k| full[k * r + d]).collect();
            if let (Some(last_dim), Some(last_col)) = (dims.last_mut(), cols.last_mut()) {
                if (0..n).all(|k| last_col[k] == col[k] * out[d]) {
                    *last_dim *= out[d];
                    *last_col = col;
                    continue;
                }
            }
            dims.push(out[d]);
            cols.push(col);
        }
        if dims.is_empty() {
            dims.push(1);
            cols.push(vec![0; n]);
        }
        let rank = dims.len();
        let mut strides = vec![0; n * rank];
        for (d, col) in cols.iter().enumerate() {
            for k in 0..n {
                strides[k * rank + d] = col[k];
            }
        }
        Ok(Bcast {
            dims,
            strides,
            n_inputs: n,
            len: numel(out),
        })
    }

    /// Output element count.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Calls `f(rel_start, seg_len, offsets, inner_strides)` for each maximal run of output
    /// elements in `start..start + len` that every input walks with a constant inner stride.
    #[inline]
    pub(super) fn segments(
        &self,
        start: usize,
        len: usize,
        mut f: impl FnMut(usize, usize, &[usize; MAX_INPUTS], &[usize; MAX_INPUTS]),
    ) {
        if len == 0 || self.len == 0 {
            return;
        }
        let rank = self.dims.len();
        let n = self.n_inputs;
        let inner = self.dims[rank - 1];
        let mut inner_st = [0usize; MAX_INPUTS];
        for (k, s) in inner_st.iter_mut().enumerate().take(n) {
            *s = self.strides[k * rank + rank - 1];
        }
        let mut offs = [0usize; MAX_INPUTS];
        let end = start + len;
        let mut p = start;
        while p < end {
            let row = p / inner;
            let col = p % inner;
            let seg = (inner - col).min(end - p);
            for (k, o) in offs.iter_mut().enumerate().take(n) {
                *o = col * inner_st[k];
            }
            let mut rem = row;
            for d in (0..rank - 1).rev() {
                let i = rem % self.dims[d];
                rem /= self.dims[d];
                if i != 0 {
                    for (k, o) in offs.iter_mut().enumerate().take(n) {
                        *o += i * self.strides[k * rank + d];
                    }
                }
            }
            f(p - start, seg, &offs, &inner_st);
            p += seg;
        }
    }
}

/// The slice of `src` a segment reads: `len` elements at stride 1, or the single element at stride 0.
#[inline(always)]
pub(super) fn seg_slice<T>(src: &[T], off: usize, stride: usize, len: usize) -> &[T] {
    if stride == 0 {
        &src[off..off + 1]
    } else {
        &src[off..off + len]
    }
}

// ------------------------------------------------------------------------------------------
// Numeric element types
// ------------------------------------------------------------------------------------------

/// Arithmetic binary ops (same input and output type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arith {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Max,
    Min,
}

/// Comparison / logic binary ops (Bool output).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cmp {
    Equal,
    Less,
    Greater,
    And,
    Or,
}

fn arith_of(op: BinaryOp) -> Option<Arith> {
    Some(match op {
        BinaryOp::Add => Arith::Add,
        BinaryOp::Sub => Arith::Sub,
        BinaryOp::Mul => Arith::Mul,
        BinaryOp::Div => Arith::Div,
        BinaryOp::Pow => Arith::Pow,
        BinaryOp::Max => Arith::Max,
        BinaryOp::Min => Arith::Min,
        _ => return None,
    })
}

fn cmp_of(op: BinaryOp) -> Option<Cmp> {
    Some(match op {
        BinaryOp::Equal => Cmp::Equal,
        BinaryOp::Less => Cmp::Less,
        BinaryOp::Greater => Cmp::Greater,
        BinaryOp::And => Cmp::And,
        BinaryOp::Or => Cmp::Or,
        _ => return None,
    })
}

/// Numeric types the arithmetic kernels support (F32, I64, I32).
trait Num: Pod + PartialOrd {
    const DT: DataType;
    const LOWEST: Self;
    const HIGHEST: Self;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn div(self, o: Self) -> Self;
    fn pow(self, o: Self) -> Self;
    fn maxv(self, o: Self) -> Self;
    fn minv(self, o: Self) -> Self;
    /// The first element of a constant tensor converted to this type.
    fn scalar(t: &Tensor) -> Result<Self>;
    /// All elements of a constant tensor converted to this type.
    fn convert(t: &Tensor) -> Result<Vec<Self>>;
    /// Whether [`Num::unary`] implements `op` for this type.
    fn unary_ok(op: UnaryOp) -> bool;
    /// Applies `op` in place (only called for ops `unary_ok` accepts).
    fn unary(op: UnaryOp, x: &mut [Self]);
}

#[inline(always)]
fn map<T: Copy>(x: &mut [T], f: impl Fn(T) -> T) {
    for v in x {
        *v = f(*v);
    }
}

/// Error function (Abramowitz–Stegun 7.1.26 evaluated in f64; |error| < 1.5e-7).
fn erf(x: f32) -> f32 {
    let x = x as f64;
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly = ((((1.061_405_429 * t - 1.453_152_027) * t + 1.421_413_741) * t - 0.284_496_736)
        * t
        + 0.254_829_592)
        * t;
    let y = 1.0 - poly * (-x * x).exp();
    y.copysign(x) as f32
}

impl Num for f32 {
    const DT: DataType = DataType::F32;
    const LOWEST: f32 = f32::NEG_INFINITY;
    const HIGHEST: f32 = f32::INFINITY;
    #[inline(always)]
    fn add(self, o: f32) -> f32 {
        self + o
    }
    #[inline(always)]
    fn sub(self, o: f32) -> f32 {
        self - o
    }
    #[inline(always)]
    fn mul(self, o: f32) -> f32 {
        self * o
    }
    #[inline(always)]
    fn div(self, o: f32) -> f32 {
        self / o
    }
    #[inline(always)]
    fn pow(self, o: f32) -> f32 {
        self.powf(o)
    }
    #[inline(always)]
    fn maxv(self, o: f32) -> f32 {
        self.max(o)
    }
    #[inline(always)]
    fn minv(self, o: f32) -> f32 {
        self.min(o)
    }
    fn scalar(t: &Tensor) -> Result<f32> {
        t.to_f32_vec()
            .first()
            .copied()
            .ok_or_else(|| Error::Shape("empty scalar tensor".into()))
    }
    fn convert(t: &Tensor) -> Result<Vec<f32>> {
        Ok(t.to_f32_vec())
    }
    fn unary_ok(op: UnaryOp) -> bool {
        op != UnaryOp::Not
    }
    fn unary(op: UnaryOp, x: &mut [f32]) {
        match op {
            UnaryOp::Act(a) => match a {
                Activation::Relu => map(x, |v| Activation::Relu.apply(v)),
                Activation::Clip { min, max } => map(x, |v| Activation::Clip { min, max }.apply(v)),
                Activation::LeakyRelu { alpha } => {
                    map(x, |v| Activation::LeakyRelu { alpha }.apply(v))
                }
                Activation::Sigmoid => map(x, |v| Activation::Sigmoid.apply(v)),
                Activation::Silu => map(x, |v| Activation::Silu.apply(v)),
                Activation::HardSwish => map(x, |v| Activation::HardSwish.apply(v)),
                Activation::HardSigmoid { alpha, beta } => {
                    map(x, |v| Activation::HardSigmoid { alpha, beta }.apply(v))
                }
                Activation::Tanh => map(x, |v| Activation::Tanh.apply(v)),
            },
            UnaryOp::Neg => map(x, |v| -v),
            UnaryOp::Abs => map(x, f32::abs),
            UnaryOp::Exp => map(x, f32::exp),
            UnaryOp::Log => map(x, f32::ln),
            UnaryOp::Sqrt => map(x, f32::sqrt),
            UnaryOp::Reciprocal => map(x, |v| 1.0 / v),
            UnaryOp::Floor => map(x, f32::floor),
            UnaryOp::Ceil => map(x, f32::ceil),
            UnaryOp::Round => map(x, f32::round_ties_even),
            UnaryOp::Erf => map(x, erf),
            UnaryOp::Not => {}
        }
    }
}

/// Integer power with C-like semantics for negative exponents (truncated toward zero).
fn ipow(b: i64, e: i64) -> i64 {
    if e < 0 {
        match b {
            1 => 1,
            -1 => {
                if e % 2 == 0 {
                    1
                } else {
                    -1
                }
            }
            _ => 0,
        }
    } else {
        b.wrapping_pow(e.min(u32::MAX as i64) as u32)
    }
}

macro_rules! int_num {
    ($t:ty, $dt:expr) => {
        impl Num for $t {
            const DT: DataType = $dt;
            const LOWEST: $t = <$t>::MIN;
            const HIGHEST: $t = <$t>::MAX;
            #[inline(always)]
            fn add(self, o: $t) -> $t {
                self.wrapping_add(o)
            }
            #[inline(always)]
            fn sub(self, o: $t) -> $t {
                self.wrapping_sub(o)
            }
            #[inline(always)]
            fn mul(self, o: $t) -> $t {
                self.wrapping_mul(o)
            }
            #[inline(always)]
            fn div(self, o: $t) -> $t {
                // C semantics: truncation toward zero; division by zero yields 0 instead of trapping.
                if o == 0 {
                    0
                } else {
                    self.wrapping_div(o)
                }
            }
            #[inline(always)]
            fn pow(self, o: $t) -> $t {
                ipow(self as i64, o as i64) as $t
            }
            #[inline(always)]
            fn maxv(self, o: $t) -> $t {
                Ord::max(self, o)
            }
            #[inline(always)]
            fn minv(self, o: $t) -> $t {
                Ord::min(self, o)
            }
            fn scalar(t: &Tensor) -> Result<$t> {
                t.to_i64_vec()?
                    .first()
                    .map(|&v| v as $t)
                    .ok_or_else(|| Error::Shape("empty scalar tensor".into()))
            }
            fn convert(t: &Tensor) -> Result<Vec<$t>> {
                Ok(t.to_i64_vec()?.into_iter().map(|v| v as $t).collect())
            }
            fn unary_ok(op: UnaryOp) -> bool {
                matches!(
                    op,
                    UnaryOp::Neg
                        | UnaryOp::Abs
                        | UnaryOp::Floor
                        | UnaryOp::Ceil
                        | UnaryOp::Round
                        | UnaryOp::Act(Activation::Relu)
                )
            }
            fn unary(op: UnaryOp, x: &mut [$t]) {
                match op {
                    UnaryOp::Neg => map(x, <$t>::wrapping_neg),
                    UnaryOp::Abs => map(x, <$t>::wrapping_abs),
                    UnaryOp::Act(Activation::Relu) => map(x, |v| Ord::max(v, 0)),
                    _ => {}
                }
            }
        }
    };
}
int_num!(i64, DataType::I64);
int_num!(i32, DataType::I32);

/// `out[j] = f(a[j*sa], b[j*sb])` with strides 0/1 specialised for vectorisation.
#[inline(always)]
fn zip3<T: Copy, O: Copy>(
    out: &mut [O],
    a: &[T],
    sa: usize,
    b: &[T],
    sb: usize,
    f: impl Fn(T, T) -> O,
) {
    let n = out.len();
    match (sa != 0, sb != 0) {
        (true, true) => {
            for ((o, &x), &y) in out.iter_mut().zip(&a[..n]).zip(&b[..n]) {
                *o = f(x, y);
            }
        }
        (false, true) => {
            let x = a[0];
            for (o, &y) in out.iter_mut().zip(&b[..n]) {
                *o = f(x, y);
            }
        }
        (true, false) => {
            let y = b[0];
            for (o, &x) in out.iter_mut().zip(&a[..n]) {
                *o = f(x, y);
            }
        }
        (false, false) => out.fill(f(a[0], b[0])),
    }
}

/// `acc[j] = f(acc[j], b[j*sb])` (or `f(b, acc)` when `acc_right`).
#[inline(always)]
fn acc2<T: Copy>(acc: &mut [T], b: &[T], sb: usize, acc_right: bool, f: impl Fn(T, T) -> T) {
    let n = acc.len();
    match (sb != 0, acc_right) {
        (true, false) => {
            for (o, &y) in acc.iter_mut().zip(&b[..n]) {
                *o = f(*o, y);
            }
        }
        (true, true) => {
            for (o, &y) in acc.iter_mut().zip(&b[..n]) {
                *o = f(y, *o);
            }
        }
        (false, false) => {
            let y = b[0];
            map(acc, |x| f(x, y));
        }
        (false, true) => {
            let y = b[0];
            map(acc, |x| f(y, x));
        }
    }
}

fn arith3<T: Num>(op: Arith, out: &mut [T], a: &[T], sa: usize, b: &[T], sb: usize) {
    match op {
        Arith::Add => zip3(out, a, sa, b, sb, T::add),
        Arith::Sub => zip3(out, a, sa, b, sb, T::sub),
        Arith::Mul => zip3(out, a, sa, b, sb, T::mul),
        Arith::Div => zip3(out, a, sa, b, sb, T::div),
        Arith::Pow => zip3(out, a, sa, b, sb, T::pow),
        Arith::Max => zip3(out, a, sa, b, sb, T::maxv),
        Arith::Min => zip3(out, a, sa, b, sb, T::minv),
    }
}

fn arith_acc<T: Num>(op: Arith, acc: &mut [T], b: &[T], sb: usize, acc_right: bool) {
    match op {
        Arith::Add => acc2(acc, b, sb, acc_right, T::add),
        Arith::Sub => acc2(acc, b, sb, acc_right, T::sub),
        Arith::Mul => acc2(acc, b, sb, acc_right, T::mul),
        Arith::Div => acc2(acc, b, sb, acc_right, T::div),
        Arith::Pow => acc2(acc, b, sb, acc_right, T::pow),
        Arith::Max => acc2(acc, b, sb, acc_right, T::maxv),
        Arith::Min => acc2(acc, b, sb, acc_right, T::minv),
    }
}

// ------------------------------------------------------------------------------------------
// Arithmetic chains (Unary, arithmetic Binary, Clip, fused Elementwise)
// ------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Step<T> {
    Unary(UnaryOp),
    Clamp(T, T),
    Bin {
        op: Arith,
        operand: usize,
        acc_right: bool,
    },
}

/// A chain of steps over broadcast inputs; plain Unary/Binary/Clip are one-step chains.
struct ChainKernel<T> {
    name: String,
    plan: Bcast,
    /// Element count of each planned input.
    lens: Vec<usize>,
    /// Build-time converted constants that replace the run-time input (dtype-mismatched operands).
    converted: Vec<Option<Vec<T>>>,
    steps: Vec<Step<T>>,
}

impl<T: Num> ChainKernel<T> {
    /// Whether input 0 can be taken from the output's bytes: it has the output's element
    /// count (so element i feeds output element i), comes from the arena, and no later step
    /// reads it again.
    fn in_place_ok(&self) -> bool {
        self.lens.first() == Some(&self.plan.len())
            && self.converted.first().is_some_and(|c| c.is_none())
            && self
                .steps
                .iter()
                .all(|s| !matches!(s, Step::Bin { operand: 0, .. }))
    }

    /// Computes `dst`; with `loaded`, `dst` already holds input 0's elements (in place).
    #[inline]
    fn eval(
        &self,
        dst: &mut [T],
        ins: &[&[T]; MAX_INPUTS],
        offs: &[usize; MAX_INPUTS],
        st: &[usize; MAX_INPUTS],
        loaded: bool,
    ) {
        let n = dst.len();
        let mut steps = &self.steps[..];
        if loaded {
            // Input 0 is in dst: every step (the first included) accumulates into it.
        } else if let Some(&Step::Bin {
            op,
            operand,
            acc_right,
        }) = steps.first()
        {
            let a = seg_slice(ins[0], offs[0], st[0], n);
            let b = seg_slice(ins[operand], offs[operand], st[operand], n);
            if acc_right {
                arith3(op, dst, b, st[operand], a, st[0]);
            } else {
                arith3(op, dst, a, st[0], b, st[operand]);
            }
            steps = &steps[1..];
        } else if st[0] == 0 {
            dst.fill(ins[0][offs[0]]);
        } else {
            dst.copy_from_slice(&ins[0][offs[0]..offs[0] + n]);
        }
        for step in steps {
            match *step {
                Step::Unary(op) => T::unary(op, dst),
                Step::Clamp(lo, hi) => map(dst, |v| {
                    let v = if v < lo { lo } else { v };
                    if v > hi {
                        hi
                    } else {
                        v
                    }
                }),
                Step::Bin {
                    op,
                    operand,
                    acc_right,
                } => {
                    let b = seg_slice(ins[operand], offs[operand], st[operand], n);
                    arith_acc(op, dst, b, st[operand], acc_right);
                }
            }
        }
    }
}

impl<T: Num> Kernel for ChainKernel<T> {
    fn run(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        _scratch: &mut [u8],
    ) -> Result<()> {
        let mut ins: [&[T]; MAX_INPUTS] = [&[]; MAX_INPUTS];
        for (k, &len) in self.lens.iter().enumerate() {
            ins[k] = match &self.converted[k] {
                Some(v) => v,
                None => view(input(inputs, k, &self.name)?.bytes, len, &self.name)?,
            };
        }
        let out = view_mut::<T>(
            output(outputs, 0, &self.name)?.bytes,
            self.plan.len(),
            &self.name,
        )?;
        drive(out, |start, chunk| {
            self.plan
                .segments(start, chunk.len(), |rel, seg, offs, st| {
                    self.eval(&mut chunk[rel..rel + seg], &ins, offs, st, false);
                });
        });
        Ok(())
    }

    fn in_place_input(&self) -> Option<usize> {
        self.in_place_ok().then_some(0)
    }

    fn run_in_place(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        _scratch: &mut [u8],
    ) -> Result<()> {
        if !self.in_place_ok() {
            return Err(unsupported_name(&self.name, "in place"));
        }
        let mut ins: [&[T]; MAX_INPUTS] = [&[]; MAX_INPUTS];
        for (k, &len) in self.lens.iter().enumerate().skip(1) {
            ins[k] = match &self.converted[k] {
                Some(v) => v,
                None => view(input(inputs, k, &self.name)?.bytes, len, &self.name)?,
            };
        }
        let out = view_mut::<T>(
            output(outputs, 0, &self.name)?.bytes,
            self.plan.len(),
            &self.name,
        )?;
        drive(out, |start, chunk| {
            self.plan
                .segments(start, chunk.len(), |rel, seg, offs, st| {
                    self.eval(&mut chunk[rel..rel + seg], &ins, offs, st, true);
                });
        });
        Ok(())
    }
}

/// The error of a kernel asked for a mode it does not support.
fn unsupported_name(name: &str, what: &str) -> Error {
    Error::Unsupported(format!("node '{name}': {what}"))
}

fn build_chain<T: Num>(graph: &Graph, node: &Node) -> Result<Box<dyn Kernel>> {
    let (n_in, steps): (usize, Vec<Step<T>>) = match &node.op {
        Op::Unary(u) => {
            if !T::unary_ok(*u) {
                return Err(unsupported(node, format_args!("{u:?} on {:?}", T::DT)));
            }
            (1, vec![Step::Unary(*u)])
        }
        Op::Binary(b) => {
            let op = arith_of(*b)
                .ok_or_else(|| unsupported(node, format_args!("{b:?} as arithmetic")))?;
            (
                2,
                vec![Step::Bin {
                    op,
                    operand: 1,
                    acc_right: false,
                }],
            )
        }
        Op::Clip => {
            let bound = |i: usize, default: T| -> Result<T> {
                match node.input(i) {
                    None => Ok(default),
                    Some(v) => match graph.constant(v) {
                        Some(t) => T::scalar(t),
                        None => Err(unsupported(
                            node,
                            format_args!("non-constant Clip bound (input {i})"),
                        )),
                    },
                }
            };
            (
                1,
                vec![Step::Clamp(bound(1, T::LOWEST)?, bound(2, T::HIGHEST)?)],
            )
        }
        Op::Elementwise(chain) => {
            let n_in = node.inputs.len();
            let mut steps = Vec::with_capacity(chain.len());
            for s in chain {
                steps.push(match *s {
                    ChainStep::Unary(u) => {
                        if !T::unary_ok(u) {
                            return Err(unsupported(
                                node,
                                format_args!("fused {u:?} on {:?}", T::DT),
                            ));
                        }
                        Step::Unary(u)
                    }
                    ChainStep::Binary {
                        op,
                        operand,
                        acc_on_right,
                    } => {
                        let a = arith_of(op)
                            .ok_or_else(|| unsupported(node, format_args!("fused {op:?}")))?;
                        if operand >= n_in {
                            return Err(Error::InvalidModel(format!(
                                "fused node '{}' reads operand {operand} of {n_in} inputs",
                                node.name
                            )));
                        }
                        Step::Bin {
                            op: a,
                            operand,
                            acc_right: acc_on_right,
                        }
                    }
                });
            }
            (n_in, steps)
        }
        _ => return Err(unsupported(node, "not an elementwise op")),
    };
    let out = out_id(node, 0)?;
    if graph.values[out].dtype != T::DT {
        return Err(Error::Type(format!(
            "{} node '{}': output is {:?}, inputs are {:?}",
            node.op.name(),
            node.name,
            graph.values[out].dtype,
            T::DT
        )));
    }
    let out_shape = shape_of(graph, out)?;
    let mut shapes = Vec::with_capacity(n_in);
    let mut converted = Vec::with_capacity(n_in);
    for k in 0..n_in {
        let v = in_id(node, k)?;
        shapes.push(shape_of(graph, v)?);
        let dt = graph.values[v].dtype;
        if dt == T::DT {
            converted.push(None);
        } else if let (Some(t), true) = (graph.constant(v), dt != DataType::Bool) {
            converted.push(Some(T::convert(t)?));
        } else {
            return Err(Error::Type(format!(
                "{} node '{}': input {k} is {dt:?} but the computation is {:?}",
                node.op.name(),
                node.name,
                T::DT
            )));
        }
    }
    let refs: Vec<&[usize]> = shapes.iter().map(|s| s.as_slice()).collect();
    let plan = Bcast::new(node, &out_shape, &refs)?;
    let lens = shapes.iter().map(|s| numel(s)).collect();
    for (k, c) in converted.iter().enumerate() {
        if let Some(c) = c {
            if c.len() != numel(&shapes[k]) {
                return Err(shape_err(
                    node,
                    format_args!("constant input {k} has the wrong element count"),
                ));
            }
        }
    }
    Ok(Box::new(ChainKernel {
        name: node.name.clone(),
        plan,
        lens,
        converted,
        steps,
    }))
}

// ------------------------------------------------------------------------------------------
// Comparisons, logic, Not, Where
// ------------------------------------------------------------------------------------------

/// Element types comparisons accept.
trait CmpElem: Pod + PartialOrd {
    /// Logical truth (non-zero).
    fn truthy(self) -> bool;
}
macro_rules! cmp_elem {
    ($($t:ty),*) => {$(
        impl CmpElem for $t {
            #[inline(always)]
            fn truthy(self) -> bool {
                self != (0 as $t)
            }
        }
    )*};
}
cmp_elem!(f32, i64, i32, i8, u8);

fn cmp_seg<T: CmpElem>(op: Cmp, out: &mut [u8], a: &[T], sa: usize, b: &[T], sb: usize) {
    match op {
        Cmp::Equal => zip3(out, a, sa, b, sb, |x, y| (x == y) as u8),
        Cmp::Less => zip3(out, a, sa, b, sb, |x, y| (x < y) as u8),
        Cmp::Greater => zip3(out, a, sa, b, sb, |x, y| (x > y) as u8),
        Cmp::And => zip3(out, a, sa, b, sb, |x: T, y: T| {
            (x.truthy() && y.truthy()) as u8
        }),
        Cmp::Or => zip3(out, a, sa, b, sb, |x: T, y: T| {
            (x.truthy() || y.truthy()) as u8
        }),
    }
}

/// Equal / Less / Greater / And / Or: broadcast inputs of type `T`, Bool output.
struct CmpKernel<T> {
    name: String,
    op: Cmp,
    plan: Bcast,
    lens: [usize; 2],
    _t: std::marker::PhantomData<fn() -> T>,
}

impl<T: CmpElem> Kernel for CmpKernel<T> {
    fn run(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        _scratch: &mut [u8],
    ) -> Result<()> {
        let a = view::<T>(
            input(inputs, 0, &self.name)?.bytes,
            self.lens[0],
            &self.name,
        )?;
        let b = view::<T>(
            input(inputs, 1, &self.name)?.bytes,
            self.lens[1],
            &self.name,
        )?;
        let out = view_mut::<u8>(
            output(outputs, 0, &self.name)?.bytes,
            self.plan.len(),
            &self.name,
        )?;
        drive(out, |start, chunk| {
            self.plan
                .segments(start, chunk.len(), |rel, seg, offs, st| {
                    let x = seg_slice(a, offs[0], st[0], seg);
                    let y = seg_slice(b, offs[1], st[1], seg);
                    cmp_seg(self.op, &mut chunk[rel..rel + seg], x, st[0], y, st[1]);
                });
        });
        Ok(())
    }
}

fn build_cmp(graph: &Graph, node: &Node, op: Cmp) -> Result<Box<dyn Kernel>> {
    let (a, b, out) = (in_id(node, 0)?, in_id(node, 1)?, out_id(node, 0)?);
    let dt = graph.values[a].dtype;
    if graph.values[b].dtype != dt {
        return Err(Error::Type(format!(
            "{} node '{}': inputs are {dt:?} and {:?}",
            node.op.name(),
            node.name,
            graph.values[b].dtype
        )));
    }
    if graph.values[out].dtype != DataType::Bool {
        return Err(Error::Type(format!(
            "{} node '{}': output must be Bool",
            node.op.name(),
            node.name
        )));
    }
    if matches!(op, Cmp::And | Cmp::Or) && dt != DataType::Bool {
        return Err(unsupported(node, format_args!("logic op on {dt:?}")));
    }
    let (sa, sb, so) = (
        shape_of(graph, a)?,
        shape_of(graph, b)?,
        shape_of(graph, out)?,
    );
    let plan = Bcast::new(node, &so, &[&sa, &sb])?;
    let lens = [numel(&sa), numel(&sb)];
    let name = node.name.clone();
    Ok(match dt {
        DataType::F32 => Box::new(CmpKernel::<f32> {
            name,
            op,
            plan,
            lens,
            _t: Default::default(),
        }),
        DataType::I64 => Box::new(CmpKernel::<i64> {
            name,
            op,
            plan,
            lens,
            _t: Default::default(),
        }),
        DataType::I32 => Box::new(CmpKernel::<i32> {
            name,
            op,
            plan,
            lens,
            _t: Default::default(),
        }),
        DataType::I8 => Box::new(CmpKernel::<i8> {
            name,
            op,
            plan,
            lens,
            _t: Default::default(),
        }),
        DataType::U8 | DataType::Bool => Box::new(CmpKernel::<u8> {
            name,
            op,
            plan,
            lens,
            _t: Default::default(),
        }),
    })
}

/// Logical Not on Bool.
struct NotKernel {
    name: String,
    len: usize,
}

impl Kernel for NotKernel {
    fn run(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        _scratch: &mut [u8],
    ) -> Result<()> {
        let x = view::<u8>(input(inputs, 0, &self.name)?.bytes, self.len, &self.name)?;
        let out = view_mut::<u8>(output(outputs, 0, &self.name)?.bytes, self.len, &self.name)?;
        for (o, &v) in out.iter_mut().zip(x) {
            *o = (v == 0) as u8;
        }
        Ok(())
    }
}

fn build_not(graph: &Graph, node: &Node) -> Result<Box<dyn Kernel>> {
    let (x, out) = (in_id(node, 0)?, out_id(node, 0)?);
    if graph.values[x].dtype != DataType::Bool || graph.values[out].dtype != DataType::Bool {
        return Err(unsupported(
            node,
            format_args!("Not on {:?}", graph.values[x].dtype),
        ));
    }
    let (sx, so) = (shape_of(graph, x)?, shape_of(graph, out)?);
    if sx != so {
        return Err(shape_err(
            node,
            format_args!("input {sx:?} vs output {so:?}"),
        ));
    }
    Ok(Box::new(NotKernel {
        name: node.name.clone(),
        len: numel(&so),
    }))
}

/// Where(condition, X, Y) for any element type, moved by element size.
struct WhereKernel {
    name: String,
    plan: Bcast,
    lens: [usize; 3],
    elem: usize,
}

fn where_typed<E: Pod>(
    k: &WhereKernel,
    c: &[u8],
    x: &[u8],
    y: &[u8],
    out: &mut [u8],
) -> Result<()> {
    let x = view::<E>(x, k.lens[1], &k.name)?;
    let y = view::<E>(y, k.lens[2], &k.name)?;
    let out = view_mut::<E>(out, k.plan.len(), &k.name)?;
    drive(out, |start, chunk| {
        k.plan.segments(start, chunk.len(), |rel, seg, offs, st| {
            let dst = &mut chunk[rel..rel + seg];
            for (j, o) in dst.iter_mut().enumerate() {
                *o = if c[offs[0] + j * st[0]] != 0 {
                    x[offs[1] + j * st[1]]
                } else {
                    y[offs[2] + j * st[2]]
                };
            }
        });
    });
    Ok(())
}

impl Kernel for WhereKernel {
    fn run(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        _scratch: &mut [u8],
    ) -> Result<()> {
        let c = view::<u8>(
            input(inputs, 0, &self.name)?.bytes,
            self.lens[0],
            &self.name,
        )?;
        let x = input(inputs, 1, &self.name)?.bytes;
        let y = input(inputs, 2, &self.name)?.bytes;
        let out = &mut *output(outputs, 0, &self.name)?.bytes;
        match self.elem {
            1 => where_typed::<u8>(self, c, x, y, out),
            2 => where_typed::<u16>(self, c, x, y, out),
            4 => where_typed::<u32>(self, c, x, y, out),
            _ => where_typed::<u64>(self, c, x, y, out),
        }
    }
}

fn build_where(graph: &Graph, node: &Node) -> Result<Box<dyn Kernel>> {
    let (c, x, y, out) = (
        in_id(node, 0)?,
        in_id(node, 1)?,
        in_id(node, 2)?,
        out_id(node, 0)?,
    );
    if graph.values[c].dtype != DataType::Bool {
        return Err(Error::Type(format!(
            "Where node '{}': condition must be Bool",
            node.name
        )));
    }
    let dt = graph.values[x].dtype;
    if graph.values[y].dtype != dt || graph.values[out].dtype != dt {
        return Err(Error::Type(format!(
            "Where node '{}': X, Y and output types differ",
            node.name
        )));
    }
    let (sc, sx, sy, so) = (
        shape_of(graph, c)?,
        shape_of(graph, x)?,
        shape_of(graph, y)?,
        shape_of(graph, out)?,
    );
    let plan = Bcast::new(node, &so, &[&sc, &sx, &sy])?;
    Ok(Box::new(WhereKernel {
        name: node.name.clone(),
        plan,
        lens: [numel(&sc), numel(&sx), numel(&sy)],
        elem: dt.size(),
    }))
}

/// Compiles an elementwise node (Unary, Binary, fused Elementwise, Clip, Where).
pub fn build(graph: &Graph, node: &Node) -> Result<Box<dyn Kernel>> {
    match &node.op {
        Op::Where => return build_where(graph, node),
        Op::Unary(UnaryOp::Not) => return build_not(graph, node),
        Op::Binary(b) => {
            if let Some(c) = cmp_of(*b) {
                return build_cmp(graph, node, c);
            }
        }
        Op::Unary(_) | Op::Clip | Op::Elementwise(_) => {}
        _ => return Err(unsupported(node, "not an elementwise op")),
    }
    let dt = graph.values[in_id(node, 0)?].dtype;
    match dt {
        DataType::F32 => build_chain::<f32>(graph, node),
        DataType::I64 => build_chain::<i64>(graph, node),
        DataType::I32 => build_chain::<i32>(graph, node),
        other => Err(unsupported(node, format_args!("arithmetic on {other:?}"))),
    }
}

/// Test support shared by this directory's kernel tests: build a one-node graph and run it.
#[cfg(test)]
pub(super) mod test_util {
    use super::super::{build_kernel, TensorMut, TensorRef};
    use super::numel;
    use crate::error::Result;
    use crate::ir::{DataType, Graph, Node, Op, Tensor, TensorData};

    /// An 8-byte aligned byte buffer (views need natural alignment).
    struct Buf {
        words: Vec<u64>,
        n: usize,
    }

    impl Buf {
        fn new(bytes: &[u8]) -> Self {
            let mut b = Buf {
                words: vec![0; bytes.len().div_ceil(8)],
                n: bytes.len(),
            };
            b.bytes_mut().copy_from_slice(bytes);
            b
        }
        fn bytes(&self) -> &[u8] {
            // SAFETY: `words` holds at least `n` initialised bytes.
            unsafe { std::slice::from_raw_parts(self.words.as_ptr() as *const u8, self.n) }
        }
        fn bytes_mut(&mut self) -> &mut [u8] {
            // SAFETY: as above, uniquely borrowed.
            unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr() as *mut u8, self.n) }
        }
    }

    /// One node input: a run-time value, a graph constant, or an omitted optional.
    pub enum In {
        Rt(Tensor),
        Const(Tensor),
        Absent,
    }

    /// Builds `op` over `ins` with outputs of the given types/shapes, runs it, returns outputs.
    pub fn run_op(op: Op, ins: Vec<In>, outs: &[(DataType, Vec<usize>)]) -> Result<Vec<Tensor>> {
        let mut g = Graph::default();
        let mut inputs = Vec::new();
        for (i, x) in ins.iter().enumerate() {
            inputs.push(match x {
                In::Rt(t) => {
                    let v = g.add_value(format!("in{i}"), t.dtype());
                    g.values[v].shape = Some(t.shape.clone());
                    Some(v)
                }
                In::Const(t) => Some(g.add_constant(format!("in{i}"), t.clone())),
                In::Absent => None,
            });
        }
        let outputs = outs
            .iter()
            .enumerate()
            .map(|(i, (dt, s))| {
                let v = g.add_value(format!("out{i}"), *dt);
                g.values[v].shape = Some(s.clone());
                v
            })
            .collect();
        let node = Node {
            name: "n".into(),
            op,
            inputs,
            outputs,
        };
        let k = build_kernel(&g, &node)?;
        let bufs: Vec<Option<(Buf, &Tensor)>> = ins
            .iter()
            .map(|x| match x {
                In::Rt(t) | In::Const(t) => Some((Buf::new(t.as_bytes()), t)),
                In::Absent => None,
            })
            .collect();
        let refs: Vec<Option<TensorRef>> = bufs
            .iter()
            .map(|o| {
                o.as_ref().map(|(b, t)| TensorRef {
                    dtype: t.dtype(),
                    shape: &t.shape,
                    bytes: b.bytes(),
                })
            })
            .collect();
        let mut out_bufs: Vec<Buf> = outs
            .iter()
            .map(|(dt, s)| Buf::new(&vec![0xAB; numel(s) * dt.size()]))
            .collect();
        let mut views: Vec<TensorMut> = out_bufs
            .iter_mut()
            .zip(outs)
            .map(|(b, (dt, s))| TensorMut {
                dtype: *dt,
                shape: s,
                bytes: b.bytes_mut(),
            })
            .collect();
        k.run(&refs, &mut views, &mut [])?;
        drop(views);
        outs.iter()
            .zip(&out_bufs)
            .map(|((dt, s), b)| {
                let t = Tensor::from_bytes(*dt, s.clone(), b.bytes())?;
                // Keep Bool bytes raw so a kernel writing anything but 0/1 is caught.
                Ok(if *dt == DataType::Bool {
                    Tensor {
                        shape: s.clone(),
                        data: TensorData::Bool(b.bytes().to_vec()),
                    }
                } else {
                    t
                })
            })
            .collect()
    }

    /// Runs a single-output op.
    pub fn run1(op: Op, ins: Vec<In>, dt: DataType, shape: &[usize]) -> Result<Tensor> {
        let mut v = run_op(op, ins, &[(dt, shape.to_vec())])?;
        v.pop()
            .ok_or_else(|| crate::error::Error::Shape("no output".into()))
    }

    /// An f32 tensor.
    pub fn f32t(shape: &[usize], d: Vec<f32>) -> Tensor {
        Tensor {
            shape: shape.to_vec(),
            data: TensorData::F32(d),
        }
    }
    /// An i64 tensor.
    pub fn i64t(shape: &[usize], d: Vec<i64>) -> Tensor {
        Tensor {
            shape: shape.to_vec(),
            data: TensorData::I64(d),
        }
    }
    /// An i32 tensor.
    pub fn i32t(shape: &[usize], d: Vec<i32>) -> Tensor {
        Tensor {
            shape: shape.to_vec(),
            data: TensorData::I32(d),
        }
    }
    /// A Bool tensor.
    pub fn boolt(shape: &[usize], d: Vec<u8>) -> Tensor {
        Tensor {
            shape: shape.to_vec(),
            data: TensorData::Bool(d),
        }
    }
    /// Deterministic pseudo-random f32 values in [-2, 2).
    pub fn rand_f32(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
            })
            .collect()
    }
    /// Flat index into `in_shape` of output element `flat` under numpy broadcasting (naive).
    pub fn bcast_index(out_shape: &[usize], in_shape: &[usize], flat: usize) -> usize {
        let r = out_shape.len();
        let off = r - in_shape.len();
        let mut idx = vec![0; r];
        let mut rem = flat;
        for d in (0..r).rev() {
            idx[d] = rem % out_shape[d];
            rem /= out_shape[d];
        }
        let mut k = 0;
        for (j, &dim) in in_shape.iter().enumerate() {
            let i = if dim == 1 { 0 } else { idx[off + j] };
            k = k * dim + i;
        }
        k
    }
}

#[cfg(test)]
mod tests {
    use super::test_util::*;

    type BinRef = fn(f32, f32) -> f32;
    type UnRef = fn(f32) -> f32;
    use crate::ir::{Activation, BinaryOp, ChainStep, DataType, Op, UnaryOp};

    fn numel(s: &[usize]) -> usize {
        s.iter().product()
    }

    fn bshape(a: &[usize], b: &[usize]) -> Vec<usize> {
        let r = a.len().max(b.len());
        (0..r)
            .map(|i| {
                let x = if i + a.len() >= r {
                    a[i + a.len() - r]
                } else {
                    1
                };
                let y = if i + b.len() >= r {
                    b[i + b.len() - r]
                } else {
                    1
                };
                x.max(y)
            })
            .collect()
    }

    const SHAPES: &[(&[usize], &[usize])] = &[
        (&[2, 3, 4], &[2, 3, 4]),
        (&[2, 3, 4], &[1]),
        (&[], &[2, 3, 4]),
        (&[2, 1, 4], &[3, 1]),
        (&[1, 3, 1, 1], &[2, 3, 2, 2]),
        (&[2, 3, 2, 2], &[1, 3, 1, 1]),
        (&[2, 3, 1], &[1, 1, 4]),
        (&[4], &[2, 3, 4]),
        (&[2, 1, 3, 1], &[1, 4, 1, 5]),
    ];

    #[test]
    fn binary_f32_broadcasting_all_directions() {
        let ops: [(BinaryOp, BinRef); 7] = [
            (BinaryOp::Add, |a, b| a + b),
            (BinaryOp::Sub, |a, b| a - b),
            (BinaryOp::Mul, |a, b| a * b),
            (BinaryOp::Div, |a, b| a / b),
            (BinaryOp::Pow, |a, b| a.abs().powf(b)),
            (BinaryOp::Max, f32::max),
            (BinaryOp::Min, f32::min),
        ];
        for (si, &(sa, sb)) in SHAPES.iter().enumerate() {
            let so = bshape(sa, sb);
            let mut a = rand_f32(numel(sa), si as u64);
            let b = rand_f32(numel(sb), 100 + si as u64);
            for (op, f) in ops {
                if op == BinaryOp::Pow {
                    a.iter_mut().for_each(|x| *x = x.abs());
                }
                let out = run1(
                    Op::Binary(op),
                    vec![In::Rt(f32t(sa, a.clone())), In::Rt(f32t(sb, b.clone()))],
                    DataType::F32,
                    &so,
                )
                .unwrap();
                let got = out.as_f32().unwrap();
                for (i, &g) in got.iter().enumerate() {
                    let want = f(a[bcast_index(&so, sa, i)], b[bcast_index(&so, sb, i)]);
                    assert!(
                        g == want || (g.is_nan() && want.is_nan()),
                        "{op:?} {sa:?} {sb:?} at {i}: {g} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn binary_large_parallel_per_channel() {
        let (sa, sb) = ([2usize, 16, 64, 64], [1usize, 16, 1, 1]);
        let a = rand_f32(numel(&sa), 1);
        let b = rand_f32(16, 2);
        let out = run1(
            Op::Binary(BinaryOp::Mul),
            vec![
                In::Rt(f32t(&sa, a.clone())),
                In::Const(f32t(&sb, b.clone())),
            ],
            DataType::F32,
            &sa,
        )
        .unwrap();
        for (i, &g) in out.as_f32().unwrap().iter().enumerate() {
            assert_eq!(g, a[i] * b[(i / 4096) % 16]);
        }
    }

    #[test]
    fn binary_integer_paths() {
        let out = run1(
            Op::Binary(BinaryOp::Div),
            vec![
                In::Rt(i64t(&[5], vec![7, -7, 7, -7, 5])),
                In::Rt(i64t(&[5], vec![2, 2, -2, -2, 0])),
            ],
            DataType::I64,
            &[5],
        )
        .unwrap();
        assert_eq!(out.to_i64_vec().unwrap(), vec![3, -3, -3, 3, 0]);
        let out = run1(
            Op::Binary(BinaryOp::Sub),
            vec![
                In::Rt(i32t(&[2, 1], vec![10, 20])),
                In::Rt(i32t(&[3], vec![1, 2, 3])),
            ],
            DataType::I32,
            &[2, 3],
        )
        .unwrap();
        assert_eq!(out.to_i64_vec().unwrap(), vec![9, 8, 7, 19, 18, 17]);
        let out = run1(
            Op::Binary(BinaryOp::Pow),
            vec![
                In::Rt(i64t(&[3], vec![2, 3, -2])),
                In::Rt(i64t(&[3], vec![3, 2, 3])),
            ],
            DataType::I64,
            &[3],
        )
        .unwrap();
        assert_eq!(out.to_i64_vec().unwrap(), vec![8, 9, -8]);
        let out = run1(
            Op::Binary(BinaryOp::Max),
            vec![
                In::Rt(i64t(&[3], vec![2, -3, 5])),
                In::Const(i64t(&[], vec![0])),
            ],
            DataType::I64,
            &[3],
        )
        .unwrap();
        assert_eq!(out.to_i64_vec().unwrap(), vec![2, 0, 5]);
        // Pow with an f32 base and a constant i64 exponent (ONNX allows mixed types).
        let out = run1(
            Op::Binary(BinaryOp::Pow),
            vec![
                In::Rt(f32t(&[2], vec![3.0, 0.5])),
                In::Const(i64t(&[], vec![2])),
            ],
            DataType::F32,
            &[2],
        )
        .unwrap();
        assert_eq!(out.as_f32().unwrap(), &[9.0, 0.25]);
    }

    #[test]
    fn comparisons_and_logic() {
        let a = vec![1.0, 2.0, 3.0];
        let b = vec![2.0, 2.0];
        let out = run1(
            Op::Binary(BinaryOp::Less),
            vec![
                In::Rt(f32t(&[3, 1], a.clone())),
                In::Rt(f32t(&[2], b.clone())),
            ],
            DataType::Bool,
            &[3, 2],
        )
        .unwrap();
        assert_eq!(out.as_bytes(), &[1, 1, 0, 0, 0, 0]);
        let out = run1(
            Op::Binary(BinaryOp::Greater),
            vec![
                In::Rt(i32t(&[3], vec![1, 5, 3])),
                In::Rt(i32t(&[], vec![3])),
            ],
            DataType::Bool,
            &[3],
        )
        .unwrap();
        assert_eq!(out.as_bytes(), &[0, 1, 0]);
        let out = run1(
            Op::Binary(BinaryOp::Equal),
            vec![
                In::Rt(i64t(&[2, 2], vec![1, 2, 3, 4])),
                In::Rt(i64t(&[2, 1], vec![2, 3])),
            ],
            DataType::Bool,
            &[2, 2],
        )
        .unwrap();
        assert_eq!(out.as_bytes(), &[0, 1, 1, 0]);
        let x = boolt(&[4], vec![0, 0, 1, 1]);
        let y = boolt(&[4], vec![0, 1, 0, 1]);
        let and = run1(
            Op::Binary(BinaryOp::And),
            vec![In::Rt(x.clone()), In::Rt(y.clone())],
            DataType::Bool,
            &[4],
        )
        .unwrap();
        let or = run1(
            Op::Binary(BinaryOp::Or),
            vec![In::Rt(x.clone()), In::Rt(y)],
            DataType::Bool,
            &[4],
        )
        .unwrap();
        let not = run1(
            Op::Unary(UnaryOp::Not),
            vec![In::Rt(x)],
            DataType::Bool,
            &[4],
        )
        .unwrap();
        assert_eq!(and.as_bytes(), &[0, 0, 0, 1]);
        assert_eq!(or.as_bytes(), &[0, 1, 1, 1]);
        assert_eq!(not.as_bytes(), &[1, 1, 0, 0]);
        // Logic on a non-Bool type is refused.
        assert!(run1(
            Op::Binary(BinaryOp::And),
            vec![In::Rt(f32t(&[1], vec![1.0])), In::Rt(f32t(&[1], vec![1.0]))],
            DataType::Bool,
            &[1]
        )
        .is_err());
    }

    #[test]
    fn unary_ops_match_reference() {
        let xs: Vec<f32> = vec![-3.5, -1.0, -0.25, 0.0, 0.3, 1.0, 2.5, 7.0];
        let acts = [
            Activation::Relu,
            Activation::Clip { min: 0.0, max: 6.0 },
            Activation::LeakyRelu { alpha: 0.1 },
            Activation::Sigmoid,
            Activation::Silu,
            Activation::HardSwish,
            Activation::HardSigmoid {
                alpha: 0.2,
                beta: 0.5,
            },
            Activation::Tanh,
        ];
        for a in acts {
            let out = run1(
                Op::Unary(UnaryOp::Act(a)),
                vec![In::Rt(f32t(&[8], xs.clone()))],
                DataType::F32,
                &[8],
            )
            .unwrap();
            let want: Vec<f32> = xs.iter().map(|&v| a.apply(v)).collect();
            assert_eq!(out.as_f32().unwrap(), &want[..], "{a:?}");
        }
        // Spot values computed by hand for a few activations.
        let relu6 = run1(
            Op::Unary(UnaryOp::Act(Activation::Clip { min: 0.0, max: 6.0 })),
            vec![In::Rt(f32t(&[8], xs.clone()))],
            DataType::F32,
            &[8],
        )
        .unwrap();
        assert_eq!(
            relu6.as_f32().unwrap(),
            &[0.0, 0.0, 0.0, 0.0, 0.3, 1.0, 2.5, 6.0]
        );
        let ops: [(UnaryOp, UnRef); 9] = [
            (UnaryOp::Neg, |v| -v),
            (UnaryOp::Abs, |v| v.abs()),
            (UnaryOp::Exp, |v| v.exp()),
            (UnaryOp::Log, |v| v.ln()),
            (UnaryOp::Sqrt, |v| v.sqrt()),
            (UnaryOp::Reciprocal, |v| 1.0 / v),
            (UnaryOp::Floor, |v| v.floor()),
            (UnaryOp::Ceil, |v| v.ceil()),
            (UnaryOp::Round, |v| v.round_ties_even()),
        ];
        for (op, f) in ops {
            let out = run1(
                Op::Unary(op),
                vec![In::Rt(f32t(&[8], xs.clone()))],
                DataType::F32,
                &[8],
            )
            .unwrap();
            for (g, &x) in out.as_f32().unwrap().iter().zip(&xs) {
                let w = f(x);
                assert!(
                    *g == w || (g.is_nan() && w.is_nan()),
                    "{op:?}({x}) = {g}, want {w}"
                );
            }
        }
        let r = run1(
            Op::Unary(UnaryOp::Round),
            vec![In::Rt(f32t(&[5], vec![0.5, 1.5, 2.5, -0.5, -1.5]))],
            DataType::F32,
            &[5],
        )
        .unwrap();
        assert_eq!(r.as_f32().unwrap(), &[0.0, 2.0, 2.0, -0.0, -2.0]);
        let e = run1(
            Op::Unary(UnaryOp::Erf),
            vec![In::Rt(f32t(&[4], vec![0.0, 0.5, 1.0, -2.0]))],
            DataType::F32,
            &[4],
        )
        .unwrap();
        let want = [0.0f32, 0.520_499_9, 0.842_700_8, -0.995_322_3];
        for (g, w) in e.as_f32().unwrap().iter().zip(want) {
            assert!((g - w).abs() < 3e-7, "erf {g} vs {w}");
        }
        let n = run1(
            Op::Unary(UnaryOp::Neg),
            vec![In::Rt(i64t(&[2], vec![3, -4]))],
            DataType::I64,
            &[2],
        )
        .unwrap();
        assert_eq!(n.to_i64_vec().unwrap(), vec![-3, 4]);
        assert!(run1(
            Op::Unary(UnaryOp::Exp),
            vec![In::Rt(i64t(&[1], vec![1]))],
            DataType::I64,
            &[1]
        )
        .is_err());
    }

    /// Runs `op` normally, then in place (input 0's bytes already in the output, input 0
    /// absent): `None` when the kernel does not offer in place, else both outputs.
    fn both_ways(
        op: Op,
        make: &dyn Fn() -> Vec<In>,
        out: &[usize],
    ) -> Option<(Vec<f32>, Vec<f32>)> {
        use super::super::{TensorMut, TensorRef};
        use crate::ir::{Graph, Node, Tensor};
        let ins = make();
        let normal = run1(op.clone(), make(), DataType::F32, out)
            .unwrap()
            .as_f32()
            .unwrap()
            .to_vec();
        let mut g = Graph::default();
        let mut inputs = Vec::new();
        for (i, x) in ins.iter().enumerate() {
            inputs.push(match x {
                In::Rt(t) => {
                    let v = g.add_value(format!("in{i}"), t.dtype());
                    g.values[v].shape = Some(t.shape.clone());
                    Some(v)
                }
                In::Const(t) => Some(g.add_constant(format!("in{i}"), t.clone())),
                In::Absent => None,
            });
        }
        let o = g.add_value("out", DataType::F32);
        g.values[o].shape = Some(out.to_vec());
        let node = Node {
            name: "n".into(),
            op,
            inputs,
            outputs: vec![o],
        };
        let k = super::super::build_kernel(&g, &node).unwrap();
        assert_eq!(k.in_place_input().unwrap_or(0), 0);
        k.in_place_input()?;
        let tensors: Vec<Option<Tensor>> = ins
            .iter()
            .map(|x| match x {
                In::Rt(t) | In::Const(t) => Some(t.clone()),
                In::Absent => None,
            })
            .collect();
        let refs: Vec<Option<TensorRef>> = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| {
                t.as_ref().filter(|_| i != 0).map(|t| TensorRef {
                    dtype: t.dtype(),
                    shape: &t.shape,
                    bytes: t.as_bytes(),
                })
            })
            .collect();
        let mut buf = tensors[0].clone().unwrap();
        let mut views = [TensorMut {
            dtype: DataType::F32,
            shape: out,
            bytes: buf.as_bytes_mut(),
        }];
        k.run_in_place(&refs, &mut views, &mut []).unwrap();
        Some((normal, buf.as_f32().unwrap().to_vec()))
    }

    #[test]
    fn in_place_runs_match_the_normal_run_and_a_reference() {
        let s = [2usize, 3, 4];
        let x = rand_f32(24, 7);
        let y = rand_f32(24, 8);
        let bias = rand_f32(4, 9);
        let rt = |v: &[f32], sh: &[usize]| In::Rt(f32t(sh, v.to_vec()));
        let sig = |v: f32| 1.0 / (1.0 + (-v).exp());
        type Make<'a> = Box<dyn Fn() -> Vec<In> + 'a>;
        let cases: Vec<(Op, Make, Vec<f32>)> = vec![
            (
                Op::Unary(UnaryOp::Act(Activation::Relu)),
                Box::new(|| vec![rt(&x, &s)]),
                x.iter().map(|v| v.max(0.0)).collect(),
            ),
            (
                Op::Unary(UnaryOp::Act(Activation::Sigmoid)),
                Box::new(|| vec![rt(&x, &s)]),
                x.iter().map(|&v| sig(v)).collect(),
            ),
            (
                Op::Binary(BinaryOp::Add),
                Box::new(|| vec![rt(&x, &s), rt(&y, &s)]),
                x.iter().zip(&y).map(|(a, b)| a + b).collect(),
            ),
            (
                Op::Binary(BinaryOp::Sub),
                Box::new(|| vec![rt(&x, &s), rt(&bias, &[4])]),
                (0..24).map(|i| x[i] - bias[i % 4]).collect(),
            ),
            (
                Op::Binary(BinaryOp::Mul),
                Box::new(|| vec![rt(&x, &s), In::Const(f32t(&[], vec![0.5]))]),
                x.iter().map(|v| v * 0.5).collect(),
            ),
            (
                Op::Clip,
                Box::new(|| {
                    vec![
                        rt(&x, &s),
                        In::Const(f32t(&[], vec![-0.5])),
                        In::Const(f32t(&[], vec![1.0])),
                    ]
                }),
                x.iter().map(|v| v.clamp(-0.5, 1.0)).collect(),
            ),
        ];
        for (op, make, want) in cases {
            let name = format!("{op:?}");
            let (normal, in_place) = both_ways(op, &*make, &s).expect("offers in place");
            assert_eq!(normal, in_place, "{name}");
            for (g, w) in in_place.iter().zip(&want) {
                assert!(
                    (g - w).abs() <= 1e-6 * w.abs().max(1.0),
                    "{name}: {g} vs {w}"
                );
            }
        }
        // Input 0 broadcast to a larger output: its element i does not feed output i.
        let small_first = both_ways(
            Op::Binary(BinaryOp::Sub),
            &|| vec![rt(&bias, &[4]), rt(&x, &s)],
            &s,
        );
        assert!(small_first.is_none());
        // Input 0 read again by the chain (x * x): not in place.
        let xx = both_ways(
            Op::Binary(BinaryOp::Mul),
            &|| vec![rt(&x, &s), rt(&x, &s)],
            &s,
        );
        assert!(xx.is_some_and(|(a, b)| a == b));
    }

    #[test]
    fn clip_bounds_and_defaults() {
        let x = f32t(&[5], vec![-2.0, -0.5, 0.5, 3.0, 9.0]);
        let out = run1(
            Op::Clip,
            vec![
                In::Rt(x.clone()),
                In::Const(f32t(&[], vec![0.0])),
                In::Const(f32t(&[], vec![6.0])),
            ],
            DataType::F32,
            &[5],
        )
        .unwrap();
        assert_eq!(out.as_f32().unwrap(), &[0.0, 0.0, 0.5, 3.0, 6.0]);
        let out = run1(
            Op::Clip,
            vec![
                In::Rt(x.clone()),
                In::Absent,
                In::Const(f32t(&[], vec![1.0])),
            ],
            DataType::F32,
            &[5],
        )
        .unwrap();
        assert_eq!(out.as_f32().unwrap(), &[-2.0, -0.5, 0.5, 1.0, 1.0]);
        let out = run1(Op::Clip, vec![In::Rt(x)], DataType::F32, &[5]).unwrap();
        assert_eq!(out.as_f32().unwrap(), &[-2.0, -0.5, 0.5, 3.0, 9.0]);
        let out = run1(
            Op::Clip,
            vec![
                In::Rt(i64t(&[4], vec![-9, 1, 5, 100])),
                In::Const(i64t(&[], vec![0])),
                In::Const(i64t(&[], vec![10])),
            ],
            DataType::I64,
            &[4],
        )
        .unwrap();
        assert_eq!(out.to_i64_vec().unwrap(), vec![0, 1, 5, 10]);
        // A run-time bound is refused with a clear error.
        let err = run1(
            Op::Clip,
            vec![In::Rt(f32t(&[1], vec![0.0])), In::Rt(f32t(&[], vec![0.0]))],
            DataType::F32,
            &[1],
        )
        .unwrap_err();
        assert!(err.to_string().contains("non-constant"), "{err}");
    }

    #[test]
    fn where_broadcasts() {
        let c = boolt(&[2, 1], vec![1, 0]);
        let x = f32t(&[1, 3], vec![1.0, 2.0, 3.0]);
        let y = f32t(&[], vec![-1.0]);
        let out = run1(
            Op::Where,
            vec![In::Rt(c), In::Rt(x), In::Rt(y)],
            DataType::F32,
            &[2, 3],
        )
        .unwrap();
        assert_eq!(out.as_f32().unwrap(), &[1.0, 2.0, 3.0, -1.0, -1.0, -1.0]);
        let c = boolt(&[3], vec![0, 1, 0]);
        let x = i64t(&[2, 3], vec![1, 2, 3, 4, 5, 6]);
        let y = i64t(&[2, 1], vec![-1, -2]);
        let out = run1(
            Op::Where,
            vec![In::Rt(c), In::Rt(x), In::Rt(y)],
            DataType::I64,
            &[2, 3],
        )
        .unwrap();
        assert_eq!(out.to_i64_vec().unwrap(), vec![-1, 2, -1, -2, 5, -2]);
    }

    /// Runs a chain unfused, one op node at a time, as the reference.
    fn unfused(
        inputs: &[(Vec<usize>, Vec<f32>)],
        chain: &[ChainStep],
        out_shape: &[usize],
    ) -> Vec<f32> {
        let mut acc = inputs[0].clone();
        for s in chain {
            acc = match *s {
                ChainStep::Unary(u) => {
                    let o = run1(
                        Op::Unary(u),
                        vec![In::Rt(f32t(&acc.0, acc.1.clone()))],
                        DataType::F32,
                        &acc.0,
                    )
                    .unwrap();
                    (acc.0.clone(), o.as_f32().unwrap().to_vec())
                }
                ChainStep::Binary {
                    op,
                    operand,
                    acc_on_right,
                } => {
                    let b = &inputs[operand];
                    let so = bshape(&acc.0, &b.0);
                    let (l, r) = if acc_on_right {
                        (b.clone(), acc.clone())
                    } else {
                        (acc.clone(), b.clone())
                    };
                    let o = run1(
                        Op::Binary(op),
                        vec![In::Rt(f32t(&l.0, l.1)), In::Rt(f32t(&r.0, r.1))],
                        DataType::F32,
                        &so,
                    )
                    .unwrap();
                    (so, o.as_f32().unwrap().to_vec())
                }
            };
        }
        assert_eq!(acc.0, out_shape);
        acc.1
    }

    #[test]
    fn fused_chain_equals_unfused_sequence() {
        let cases: Vec<(Vec<Vec<usize>>, Vec<ChainStep>)> = vec![
            (
                vec![vec![2, 3, 4, 5], vec![3, 1, 1], vec![5]],
                vec![
                    ChainStep::Binary {
                        op: BinaryOp::Mul,
                        operand: 1,
                        acc_on_right: false,
                    },
                    ChainStep::Unary(UnaryOp::Act(Activation::Sigmoid)),
                    ChainStep::Binary {
                        op: BinaryOp::Add,
                        operand: 2,
                        acc_on_right: true,
                    },
                    ChainStep::Binary {
                        op: BinaryOp::Sub,
                        operand: 1,
                        acc_on_right: true,
                    },
                    ChainStep::Binary {
                        op: BinaryOp::Mul,
                        operand: 0,
                        acc_on_right: false,
                    },
                ],
            ),
            (
                vec![vec![3, 1], vec![1, 4]],
                vec![
                    ChainStep::Unary(UnaryOp::Abs),
                    ChainStep::Binary {
                        op: BinaryOp::Div,
                        operand: 1,
                        acc_on_right: true,
                    },
                    ChainStep::Unary(UnaryOp::Act(Activation::Clip {
                        min: -1.0,
                        max: 1.0,
                    })),
                ],
            ),
            (
                vec![vec![1, 8, 96, 96], vec![1, 8, 96, 96], vec![1, 8, 1, 1]],
                vec![
                    ChainStep::Binary {
                        op: BinaryOp::Add,
                        operand: 1,
                        acc_on_right: true,
                    },
                    ChainStep::Binary {
                        op: BinaryOp::Max,
                        operand: 2,
                        acc_on_right: false,
                    },
                    ChainStep::Unary(UnaryOp::Act(Activation::HardSwish)),
                ],
            ),
        ];
        for (ci, (shapes, chain)) in cases.into_iter().enumerate() {
            let inputs: Vec<(Vec<usize>, Vec<f32>)> = shapes
                .iter()
                .enumerate()
                .map(|(k, s)| (s.clone(), rand_f32(numel(s), (ci * 10 + k) as u64)))
                .collect();
            let so = shapes.iter().fold(vec![], |a, s| bshape(&a, s));
            let want = unfused(&inputs, &chain, &so);
            let ins = inputs
                .iter()
                .map(|(s, d)| In::Rt(f32t(s, d.clone())))
                .collect();
            let got = run1(Op::Elementwise(chain), ins, DataType::F32, &so).unwrap();
            assert_eq!(got.as_f32().unwrap(), &want[..], "case {ci}");
        }
    }
}
