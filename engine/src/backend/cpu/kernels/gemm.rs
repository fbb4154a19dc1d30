//! CPU kernels: Gemm and MatMul, plus the shared f32 matrix-product helpers the other compute
//! kernels (conv) build on. Constant right-hand sides go through our packed micro-kernels
//! ([`packed`]); products with a runtime right-hand side go through the `gemm` crate.

use rayon::prelude::*;

pub(super) mod packed;

use super::{Kernel, TensorMut, TensorRef};
use crate::error::{Error, Result};
use crate::ir::{Activation, DataType, Graph, Node, Op};

pub(super) use ::gemm::Parallelism;

/// Work (m*n*k multiply-adds) below which a product runs on the calling thread only.
const PAR_THRESHOLD: usize = 96 * 96 * 96;

/// Picks the `gemm` parallelism for an `m x k` by `k x n` product.
pub(super) fn parallelism(m: usize, n: usize, k: usize) -> Parallelism {
    let threads = rayon::current_num_threads();
    if threads > 1 && m.saturating_mul(n).saturating_mul(k) >= PAR_THRESHOLD {
        Parallelism::Rayon(threads)
    } else {
        Parallelism::None
    }
}

/// A strided read-only matrix operand: element (i, j) is `data[i * rs + j * cs]`.
#[derive(Clone, Copy)]
pub(super) struct Mat<'a> {
    pub data: &'a [f32],
    pub rs: usize,
    pub cs: usize,
}

fn extent(rows: usize, cols: usize, rs: usize, cs: usize) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        (rows - 1) * rs + (cols - 1) * cs + 1
    }
}

/// `c = alpha * a * b (+ c when accumulate)`, with `a` m x k, `b` k x n and `c` m x n (row stride
/// `c_rs`, unit column stride). Bounds of every operand are checked before the unsafe call.
#[allow(clippy::too_many_arguments)]
pub(super) fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    a: Mat<'_>,
    b: Mat<'_>,
    c: &mut [f32],
    c_rs: usize,
    accumulate: bool,
    alpha: f32,
    par: Parallelism,
) -> Result<()> {
    if m == 0 || n == 0 {
        return Ok(());
    }
    if extent(m, n, c_rs, 1) > c.len() {
        return Err(Error::Shape(format!(
            "gemm output {m}x{n} (row stride {c_rs}) exceeds its buffer"
        )));
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                c[i * c_rs..i * c_rs + n].fill(0.0);
            }
        }
        return Ok(());
    }
    if extent(m, k, a.rs, a.cs) > a.data.len() || extent(k, n, b.rs, b.cs) > b.data.len() {
        return Err(Error::Shape(format!(
            "gemm operands of a {m}x{k}x{n} product exceed their buffers"
        )));
    }
    // SAFETY: every index the product touches lies inside the slices (checked above); `c` is
    // exclusively borrowed and does not alias `a` or `b` (distinct borrows).
    unsafe {
        ::gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            c_rs as isize,
            accumulate,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            1.0,
            alpha,
            false,
            false,
            false,
            par,
        );
    }
    Ok(())
}

/// Errors unless every present input and every output of `node` is f32.
pub(super) fn check_f32(graph: &Graph, node: &Node, inputs: &[usize]) -> Result<()> {
    let mut ids: Vec<usize> = inputs.iter().filter_map(|&i| node.input(i)).collect();
    ids.extend(node.outputs.iter().copied());
    for v in ids {
        if graph.values[v].dtype != DataType::F32 {
            return Err(Error::Unsupported(format!(
                "{} (node '{}'): only f32 is supported, '{}' is {:?}",
                node.op.name(),
                node.name,
                graph.values[v].name,
                graph.values[v].dtype
            )));
        }
    }
    Ok(())
}

/// The static shape of input `i` of `node`, or an error naming the node.
pub(super) fn in_shape<'g>(graph: &'g Graph, node: &Node, i: usize) -> Result<&'g [usize]> {
    let v = node.input(i).ok_or_else(|| {
        Error::InvalidModel(format!(
            "{} '{}' lacks input {i}",
            node.op.name(),
            node.name
        ))
    })?;
    graph.shape(v)
}

