//! CPU kernels: data movement — Concat, Split, Slice, Reshape-likes, Transpose, Gather, Expand,
//! ScatterND, Pad and Cast.
//!
//! Everything except Cast moves elements by size (1, 2, 4 or 8 bytes), so it works for any
//! `DataType`. Index arithmetic (strides, clamped slice bounds, pad source tables) is done at
//! build time; `run` only walks precomputed plans.

use super::elementwise::{
    drive, in_id, input, norm_axis, numel, out_id, output, pod_from_bytes, shape_err, shape_of,
    strides_of, unsupported, view, view_mut, Pod, CHUNK, PAR_MIN,
};
use super::{Kernel, TensorMut, TensorRef};
use crate::error::{Error, Result};
use crate::ir::{DataType, Graph, Node, Op, PadMode};

use rayon::prelude::*;

/// Calls `f` with the element type matching `elem` bytes (1, 2, 4 or 8).
macro_rules! by_elem {
    ($elem:expr, $f:ident ( $($arg:expr),* )) => {
        match $elem {
            1 => $f::<u8>($($arg),*),
            2 => $f::<u16>($($arg),*),
            4 => $f::<u32>($($arg),*),
            _ => $f::<u64>($($arg),*),
        }
    };
}

/// Reads constant input `i` as i64s, erroring (Unsupported) when present but not constant.
fn const_i64(graph: &Graph, node: &Node, i: usize, what: &str) -> Result<Option<Vec<i64>>> {
    match node.input(i) {
        None => Ok(None),
        Some(v) => match graph.constant(v) {
            Some(t) => Ok(Some(t.to_i64_vec()?)),
            None => Err(unsupported(
                node,
                format_args!("{what} (input {i}) must be a constant"),
            )),
        },
    }
}

// ------------------------------------------------------------------------------------------
// Strided copy: out[i0..ik] = in[base + sum i_d * stride_d] (Slice, Transpose, Expand)
// ------------------------------------------------------------------------------------------

/// A collapsed strided read of the input in output order.
#[derive(Clone, Debug)]
struct Strided {
    dims: Vec<usize>,
    strides: Vec<isize>,
    base: isize,
    len: usize,
    in_len: usize,
}

impl Strided {
    fn new(dims: &[usize], strides: &[isize], base: isize, in_len: usize) -> Self {
        let mut cd: Vec<usize> = Vec::new();
        let mut cs: Vec<isize> = Vec::new();
        for (&d, &s) in dims.iter().zip(strides) {
            if d == 1 {
                continue;
            }
            if let (Some(ld), Some(ls)) = (cd.last_mut(), cs.last_mut()) {
                if *ls == s * d as isize {
                    *ld *= d;
                    *ls = s;
                    continue;
                }
            }
            cd.push(d);
            cs.push(s);
        }
        if cd.is_empty() {
            cd.push(1);
            cs.push(0);
        }
        Strided {
            len: numel(dims),
            dims: cd,
            strides: cs,
            base,
            in_len,
        }
    }

    /// Source offset of the first element of output row `row` (rows run along the last dim).
    #[inline]
    fn row_base(&self, row: usize) -> isize {
        let r = self.dims.len();
        let mut off = self.base;
        let mut rem = row;
        for d in (0..r - 1).rev() {
            off += (rem % self.dims[d]) as isize * self.strides[d];
            rem /= self.dims[d];
        }
        off
    }

    fn run_typed<E: Pod>(&self, src: &[u8], dst: &mut [u8], name: &str) -> Result<()> {
        let src = view::<E>(src, self.in_len, name)?;
        let dst = view_mut::<E>(dst, self.len, name)?;
        if self.len == 0 {
            return Ok(());
        }
        let r = self.dims.len();
        // 2-D transpose pattern: [batch,] rows, cols with input strides [.., 1, rows].
        if r >= 2 && self.strides[r - 2] == 1 && self.strides[r - 1] == self.dims[r - 2] as isize {
            let batch_ok =
                r == 2 || (r == 3 && self.strides[0] == (self.dims[1] * self.dims[2]) as isize);
            if batch_ok && self.base == 0 {
                transpose_blocked(src, dst, self.dims[r - 2], self.dims[r - 1]);
                return Ok(());
            }
        }
        let inner = self.dims[r - 1];
        let s = self.strides[r - 1];
        let rows_per = (CHUNK / inner).max(1);
        let body = |ci: usize, chunk: &mut [E]| {
            for (ri, row) in chunk.chunks_mut(inner).enumerate() {
                let b = self.row_base(ci * rows_per + ri);
                if s == 1 {
                    let b = b as usize;
                    row.copy_from_slice(&src[b..b + inner]);
                } else if s == 0 {
                    row.fill(src[b as usize]);
                } else {
                    for (j, o) in row.iter_mut().enumerate() {
                        *o = src[(b + j as isize * s) as usize];
                    }
                }
            }
        };
        if self.len >= PAR_MIN {
            dst.par_chunks_mut(rows_per * inner)
                .enumerate()
                .for_each(|(ci, c)| body(ci, c));
        } else {
            for (ci, c) in dst.chunks_mut(rows_per * inner).enumerate() {
                body(ci, c);
            }
        }
        Ok(())
    }

    fn run(&self, src: &[u8], dst: &mut [u8], elem: usize, name: &str) -> Result<()> {
        by_elem!(elem, run_typed_dispatch(self, src, dst, name))
    }
}

fn run_typed_dispatch<E: Pod>(s: &Strided, src: &[u8], dst: &mut [u8], name: &str) -> Result<()> {
    s.run_typed::<E>(src, dst, name)
}

/// Batched blocked transpose: `src` is `[batch, cols, rows]`, `dst` is `[batch, rows, cols]`.
/// Each parallel chunk holds whole output rows (at least `CHUNK` elements, so narrow outputs
/// such as NCHW -> NHWC with 3 channels are not split into tiny tasks); within a chunk the
/// columns go in blocks of `TILE`, reading `TILE` input rows sequentially.
fn transpose_blocked<E: Pod>(src: &[E], dst: &mut [E], rows: usize, cols: usize) {
    const TILE: usize = 32;
    if cols == 0 || rows == 0 {
        return;
    }
    match cols {
        1 => return dst.copy_from_slice(&src[..dst.len()]),
        2 => return transpose_narrow::<E, 2>(src, dst, rows),
        3 => return transpose_narrow::<E, 3>(src, dst, rows),
        4 => return transpose_narrow::<E, 4>(src, dst, rows),
        _ => {}
    }
    let plane = rows * cols;
    let rows_per = (CHUNK / cols).max(TILE) / TILE * TILE;
    let body = |gi: usize, chunk: &mut [E]| {
        // `chunk` covers output rows [g0, g0 + chunk.len()/cols) of the flattened batch.
        let g0 = gi * rows_per;
        let nrows = chunk.len() / cols;
        let mut j0 = 0;
        while j0 < cols {
            let j1 = (j0 + TILE).min(cols);
            let (mut b, mut i) = (g0 / rows, g0 % rows);
            for rr in 0..nrows {
                let sb = b * plane + i;
                for (j, o) in chunk[rr * cols + j0..rr * cols + j1].iter_mut().enumerate() {
                    *o = src[sb + (j0 + j) * rows];
                }
                i += 1;
                if i == rows {
                    (b, i) = (b + 1, 0);
                }
            }
            j0 = j1;
        }
    };
    if dst.len() >= PAR_MIN {
        dst.par_chunks_mut(rows_per * cols)
            .enumerate()
            .for_each(|(gi, c)| body(gi, c));
    } else {
        for (gi, c) in dst.chunks_mut(rows_per * cols).enumerate() {
            body(gi, c);
        }
    }
}

