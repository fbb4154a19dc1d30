//! CPU kernels: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool in NCHW and NHWC
//! (NHWC vectorised across channels); MaxPool also on 8-bit codes.

use rayon::prelude::*;

use super::gemm::{check_f32, in_shape, input_f32, out_shape, output_f32};
use super::{Kernel, TensorMut, TensorRef};
use crate::error::{Error, Result};
use crate::ir::{AutoPad, DataType, Graph, Layout, Node, Op, PoolAttrs};

/// Compiles a pooling node.
pub fn build(graph: &Graph, node: &Node) -> Result<Box<dyn Kernel>> {
    // MaxPool also runs on 8-bit codes (QDQ propagation moves dequantization past it).
    let codes = matches!(node.op, Op::MaxPool(_))
        && node
            .input(0)
            .is_some_and(|x| matches!(graph.values[x].dtype, DataType::U8 | DataType::I8));
    if !codes {
        check_f32(graph, node, &[0])?;
    }
    if node.outputs.len() > 1 {
        return Err(Error::Unsupported(format!(
            "{} '{}': the Indices output is not supported",
            node.op.name(),
            node.name
        )));
    }
    match &node.op {
        Op::MaxPool(a) => build_pool(graph, node, a, true),
        Op::AveragePool(a) => build_pool(graph, node, a, false),
        Op::GlobalAveragePool { layout } => build_global(graph, node, *layout, false),
        Op::GlobalMaxPool { layout } => build_global(graph, node, *layout, true),
        other => Err(Error::Unsupported(format!(
            "pool kernels do not handle {}",
            other.name()
        ))),
    }
}

/// (N, C, H, W) of a rank-3 (1-D) or rank-4 activation in `layout`.
fn nchw(s: &[usize], layout: Layout, name: &str) -> Result<(usize, usize, usize, usize)> {
    match (s.len(), layout) {
        (3, Layout::Nchw) => Ok((s[0], s[1], 1, s[2])),
        (3, Layout::Nhwc) => Ok((s[0], s[2], 1, s[1])),
        (4, Layout::Nchw) => Ok((s[0], s[1], s[2], s[3])),
        (4, Layout::Nhwc) => Ok((s[0], s[3], s[1], s[2])),
        _ => Err(Error::Unsupported(format!(
            "{name}: only 1-D and 2-D pooling is supported (shape {s:?})"
        ))),
    }
}

/// Per spatial axis: the taps' input start and the average divisor factor, per output index.
#[derive(Debug)]
struct Axis {
    k: usize,
    d: usize,
    /// Input coordinate of tap 0 (may be negative, in wrapping usize form) per output index.
    start: Vec<usize>,
    /// Divisor factor per output index (valid taps, or taps within the padded extent).
    count: Vec<f32>,
}

#[allow(clippy::too_many_arguments)]
fn axis(
    inp: usize,
    out: usize,
    k: usize,
    s: usize,
    d: usize,
    pb: usize,
    pe: usize,
    include_pad: bool,
) -> Axis {
    let mut start = Vec::with_capacity(out);
    let mut count = Vec::with_capacity(out);
    for o in 0..out {
        let st = (o * s) as isize - pb as isize;
        let (lo, hi) = if include_pad {
            (-(pb as isize), (inp + pe) as isize)
        } else {
            (0, inp as isize)
        };
        let c = (0..k)
            .filter(|&t| (lo..hi).contains(&(st + (t * d) as isize)))
            .count();
        start.push(st as usize);
        count.push(c as f32);
    }
    Axis { k, d, start, count }
}

struct PoolKernel {
    max: bool,
    /// Element type: F32, or U8/I8 codes (max only).
    dtype: DataType,
    nhwc: bool,
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    ay: Axis,
    ax: Axis,
}