/// The static shape of output `i` of `node`.
pub(super) fn out_shape<'g>(graph: &'g Graph, node: &Node, i: usize) -> Result<&'g [usize]> {
    let v = *node.outputs.get(i).ok_or_else(|| {
        Error::InvalidModel(format!(
            "{} '{}' lacks output {i}",
            node.op.name(),
            node.name
        ))
    })?;
    graph.shape(v)
}

/// Input `i` at run time as f32 elements, checking its element count.
pub(super) fn input_f32<'a>(
    inputs: &[Option<TensorRef<'a>>],
    i: usize,
    len: usize,
) -> Result<&'a [f32]> {
    let t = inputs
        .get(i)
        .and_then(|t| t.as_ref())
        .ok_or_else(|| Error::BadInput(format!("kernel input {i} is missing")))?;
    let s = t.f32();
    if s.len() < len {
        return Err(Error::Shape(format!(
            "kernel input {i} has {} elements, expected {len}",
            s.len()
        )));
    }
    Ok(&s[..len])
}

/// Output `i` at run time as mutable f32 elements, checking its element count.
pub(super) fn output_f32<'o>(
    outputs: &'o mut [TensorMut<'_>],
    i: usize,
    len: usize,
) -> Result<&'o mut [f32]> {
    let t = outputs
        .get_mut(i)
        .ok_or_else(|| Error::BadInput(format!("kernel output {i} is missing")))?;
    let s = t.f32();
    if s.len() < len {
        return Err(Error::Shape(format!(
            "kernel output {i} has {} elements, expected {len}",
            s.len()
        )));
    }
    Ok(&mut s[..len])
}

/// Reinterprets (a prefix of) scratch bytes as `len` f32s; errors when too small or misaligned.
pub(super) fn scratch_f32(scratch: &mut [u8], len: usize) -> Result<&mut [f32]> {
    let bytes = len * 4;
    if scratch.len() < bytes || (scratch.as_ptr() as usize) & 3 != 0 {
        return Err(Error::Shape(format!(
            "scratch of {} bytes cannot hold {len} f32s",
            scratch.len()
        )));
    }
    let s = &mut scratch[..bytes];
    // SAFETY: length and 4-byte alignment checked above; every bit pattern is a valid f32.
    Ok(unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut f32, len) })
}

/// Applies an optional activation in place.
pub(super) fn apply_act(act: Option<Activation>, data: &mut [f32]) {
    if let Some(a) = act {
        match a {
            Activation::Relu => data.iter_mut().for_each(|x| *x = x.max(0.0)),
            Activation::Clip { min, max } => data.iter_mut().for_each(|x| *x = x.max(min).min(max)),
            _ => data.iter_mut().for_each(|x| *x = a.apply(*x)),
        }
    }
}

/// Where an operand comes from: a constant copied (and possibly repacked) at build, or a runtime input.
enum Operand {
    Const(Vec<f32>),
    Input(usize),
}