/// [`transpose_blocked`] for `C` (at most 4) output columns, such as an NCHW -> NHWC image:
/// each output row gathers one element from each of the `C` input rows of its batch.
fn transpose_narrow<E: Pod, const C: usize>(src: &[E], dst: &mut [E], rows: usize) {
    let plane = rows * C;
    let rows_per = (CHUNK / C).min(rows).max(1);
    let parallel = dst.len() >= PAR_MIN;
    #[cfg(target_arch = "x86_64")]
    let vbmi = super::quantize::vbmi_available();
    for (sp, dp) in src.chunks(plane).zip(dst.chunks_mut(plane)) {
        let body = |ci: usize, chunk: &mut [E]| {
            let r0 = ci * rows_per;
            #[cfg(target_arch = "x86_64")]
            if C == 3 && vbmi && std::any::TypeId::of::<E>() == std::any::TypeId::of::<u8>() {
                // SAFETY: `E` is `u8` (checked just above), so both views are the same memory at
                // the same type; VBMI was detected; `sp` holds the C planes of `rows` bytes.
                unsafe {
                    let src = std::slice::from_raw_parts(sp.as_ptr() as *const u8, sp.len());
                    let dst =
                        std::slice::from_raw_parts_mut(chunk.as_mut_ptr() as *mut u8, chunk.len());
                    interleave3_vbmi(src, rows, r0, dst);
                }
                return;
            }
            for (r, o) in chunk.chunks_exact_mut(C).enumerate() {
                for (c, v) in o.iter_mut().enumerate() {
                    *v = sp[c * rows + r0 + r];
                }
            }
        };
        if parallel {
            dp.par_chunks_mut(rows_per * C)
                .enumerate()
                .for_each(|(ci, c)| body(ci, c));
        } else {
            dp.chunks_mut(rows_per * C)
                .enumerate()
                .for_each(|(ci, c)| body(ci, c));
        }
    }
}

/// Interleaves three byte planes (`src` = planes of `rows` bytes) from position `r0` into
/// `dst` as `[r][3]`, 64 positions per step: one `vpermt2b` places the first two planes' bytes
/// of each 64-byte output vector and one masked `vpermb` the third's (an NCHW -> NHWC
/// quantized image: 6 shuffles per 64 pixels instead of 192 scalar moves).
///
/// # Safety
/// AVX-512BW and VBMI available; `src.len() >= 3 * rows` and `r0 + dst.len() / 3 <= rows`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn interleave3_vbmi(src: &[u8], rows: usize, r0: usize, dst: &mut [u8]) {
    use std::arch::x86_64::*;
    let n = dst.len() / 3;
    // Output vector k, byte j: position (64k + j) / 3 of the step, plane (64k + j) % 3; the
    // pair index picks plane 0 (bit 6 clear) or plane 1 (set), the mask the bytes of plane 2.
    let table = |k: usize| -> (__m512i, __m512i, __mmask64) {
        let (mut pair, mut third, mut mask) = ([0u8; 64], [0u8; 64], 0u64);
        for j in 0..64 {
            let (px, plane) = ((64 * k + j) / 3, (64 * k + j) % 3);
            pair[j] = px as u8 | if plane == 1 { 64 } else { 0 };
            third[j] = px as u8;
            if plane == 2 {
                mask |= 1 << j;
            }
        }
        let load = |v: &[u8; 64]| _mm512_loadu_si512(v.as_ptr() as *const _);
        (load(&pair), load(&third), mask)
    };
    let t = [table(0), table(1), table(2)];
    let (p0, p1, p2) = (
        src.as_ptr(),
        src.as_ptr().add(rows),
        src.as_ptr().add(2 * rows),
    );
    let mut i = 0;
    while i + 64 <= n {
        let a = _mm512_loadu_si512(p0.add(r0 + i) as *const _);
        let b = _mm512_loadu_si512(p1.add(r0 + i) as *const _);
        let c = _mm512_loadu_si512(p2.add(r0 + i) as *const _);
        for (k, (pair, third, mask)) in t.iter().enumerate() {
            let ab = _mm512_permutex2var_epi8(a, *pair, b);
            let v = _mm512_mask_permutexvar_epi8(ab, *mask, *third, c);
            _mm512_storeu_si512(dst.as_mut_ptr().add(3 * i + 64 * k) as *mut _, v);
        }
        i += 64;
    }
    for r in i..n {
        for c in 0..3 {
            dst[3 * r + c] = src[c * rows + r0 + r];
        }
    }
}

struct StridedKernel {
    name: String,
    plan: Strided,
    elem: usize,
}

impl Kernel for StridedKernel {
    fn run(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        _scratch: &mut [u8],
    ) -> Result<()> {
        let src = input(inputs, 0, &self.name)?.bytes;
        let dst = &mut *output(outputs, 0, &self.name)?.bytes;
        self.plan.run(src, dst, self.elem, &self.name)
    }
}

fn io_dtype(graph: &Graph, node: &Node) -> Result<DataType> {
    let (x, y) = (in_id(node, 0)?, out_id(node, 0)?);
    let dt = graph.values[x].dtype;
    if graph.values[y].dtype != dt {
        return Err(Error::Type(format!(
            "{} node '{}': input is {dt:?} but output is {:?}",
            node.op.name(),
            node.name,
            graph.values[y].dtype
        )));
    }
    Ok(dt)
}

fn build_transpose(graph: &Graph, node: &Node, perm: &[usize]) -> Result<Box<dyn Kernel>> {
    let dt = io_dtype(graph, node)?;
    let si = shape_of(graph, in_id(node, 0)?)?;
    let so = shape_of(graph, out_id(node, 0)?)?;
    let r = si.len();
    let perm: Vec<usize> = if perm.is_empty() {
        (0..r).rev().collect()
    } else {
        perm.to_vec()
    };
    let mut seen = vec![false; r];
    if perm.len() != r
        || perm
            .iter()
            .any(|&p| p >= r || std::mem::replace(&mut seen[p], true))
    {
        return Err(shape_err(
            node,
            format_args!("perm {perm:?} is not a permutation of rank {r}"),
        ));
    }
    let want: Vec<usize> = perm.iter().map(|&p| si[p]).collect();
    if want != so {
        return Err(shape_err(
            node,
            format_args!("output shape {so:?} does not match {want:?}"),
        ));
    }
    let ist = strides_of(&si);
    let strides: Vec<isize> = perm.iter().map(|&p| ist[p] as isize).collect();
    Ok(Box::new(StridedKernel {
        name: node.name.clone(),
        plan: Strided::new(&so, &strides, 0, numel(&si)),
        elem: dt.size(),
    }))
}

fn build_expand(graph: &Graph, node: &Node) -> Result<Box<dyn Kernel>> {
    // The target shape (input 1) is already reflected in the inferred output shape.
    let dt = io_dtype(graph, node)?;
    let si = shape_of(graph, in_id(node, 0)?)?;
    let so = shape_of(graph, out_id(node, 0)?)?;
    if si.len() > so.len() {
        return Err(shape_err(
            node,
            format_args!("input {si:?} has higher rank than output {so:?}"),
        ));
    }
    let off = so.len() - si.len();
    let ist = strides_of(&si);
    let mut strides = vec![0isize; so.len()];
    for (j, &d) in si.iter().enumerate() {
        if d == so[off + j] {
            strides[off + j] = if d == 1 { 0 } else { ist[j] as isize };
        } else if d != 1 {
            return Err(shape_err(
                node,
                format_args!("input {si:?} does not broadcast to {so:?}"),
            ));
        }
    }
    Ok(Box::new(StridedKernel {
        name: node.name.clone(),
        plan: Strided::new(&so, &strides, 0, numel(&si)),
        elem: dt.size(),
    }))
}

/// Per-axis (start, step, count) of an ONNX Slice with clamping.
fn slice_axis(start: i64, end: i64, step: i64, dim: usize) -> (i64, i64, usize) {
    let d = dim as i64;
    if dim == 0 {
        return (0, step, 0);
    }
    let mut s = if start < 0 {
        start.saturating_add(d)
    } else {
        start
    };
    let mut e = if end < 0 { end.saturating_add(d) } else { end };
    let count = if step > 0 {
        s = s.clamp(0, d);
        e = e.clamp(0, d);
        if e > s {
            (e - s + step - 1) / step
        } else {
            0
        }
    } else {
        s = s.clamp(0, (d - 1).max(0));
        e = e.clamp(-1, d - 1);
        if s > e {
            (s - e + (-step) - 1) / (-step)
        } else {
            0
        }
    };
    (s, step, count as usize)
}