fn build_pool(graph: &Graph, node: &Node, a: &PoolAttrs, max: bool) -> Result<Box<dyn Kernel>> {
    let name = format!("{} '{}'", node.op.name(), node.name);
    let xs = in_shape(graph, node, 0)?;
    let spatial = xs.len().saturating_sub(2);
    let (n, c, h, w) = nchw(xs, a.layout, &name)?;
    let (on, oc, oh, ow) = nchw(out_shape(graph, node, 0)?, a.layout, &name)?;
    if (on, oc) != (n, c) {
        return Err(Error::Shape(format!(
            "{name}: output batch/channels ({on}, {oc}) differ from input ({n}, {c})"
        )));
    }
    if a.auto_pad != AutoPad::NotSet && a.auto_pad != AutoPad::Valid {
        return Err(Error::Unsupported(format!(
            "{name}: auto_pad must be resolved by shape inference first"
        )));
    }
    let get = |v: &[usize], i: usize, def: usize| if v.len() == spatial { v[i] } else { def };
    let (ky, kx) = if spatial == 1 {
        (1, get(&a.kernel_shape, 0, 1))
    } else {
        (get(&a.kernel_shape, 0, 1), get(&a.kernel_shape, 1, 1))
    };
    let (sy, sx) = if spatial == 1 {
        (1, get(&a.strides, 0, 1))
    } else {
        (get(&a.strides, 0, 1), get(&a.strides, 1, 1))
    };
    let (dy, dx) = if spatial == 1 {
        (1, get(&a.dilations, 0, 1))
    } else {
        (get(&a.dilations, 0, 1), get(&a.dilations, 1, 1))
    };
    let p = &a.pads;
    let (pt, pl, pb, pr) = match (spatial, p.len()) {
        (1, 2) => (0, p[0], 0, p[1]),
        (2, 4) => (p[0], p[1], p[2], p[3]),
        _ => (0, 0, 0, 0),
    };
    if ky == 0 || kx == 0 || sy == 0 || sx == 0 || dy == 0 || dx == 0 {
        return Err(Error::Shape(format!(
            "{name}: zero kernel, stride or dilation"
        )));
    }
    // Accept the floor- or ceil-mode size the graph recorded.
    for (inp, out, k, s, d, pad) in [(h, oh, ky, sy, dy, pt + pb), (w, ow, kx, sx, dx, pl + pr)] {
        let eff = (k - 1) * d + 1;
        let span = (inp + pad)
            .checked_sub(eff)
            .ok_or_else(|| Error::Shape(format!("{name}: window larger than padded input")))?;
        if out < span / s + 1 || out > span.div_ceil(s) + 1 {
            return Err(Error::Shape(format!(
                "{name}: output size {out} does not fit input {inp}"
            )));
        }
    }
    let inc = a.count_include_pad;
    let dtype = node
        .input(0)
        .map_or(DataType::F32, |x| graph.values[x].dtype);
    Ok(Box::new(PoolKernel {
        max,
        dtype,
        nhwc: a.layout == Layout::Nhwc,
        n,
        c,
        h,
        w,
        ay: axis(h, oh, ky, sy, dy, pt, pb, inc),
        ax: axis(w, ow, kx, sx, dx, pl, pr, inc),
    }))
}

impl Kernel for PoolKernel {
    fn run(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        _scratch: &mut [u8],
    ) -> Result<()> {
        let (oh, ow) = (self.ay.start.len(), self.ax.start.len());
        let (n, c, h, w) = (self.n, self.c, self.h, self.w);
        if self.dtype != DataType::F32 {
            let x = inputs
                .first()
                .and_then(|t| t.as_ref())
                .map(|t| t.bytes)
                .filter(|b| b.len() == n * c * h * w)
                .ok_or_else(|| Error::Shape("MaxPool: input size mismatch".into()))?;
            let out = outputs
                .first_mut()
                .map(|t| &mut *t.bytes)
                .filter(|b| b.len() == n * c * oh * ow)
                .ok_or_else(|| Error::Shape("MaxPool: output size mismatch".into()))?;
            if self.dtype == DataType::I8 {
                self.max_codes::<i8>(super::cast_slice(x), super::cast_slice_mut(out), i8::MIN);
            } else {
                self.max_codes::<u8>(x, out, u8::MIN);
            }
            return Ok(());
        }
        let x = input_f32(inputs, 0, n * c * h * w)?;
        let out = output_f32(outputs, 0, n * c * oh * ow)?;
        let (ay, ax) = (&self.ay, &self.ax);
        if self.max {
            // A window with no valid tap gives f32::MIN (ONNX Runtime's value).
            self.windows(x, out, f32::NEG_INFINITY, f32::max, |a, any, _| {
                if any {
                    a
                } else {
                    f32::MIN
                }
            });
        } else {
            self.windows(
                x,
                out,
                0.0,
                |a, v| a + v,
                |a, any, (oy, ox)| {
                    if any {
                        a / (ay.count[oy] * ax.count[ox])
                    } else {
                        0.0
                    }
                },
            );
        }
        Ok(())
    }
}