impl Operand {
    fn get<'a>(&'a self, inputs: &[Option<TensorRef<'a>>], len: usize) -> Result<&'a [f32]> {
        match self {
            Operand::Const(v) => Ok(&v[..len.min(v.len())]),
            Operand::Input(i) => input_f32(inputs, *i, len),
        }
    }
}

/// Compiles a Gemm or MatMul node.
pub fn build(graph: &Graph, node: &Node) -> Result<Box<dyn Kernel>> {
    match &node.op {
        Op::Gemm {
            alpha,
            beta,
            trans_a,
            trans_b,
            activation,
        } => build_gemm(graph, node, *alpha, *beta, *trans_a, *trans_b, *activation),
        Op::MatMul => build_matmul(graph, node),
        other => Err(Error::Unsupported(format!(
            "gemm kernels do not handle {}",
            other.name()
        ))),
    }
}

struct GemmKernel {
    m: usize,
    n: usize,
    k: usize,
    a: Operand,
    a_rs: usize,
    a_cs: usize,
    b: Operand,
    b_rs: usize,
    b_cs: usize,
    /// C operand with its broadcast strides into [M, N] and element count.
    c: Option<(Operand, usize, usize, usize)>,
    alpha: f32,
    beta: f32,
    act: Option<Activation>,
    /// Constant B (alpha folded in), packed for the micro-kernels; A must then be row-major.
    packed: Option<packed::PackedB>,
}

fn build_gemm(
    graph: &Graph,
    node: &Node,
    alpha: f32,
    beta: f32,
    trans_a: bool,
    trans_b: bool,
    act: Option<Activation>,
) -> Result<Box<dyn Kernel>> {
    check_f32(graph, node, &[0, 1, 2])?;
    let sa = in_shape(graph, node, 0)?;
    let sb = in_shape(graph, node, 1)?;
    if sa.len() != 2 || sb.len() != 2 {
        return Err(Error::Shape(format!(
            "Gemm '{}' needs 2-D A and B, got {sa:?} and {sb:?}",
            node.name
        )));
    }
    let (m, k) = if trans_a {
        (sa[1], sa[0])
    } else {
        (sa[0], sa[1])
    };
    let (kb, n) = if trans_b {
        (sb[1], sb[0])
    } else {
        (sb[0], sb[1])
    };
    if k != kb {
        return Err(Error::Shape(format!(
            "Gemm '{}': inner dimensions {k} and {kb} differ",
            node.name
        )));
    }
    let so = out_shape(graph, node, 0)?;
    if so != [m, n] {
        return Err(Error::Shape(format!(
            "Gemm '{}': output shape {so:?} is not [{m}, {n}]",
            node.name
        )));
    }
    let (a_rs, a_cs) = if trans_a { (1, m) } else { (k, 1) };
    let a = match graph.const_input(node, 0) {
        Some(t) => Operand::Const(t.as_f32()?.to_vec()),
        None => Operand::Input(0),
    };
    // Constant B is repacked to row-major [K, N].
    let (b, b_rs, b_cs) = match graph.const_input(node, 1) {
        Some(t) => {
            let src = t.as_f32()?;
            if trans_b {
                let mut v = vec![0.0; k * n];
                for j in 0..n {
                    for p in 0..k {
                        v[p * n + j] = src[j * k + p];
                    }
                }
                (Operand::Const(v), n, 1)
            } else {
                (Operand::Const(src.to_vec()), n, 1)
            }
        }
        None if trans_b => (Operand::Input(1), 1, k),
        None => (Operand::Input(1), n, 1),
    };
    let c = match node.input(2) {
        Some(cv) if beta != 0.0 => {
            let sc = graph.shape(cv)?;
            if sc.len() > 2 {
                return Err(Error::Shape(format!(
                    "Gemm '{}': C has rank {} > 2",
                    node.name,
                    sc.len()
                )));
            }
            let cr = if sc.len() == 2 { sc[0] } else { 1 };
            let cc = sc.last().copied().unwrap_or(1);
            if (cr != 1 && cr != m) || (cc != 1 && cc != n) {
                return Err(Error::Shape(format!(
                    "Gemm '{}': C of shape {sc:?} does not broadcast to [{m}, {n}]",
                    node.name
                )));
            }
            let rs = if cr == 1 { 0 } else { cc };
            let cs = if cc == 1 { 0 } else { 1 };
            let op = match graph.constant(cv) {
                Some(t) => Operand::Const(t.as_f32()?.to_vec()),
                None => Operand::Input(2),
            };
            Some((op, rs, cs, cr * cc))
        }
        _ => None,
    };
    let packed = match (&b, trans_a, &a) {
        (Operand::Const(bv), false, Operand::Input(_)) => Some(packed::PackedB::new(
            packed::Isa::detect(),
            k,
            n,
            bv,
            b_rs,
            b_cs,
            alpha,
            None,
        )?),
        _ => None,
    };
    // The packed copy replaces the plain one.
    let b = if packed.is_some() {
        Operand::Const(Vec::new())
    } else {
        b
    };
    Ok(Box::new(GemmKernel {
        m,
        n,
        k,
        a,
        a_rs,
        a_cs,
        b,
        b_rs,
        b_cs,
        c,
        alpha,
        beta,
        act,
        packed,
    }))
}

impl Kernel for GemmKernel {
    fn run(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        _scratch: &mut [u8],
    ) -> Result<()> {
        let (m, n, k) = (self.m, self.n, self.k);
        let a = self.a.get(inputs, m * k)?;
        let out = output_f32(outputs, 0, m * n)?;
        let accumulate = match &self.c {
            Some((op, rs, cs, len)) => {
                let c = op.get(inputs, *len)?;
                if c.len() < *len {
                    return Err(Error::Shape("Gemm C operand is too small".into()));
                }
                for i in 0..m {
                    let row = &mut out[i * n..(i + 1) * n];
                    for (j, o) in row.iter_mut().enumerate() {
                        *o = self.beta * c[i * rs + j * cs];
                    }
                }
                true
            }
            None => false,
        };
        if let Some(pb) = &self.packed {
            return pb.run(
                m,
                a,
                k,
                out,
                n,
                accumulate,
                packed::Epilogue::new(self.act),
                true,
            );
        }
        let b = self.b.get(inputs, k * n)?;
        sgemm(
            m,
            n,
            k,
            Mat {
                data: a,
                rs: self.a_rs,
                cs: self.a_cs,
            },
            Mat {
                data: b,
                rs: self.b_rs,
                cs: self.b_cs,
            },
            out,
            n,
            accumulate,
            self.alpha,
            parallelism(m, n, k),
        )?;
        apply_act(self.act, out);
        Ok(())
    }
}

struct MatMulKernel {
    m: usize,
    n: usize,
    k: usize,
    a: Operand,
    a_len: usize,
    b: Operand,
    b_len: usize,
    /// (A offset, B offset) per output batch; empty when batches were folded into M.
    batches: Vec<(usize, usize)>,
    /// Row count of the single product when batches are folded (A batches contiguous, B shared).
    folded_m: usize,
}

/// Row-major strides of a batch shape, zeroed on broadcast (size-1) dims, aligned right to `rank`.
fn batch_strides(dims: &[usize], inner: usize, rank: usize) -> Vec<usize> {
    let mut st = vec![0; rank];
    let mut acc = inner;
    for (i, &d) in dims.iter().enumerate().rev() {
        let pos = rank - dims.len() + i;
        st[pos] = if d == 1 { 0 } else { acc };
        acc *= d;
    }
    st
}

fn build_matmul(graph: &Graph, node: &Node) -> Result<Box<dyn Kernel>> {
    check_f32(graph, node, &[0, 1])?;
    let sa = in_shape(graph, node, 0)?.to_vec();
    let sb = in_shape(graph, node, 1)?.to_vec();
    if sa.is_empty() || sb.is_empty() {
        return Err(Error::Shape(format!(
            "MatMul '{}': scalar operands are not allowed",
            node.name
        )));
    }
    let (m, k, a_batch) = if sa.len() == 1 {
        (1, sa[0], &sa[..0])
    } else {
        (sa[sa.len() - 2], sa[sa.len() - 1], &sa[..sa.len() - 2])
    };
    let (kb, n, b_batch) = if sb.len() == 1 {
        (sb[0], 1, &sb[..0])
    } else {
        (sb[sb.len() - 2], sb[sb.len() - 1], &sb[..sb.len() - 2])
    };
    if k != kb {
        return Err(Error::Shape(format!(
            "MatMul '{}': inner dimensions {k} and {kb} differ ({sa:?} x {sb:?})",
            node.name
        )));
    }
    let rank = a_batch.len().max(b_batch.len());
    let mut out_batch = vec![1; rank];
    for (i, o) in out_batch.iter_mut().enumerate() {
        let da = if i + a_batch.len() >= rank {
            a_batch[i + a_batch.len() - rank]
        } else {
            1
        };
        let db = if i + b_batch.len() >= rank {
            b_batch[i + b_batch.len() - rank]
        } else {
            1
        };
        if da != db && da != 1 && db != 1 {
            return Err(Error::Shape(format!(
                "MatMul '{}': batch dims {sa:?} and {sb:?} do not broadcast",
                node.name
            )));
        }
        *o = da.max(db);
    }
    let nb: usize = out_batch.iter().product();
    let total = nb * m * n;
    let so = out_shape(graph, node, 0)?;
    if so.iter().product::<usize>() != total {
        return Err(Error::Shape(format!(
            "MatMul '{}': output shape {so:?} does not hold {total} elements",
            node.name
        )));
    }
    let sta = batch_strides(a_batch, m * k, rank);
    let stb = batch_strides(b_batch, k * n, rank);
    let mut batches = Vec::with_capacity(nb);
    let mut idx = vec![0; rank];
    for _ in 0..nb {
        let ao: usize = idx.iter().zip(&sta).map(|(i, s)| i * s).sum();
        let bo: usize = idx.iter().zip(&stb).map(|(i, s)| i * s).sum();
        batches.push((ao, bo));
        for d in (0..rank).rev() {
            idx[d] += 1;
            if idx[d] < out_batch[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    let foldable = batches
        .iter()
        .enumerate()
        .all(|(i, &(ao, bo))| bo == 0 && ao == i * m * k);
    let (batches, folded_m) = if foldable {
        (Vec::new(), nb * m)
    } else {
        (batches, 0)
    };
    let a_len = sa.iter().product();
    let b_len = sb.iter().product();
    let a = match graph.const_input(node, 0) {
        Some(t) => Operand::Const(t.as_f32()?.to_vec()),
        None => Operand::Input(0),
    };
    let b = match graph.const_input(node, 1) {
        Some(t) => Operand::Const(t.as_f32()?.to_vec()),
        None => Operand::Input(1),
    };
    Ok(Box::new(MatMulKernel {
        m,
        n,
        k,
        a,
        a_len,
        b,
        b_len,
        batches,
        folded_m,
    }))
}

impl Kernel for MatMulKernel {
    fn run(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        _scratch: &mut [u8],
    ) -> Result<()> {
        let (m, n, k) = (self.m, self.n, self.k);
        let a = self.a.get(inputs, self.a_len)?;
        let b = self.b.get(inputs, self.b_len)?;
        if self.batches.is_empty() {
            let fm = self.folded_m;
            let out = output_f32(outputs, 0, fm * n)?;
            return sgemm(
                fm,
                n,
                k,
                Mat {
                    data: a,
                    rs: k,
                    cs: 1,
                },
                Mat {
                    data: b,
                    rs: n,
                    cs: 1,
                },
                out,
                n,
                false,
                1.0,
                parallelism(fm, n, k),
            );
        }
        let out = output_f32(outputs, 0, self.batches.len() * m * n)?;
        if out.is_empty() {
            return Ok(());
        }
        let one = |o: &mut [f32], &(ao, bo): &(usize, usize), par| {
            sgemm(
                m,
                n,
                k,
                Mat {
                    data: a.get(ao..).unwrap_or(&[]),
                    rs: k,
                    cs: 1,
                },
                Mat {
                    data: b.get(bo..).unwrap_or(&[]),
                    rs: n,
                    cs: 1,
                },
                o,
                n,
                false,
                1.0,
                par,
            )
        };
        let per = parallelism(m, n, k);
        if matches!(per, Parallelism::None)
            && rayon::current_num_threads() > 1
            && m * n * k * self.batches.len() >= PAR_THRESHOLD
        {
            out.par_chunks_mut(m * n)
                .zip(self.batches.par_iter())
                .try_for_each(|(o, bt)| one(o, bt, Parallelism::None))
        } else {
            out.chunks_mut(m * n)
                .zip(self.batches.iter())
                .try_for_each(|(o, bt)| one(o, bt, per))
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::ir::Tensor;

    /// Tiny deterministic generator for test data.
    pub struct Rng(pub u64);
    impl Rng {
        /// Uniform in [-1, 1).
        pub fn next(&mut self) -> f32 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
        /// `n` uniform values.
        pub fn vec(&mut self, n: usize) -> Vec<f32> {
            (0..n).map(|_| self.next()).collect()
        }
    }

    /// Asserts elementwise closeness with a relative+absolute tolerance.
    pub fn assert_close(got: &[f32], want: &[f32], tol: f32) {
        assert_eq!(got.len(), want.len(), "length mismatch");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= tol * (1.0 + w.abs()),
                "element {i}: got {g}, want {w}"
            );
        }
    }

    /// A graph input (non-constant) or constant for a test node.
    pub enum In {
        Val(Vec<usize>, Vec<f32>),
        Const(Vec<usize>, Vec<f32>),
        ConstI64(Vec<usize>, Vec<i64>),
        Absent,
    }

    fn bytes(v: &[f32]) -> &[u8] {
        // SAFETY: f32 slice viewed as its bytes.
        unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * 4) }
    }

    /// Builds a one-node graph, compiles it and runs it; returns each output's data.
    pub fn run_node(op: Op, ins: Vec<In>, out_shapes: Vec<Vec<usize>>) -> Result<Vec<Vec<f32>>> {
        let mut g = Graph {
            opset: 17,
            ..Default::default()
        };
        let mut inputs = Vec::new();
        let mut data: Vec<Option<(Vec<usize>, Vec<f32>)>> = Vec::new();
        for (i, x) in ins.into_iter().enumerate() {
            match x {
                In::Val(s, d) => {
                    let v = g.add_value(format!("in{i}"), DataType::F32);
                    g.values[v].shape = Some(s.clone());
                    inputs.push(Some(v));
                    data.push(Some((s, d)));
                }
                In::Const(s, d) => {
                    let v =
                        g.add_constant(format!("in{i}"), Tensor::from_f32(s.clone(), d.clone())?);
                    inputs.push(Some(v));
                    data.push(Some((s, d)));
                }
                In::ConstI64(s, d) => {
                    let v = g.add_constant(format!("in{i}"), Tensor::from_i64(s, d)?);
                    inputs.push(Some(v));
                    data.push(None);
                }
                In::Absent => {
                    inputs.push(None);
                    data.push(None);
                }
            }
        }
        let mut outputs = Vec::new();
        for (i, s) in out_shapes.iter().enumerate() {
            let v = g.add_value(format!("out{i}"), DataType::F32);
            g.values[v].shape = Some(s.clone());
            outputs.push(v);
        }
        let node = Node {
            name: "n".into(),
            op,
            inputs,
            outputs,
        };
        g.nodes.push(node.clone());
        let k = super::super::build_kernel(&g, &node)?;
        let views: Vec<Option<TensorRef<'_>>> = data
            .iter()
            .map(|d| {
                d.as_ref().map(|(s, v)| TensorRef {
                    dtype: DataType::F32,
                    shape: s,
                    bytes: bytes(v),
                })
            })
            .collect();
        let mut outs: Vec<Vec<f32>> = out_shapes
            .iter()
            .map(|s| vec![f32::NAN; s.iter().product()])
            .collect();
        let mut scratch = vec![0u64; k.scratch_bytes().div_ceil(8)];
        {
            let mut ov: Vec<TensorMut<'_>> = outs
                .iter_mut()
                .zip(&out_shapes)
                .map(|(o, s)| {
                    // SAFETY: f32 buffer viewed as bytes, exclusively borrowed.
                    let b = unsafe {
                        std::slice::from_raw_parts_mut(o.as_mut_ptr() as *mut u8, o.len() * 4)
                    };
                    TensorMut {
                        dtype: DataType::F32,
                        shape: s,
                        bytes: b,
                    }
                })
                .collect();
            // SAFETY: u64 buffer viewed as bytes.
            let sb = unsafe {
                std::slice::from_raw_parts_mut(scratch.as_mut_ptr() as *mut u8, scratch.len() * 8)
            };
            k.run(&views, &mut ov, sb)?;
        }
        Ok(outs)
    }

    fn naive_mm(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    }

    fn transpose(a: &[f32], r: usize, c: usize) -> Vec<f32> {
        let mut t = vec![0.0; r * c];
        for i in 0..r {
            for j in 0..c {
                t[j * r + i] = a[i * c + j];
            }
        }
        t
    }

    #[test]
    fn gemm_variants_match_naive() {
        let mut rng = Rng(1);
        let (m, k, n) = (37, 29, 53);
        for (ta, tb, cshape, bconst) in [
            (false, false, vec![n], true),
            (true, false, vec![1, n], false),
            (false, true, vec![m, 1], true),
            (true, true, vec![], false),
            (false, false, vec![m, n], false),
        ] {
            let a = rng.vec(m * k);
            let b = rng.vec(k * n);
            let c = rng.vec(cshape.iter().product());
            let (alpha, beta) = (0.7, -1.3);
            let mut want = naive_mm(&a, &b, m, k, n);
            for i in 0..m {
                for j in 0..n {
                    let cv = match cshape.len() {
                        0 => c[0],
                        1 => c[j],
                        _ if cshape[0] == 1 => c[j],
                        _ if cshape[1] == 1 => c[i],
                        _ => c[i * n + j],
                    };
                    want[i * n + j] = (alpha * want[i * n + j] + beta * cv).max(0.0);
                }
            }
            let a_in = if ta { transpose(&a, m, k) } else { a.clone() };
            let b_in = if tb { transpose(&b, k, n) } else { b.clone() };
            let sa = if ta { vec![k, m] } else { vec![m, k] };
            let sb = if tb { vec![n, k] } else { vec![k, n] };
            let bi = if bconst {
                In::Const(sb, b_in)
            } else {
                In::Val(sb, b_in)
            };
            let op = Op::Gemm {
                alpha,
                beta,
                trans_a: ta,
                trans_b: tb,
                activation: Some(Activation::Relu),
            };
            let got = run_node(
                op,
                vec![In::Val(sa, a_in), bi, In::Const(cshape.clone(), c)],
                vec![vec![m, n]],
            )
            .unwrap();
            assert_close(&got[0], &want, 1e-4);
        }
    }

    #[test]
    fn gemm_large_threaded_and_no_c() {
        let mut rng = Rng(2);
        let (m, k, n) = (150, 140, 130);
        let a = rng.vec(m * k);
        let b = rng.vec(k * n);
        let want = naive_mm(&a, &b, m, k, n);
        let op = Op::Gemm {
            alpha: 1.0,
            beta: 1.0,
            trans_a: false,
            trans_b: false,
            activation: None,
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let got = pool
            .install(|| {
                run_node(
                    op,
                    vec![In::Val(vec![m, k], a), In::Const(vec![k, n], b), In::Absent],
                    vec![vec![m, n]],
                )
            })
            .unwrap();
        assert_close(&got[0], &want, 1e-4);
    }

    #[test]
    fn matmul_batched_broadcast_and_1d() {
        let mut rng = Rng(3);
        // [2,1,4,5] x [3,5,6] -> [2,3,4,6]
        let a = rng.vec(2 * 4 * 5);
        let b = rng.vec(3 * 5 * 6);
        let mut want = Vec::new();
        for i in 0..2 {
            for j in 0..3 {
                want.extend(naive_mm(
                    &a[i * 20..(i + 1) * 20],
                    &b[j * 30..(j + 1) * 30],
                    4,
                    5,
                    6,
                ));
            }
        }
        let got = run_node(
            Op::MatMul,
            vec![
                In::Val(vec![2, 1, 4, 5], a.clone()),
                In::Const(vec![3, 5, 6], b),
            ],
            vec![vec![2, 3, 4, 6]],
        )
        .unwrap();
        assert_close(&got[0], &want, 1e-4);

        // Folded path: [3,4,5] x [5,6]
        let b2 = rng.vec(30);
        let a2 = rng.vec(60);
        let want: Vec<f32> = (0..3)
            .flat_map(|i| naive_mm(&a2[i * 20..(i + 1) * 20], &b2, 4, 5, 6))
            .collect();
        let got = run_node(
            Op::MatMul,
            vec![In::Val(vec![3, 4, 5], a2), In::Val(vec![5, 6], b2.clone())],
            vec![vec![3, 4, 6]],
        )
        .unwrap();
        assert_close(&got[0], &want, 1e-4);

        // 1-D x 2-D and 2-D x 1-D
        let v = rng.vec(5);
        let got = run_node(
            Op::MatMul,
            vec![In::Val(vec![5], v.clone()), In::Val(vec![5, 6], b2.clone())],
            vec![vec![6]],
        )
        .unwrap();
        assert_close(&got[0], &naive_mm(&v, &b2, 1, 5, 6), 1e-4);
        let mt = rng.vec(30);
        let got = run_node(
            Op::MatMul,
            vec![In::Val(vec![6, 5], mt.clone()), In::Val(vec![5], v.clone())],
            vec![vec![6]],
        )
        .unwrap();
        assert_close(&got[0], &naive_mm(&mt, &v, 6, 5, 1), 1e-4);
        // 1-D x 1-D -> scalar
        let got = run_node(
            Op::MatMul,
            vec![In::Val(vec![5], v.clone()), In::Val(vec![5], v.clone())],
            vec![vec![]],
        )
        .unwrap();
        assert_close(&got[0], &[v.iter().map(|x| x * x).sum()], 1e-5);
    }

    #[test]
    fn gemm_rejects_non_f32() {
        let mut g = Graph::default();
        let a = g.add_value("a", DataType::I64);
        g.values[a].shape = Some(vec![2, 2]);
        let b = g.add_value("b", DataType::I64);
        g.values[b].shape = Some(vec![2, 2]);
        let o = g.add_value("o", DataType::I64);
        g.values[o].shape = Some(vec![2, 2]);
        let node = Node {
            name: "mm".into(),
            op: Op::MatMul,
            inputs: vec![Some(a), Some(b)],
            outputs: vec![o],
        };
        assert!(matches!(build(&g, &node), Err(Error::Unsupported(_))));
    }
}