fn build_slice(graph: &Graph, node: &Node) -> Result<Box<dyn Kernel>> {
    let dt = io_dtype(graph, node)?;
    let si = shape_of(graph, in_id(node, 0)?)?;
    let so = shape_of(graph, out_id(node, 0)?)?;
    let r = si.len();
    let starts =
        const_i64(graph, node, 1, "starts")?.ok_or_else(|| shape_err(node, "missing starts"))?;
    let ends = const_i64(graph, node, 2, "ends")?.ok_or_else(|| shape_err(node, "missing ends"))?;
    let axes =
        const_i64(graph, node, 3, "axes")?.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = const_i64(graph, node, 4, "steps")?.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(shape_err(node, "starts/ends/axes/steps lengths differ"));
    }
    let mut start = vec![0i64; r];
    let mut step = vec![1i64; r];
    let mut count = si.clone();
    let mut done = vec![false; r];
    for k in 0..starts.len() {
        let a = norm_axis(node, axes[k], r)?;
        if std::mem::replace(&mut done[a], true) {
            return Err(shape_err(node, format_args!("axis {} repeated", axes[k])));
        }
        if steps[k] == 0 {
            return Err(shape_err(node, "step 0"));
        }
        let (s, st, c) = slice_axis(starts[k], ends[k], steps[k], si[a]);
        start[a] = s;
        step[a] = st;
        count[a] = c;
    }
    if count != so {
        return Err(shape_err(
            node,
            format_args!("computed output {count:?} but inferred {so:?}"),
        ));
    }
    let ist = strides_of(&si);
    let base: isize = (0..r)
        .map(|d| {
            if count[d] == 0 {
                0
            } else {
                start[d] as isize * ist[d] as isize
            }
        })
        .sum();
    let strides: Vec<isize> = (0..r).map(|d| step[d] as isize * ist[d] as isize).collect();
    Ok(Box::new(StridedKernel {
        name: node.name.clone(),
        plan: Strided::new(&so, &strides, base, numel(&si)),
        elem: dt.size(),
    }))
}

// ------------------------------------------------------------------------------------------
// Plain copies (Reshape, Flatten, Squeeze, Unsqueeze, Identity)
// ------------------------------------------------------------------------------------------

struct CopyKernel {
    name: String,
    bytes: usize,
}

impl Kernel for CopyKernel {
    fn run(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        _scratch: &mut [u8],
    ) -> Result<()> {
        let src = input(inputs, 0, &self.name)?.bytes;
        let dst = &mut *output(outputs, 0, &self.name)?.bytes;
        if src.len() != self.bytes || dst.len() != self.bytes {
            return Err(Error::Shape(format!(
                "node '{}': copy of {} bytes got views of {} and {}",
                self.name,
                self.bytes,
                src.len(),
                dst.len()
            )));
        }
        if src.as_ptr() != dst.as_ptr() {
            dst.copy_from_slice(src);
        }
        Ok(())
    }
}

fn build_copy(graph: &Graph, node: &Node) -> Result<Box<dyn Kernel>> {
    // Shape/axes inputs only determine the output shape, which inference already recorded.
    let dt = io_dtype(graph, node)?;
    let si = shape_of(graph, in_id(node, 0)?)?;
    let so = shape_of(graph, out_id(node, 0)?)?;
    if numel(&si) != numel(&so) {
        return Err(shape_err(
            node,
            format_args!("input {si:?} and output {so:?} differ in size"),
        ));
    }
    Ok(Box::new(CopyKernel {
        name: node.name.clone(),
        bytes: numel(&so) * dt.size(),
    }))
}

// ------------------------------------------------------------------------------------------
// Concat / Split
// ------------------------------------------------------------------------------------------

/// Concat (`join`) or Split: `outer` rows, each made of one block (bytes) per part.
struct JoinKernel {
    name: String,
    split: bool,
    outer: usize,
    blocks: Vec<usize>,
    whole: usize,
}

impl Kernel for JoinKernel {
    fn run(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        _scratch: &mut [u8],
    ) -> Result<()> {
        let bad = |what: &str| {
            Error::Shape(format!(
                "node '{}': {what} view has the wrong size",
                self.name
            ))
        };
        if self.split {
            let src = input(inputs, 0, &self.name)?.bytes;
            if src.len() != self.whole {
                return Err(bad("input"));
            }
            if outputs.len() != self.blocks.len() {
                return Err(bad("output count"));
            }
            for (k, out) in outputs.iter_mut().enumerate() {
                let bk = self.blocks[k];
                if out.bytes.len() != bk * self.outer {
                    return Err(bad("output"));
                }
            }
            let row = self.whole / self.outer.max(1);
            let mut col = 0;
            for (k, out) in outputs.iter_mut().enumerate() {
                let bk = self.blocks[k];
                if bk > 0 {
                    for (o, dst) in out.bytes.chunks_exact_mut(bk).enumerate() {
                        dst.copy_from_slice(&src[o * row + col..o * row + col + bk]);
                    }
                }
                col += bk;
            }
        } else {
            let dst = &mut *output(outputs, 0, &self.name)?.bytes;
            if dst.len() != self.whole {
                return Err(bad("output"));
            }
            let row = self.whole / self.outer.max(1);
            let mut col = 0;
            for (k, &bk) in self.blocks.iter().enumerate() {
                let src = input(inputs, k, &self.name)?.bytes;
                if src.len() != bk * self.outer {
                    return Err(bad("input"));
                }
                if bk > 0 {
                    for (o, s) in src.chunks_exact(bk).enumerate() {
                        dst[o * row + col..o * row + col + bk].copy_from_slice(s);
                    }
                }
                col += bk;
            }
        }
        Ok(())
    }
}

fn build_concat(graph: &Graph, node: &Node, axis: i64) -> Result<Box<dyn Kernel>> {
    let out = out_id(node, 0)?;
    let dt = graph.values[out].dtype;
    let so = shape_of(graph, out)?;
    let a = norm_axis(node, axis, so.len())?;
    let inner = numel(&so[a + 1..]) * dt.size();
    let mut blocks = Vec::with_capacity(node.inputs.len());
    let mut total = 0;
    for k in 0..node.inputs.len() {
        let v = in_id(node, k)?;
        if graph.values[v].dtype != dt {
            return Err(Error::Type(format!(
                "Concat node '{}': input {k} has a different type",
                node.name
            )));
        }
        let s = shape_of(graph, v)?;
        if s.len() != so.len() || (0..so.len()).any(|d| d != a && s[d] != so[d]) {
            return Err(shape_err(
                node,
                format_args!("input {k} shape {s:?} does not fit output {so:?}"),
            ));
        }
        total += s[a];
        blocks.push(s[a] * inner);
    }
    if total != so[a] {
        return Err(shape_err(
            node,
            format_args!("inputs sum to {total} along axis {a}, output has {}", so[a]),
        ));
    }
    Ok(Box::new(JoinKernel {
        name: node.name.clone(),
        split: false,
        outer: numel(&so[..a]),
        blocks,
        whole: numel(&so) * dt.size(),
    }))
}

fn build_split(
    graph: &Graph,
    node: &Node,
    axis: i64,
    split: &Option<Vec<usize>>,
) -> Result<Box<dyn Kernel>> {
    let x = in_id(node, 0)?;
    let dt = graph.values[x].dtype;
    let si = shape_of(graph, x)?;
    let a = norm_axis(node, axis, si.len())?;
    let inner = numel(&si[a + 1..]) * dt.size();
    // Sizes: attribute, else constant input 1, else what inference gave each output.
    let given: Option<Vec<usize>> = match split {
        Some(s) => Some(s.clone()),
        None => const_i64(graph, node, 1, "split")?
            .map(|v| {
                v.into_iter()
                    .map(|x| usize::try_from(x).map_err(|_| shape_err(node, "negative split size")))
                    .collect()
            })
            .transpose()?,
    };
    let mut blocks = Vec::with_capacity(node.outputs.len());
    let mut total = 0;
    for (k, &o) in node.outputs.iter().enumerate() {
        if graph.values[o].dtype != dt {
            return Err(Error::Type(format!(
                "Split node '{}': output {k} has a different type",
                node.name
            )));
        }
        let s = shape_of(graph, o)?;
        if s.len() != si.len() || (0..si.len()).any(|d| d != a && s[d] != si[d]) {
            return Err(shape_err(
                node,
                format_args!("output {k} shape {s:?} does not fit input {si:?}"),
            ));
        }
        if let Some(g) = &given {
            if g.get(k) != Some(&s[a]) {
                return Err(shape_err(
                    node,
                    format_args!(
                        "output {k} has {} along the axis, split says {:?}",
                        s[a],
                        g.get(k)
                    ),
                ));
            }
        }
        total += s[a];
        blocks.push(s[a] * inner);
    }
    if total != si[a] {
        return Err(shape_err(
            node,
            format_args!("outputs sum to {total} along axis {a}, input has {}", si[a]),
        ));
    }
    Ok(Box::new(JoinKernel {
        name: node.name.clone(),
        split: true,
        outer: numel(&si[..a]),
        blocks,
        whole: numel(&si) * dt.size(),
    }))
}

// ------------------------------------------------------------------------------------------
// Gather / ScatterND
// ------------------------------------------------------------------------------------------

