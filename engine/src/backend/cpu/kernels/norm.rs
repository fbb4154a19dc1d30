//! CPU kernels: BatchNormalization (inference), Softmax (numerically stable, any axis) and ReduceMean.

use rayon::prelude::*;

use super::gemm::{check_f32, in_shape, input_f32, out_shape, output_f32};
use super::{Kernel, TensorMut, TensorRef};
use crate::error::{Error, Result};
use crate::ir::{Graph, Node, Op};

/// Elements below which a kernel runs on the calling thread.
const PAR_MIN: usize = 1 << 15;

/// Compiles a BatchNormalization, Softmax or ReduceMean node.
pub fn build(graph: &Graph, node: &Node) -> Result<Box<dyn Kernel>> {
    match &node.op {
        Op::BatchNormalization { epsilon } => build_bn(graph, node, *epsilon),
        Op::Softmax { axis } => build_softmax(graph, node, *axis),
        Op::ReduceMean { axes, keepdims } => {
            build_reduce_mean(graph, node, axes.as_deref(), *keepdims)
        }
        other => Err(Error::Unsupported(format!(
            "norm kernels do not handle {}",
            other.name()
        ))),
    }
}

fn norm_axis(axis: i64, rank: usize, what: &str) -> Result<usize> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    if a < 0 || a as usize >= rank.max(1) {
        return Err(Error::Shape(format!(
            "{what}: axis {axis} out of range for rank {rank}"
        )));
    }
    Ok(a as usize)
}

struct BnKernel {
    n: usize,
    c: usize,
    inner: usize,
    eps: f32,
}

fn build_bn(graph: &Graph, node: &Node, eps: f32) -> Result<Box<dyn Kernel>> {
    check_f32(graph, node, &[0, 1, 2, 3, 4])?;
    if node.outputs.len() > 1 {
        return Err(Error::Unsupported(format!(
            "BatchNormalization '{}': training outputs are not supported",
            node.name
        )));
    }
    let s = in_shape(graph, node, 0)?;
    if s.len() < 2 {
        return Err(Error::Shape(format!(
            "BatchNormalization '{}': input rank {} < 2",
            node.name,
            s.len()
        )));
    }
    let (n, c, inner) = (s[0], s[1], s[2..].iter().product());
    for i in 1..5 {
        if in_shape(graph, node, i)?.iter().product::<usize>() != c {
            return Err(Error::Shape(format!(
                "BatchNormalization '{}': parameter {i} must have {c} elements",
                node.name
            )));
        }
    }
    Ok(Box::new(BnKernel { n, c, inner, eps }))
}

impl Kernel for BnKernel {
    fn run(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        _scratch: &mut [u8],
    ) -> Result<()> {
        let (n, c, inner) = (self.n, self.c, self.inner);
        let x = input_f32(inputs, 0, n * c * inner)?;
        let scale = input_f32(inputs, 1, c)?;
        let bias = input_f32(inputs, 2, c)?;
        let mean = input_f32(inputs, 3, c)?;
        let var = input_f32(inputs, 4, c)?;
        let out = output_f32(outputs, 0, n * c * inner)?;
        let plane = |(i, o): (usize, &mut [f32])| {
            let ch = i % c;
            let s = scale[ch] / (var[ch] + self.eps).sqrt();
            let b = bias[ch] - mean[ch] * s;
            o.iter_mut()
                .zip(&x[i * inner..(i + 1) * inner])
                .for_each(|(o, &v)| *o = v * s + b);
        };
        if inner == 0 {
            return Ok(());
        }
        if out.len() >= PAR_MIN {
            out.par_chunks_mut(inner).enumerate().for_each(plane);
        } else {
            out.chunks_mut(inner).enumerate().for_each(plane);
        }
        Ok(())
    }
}

struct SoftmaxKernel {
    outer: usize,
    len: usize,
    inner: usize,
}