impl PoolKernel {
    /// Max pooling of 8-bit codes (a window with no valid tap gives `lo`, what the f32 path's
    /// `f32::MIN` quantizes to).
    fn max_codes<T: Copy + Ord + Send + Sync>(&self, x: &[T], out: &mut [T], lo: T) {
        self.windows(x, out, lo, Ord::max, |a, _, _| a);
    }

    /// Reduces every pooling window in either layout: `acc = add(acc, tap)` from `init` over
    /// the valid taps, then `finish(acc, any valid tap, (oy, ox))`.
    fn windows<T: Copy + Send + Sync>(
        &self,
        x: &[T],
        out: &mut [T],
        init: T,
        add: impl Fn(T, T) -> T + Sync,
        finish: impl Fn(T, bool, (usize, usize)) -> T + Sync,
    ) {
        let (oh, ow) = (self.ay.start.len(), self.ax.start.len());
        let (c, h, w) = (self.c, self.h, self.w);
        let (ay, ax) = (&self.ay, &self.ax);
        if out.is_empty() {
            return;
        }
        if self.nhwc {
            out.par_chunks_mut(ow * c).enumerate().for_each(|(row, o)| {
                let (ni, oy) = (row / oh, row % oh);
                for ox in 0..ow {
                    let acc = &mut o[ox * c..(ox + 1) * c];
                    acc.fill(init);
                    let mut any = false;
                    for ty in 0..ay.k {
                        let iy = ay.start[oy].wrapping_add(ty * ay.d);
                        if iy >= h {
                            continue;
                        }
                        for tx in 0..ax.k {
                            let ix = ax.start[ox].wrapping_add(tx * ax.d);
                            if ix < w {
                                any = true;
                                let xi = &x[((ni * h + iy) * w + ix) * c..][..c];
                                acc.iter_mut().zip(xi).for_each(|(a, &v)| *a = add(*a, v));
                            }
                        }
                    }
                    acc.iter_mut().for_each(|a| *a = finish(*a, any, (oy, ox)));
                }
            });
        } else {
            out.par_chunks_mut(oh * ow)
                .enumerate()
                .for_each(|(plane, o)| {
                    let xp = &x[plane * h * w..(plane + 1) * h * w];
                    for oy in 0..oh {
                        for ox in 0..ow {
                            let (mut acc, mut any) = (init, false);
                            for ty in 0..ay.k {
                                let iy = ay.start[oy].wrapping_add(ty * ay.d);
                                if iy >= h {
                                    continue;
                                }
                                for tx in 0..ax.k {
                                    let ix = ax.start[ox].wrapping_add(tx * ax.d);
                                    if ix < w {
                                        any = true;
                                        acc = add(acc, xp[iy * w + ix]);
                                    }
                                }
                            }
                            o[oy * ow + ox] = finish(acc, any, (oy, ox));
                        }
                    }
                });
        }
    }
}

struct GlobalKernel {
    max: bool,
    nhwc: bool,
    n: usize,
    c: usize,
    hw: usize,
}