/// Reads index `i` of an I64 or I32 index tensor.
#[inline]
fn index_at(idx: &[u8], wide: bool, i: usize) -> i64 {
    if wide {
        let mut b = [0u8; 8];
        b.copy_from_slice(&idx[i * 8..i * 8 + 8]);
        i64::from_le_bytes(b)
    } else {
        let mut b = [0u8; 4];
        b.copy_from_slice(&idx[i * 4..i * 4 + 4]);
        i32::from_le_bytes(b) as i64
    }
}

/// Normalises a possibly negative index against `dim`, erroring when out of range.
#[inline]
fn norm_index(i: i64, dim: usize, name: &str) -> Result<usize> {
    let d = dim as i64;
    let j = if i < 0 { i + d } else { i };
    if j < 0 || j >= d {
        return Err(Error::BadInput(format!(
            "node '{name}': index {i} out of range for dimension {dim}"
        )));
    }
    Ok(j as usize)
}

fn index_wide(graph: &Graph, node: &Node, v: usize) -> Result<bool> {
    match graph.values[v].dtype {
        DataType::I64 => Ok(true),
        DataType::I32 => Ok(false),
        other => Err(unsupported(node, format_args!("indices of type {other:?}"))),
    }
}

struct GatherKernel {
    name: String,
    outer: usize,
    axis_dim: usize,
    /// Bytes per gathered block.
    inner: usize,
    n_idx: usize,
    wide: bool,
    data_bytes: usize,
}

impl Kernel for GatherKernel {
    fn run(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        _scratch: &mut [u8],
    ) -> Result<()> {
        let data = input(inputs, 0, &self.name)?.bytes;
        let idx = input(inputs, 1, &self.name)?.bytes;
        let dst = &mut *output(outputs, 0, &self.name)?.bytes;
        let isz = if self.wide { 8 } else { 4 };
        if data.len() != self.data_bytes
            || idx.len() != self.n_idx * isz
            || dst.len() != self.outer * self.n_idx * self.inner
        {
            return Err(Error::Shape(format!(
                "node '{}': Gather views have the wrong size",
                self.name
            )));
        }
        for t in 0..self.n_idx {
            norm_index(index_at(idx, self.wide, t), self.axis_dim, &self.name)?;
        }
        if self.inner == 0 {
            return Ok(());
        }
        let row_in = self.axis_dim * self.inner;
        for (ot, blk) in dst.chunks_exact_mut(self.inner).enumerate() {
            let (o, t) = (ot / self.n_idx, ot % self.n_idx);
            let i = index_at(idx, self.wide, t);
            let j = if i < 0 {
                (i + self.axis_dim as i64) as usize
            } else {
                i as usize
            };
            let s = o * row_in + j * self.inner;
            blk.copy_from_slice(&data[s..s + self.inner]);
        }
        Ok(())
    }
}

fn build_gather(graph: &Graph, node: &Node, axis: i64) -> Result<Box<dyn Kernel>> {
    let (d, ix, out) = (in_id(node, 0)?, in_id(node, 1)?, out_id(node, 0)?);
    let dt = graph.values[d].dtype;
    if graph.values[out].dtype != dt {
        return Err(Error::Type(format!(
            "Gather node '{}': output type differs from data",
            node.name
        )));
    }
    let wide = index_wide(graph, node, ix)?;
    let (sd, si, so) = (
        shape_of(graph, d)?,
        shape_of(graph, ix)?,
        shape_of(graph, out)?,
    );
    let a = norm_axis(node, axis, sd.len())?;
    let want: Vec<usize> = sd[..a]
        .iter()
        .chain(&si)
        .chain(&sd[a + 1..])
        .copied()
        .collect();
    if want != so {
        return Err(shape_err(
            node,
            format_args!("output {so:?} does not match {want:?}"),
        ));
    }
    Ok(Box::new(GatherKernel {
        name: node.name.clone(),
        outer: numel(&sd[..a]),
        axis_dim: sd[a],
        inner: numel(&sd[a + 1..]) * dt.size(),
        n_idx: numel(&si),
        wide,
        data_bytes: numel(&sd) * dt.size(),
    }))
}

struct ScatterNdKernel {
    name: String,
    data_bytes: usize,
    /// Leading data dims addressed by each index tuple and their byte strides.
    dims: Vec<usize>,
    strides: Vec<usize>,
    n_tuples: usize,
    /// Bytes per update slice.
    slice: usize,
    wide: bool,
}

impl Kernel for ScatterNdKernel {
    fn run(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        _scratch: &mut [u8],
    ) -> Result<()> {
        let data = input(inputs, 0, &self.name)?.bytes;
        let idx = input(inputs, 1, &self.name)?.bytes;
        let upd = input(inputs, 2, &self.name)?.bytes;
        let dst = &mut *output(outputs, 0, &self.name)?.bytes;
        let k = self.dims.len();
        let isz = if self.wide { 8 } else { 4 };
        if data.len() != self.data_bytes
            || dst.len() != self.data_bytes
            || idx.len() != self.n_tuples * k * isz
            || upd.len() != self.n_tuples * self.slice
        {
            return Err(Error::Shape(format!(
                "node '{}': ScatterND views have the wrong size",
                self.name
            )));
        }
        // Validate every index before writing so a bad index leaves no partial result.
        for t in 0..self.n_tuples {
            for (j, &dim) in self.dims.iter().enumerate() {
                norm_index(index_at(idx, self.wide, t * k + j), dim, &self.name)?;
            }
        }
        if data.as_ptr() != dst.as_ptr() {
            dst.copy_from_slice(data);
        }
        for t in 0..self.n_tuples {
            let mut off = 0;
            for (j, &dim) in self.dims.iter().enumerate() {
                let i = index_at(idx, self.wide, t * k + j);
                let i = if i < 0 {
                    (i + dim as i64) as usize
                } else {
                    i as usize
                };
                off += i * self.strides[j];
            }
            dst[off..off + self.slice].copy_from_slice(&upd[t * self.slice..(t + 1) * self.slice]);
        }
        Ok(())
    }
}

fn build_scatter_nd(graph: &Graph, node: &Node) -> Result<Box<dyn Kernel>> {
    let (d, ix, up, out) = (
        in_id(node, 0)?,
        in_id(node, 1)?,
        in_id(node, 2)?,
        out_id(node, 0)?,
    );
    let dt = graph.values[d].dtype;
    if graph.values[out].dtype != dt || graph.values[up].dtype != dt {
        return Err(Error::Type(format!(
            "ScatterND node '{}': data, updates and output types differ",
            node.name
        )));
    }
    let wide = index_wide(graph, node, ix)?;
    let (sd, si, su, so) = (
        shape_of(graph, d)?,
        shape_of(graph, ix)?,
        shape_of(graph, up)?,
        shape_of(graph, out)?,
    );
    if so != sd {
        return Err(shape_err(node, "output shape differs from data"));
    }
    let k = *si
        .last()
        .ok_or_else(|| shape_err(node, "indices must have rank >= 1"))?;
    if k == 0 || k > sd.len() {
        return Err(shape_err(
            node,
            format_args!("index depth {k} invalid for data rank {}", sd.len()),
        ));
    }
    let want: Vec<usize> = si[..si.len() - 1].iter().chain(&sd[k..]).copied().collect();
    if su != want {
        return Err(shape_err(
            node,
            format_args!("updates {su:?} do not match {want:?}"),
        ));
    }
    let es = dt.size();
    let strides = strides_of(&sd)[..k].iter().map(|s| s * es).collect();
    Ok(Box::new(ScatterNdKernel {
        name: node.name.clone(),
        data_bytes: numel(&sd) * es,
        dims: sd[..k].to_vec(),
        strides,
        n_tuples: numel(&si[..si.len() - 1]),
        slice: numel(&sd[k..]) * es,
        wide,
    }))
}

// ------------------------------------------------------------------------------------------
// Pad
// ------------------------------------------------------------------------------------------

/// Source coordinate along one axis for output coordinate `o` (or -1 for the constant).
fn pad_source(mode: PadMode, o: i64, before: i64, dim: i64) -> i64 {
    let i = o - before;
    if (0..dim).contains(&i) {
        return i;
    }
    match mode {
        PadMode::Constant => -1,
        PadMode::Edge => i.clamp(0, dim - 1),
        PadMode::Reflect => {
            if dim == 1 {
                return 0;
            }
            let period = 2 * (dim - 1);
            let m = i.rem_euclid(period);
            if m < dim {
                m
            } else {
                period - m
            }
        }
    }
}