fn build_softmax(graph: &Graph, node: &Node, axis: i64) -> Result<Box<dyn Kernel>> {
    check_f32(graph, node, &[0])?;
    let s = in_shape(graph, node, 0)?;
    let what = format!("Softmax '{}'", node.name);
    if s.is_empty() {
        return Ok(Box::new(SoftmaxKernel {
            outer: 1,
            len: 1,
            inner: 1,
        }));
    }
    let a = norm_axis(axis, s.len(), &what)?;
    let outer = s[..a].iter().product();
    // Before opset 13 the input is coerced to 2-D at `axis`; from 13 on only `axis` is normalised.
    let (len, inner) = if graph.opset != 0 && graph.opset < 13 {
        (s[a..].iter().product(), 1)
    } else {
        (s[a], s[a + 1..].iter().product())
    };
    if out_shape(graph, node, 0)? != s {
        return Err(Error::Shape(format!(
            "{what}: output shape differs from input"
        )));
    }
    Ok(Box::new(SoftmaxKernel { outer, len, inner }))
}

/// Softmax over `len` elements at stride `inner` starting at offset 0 of `x`/`o`.
fn softmax_strided(x: &[f32], o: &mut [f32], len: usize, inner: usize, j: usize) {
    let mut mx = f32::NEG_INFINITY;
    for r in 0..len {
        mx = mx.max(x[r * inner + j]);
    }
    let mut sum = 0.0;
    for r in 0..len {
        let e = (x[r * inner + j] - mx).exp();
        o[r * inner + j] = e;
        sum += e;
    }
    let inv = 1.0 / sum;
    for r in 0..len {
        o[r * inner + j] *= inv;
    }
}

impl Kernel for SoftmaxKernel {
    fn run(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        _scratch: &mut [u8],
    ) -> Result<()> {
        let (outer, len, inner) = (self.outer, self.len, self.inner);
        let block = len * inner;
        let x = input_f32(inputs, 0, outer * block)?;
        let out = output_f32(outputs, 0, outer * block)?;
        if block == 0 {
            return Ok(());
        }
        let one = |(b, o): (usize, &mut [f32])| {
            let xs = &x[b * block..(b + 1) * block];
            for j in 0..inner {
                softmax_strided(xs, o, len, inner, j);
            }
        };
        if out.len() >= PAR_MIN {
            out.par_chunks_mut(block).enumerate().for_each(one);
        } else {
            out.chunks_mut(block).enumerate().for_each(one);
        }
        Ok(())
    }
}

/// Maximum number of (merged) dims the general ReduceMean path handles.
const MAX_DIMS: usize = 8;

struct ReduceMeanKernel {
    /// Input dims after merging adjacent dims of the same kind, with their reduced flags.
    dims: Vec<usize>,
    reduced: Vec<bool>,
    total: usize,
    out_len: usize,
}

fn build_reduce_mean(
    graph: &Graph,
    node: &Node,
    axes: Option<&[i64]>,
    _keepdims: bool,
) -> Result<Box<dyn Kernel>> {
    check_f32(graph, node, &[0])?;
    let what = format!("ReduceMean '{}'", node.name);
    let s = in_shape(graph, node, 0)?;
    let axes: Vec<i64> = match (axes, node.input(1)) {
        (Some(a), _) => a.to_vec(),
        (None, Some(_)) => graph
            .const_input(node, 1)
            .ok_or_else(|| Error::Unsupported(format!("{what}: axes input must be a constant")))?
            .to_i64_vec()?,
        (None, None) => Vec::new(),
    };
    let mut red = vec![axes.is_empty(); s.len()];
    for &a in &axes {
        red[norm_axis(a, s.len(), &what)?] = true;
    }
    let mut dims = Vec::new();
    let mut reduced = Vec::new();
    for (&d, &r) in s.iter().zip(&red) {
        if d == 1 {
            continue;
        }
        if reduced.last() == Some(&r) {
            if let Some(l) = dims.last_mut() {
                *l *= d;
            }
        } else {
            dims.push(d);
            reduced.push(r);
        }
    }
    if dims.len() > MAX_DIMS {
        return Err(Error::Unsupported(format!(
            "{what}: too many interleaved reduced axes"
        )));
    }
    let total: usize = s.iter().product();
    let out_len: usize = s
        .iter()
        .zip(&red)
        .filter(|(_, &r)| !r)
        .map(|(d, _)| d)
        .product();
    if out_shape(graph, node, 0)?.iter().product::<usize>() != out_len {
        return Err(Error::Shape(format!(
            "{what}: output shape does not hold {out_len} elements"
        )));
    }
    Ok(Box::new(ReduceMeanKernel {
        dims,
        reduced,
        total,
        out_len,
    }))
}