fn build_global(graph: &Graph, node: &Node, layout: Layout, max: bool) -> Result<Box<dyn Kernel>> {
    let s = in_shape(graph, node, 0)?;
    if s.len() < 3 {
        return Err(Error::Shape(format!(
            "{} '{}': input rank {} < 3",
            node.op.name(),
            node.name,
            s.len()
        )));
    }
    let (n, c, hw) = match layout {
        Layout::Nchw => (s[0], s[1], s[2..].iter().product()),
        Layout::Nhwc => (s[0], s[s.len() - 1], s[1..s.len() - 1].iter().product()),
    };
    if out_shape(graph, node, 0)?.iter().product::<usize>() != n * c {
        return Err(Error::Shape(format!(
            "{} '{}': output must hold N*C elements",
            node.op.name(),
            node.name
        )));
    }
    if hw == 0 {
        return Err(Error::Shape(format!(
            "{} '{}': empty spatial extent",
            node.op.name(),
            node.name
        )));
    }
    Ok(Box::new(GlobalKernel {
        max,
        nhwc: layout == Layout::Nhwc,
        n,
        c,
        hw,
    }))
}

impl Kernel for GlobalKernel {
    fn run(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        _scratch: &mut [u8],
    ) -> Result<()> {
        let (n, c, hw) = (self.n, self.c, self.hw);
        let x = input_f32(inputs, 0, n * c * hw)?;
        let out = output_f32(outputs, 0, n * c)?;
        if out.is_empty() {
            return Ok(());
        }
        let inv = 1.0 / hw as f32;
        if self.nhwc {
            out.par_chunks_mut(c).enumerate().for_each(|(ni, o)| {
                let xs = &x[ni * hw * c..(ni + 1) * hw * c];
                o.copy_from_slice(&xs[..c]);
                for px in xs.chunks_exact(c).skip(1) {
                    if self.max {
                        o.iter_mut().zip(px).for_each(|(a, &v)| *a = a.max(v));
                    } else {
                        o.iter_mut().zip(px).for_each(|(a, &v)| *a += v);
                    }
                }
                if !self.max {
                    o.iter_mut().for_each(|a| *a *= inv);
                }
            });
        } else {
            out.par_iter_mut().enumerate().for_each(|(i, o)| {
                let xs = &x[i * hw..(i + 1) * hw];
                *o = if self.max {
                    xs.iter().copied().fold(f32::NEG_INFINITY, f32::max)
                } else {
                    xs.iter().sum::<f32>() * inv
                };
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::gemm::tests::{assert_close, run_node, In, Rng};
    use super::*;

    struct P {
        k: (usize, usize),
        s: (usize, usize),
        d: (usize, usize),
        p: [usize; 4],
        ceil: bool,
        cip: bool,
    }

    fn out_len(
        inp: usize,
        k: usize,
        s: usize,
        d: usize,
        (pb, pe): (usize, usize),
        ceil: bool,
    ) -> usize {
        let span = inp + pb + pe - (k - 1) * d - 1;
        let mut o = if ceil {
            span.div_ceil(s) + 1
        } else {
            span / s + 1
        };
        // ceil mode: the last window must start inside the input or left padding.
        if ceil && (o - 1) * s >= inp + pb {
            o -= 1;
        }
        o
    }

    /// Naive NCHW pooling with ORT/PyTorch semantics.
    fn naive(
        x: &[f32],
        (n, c, h, w): (usize, usize, usize, usize),
        p: &P,
        max: bool,
    ) -> (Vec<f32>, usize, usize) {
        let oh = out_len(h, p.k.0, p.s.0, p.d.0, (p.p[0], p.p[2]), p.ceil);
        let ow = out_len(w, p.k.1, p.s.1, p.d.1, (p.p[1], p.p[3]), p.ceil);
        let mut out = Vec::new();
        for plane in 0..n * c {
            for oy in 0..oh {
                for ox in 0..ow {
                    let (mut acc, mut cnt, mut cnt_pad) =
                        (if max { f32::NEG_INFINITY } else { 0.0 }, 0, 0);
                    for ky in 0..p.k.0 {
                        for kx in 0..p.k.1 {
                            let iy = (oy * p.s.0 + ky * p.d.0) as isize - p.p[0] as isize;
                            let ix = (ox * p.s.1 + kx * p.d.1) as isize - p.p[1] as isize;
                            let in_pad = iy < (h + p.p[2]) as isize && ix < (w + p.p[3]) as isize;
                            if in_pad {
                                cnt_pad += 1;
                            }
                            if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                continue;
                            }
                            cnt += 1;
                            let v = x[(plane * h + iy as usize) * w + ix as usize];
                            acc = if max { acc.max(v) } else { acc + v };
                        }
                    }
                    out.push(if max {
                        acc
                    } else {
                        acc / if p.cip { cnt_pad } else { cnt } as f32
                    });
                }
            }
        }
        (out, oh, ow)
    }

    fn to_nhwc(x: &[f32], n: usize, c: usize, h: usize, w: usize) -> Vec<f32> {
        let mut o = vec![0.0; x.len()];
        for ni in 0..n {
            for ci in 0..c {
                for i in 0..h * w {
                    o[(ni * h * w + i) * c + ci] = x[(ni * c + ci) * h * w + i];
                }
            }
        }
        o
    }

    /// MaxPool on u8 and i8 codes, both layouts, against the naive f32 max of the same codes
    /// (max commutes with the monotone byte -> number map).
    #[test]
    fn max_pool_on_codes_matches_naive() {
        use super::super::elementwise::test_util::{run1, In};
        use crate::ir::{Tensor, TensorData};
        let (n, c, h, w) = (2, 19, 9, 8);
        let p = P {
            k: (3, 3),
            s: (2, 2),
            d: (1, 1),
            p: [1, 1, 1, 0],
            ceil: false,
            cip: false,
        };
        let mut rng = Rng(31);
        let bytes: Vec<u8> = rng
            .vec(n * c * h * w)
            .iter()
            .map(|v| (v * 127.0 + 128.0) as u8)
            .collect();
        for signed in [false, true] {
            let value = |b: u8| if signed { b as i8 as f32 } else { b as f32 };
            let xf: Vec<f32> = bytes.iter().map(|&b| value(b)).collect();
            let (want, oh, ow) = naive(&xf, (n, c, h, w), &p, true);
            for nhwc in [false, true] {
                let (dt, data) = if signed {
                    let x = if nhwc {
                        to_nhwc(&xf, n, c, h, w)
                    } else {
                        xf.clone()
                    };
                    (
                        DataType::I8,
                        TensorData::I8(x.iter().map(|&v| v as i8).collect()),
                    )
                } else {
                    let x = if nhwc {
                        to_nhwc(&xf, n, c, h, w)
                    } else {
                        xf.clone()
                    };
                    (
                        DataType::U8,
                        TensorData::U8(x.iter().map(|&v| v as u8).collect()),
                    )
                };
                let (xs, ys) = if nhwc {
                    (vec![n, h, w, c], vec![n, oh, ow, c])
                } else {
                    (vec![n, c, h, w], vec![n, c, oh, ow])
                };
                let attrs = PoolAttrs {
                    kernel_shape: vec![3, 3],
                    strides: vec![2, 2],
                    pads: p.p.to_vec(),
                    dilations: vec![1, 1],
                    ceil_mode: false,
                    auto_pad: AutoPad::NotSet,
                    count_include_pad: false,
                    layout: if nhwc { Layout::Nhwc } else { Layout::Nchw },
                };
                let x = Tensor { shape: xs, data };
                let got = run1(Op::MaxPool(attrs), vec![In::Rt(x)], dt, &ys).expect("run");
                let got: Vec<f32> = match &got.data {
                    TensorData::U8(v) => v.iter().map(|&b| b as f32).collect(),
                    TensorData::I8(v) => v.iter().map(|&b| b as f32).collect(),
                    other => panic!("output type {other:?}"),
                };
                let want = if nhwc {
                    to_nhwc(&want, n, c, oh, ow)
                } else {
                    want.clone()
                };
                assert_eq!(got, want, "signed {signed} nhwc {nhwc}");
            }
        }
    }

    #[test]
    fn pools_match_naive_both_layouts() {
        let mut rng = Rng(30);
        let (n, c, h, w) = (2, 5, 9, 8);
        let x = rng.vec(n * c * h * w);
        let cases = [
            P {
                k: (3, 3),
                s: (2, 2),
                d: (1, 1),
                p: [1, 1, 1, 1],
                ceil: false,
                cip: false,
            },
            P {
                k: (3, 3),
                s: (2, 2),
                d: (1, 1),
                p: [1, 1, 1, 1],
                ceil: false,
                cip: true,
            },
            P {
                k: (2, 2),
                s: (2, 2),
                d: (1, 1),
                p: [0, 0, 0, 0],
                ceil: true,
                cip: false,
            },
            P {
                k: (3, 2),
                s: (2, 3),
                d: (1, 1),
                p: [0, 1, 1, 0],
                ceil: true,
                cip: true,
            },
            P {
                k: (2, 3),
                s: (1, 1),
                d: (2, 2),
                p: [1, 0, 0, 2],
                ceil: false,
                cip: false,
            },
            P {
                k: (5, 5),
                s: (1, 1),
                d: (1, 1),
                p: [2, 2, 2, 2],
                ceil: false,
                cip: false,
            },
        ];
        for p in &cases {
            for max in [true, false] {
                let (want, oh, ow) = naive(&x, (n, c, h, w), p, max);
                for layout in [Layout::Nchw, Layout::Nhwc] {
                    let a = PoolAttrs {
                        kernel_shape: vec![p.k.0, p.k.1],
                        strides: vec![p.s.0, p.s.1],
                        pads: p.p.to_vec(),
                        dilations: vec![p.d.0, p.d.1],
                        ceil_mode: p.ceil,
                        auto_pad: AutoPad::NotSet,
                        count_include_pad: p.cip,
                        layout,
                    };
                    let op = if max {
                        Op::MaxPool(a)
                    } else {
                        Op::AveragePool(a)
                    };
                    let (xin, xs, os, want) = if layout == Layout::Nchw {
                        (
                            x.clone(),
                            vec![n, c, h, w],
                            vec![n, c, oh, ow],
                            want.clone(),
                        )
                    } else {
                        (
                            to_nhwc(&x, n, c, h, w),
                            vec![n, h, w, c],
                            vec![n, oh, ow, c],
                            to_nhwc(&want, n, c, oh, ow),
                        )
                    };
                    let got = run_node(op, vec![In::Val(xs, xin)], vec![os]).unwrap();
                    assert_close(&got[0], &want, 1e-5);
                }
            }
        }
    }

    #[test]
    fn global_pools() {
        let mut rng = Rng(31);
        let (n, c, h, w) = (2, 7, 4, 5);
        let x = rng.vec(n * c * h * w);
        let mean: Vec<f32> = x
            .chunks(h * w)
            .map(|p| p.iter().sum::<f32>() / (h * w) as f32)
            .collect();
        let mx: Vec<f32> = x
            .chunks(h * w)
            .map(|p| p.iter().copied().fold(f32::MIN, f32::max))
            .collect();
        for (max, want) in [(false, &mean), (true, &mx)] {
            for layout in [Layout::Nchw, Layout::Nhwc] {
                let op = if max {
                    Op::GlobalMaxPool { layout }
                } else {
                    Op::GlobalAveragePool { layout }
                };
                let (xin, xs, os) = if layout == Layout::Nchw {
                    (x.clone(), vec![n, c, h, w], vec![n, c, 1, 1])
                } else {
                    (to_nhwc(&x, n, c, h, w), vec![n, h, w, c], vec![n, 1, 1, c])
                };
                let got = run_node(op, vec![In::Val(xs, xin)], vec![os]).unwrap();
                assert_close(&got[0], want, 1e-5);
            }
        }
    }
}