struct PadKernel {
    name: String,
    elem: usize,
    in_shape: Vec<usize>,
    out_shape: Vec<usize>,
    /// Per output dim, the source coordinate for each output coordinate (-1 = constant).
    tables: Vec<Vec<i64>>,
    in_strides: Vec<usize>,
    /// Last-dim contiguous run: (output start, length, input start).
    mid: (usize, usize, usize),
    constant: Option<[u8; 8]>,
}

impl PadKernel {
    fn run_typed<E: Pod>(&self, src: &[u8], dst: &mut [u8], fill: [u8; 8]) -> Result<()> {
        let src = view::<E>(src, numel(&self.in_shape), &self.name)?;
        let dst = view_mut::<E>(dst, numel(&self.out_shape), &self.name)?;
        if dst.is_empty() {
            return Ok(());
        }
        let fill_v: E = pod_from_bytes(&fill)
            .ok_or_else(|| Error::Shape(format!("node '{}': pad value", self.name)))?;
        let r = self.out_shape.len();
        if r == 0 {
            dst[0] = src[0];
            return Ok(());
        }
        let inner = self.out_shape[r - 1];
        let last = &self.tables[r - 1];
        let (m0, ml, mi) = self.mid;
        let body = |row: usize, drow: &mut [E]| {
            let mut rem = row;
            let mut base = 0usize;
            let mut pad_row = false;
            for d in (0..r - 1).rev() {
                let o = rem % self.out_shape[d];
                rem /= self.out_shape[d];
                let s = self.tables[d][o];
                if s < 0 {
                    pad_row = true;
                    break;
                }
                base += s as usize * self.in_strides[d];
            }
            if pad_row {
                drow.fill(fill_v);
                return;
            }
            let (head, rest) = drow.split_at_mut(m0);
            let (midv, tail) = rest.split_at_mut(ml);
            for (o, &s) in head.iter_mut().zip(&last[..m0]) {
                *o = if s < 0 {
                    fill_v
                } else {
                    src[base + s as usize]
                };
            }
            midv.copy_from_slice(&src[base + mi..base + mi + ml]);
            for (o, &s) in tail.iter_mut().zip(&last[m0 + ml..]) {
                *o = if s < 0 {
                    fill_v
                } else {
                    src[base + s as usize]
                };
            }
        };
        if dst.len() >= PAR_MIN && inner > 0 {
            dst.par_chunks_mut(inner)
                .enumerate()
                .for_each(|(row, d)| body(row, d));
        } else if inner > 0 {
            for (row, d) in dst.chunks_mut(inner).enumerate() {
                body(row, d);
            }
        }
        Ok(())
    }
}

fn pad_typed<E: Pod>(k: &PadKernel, src: &[u8], dst: &mut [u8], fill: [u8; 8]) -> Result<()> {
    k.run_typed::<E>(src, dst, fill)
}

impl Kernel for PadKernel {
    fn run(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        _scratch: &mut [u8],
    ) -> Result<()> {
        let src = input(inputs, 0, &self.name)?.bytes;
        let fill = match (self.constant, inputs.get(2).copied().flatten()) {
            (Some(c), _) => c,
            (None, Some(t)) if t.bytes.len() >= self.elem => {
                let mut c = [0u8; 8];
                c[..self.elem].copy_from_slice(&t.bytes[..self.elem]);
                c
            }
            _ => [0u8; 8],
        };
        let dst = &mut *output(outputs, 0, &self.name)?.bytes;
        by_elem!(self.elem, pad_typed(self, src, dst, fill))
    }
}

fn build_pad(graph: &Graph, node: &Node, mode: PadMode) -> Result<Box<dyn Kernel>> {
    let dt = io_dtype(graph, node)?;
    let si = shape_of(graph, in_id(node, 0)?)?;
    let so = shape_of(graph, out_id(node, 0)?)?;
    let r = si.len();
    let pads = const_i64(graph, node, 1, "pads")?.ok_or_else(|| shape_err(node, "missing pads"))?;
    let axes: Vec<usize> = match const_i64(graph, node, 3, "axes")? {
        Some(a) => a
            .iter()
            .map(|&x| norm_axis(node, x, r))
            .collect::<Result<_>>()?,
        None => (0..r).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(shape_err(
            node,
            format_args!("{} pads for {} axes", pads.len(), axes.len()),
        ));
    }
    let mut before = vec![0i64; r];
    let mut after = vec![0i64; r];
    for (k, &a) in axes.iter().enumerate() {
        before[a] = pads[k];
        after[a] = pads[k + axes.len()];
    }
    if so.len() != r {
        return Err(shape_err(
            node,
            format_args!("output rank of {so:?} differs from input {si:?}"),
        ));
    }
    let mut tables = Vec::with_capacity(r);
    for d in 0..r {
        let out_d = si[d] as i64 + before[d] + after[d];
        if out_d < 0 || out_d as usize != so[d] {
            return Err(shape_err(
                node,
                format_args!("padded shape does not match inferred output {so:?}"),
            ));
        }
        if si[d] == 0 && out_d > 0 && mode != PadMode::Constant {
            return Err(shape_err(node, "cannot reflect/edge-pad an empty axis"));
        }
        tables.push(
            (0..out_d)
                .map(|o| pad_source(mode, o, before[d], si[d] as i64))
                .collect::<Vec<i64>>(),
        );
    }
    // Longest run of the last dim that maps to consecutive input elements.
    let mut mid = (0, 0, 0);
    if let Some(last) = tables.last() {
        let mut j = 0;
        while j < last.len() {
            if last[j] >= 0 {
                let mut e = j + 1;
                while e < last.len() && last[e] == last[e - 1] + 1 {
                    e += 1;
                }
                if e - j > mid.1 {
                    mid = (j, e - j, last[j] as usize);
                }
                j = e;
            } else {
                j += 1;
            }
        }
    }
    let constant = match node.input(2).and_then(|v| graph.constant(v)) {
        Some(t) => {
            let b = t.as_bytes();
            if t.dtype() != dt || b.len() < dt.size() {
                return Err(Error::Type(format!(
                    "Pad node '{}': constant_value must be one {dt:?}",
                    node.name
                )));
            }
            let mut c = [0u8; 8];
            c[..dt.size()].copy_from_slice(&b[..dt.size()]);
            Some(c)
        }
        None if node.input(2).is_none() => Some([0u8; 8]),
        None => None,
    };
    Ok(Box::new(PadKernel {
        name: node.name.clone(),
        elem: dt.size(),
        in_strides: strides_of(&si),
        in_shape: si,
        out_shape: so,
        tables,
        mid,
        constant,
    }))
}

// ------------------------------------------------------------------------------------------
// Cast
// ------------------------------------------------------------------------------------------

/// Source element types of Cast.
trait CastSrc: Pod {
    fn to_f32(self) -> f32;
    fn to_i64(self) -> i64;
    fn nonzero(self) -> bool;
}

macro_rules! cast_src_int {
    ($($t:ty),*) => {$(
        impl CastSrc for $t {
            #[inline(always)]
            fn to_f32(self) -> f32 { self as f32 }
            #[inline(always)]
            fn to_i64(self) -> i64 { self as i64 }
            #[inline(always)]
            fn nonzero(self) -> bool { self != 0 }
        }
    )*};
}
cast_src_int!(i64, i32, i8, u8);

impl CastSrc for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        // Truncation toward zero (saturating; NaN becomes 0).
        self as i64
    }
    #[inline(always)]
    fn nonzero(self) -> bool {
        self != 0.0
    }
}

#[inline(always)]
fn cast_loop<S: CastSrc, D: Pod>(src: &[S], dst: &mut [D], f: impl Fn(S) -> D + Sync + Send) {
    drive(dst, |start, chunk| {
        let n = chunk.len();
        for (o, &s) in chunk.iter_mut().zip(&src[start..start + n]) {
            *o = f(s);
        }
    });
}

fn cast_from<S: CastSrc>(
    src: &[u8],
    dst: &mut [u8],
    to: DataType,
    n: usize,
    name: &str,
) -> Result<()> {
    let s = view::<S>(src, n, name)?;
    match to {
        DataType::F32 => cast_loop(s, view_mut::<f32>(dst, n, name)?, S::to_f32),
        DataType::I64 => cast_loop(s, view_mut::<i64>(dst, n, name)?, S::to_i64),
        DataType::I32 => cast_loop(s, view_mut::<i32>(dst, n, name)?, |v| v.to_i64() as i32),
        DataType::I8 => cast_loop(s, view_mut::<i8>(dst, n, name)?, |v| v.to_i64() as i8),
        DataType::U8 => cast_loop(s, view_mut::<u8>(dst, n, name)?, |v| v.to_i64() as u8),
        DataType::Bool => cast_loop(s, view_mut::<u8>(dst, n, name)?, |v| v.nonzero() as u8),
    }
    Ok(())
}