impl Kernel for ReduceMeanKernel {
    fn run(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        _scratch: &mut [u8],
    ) -> Result<()> {
        let x = input_f32(inputs, 0, self.total)?;
        let out = output_f32(outputs, 0, self.out_len)?;
        if self.out_len == 0 {
            return Ok(());
        }
        let red_count = (self.total / self.out_len) as f32;
        let inv = if red_count > 0.0 {
            1.0 / red_count
        } else {
            f32::NAN
        };
        let nd = self.dims.len();
        let mut stride = [0usize; MAX_DIMS];
        let mut acc = 1;
        for i in (0..nd).rev() {
            stride[i] = acc;
            acc *= self.dims[i];
        }
        // Fast path: at most one reduced block -> (outer, red, inner).
        let nred = self.reduced.iter().filter(|&&r| r).count();
        if nred <= 1 {
            let pos = self.reduced.iter().position(|&r| r);
            let (outer, redn, inner) = match pos {
                None => (self.total, 1, 1),
                Some(p) => (
                    self.dims[..p].iter().product(),
                    self.dims[p],
                    self.dims[p + 1..].iter().product::<usize>(),
                ),
            };
            for o in 0..outer {
                let dst = &mut out[o * inner..(o + 1) * inner];
                dst.fill(0.0);
                for r in 0..redn {
                    let src = &x[(o * redn + r) * inner..(o * redn + r + 1) * inner];
                    dst.iter_mut().zip(src).for_each(|(d, &v)| *d += v);
                }
                dst.iter_mut().for_each(|d| *d *= inv);
            }
            return Ok(());
        }
        // General: odometer over kept dims (outputs, in order) and reduced dims (summed).
        let mut kidx = [0usize; MAX_DIMS];
        for o in out.iter_mut() {
            let base: usize = (0..nd)
                .filter(|&i| !self.reduced[i])
                .map(|i| kidx[i] * stride[i])
                .sum();
            let mut ridx = [0usize; MAX_DIMS];
            let mut sum = 0.0;
            loop {
                let off: usize = (0..nd)
                    .filter(|&i| self.reduced[i])
                    .map(|i| ridx[i] * stride[i])
                    .sum();
                sum += x[base + off];
                let mut d = nd;
                let mut carried = true;
                while d > 0 {
                    d -= 1;
                    if !self.reduced[d] {
                        continue;
                    }
                    ridx[d] += 1;
                    if ridx[d] < self.dims[d] {
                        carried = false;
                        break;
                    }
                    ridx[d] = 0;
                }
                if carried {
                    break;
                }
            }
            *o = sum * inv;
            let mut d = nd;
            while d > 0 {
                d -= 1;
                if self.reduced[d] {
                    continue;
                }
                kidx[d] += 1;
                if kidx[d] < self.dims[d] {
                    break;
                }
                kidx[d] = 0;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::gemm::tests::{assert_close, run_node, In, Rng};
    use super::*;

    #[test]
    fn batchnorm_matches_formula() {
        let mut rng = Rng(40);
        let (n, c, hw) = (2, 3, 5);
        let x = rng.vec(n * c * hw);
        let sc = rng.vec(c);
        let b = rng.vec(c);
        let m = rng.vec(c);
        let v: Vec<f32> = rng.vec(c).iter().map(|v| v.abs() + 0.1).collect();
        let eps = 1e-3;
        let want: Vec<f32> = (0..n * c * hw)
            .map(|i| {
                let ch = (i / hw) % c;
                (x[i] - m[ch]) / (v[ch] + eps).sqrt() * sc[ch] + b[ch]
            })
            .collect();
        let p = |d: &Vec<f32>| In::Const(vec![c], d.clone());
        let got = run_node(
            Op::BatchNormalization { epsilon: eps },
            vec![In::Val(vec![n, c, 1, hw], x), p(&sc), p(&b), p(&m), p(&v)],
            vec![vec![n, c, 1, hw]],
        )
        .unwrap();
        assert_close(&got[0], &want, 1e-5);
    }

    fn naive_softmax(x: &[f32], outer: usize, len: usize, inner: usize) -> Vec<f32> {
        let mut o = vec![0.0; x.len()];
        for a in 0..outer {
            for j in 0..inner {
                let idx = |r: usize| (a * len + r) * inner + j;
                let s: f64 = (0..len).map(|r| (x[idx(r)] as f64).exp()).sum();
                for r in 0..len {
                    o[idx(r)] = ((x[idx(r)] as f64).exp() / s) as f32;
                }
            }
        }
        o
    }

    #[test]
    fn softmax_axes_and_sums() {
        let mut rng = Rng(41);
        let s = vec![2, 3, 4, 5];
        let x: Vec<f32> = rng.vec(120).iter().map(|v| v * 30.0).collect();
        for (axis, outer, len, inner) in [
            (-1i64, 24, 5, 1),
            (1, 2, 3, 20),
            (0, 1, 2, 60),
            (2, 6, 4, 5),
        ] {
            let got = run_node(
                Op::Softmax { axis },
                vec![In::Val(s.clone(), x.clone())],
                vec![s.clone()],
            )
            .unwrap();
            assert_close(&got[0], &naive_softmax(&x, outer, len, inner), 1e-5);
            for a in 0..outer {
                for j in 0..inner {
                    let sum: f32 = (0..len).map(|r| got[0][(a * len + r) * inner + j]).sum();
                    assert!((sum - 1.0).abs() < 1e-5, "sum {sum}");
                }
            }
        }
        // Large logits stay finite (stability).
        let got = run_node(
            Op::Softmax { axis: -1 },
            vec![In::Val(vec![1, 3], vec![1000.0, 1001.0, 1002.0])],
            vec![vec![1, 3]],
        )
        .unwrap();
        assert_close(&got[0], &naive_softmax(&[0.0, 1.0, 2.0], 1, 3, 1), 1e-6);
    }

    fn naive_reduce_mean(x: &[f32], s: &[usize], axes: &[usize]) -> Vec<f32> {
        let out_shape: Vec<usize> = s
            .iter()
            .enumerate()
            .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
            .collect();
        let n_out: usize = out_shape.iter().product();
        let mut sum = vec![0.0f64; n_out];
        let mut cnt = vec![0usize; n_out];
        for (i, &v) in x.iter().enumerate() {
            let mut rem = i;
            let mut coords = vec![0; s.len()];
            for d in (0..s.len()).rev() {
                coords[d] = rem % s[d];
                rem /= s[d];
            }
            let mut o = 0;
            for d in 0..s.len() {
                o = o * out_shape[d] + if axes.contains(&d) { 0 } else { coords[d] };
            }
            sum[o] += v as f64;
            cnt[o] += 1;
        }
        sum.iter()
            .zip(&cnt)
            .map(|(s, &c)| (*s / c as f64) as f32)
            .collect()
    }

    #[test]
    fn reduce_mean_axes() {
        let mut rng = Rng(42);
        let s = vec![2, 3, 4, 5];
        let x = rng.vec(120);
        for axes in [
            vec![2usize, 3],
            vec![1],
            vec![0, 2],
            vec![1, 3],
            vec![0, 1, 2, 3],
            vec![0],
        ] {
            let want = naive_reduce_mean(&x, &s, &axes);
            let keep: Vec<usize> = s
                .iter()
                .enumerate()
                .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
                .collect();
            let ax: Vec<i64> = axes.iter().map(|&a| a as i64 - 4).collect();
            let got = run_node(
                Op::ReduceMean {
                    axes: Some(ax),
                    keepdims: true,
                },
                vec![In::Val(s.clone(), x.clone())],
                vec![keep],
            )
            .unwrap();
            assert_close(&got[0], &want, 1e-5);
        }
        // Axes from a constant input, keepdims = false.
        let want = naive_reduce_mean(&x, &s, &[1, 3]);
        let got = run_node(
            Op::ReduceMean {
                axes: None,
                keepdims: false,
            },
            vec![
                In::Val(s.clone(), x.clone()),
                In::ConstI64(vec![2], vec![1, 3]),
            ],
            vec![vec![2, 4]],
        )
        .unwrap();
        assert_close(&got[0], &want, 1e-5);
    }
}