struct CastKernel {
    name: String,
    from: DataType,
    to: DataType,
    len: usize,
}

impl Kernel for CastKernel {
    fn run(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        _scratch: &mut [u8],
    ) -> Result<()> {
        let src = input(inputs, 0, &self.name)?.bytes;
        let dst = &mut *output(outputs, 0, &self.name)?.bytes;
        let (n, name) = (self.len, self.name.as_str());
        match self.from {
            DataType::F32 => cast_from::<f32>(src, dst, self.to, n, name),
            DataType::I64 => cast_from::<i64>(src, dst, self.to, n, name),
            DataType::I32 => cast_from::<i32>(src, dst, self.to, n, name),
            DataType::I8 => cast_from::<i8>(src, dst, self.to, n, name),
            DataType::U8 | DataType::Bool => cast_from::<u8>(src, dst, self.to, n, name),
        }
    }
}

fn build_cast(graph: &Graph, node: &Node, to: DataType) -> Result<Box<dyn Kernel>> {
    let (x, out) = (in_id(node, 0)?, out_id(node, 0)?);
    if graph.values[out].dtype != to {
        return Err(Error::Type(format!(
            "Cast node '{}': output value is not {to:?}",
            node.name
        )));
    }
    let (si, so) = (shape_of(graph, x)?, shape_of(graph, out)?);
    if si != so {
        return Err(shape_err(
            node,
            format_args!("input {si:?} vs output {so:?}"),
        ));
    }
    Ok(Box::new(CastKernel {
        name: node.name.clone(),
        from: graph.values[x].dtype,
        to,
        len: numel(&so),
    }))
}

/// Compiles a data-movement node (Concat, Split, Slice, Reshape-likes, Transpose, Gather,
/// Expand, ScatterND, Pad, Cast).
pub fn build(graph: &Graph, node: &Node) -> Result<Box<dyn Kernel>> {
    match &node.op {
        Op::Concat { axis } => build_concat(graph, node, *axis),
        Op::Split { axis, split } => build_split(graph, node, *axis, split),
        Op::Slice => build_slice(graph, node),
        Op::Reshape { .. }
        | Op::Flatten { .. }
        | Op::Squeeze { .. }
        | Op::Unsqueeze { .. }
        | Op::Identity => build_copy(graph, node),
        Op::Transpose { perm } => build_transpose(graph, node, perm),
        Op::Gather { axis } => build_gather(graph, node, *axis),
        Op::Expand => build_expand(graph, node),
        Op::ScatterND => build_scatter_nd(graph, node),
        Op::Pad { mode } => build_pad(graph, node, *mode),
        Op::Cast { to } => build_cast(graph, node, *to),
        _ => Err(unsupported(node, "not a data-movement op")),
    }
}

#[cfg(test)]
mod tests {
    use super::super::elementwise::test_util::*;
    use crate::ir::{DataType, Op, PadMode, Tensor};

    fn iota(n: usize) -> Vec<f32> {
        (0..n).map(|i| i as f32).collect()
    }

    fn i64c(v: &[i64]) -> In {
        In::Const(i64t(&[v.len()], v.to_vec()))
    }

    /// Naive transpose reference via multi-index arithmetic.
    fn naive_transpose(x: &[f32], shape: &[usize], perm: &[usize]) -> Vec<f32> {
        let r = shape.len();
        let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
        let n: usize = shape.iter().product();
        let mut out = vec![0.0; n];
        for (flat, o) in out.iter_mut().enumerate() {
            let mut idx = vec![0; r];
            let mut rem = flat;
            for d in (0..r).rev() {
                idx[d] = rem % out_shape[d];
                rem /= out_shape[d];
            }
            let mut src_idx = vec![0; r];
            for d in 0..r {
                src_idx[perm[d]] = idx[d];
            }
            let mut k = 0;
            for d in 0..r {
                k = k * shape[d] + src_idx[d];
            }
            *o = x[k];
        }
        out
    }

    #[test]
    fn transpose_general_and_nchw_nhwc() {
        let cases: Vec<(Vec<usize>, Vec<usize>)> = vec![
            (vec![2, 3, 4], vec![2, 0, 1]),
            (vec![2, 3, 4], vec![1, 0, 2]),
            (vec![2, 3, 5, 7], vec![0, 2, 3, 1]),
            (vec![2, 5, 7, 3], vec![0, 3, 1, 2]),
            (vec![1, 64, 40, 40], vec![0, 2, 3, 1]),
            (vec![1, 40, 40, 64], vec![0, 3, 1, 2]),
            (vec![3, 70], vec![1, 0]),
            (vec![2, 3, 4, 5], vec![3, 1, 0, 2]),
            // Narrow outputs (2..4 columns), serial and parallel, batched.
            (vec![2, 3, 50, 60], vec![0, 2, 3, 1]),
            (vec![1, 3, 200, 200], vec![0, 2, 3, 1]),
            (vec![2, 4, 100, 100], vec![0, 2, 3, 1]),
            (vec![3, 2, 7, 9], vec![0, 2, 3, 1]),
            // Parallel chunks that straddle batch planes (4500 rows, 192-row chunks).
            (vec![2, 40, 150, 30], vec![0, 2, 3, 1]),
        ];
        for (shape, perm) in cases {
            let n = shape.iter().product();
            let x = rand_f32(n, 7);
            let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
            let got = run1(
                Op::Transpose { perm: perm.clone() },
                vec![In::Rt(f32t(&shape, x.clone()))],
                DataType::F32,
                &out_shape,
            )
            .unwrap();
            assert_eq!(
                got.as_f32().unwrap(),
                &naive_transpose(&x, &shape, &perm)[..],
                "{shape:?} {perm:?}"
            );
        }
        // 8-byte and 1-byte elements take the same paths.
        let x: Vec<i64> = (0..24).collect();
        let got = run1(
            Op::Transpose {
                perm: vec![0, 2, 1],
            },
            vec![In::Rt(i64t(&[2, 3, 4], x))],
            DataType::I64,
            &[2, 4, 3],
        )
        .unwrap();
        let want: Vec<i64> = naive_transpose(&iota(24), &[2, 3, 4], &[0, 2, 1])
            .iter()
            .map(|&v| v as i64)
            .collect();
        assert_eq!(got.to_i64_vec().unwrap(), want);
        let got = run1(
            Op::Transpose { perm: vec![] },
            vec![In::Rt(boolt(&[2, 3], vec![1, 0, 0, 0, 1, 1]))],
            DataType::Bool,
            &[3, 2],
        )
        .unwrap();
        assert_eq!(got.as_bytes(), &[1, 0, 0, 1, 0, 1]);
        // A 3-channel byte image to NHWC (the interleave of a quantized input: VBMI shuffles
        // where present, 64 pixels a step, with scalar tails): parallel chunks, a plane whose
        // size is no multiple of 64, and batches.
        for shape in [
            [1, 3, 224, 224],
            [1, 3, 50, 61],
            [2, 3, 7, 9],
            [2, 3, 130, 131],
        ] {
            let n: usize = shape.iter().product();
            let bytes: Vec<u8> = (0..n).map(|i| (i * 7 + i / 251) as u8).collect();
            let x = Tensor {
                shape: shape.to_vec(),
                data: crate::ir::TensorData::U8(bytes.clone()),
            };
            let out_shape = [shape[0], shape[2], shape[3], shape[1]];
            let got = run1(
                Op::Transpose {
                    perm: vec![0, 2, 3, 1],
                },
                vec![In::Rt(x)],
                DataType::U8,
                &out_shape,
            )
            .unwrap();
            let as_f32: Vec<f32> = bytes.iter().map(|&b| b as f32).collect();
            let want: Vec<u8> = naive_transpose(&as_f32, &shape, &[0, 2, 3, 1])
                .iter()
                .map(|&v| v as u8)
                .collect();
            assert_eq!(got.as_bytes(), &want[..], "{shape:?}");
        }
    }

    #[test]
    fn concat_and_split() {
        let a = f32t(&[2, 1], vec![1.0, 2.0]);
        let b = f32t(&[2, 2], vec![3.0, 4.0, 5.0, 6.0]);
        let out = run1(
            Op::Concat { axis: -1 },
            vec![In::Rt(a.clone()), In::Rt(b.clone())],
            DataType::F32,
            &[2, 3],
        )
        .unwrap();
        assert_eq!(out.as_f32().unwrap(), &[1.0, 3.0, 4.0, 2.0, 5.0, 6.0]);
        let c = i64t(&[1, 2], vec![7, 8]);
        let out = run1(
            Op::Concat { axis: 0 },
            vec![
                In::Rt(i64t(&[2, 2], vec![1, 2, 3, 4])),
                In::Const(c),
                In::Rt(i64t(&[0, 2], vec![])),
            ],
            DataType::I64,
            &[3, 2],
        )
        .unwrap();
        assert_eq!(out.to_i64_vec().unwrap(), vec![1, 2, 3, 4, 7, 8]);

        let x = f32t(&[2, 4], iota(8));
        // Equal split by output count.
        let outs = run_op(
            Op::Split {
                axis: 1,
                split: None,
            },
            vec![In::Rt(x.clone())],
            &[(DataType::F32, vec![2, 2]), (DataType::F32, vec![2, 2])],
        )
        .unwrap();
        assert_eq!(outs[0].as_f32().unwrap(), &[0.0, 1.0, 4.0, 5.0]);
        assert_eq!(outs[1].as_f32().unwrap(), &[2.0, 3.0, 6.0, 7.0]);
        // Sizes from a constant input, negative axis.
        let outs = run_op(
            Op::Split {
                axis: -1,
                split: None,
            },
            vec![In::Rt(x.clone()), i64c(&[1, 3])],
            &[(DataType::F32, vec![2, 1]), (DataType::F32, vec![2, 3])],
        )
        .unwrap();
        assert_eq!(outs[0].as_f32().unwrap(), &[0.0, 4.0]);
        assert_eq!(outs[1].as_f32().unwrap(), &[1.0, 2.0, 3.0, 5.0, 6.0, 7.0]);
        // Sizes from the attribute, axis 0.
        let outs = run_op(
            Op::Split {
                axis: 0,
                split: Some(vec![1, 1]),
            },
            vec![In::Rt(x.clone())],
            &[(DataType::F32, vec![1, 4]), (DataType::F32, vec![1, 4])],
        )
        .unwrap();
        assert_eq!(outs[1].as_f32().unwrap(), &[4.0, 5.0, 6.0, 7.0]);
        // A run-time split input is refused, naming the node.
        let err = run_op(
            Op::Split {
                axis: 1,
                split: None,
            },
            vec![In::Rt(x), In::Rt(i64t(&[2], vec![2, 2]))],
            &[(DataType::F32, vec![2, 2]), (DataType::F32, vec![2, 2])],
        )
        .unwrap_err();
        assert!(
            matches!(err, crate::error::Error::Unsupported(_)) && err.to_string().contains("'n'"),
            "{err}"
        );
    }

    #[test]
    fn slice_steps_and_clamping() {
        let x = f32t(&[3, 4], iota(12));
        let out = run1(
            Op::Slice,
            vec![
                In::Rt(x.clone()),
                i64c(&[-100]),
                i64c(&[100]),
                i64c(&[1]),
                i64c(&[2]),
            ],
            DataType::F32,
            &[3, 2],
        )
        .unwrap();
        assert_eq!(out.as_f32().unwrap(), &[0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        let out = run1(
            Op::Slice,
            vec![
                In::Rt(x.clone()),
                i64c(&[-1, 100]),
                i64c(&[i64::MIN, 0]),
                i64c(&[0, -1]),
                i64c(&[-1, -2]),
            ],
            DataType::F32,
            &[3, 2],
        )
        .unwrap();
        assert_eq!(out.as_f32().unwrap(), &[11.0, 9.0, 7.0, 5.0, 3.0, 1.0]);
        // Default axes and steps; end beyond the dim.
        let out = run1(
            Op::Slice,
            vec![In::Rt(x.clone()), i64c(&[1, 1]), i64c(&[10, 3])],
            DataType::F32,
            &[2, 2],
        )
        .unwrap();
        assert_eq!(out.as_f32().unwrap(), &[5.0, 6.0, 9.0, 10.0]);
        // Empty result.
        let out = run1(
            Op::Slice,
            vec![In::Rt(x.clone()), i64c(&[2]), i64c(&[1]), i64c(&[0])],
            DataType::F32,
            &[0, 4],
        )
        .unwrap();
        assert!(out.is_empty());
        // Non-constant bounds are refused.
        let err = run1(
            Op::Slice,
            vec![In::Rt(x), In::Rt(i64t(&[1], vec![0])), i64c(&[1])],
            DataType::F32,
            &[1, 4],
        )
        .unwrap_err();
        assert!(err.to_string().contains("constant"), "{err}");
    }

    #[test]
    fn large_slice_and_pad_parallel_paths() {
        // [1, 8, 130, 130] reversed along W and cropped along H: exercises the parallel strided path.
        let (c, h, w) = (8usize, 130usize, 130usize);
        let x = rand_f32(c * h * w, 3);
        let out = run1(
            Op::Slice,
            vec![
                In::Rt(f32t(&[1, c, h, w], x.clone())),
                i64c(&[1, -1]),
                i64c(&[h as i64, i64::MIN]),
                i64c(&[2, 3]),
                i64c(&[1, -1]),
            ],
            DataType::F32,
            &[1, c, h - 1, w],
        )
        .unwrap();
        let got = out.as_f32().unwrap();
        for ci in 0..c {
            for i in 0..h - 1 {
                for j in 0..w {
                    assert_eq!(
                        got[(ci * (h - 1) + i) * w + j],
                        x[(ci * h + i + 1) * w + (w - 1 - j)]
                    );
                }
            }
        }
        // Edge pad of the same tensor by 2 on each spatial side (parallel pad rows).
        let out = run1(
            Op::Pad {
                mode: PadMode::Edge,
            },
            vec![
                In::Rt(f32t(&[1, c, h, w], x.clone())),
                i64c(&[0, 0, 2, 2, 0, 0, 2, 2]),
            ],
            DataType::F32,
            &[1, c, h + 4, w + 4],
        )
        .unwrap();
        let got = out.as_f32().unwrap();
        for ci in 0..c {
            for i in 0..h + 4 {
                for j in 0..w + 4 {
                    let si = (i as i64 - 2).clamp(0, h as i64 - 1) as usize;
                    let sj = (j as i64 - 2).clamp(0, w as i64 - 1) as usize;
                    assert_eq!(
                        got[(ci * (h + 4) + i) * (w + 4) + j],
                        x[(ci * h + si) * w + sj]
                    );
                }
            }
        }
    }

    #[test]
    fn reshape_like_copies() {
        let x = i32t(&[2, 3], vec![1, 2, 3, 4, 5, 6]);
        for op in [
            Op::Reshape { allowzero: false },
            Op::Flatten { axis: 1 },
            Op::Identity,
        ] {
            let out = run1(
                op,
                vec![In::Rt(x.clone()), i64c(&[3, 2])],
                DataType::I32,
                &[3, 2],
            )
            .unwrap();
            assert_eq!(out.to_i64_vec().unwrap(), vec![1, 2, 3, 4, 5, 6]);
        }
        assert!(run1(Op::Identity, vec![In::Rt(x)], DataType::I32, &[4]).is_err());
    }

    #[test]
    fn gather_axes_and_negative_indices() {
        let x = f32t(&[3, 2], iota(6));
        let out = run1(
            Op::Gather { axis: 0 },
            vec![In::Rt(x.clone()), In::Rt(i64t(&[2], vec![-1, 0]))],
            DataType::F32,
            &[2, 2],
        )
        .unwrap();
        assert_eq!(out.as_f32().unwrap(), &[4.0, 5.0, 0.0, 1.0]);
        let x = f32t(&[2, 3], iota(6));
        let out = run1(
            Op::Gather { axis: 1 },
            vec![In::Rt(x.clone()), In::Rt(i32t(&[2, 2], vec![2, 0, -2, 2]))],
            DataType::F32,
            &[2, 2, 2],
        )
        .unwrap();
        assert_eq!(
            out.as_f32().unwrap(),
            &[2.0, 0.0, 1.0, 2.0, 5.0, 3.0, 4.0, 5.0]
        );
        // Scalar index removes the axis.
        let out = run1(
            Op::Gather { axis: -1 },
            vec![In::Rt(x.clone()), In::Const(i64t(&[], vec![1]))],
            DataType::F32,
            &[2],
        )
        .unwrap();
        assert_eq!(out.as_f32().unwrap(), &[1.0, 4.0]);
        let err = run1(
            Op::Gather { axis: 1 },
            vec![In::Rt(x), In::Rt(i64t(&[1], vec![3]))],
            DataType::F32,
            &[2, 1],
        );
        assert!(err.is_err());
    }

    #[test]
    fn expand_broadcasts() {
        let x = i64t(&[3, 1], vec![1, 2, 3]);
        let out = run1(
            Op::Expand,
            vec![In::Rt(x), i64c(&[2, 1, 4])],
            DataType::I64,
            &[2, 3, 4],
        )
        .unwrap();
        let want: Vec<i64> = (0..24).map(|i| ((i / 4) % 3 + 1) as i64).collect();
        assert_eq!(out.to_i64_vec().unwrap(), want);
        let x = f32t(&[2], vec![5.0, 6.0]);
        let out = run1(
            Op::Expand,
            vec![In::Rt(x), i64c(&[3, 1])],
            DataType::F32,
            &[3, 2],
        )
        .unwrap();
        assert_eq!(out.as_f32().unwrap(), &[5.0, 6.0, 5.0, 6.0, 5.0, 6.0]);
    }

    #[test]
    fn scatter_nd_rows_and_elements() {
        let data = f32t(&[4, 3], vec![0.0; 12]);
        let out = run1(
            Op::ScatterND,
            vec![
                In::Rt(data),
                In::Rt(i64t(&[2, 1], vec![1, -1])),
                In::Rt(f32t(&[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])),
            ],
            DataType::F32,
            &[4, 3],
        )
        .unwrap();
        assert_eq!(
            out.as_f32().unwrap(),
            &[0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 4.0, 5.0, 6.0]
        );
        let data = i64t(&[2, 2, 2], (0..8).collect());
        let out = run1(
            Op::ScatterND,
            vec![
                In::Rt(data),
                In::Rt(i64t(&[2, 2], vec![0, 1, 1, 0])),
                In::Rt(i64t(&[2, 2], vec![-1, -2, -3, -4])),
            ],
            DataType::I64,
            &[2, 2, 2],
        )
        .unwrap();
        assert_eq!(out.to_i64_vec().unwrap(), vec![0, 1, -1, -2, -3, -4, 6, 7]);
        let data = i64t(&[2, 2], vec![0; 4]);
        let out = run1(
            Op::ScatterND,
            vec![
                In::Rt(data),
                In::Rt(i64t(&[1, 2], vec![1, 1])),
                In::Rt(i64t(&[1], vec![9])),
            ],
            DataType::I64,
            &[2, 2],
        )
        .unwrap();
        assert_eq!(out.to_i64_vec().unwrap(), vec![0, 0, 0, 9]);
    }

    fn pad(
        x: Tensor,
        mode: PadMode,
        pads: &[i64],
        cval: Option<In>,
        axes: Option<&[i64]>,
        out: &[usize],
    ) -> Tensor {
        let dt = x.dtype();
        let mut ins = vec![In::Rt(x), i64c(pads)];
        match (cval, axes) {
            (c, Some(a)) => {
                ins.push(c.unwrap_or(In::Absent));
                ins.push(i64c(a));
            }
            (Some(c), None) => ins.push(c),
            (None, None) => {}
        }
        run1(Op::Pad { mode }, ins, dt, out).unwrap()
    }

    #[test]
    fn pad_every_mode() {
        let x = f32t(&[4], vec![1.0, 2.0, 3.0, 4.0]);
        let c = pad(
            x.clone(),
            PadMode::Constant,
            &[2, 3],
            Some(In::Const(f32t(&[], vec![9.0]))),
            None,
            &[9],
        );
        assert_eq!(
            c.as_f32().unwrap(),
            &[9.0, 9.0, 1.0, 2.0, 3.0, 4.0, 9.0, 9.0, 9.0]
        );
        let c = pad(
            x.clone(),
            PadMode::Constant,
            &[1, 1],
            Some(In::Rt(f32t(&[], vec![-5.0]))),
            None,
            &[6],
        );
        assert_eq!(c.as_f32().unwrap(), &[-5.0, 1.0, 2.0, 3.0, 4.0, -5.0]);
        let r = pad(x.clone(), PadMode::Reflect, &[2, 3], None, None, &[9]);
        assert_eq!(
            r.as_f32().unwrap(),
            &[3.0, 2.0, 1.0, 2.0, 3.0, 4.0, 3.0, 2.0, 1.0]
        );
        let e = pad(x.clone(), PadMode::Edge, &[2, 3], None, None, &[9]);
        assert_eq!(
            e.as_f32().unwrap(),
            &[1.0, 1.0, 1.0, 2.0, 3.0, 4.0, 4.0, 4.0, 4.0]
        );
        // Negative pads crop.
        let n = pad(x.clone(), PadMode::Constant, &[-1, 1], None, None, &[4]);
        assert_eq!(n.as_f32().unwrap(), &[2.0, 3.0, 4.0, 0.0]);
        let n = pad(x, PadMode::Reflect, &[-1, 2], None, None, &[5]);
        assert_eq!(n.as_f32().unwrap(), &[2.0, 3.0, 4.0, 3.0, 2.0]);
        // 2-D reflect on both axes.
        let x2 = f32t(&[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let r = pad(
            x2.clone(),
            PadMode::Reflect,
            &[1, 1, 1, 1],
            None,
            None,
            &[4, 5],
        );
        assert_eq!(
            r.as_f32().unwrap(),
            &[
                5.0, 4.0, 5.0, 6.0, 5.0, 2.0, 1.0, 2.0, 3.0, 2.0, 5.0, 4.0, 5.0, 6.0, 5.0, 2.0,
                1.0, 2.0, 3.0, 2.0
            ]
        );
        // Opset-18 axes input (negative axis), edge mode.
        let e = pad(
            x2.clone(),
            PadMode::Edge,
            &[1, 0],
            None,
            Some(&[-1]),
            &[2, 4],
        );
        assert_eq!(
            e.as_f32().unwrap(),
            &[1.0, 1.0, 2.0, 3.0, 4.0, 4.0, 5.0, 6.0]
        );
        // Constant rows above and below, i64 data.
        let xi = i64t(&[1, 2], vec![7, 8]);
        let c = pad(
            xi,
            PadMode::Constant,
            &[1, 0, 1, 1],
            Some(In::Const(i64t(&[1], vec![-1]))),
            None,
            &[3, 3],
        );
        assert_eq!(
            c.to_i64_vec().unwrap(),
            vec![-1, -1, -1, 7, 8, -1, -1, -1, -1]
        );
    }

    #[test]
    fn cast_rounding_and_types() {
        let x = f32t(&[6], vec![2.7, -2.7, 0.0, 0.5, -0.5, 100.9]);
        let cases: Vec<(DataType, Vec<i64>)> = vec![
            (DataType::I64, vec![2, -2, 0, 0, 0, 100]),
            (DataType::I32, vec![2, -2, 0, 0, 0, 100]),
            (DataType::I8, vec![2, -2, 0, 0, 0, 100]),
            (DataType::Bool, vec![1, 1, 0, 1, 1, 1]),
        ];
        for (to, want) in cases {
            let out = run1(Op::Cast { to }, vec![In::Rt(x.clone())], to, &[6]).unwrap();
            assert_eq!(out.to_i64_vec().unwrap(), want, "{to:?}");
        }
        let out = run1(
            Op::Cast { to: DataType::U8 },
            vec![In::Rt(f32t(&[2], vec![3.9, 255.0]))],
            DataType::U8,
            &[2],
        )
        .unwrap();
        assert_eq!(out.as_bytes(), &[3, 255]);
        let out = run1(
            Op::Cast { to: DataType::F32 },
            vec![In::Rt(i64t(&[3], vec![-3, 0, 1 << 40]))],
            DataType::F32,
            &[3],
        )
        .unwrap();
        assert_eq!(out.as_f32().unwrap(), &[-3.0, 0.0, (1u64 << 40) as f32]);
        let out = run1(
            Op::Cast { to: DataType::F32 },
            vec![In::Rt(boolt(&[2], vec![1, 0]))],
            DataType::F32,
            &[2],
        )
        .unwrap();
        assert_eq!(out.as_f32().unwrap(), &[1.0, 0.0]);
        let out = run1(
            Op::Cast { to: DataType::I64 },
            vec![In::Rt(i32t(&[2], vec![-7, 9]))],
            DataType::I64,
            &[2],
        )
        .unwrap();
        assert_eq!(out.to_i64_vec().unwrap(), vec![-7, 9]);
        let out = run1(
            Op::Cast { to: DataType::I32 },
            vec![In::Rt(i64t(&[1], vec![(1 << 32) + 5]))],
            DataType::I32,
            &[1],
        )
        .unwrap();
        assert_eq!(out.to_i64_vec().unwrap(), vec![5]);
    }
}
