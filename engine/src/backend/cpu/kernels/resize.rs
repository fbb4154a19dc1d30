//! CPU kernel: Resize (nearest and bilinear over the two spatial dims) in NCHW and NHWC, with
//! index/weight tables precomputed at build time.

use rayon::prelude::*;

use super::gemm::{check_f32, in_shape, input_f32, out_shape, output_f32};
use super::{Kernel, TensorMut, TensorRef};
use crate::backend::resize_taps::{taps, Tap};
use crate::error::{Error, Result};
use crate::ir::{Graph, Layout, Node, Op, ResizeMode};

/// Elements below which the kernel runs on the calling thread.
const PAR_MIN: usize = 1 << 14;

struct ResizeKernel {
    nhwc: bool,
    nearest: bool,
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    ty: Vec<Tap>,
    tx: Vec<Tap>,
}

/// Compiles a Resize node.
pub fn build(graph: &Graph, node: &Node) -> Result<Box<dyn Kernel>> {
    let Op::Resize(a) = &node.op else {
        return Err(Error::Unsupported(format!(
            "resize kernel does not handle {}",
            node.op.name()
        )));
    };
    check_f32(graph, node, &[0])?;
    let what = format!("Resize '{}'", node.name);
    let xs = in_shape(graph, node, 0)?;
    let os = out_shape(graph, node, 0)?;
    if xs.len() != 4 || os.len() != 4 {
        return Err(Error::Unsupported(format!(
            "{what}: only 4-D inputs are supported (got {xs:?})"
        )));
    }
    // Logical positions of (N, C, H, W) in the physical shape.
    let pos = if a.layout == Layout::Nhwc {
        [0, 3, 1, 2]
    } else {
        [0, 1, 2, 3]
    };
    let (n, c, h, w) = (xs[pos[0]], xs[pos[1]], xs[pos[2]], xs[pos[3]]);
    let (on, oc, oh, ow) = (os[pos[0]], os[pos[1]], os[pos[2]], os[pos[3]]);
    if on != n || oc != c {
        return Err(Error::Unsupported(format!(
            "{what}: resizing the batch or channel dims is not supported ({xs:?} -> {os:?})"
        )));
    }
    if h == 0 || w == 0 {
        return Err(Error::Shape(format!("{what}: empty spatial input")));
    }
    let scales: Vec<f32> = graph
        .const_input(node, 2)
        .map(|t| t.to_f32_vec())
        .unwrap_or_default();
    let pick = |inp: usize, out: usize, cands: &[usize]| -> f32 {
        // The scale stored for this axis (logical NCHW order first, then physical order), if it
        // is consistent with the recorded output size; otherwise out/in (as with `sizes`).
        for &i in cands {
            if let Some(&s) = scales.get(i) {
                if s > 0.0 && ((inp as f32 * s).floor() as usize == out) {
                    return s;
                }
            }
        }
        out as f32 / inp as f32
    };
    let sh = pick(h, oh, &[2, pos[2]]);
    let sw = pick(w, ow, &[3, pos[3]]);
    Ok(Box::new(ResizeKernel {
        nhwc: a.layout == Layout::Nhwc,
        nearest: a.mode == ResizeMode::Nearest,
        n,
        c,
        h,
        w,
        ty: taps(a, sh, h, oh),
        tx: taps(a, sw, w, ow),
    }))
}

impl Kernel for ResizeKernel {
    fn run(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        _scratch: &mut [u8],
    ) -> Result<()> {
        let (n, c, h, w) = (self.n, self.c, self.h, self.w);
        let (oh, ow) = (self.ty.len(), self.tx.len());
        let x = input_f32(inputs, 0, n * c * h * w)?;
        let out = output_f32(outputs, 0, n * c * oh * ow)?;
        if out.is_empty() {
            return Ok(());
        }
        let par = out.len() >= PAR_MIN;
        if self.nhwc {
            let row = |(r, o): (usize, &mut [f32])| {
                let (ni, oy) = (r / oh, r % oh);
                let ty = self.ty[oy];
                let r0 = &x[(ni * h + ty.i0) * w * c..(ni * h + ty.i0 + 1) * w * c];
                let r1 = &x[(ni * h + ty.i1) * w * c..(ni * h + ty.i1 + 1) * w * c];
                for (ox, tx) in self.tx.iter().enumerate() {
                    let d = &mut o[ox * c..(ox + 1) * c];
                    let a = &r0[tx.i0 * c..(tx.i0 + 1) * c];
                    if self.nearest {
                        d.copy_from_slice(a);
                        continue;
                    }
                    let b = &r0[tx.i1 * c..(tx.i1 + 1) * c];
                    let cc = &r1[tx.i0 * c..(tx.i0 + 1) * c];
                    let dd = &r1[tx.i1 * c..(tx.i1 + 1) * c];
                    let (w00, w01, w10, w11) =
                        (ty.w0 * tx.w0, ty.w0 * tx.w1, ty.w1 * tx.w0, ty.w1 * tx.w1);
                    for i in 0..c {
                        d[i] = w00 * a[i] + w01 * b[i] + w10 * cc[i] + w11 * dd[i];
                    }
                }
            };
            if par {
                out.par_chunks_mut(ow * c).enumerate().for_each(row);
            } else {
                out.chunks_mut(ow * c).enumerate().for_each(row);
            }
        } else {
            let plane = |(p, o): (usize, &mut [f32])| {
                let xp = &x[p * h * w..(p + 1) * h * w];
                for (oy, ty) in self.ty.iter().enumerate() {
                    let r0 = &xp[ty.i0 * w..(ty.i0 + 1) * w];
                    let r1 = &xp[ty.i1 * w..(ty.i1 + 1) * w];
                    let d = &mut o[oy * ow..(oy + 1) * ow];
                    if self.nearest {
                        d.iter_mut()
                            .zip(&self.tx)
                            .for_each(|(d, tx)| *d = r0[tx.i0]);
                    } else {
                        d.iter_mut().zip(&self.tx).for_each(|(d, tx)| {
                            *d = ty.w0 * (tx.w0 * r0[tx.i0] + tx.w1 * r0[tx.i1])
                                + ty.w1 * (tx.w0 * r1[tx.i0] + tx.w1 * r1[tx.i1]);
                        });
                    }
                }
            };
            if par {
                out.par_chunks_mut(oh * ow).enumerate().for_each(plane);
            } else {
                out.chunks_mut(oh * ow).enumerate().for_each(plane);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::gemm::tests::{assert_close, run_node, In, Rng};
    use super::*;
    use crate::ir::{CoordMode, NearestMode, ResizeAttrs};

    fn attrs(
        mode: ResizeMode,
        coord: CoordMode,
        nearest: NearestMode,
        layout: Layout,
    ) -> ResizeAttrs {
        ResizeAttrs {
            mode,
            coord,
            nearest,
            layout,
        }
    }

    /// Runs a 4-D NCHW resize with either scales or sizes.
    fn resize(
        a: ResizeAttrs,
        xs: Vec<usize>,
        x: Vec<f32>,
        scales: Option<Vec<f32>>,
        os: Vec<usize>,
    ) -> Vec<f32> {
        let (s_in, z_in) = match scales {
            Some(s) => (In::Const(vec![s.len()], s), In::Absent),
            None => (
                In::Absent,
                In::ConstI64(vec![4], os.iter().map(|&d| d as i64).collect()),
            ),
        };
        run_node(
            Op::Resize(a),
            vec![In::Val(xs, x), In::Absent, s_in, z_in],
            vec![os],
        )
        .unwrap()
        .remove(0)
    }

    #[test]
    fn resize_onnx_reference_values() {
        use CoordMode::*;
        use NearestMode::*;
        use ResizeMode::*;
        let l = Layout::Nchw;
        let x22 = vec![1.0, 2.0, 3.0, 4.0];
        // ONNX test resize_upsample_scales_linear (half_pixel).
        let got = resize(
            attrs(Linear, HalfPixel, RoundPreferFloor, l),
            vec![1, 1, 2, 2],
            x22.clone(),
            Some(vec![1.0, 1.0, 2.0, 2.0]),
            vec![1, 1, 4, 4],
        );
        let want = [
            1.0, 1.25, 1.75, 2.0, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5, 3.0, 3.25, 3.75, 4.0,
        ];
        assert_close(&got, &want, 1e-6);
        // resize_upsample_scales_linear_align_corners.
        let got = resize(
            attrs(Linear, AlignCorners, RoundPreferFloor, l),
            vec![1, 1, 2, 2],
            x22.clone(),
            Some(vec![1.0, 1.0, 2.0, 2.0]),
            vec![1, 1, 4, 4],
        );
        let t = 1.0 / 3.0;
        let want = [
            1.0,
            1.0 + t,
            1.0 + 2.0 * t,
            2.0, //
            1.0 + 2.0 * t,
            2.0,
            2.0 + t,
            2.0 + 2.0 * t, //
            2.0 + t,
            2.0 + 2.0 * t,
            3.0,
            3.0 + t, //
            3.0,
            3.0 + t,
            3.0 + 2.0 * t,
            4.0,
        ];
        assert_close(&got, &want, 1e-6);
        // resize_upsample_scales_nearest (half_pixel, round_prefer_floor), scales [1,1,2,3].
        let got = resize(
            attrs(Nearest, HalfPixel, RoundPreferFloor, l),
            vec![1, 1, 2, 2],
            x22.clone(),
            Some(vec![1.0, 1.0, 2.0, 3.0]),
            vec![1, 1, 4, 6],
        );
        let want = [
            1., 1., 1., 2., 2., 2., 1., 1., 1., 2., 2., 2., 3., 3., 3., 4., 4., 4., 3., 3., 3., 4.,
            4., 4.,
        ];
        assert_close(&got, &want, 0.0);
        // resize_downsample_scales_nearest / _linear, scales 0.6.
        let x24: Vec<f32> = (1..=8).map(|v| v as f32).collect();
        let got = resize(
            attrs(Nearest, HalfPixel, RoundPreferFloor, l),
            vec![1, 1, 2, 4],
            x24.clone(),
            Some(vec![1.0, 1.0, 0.6, 0.6]),
            vec![1, 1, 1, 2],
        );
        assert_close(&got, &[1.0, 3.0], 0.0);
        let got = resize(
            attrs(Linear, HalfPixel, RoundPreferFloor, l),
            vec![1, 1, 2, 4],
            x24.clone(),
            Some(vec![1.0, 1.0, 0.6, 0.6]),
            vec![1, 1, 1, 2],
        );
        assert_close(&got, &[2.6666665, 4.333333], 1e-5);

        let row = vec![1.0, 2.0, 3.0, 4.0];
        // Asymmetric: x_orig = x / 2.
        let got = resize(
            attrs(Nearest, Asymmetric, Floor, l),
            vec![1, 1, 1, 4],
            row.clone(),
            Some(vec![1.0, 1.0, 1.0, 2.0]),
            vec![1, 1, 1, 8],
        );
        assert_close(&got, &[1., 1., 2., 2., 3., 3., 4., 4.], 0.0);
        let got = resize(
            attrs(Linear, Asymmetric, Floor, l),
            vec![1, 1, 1, 4],
            row.clone(),
            Some(vec![1.0, 1.0, 1.0, 2.0]),
            vec![1, 1, 1, 8],
        );
        assert_close(&got, &[1., 1.5, 2., 2.5, 3., 3.5, 4., 4.], 1e-6);
        // Asymmetric + ceil.
        let got = resize(
            attrs(Nearest, Asymmetric, Ceil, l),
            vec![1, 1, 1, 4],
            row.clone(),
            Some(vec![1.0, 1.0, 1.0, 2.0]),
            vec![1, 1, 1, 8],
        );
        assert_close(&got, &[1., 2., 2., 3., 3., 4., 4., 4.], 0.0);
        // Downsample by 2: half_pixel gives x_orig 0.5, 2.5 (ties); tf_half_pixel_for_nn gives 1, 3.
        let sc = Some(vec![1.0, 1.0, 1.0, 0.5]);
        let got = resize(
            attrs(Nearest, HalfPixel, RoundPreferFloor, l),
            vec![1, 1, 1, 4],
            row.clone(),
            sc.clone(),
            vec![1, 1, 1, 2],
        );
        assert_close(&got, &[1., 3.], 0.0);
        let got = resize(
            attrs(Nearest, HalfPixel, RoundPreferCeil, l),
            vec![1, 1, 1, 4],
            row.clone(),
            sc.clone(),
            vec![1, 1, 1, 2],
        );
        assert_close(&got, &[2., 4.], 0.0);
        let got = resize(
            attrs(Nearest, TfHalfPixelForNn, RoundPreferFloor, l),
            vec![1, 1, 1, 4],
            row.clone(),
            sc.clone(),
            vec![1, 1, 1, 2],
        );
        assert_close(&got, &[2., 4.], 0.0);
        // Output length 1 from sizes: pytorch_half_pixel samples x = 0, half_pixel x = 1.5.
        let got = resize(
            attrs(Linear, PytorchHalfPixel, RoundPreferFloor, l),
            vec![1, 1, 1, 4],
            row.clone(),
            None,
            vec![1, 1, 1, 1],
        );
        assert_close(&got, &[1.0], 1e-6);
        let got = resize(
            attrs(Linear, HalfPixel, RoundPreferFloor, l),
            vec![1, 1, 1, 4],
            row.clone(),
            None,
            vec![1, 1, 1, 1],
        );
        assert_close(&got, &[2.5], 1e-6);
        // pytorch_half_pixel equals half_pixel for longer outputs: 4 -> 8 linear.
        let got = resize(
            attrs(Linear, PytorchHalfPixel, RoundPreferFloor, l),
            vec![1, 1, 1, 4],
            row.clone(),
            None,
            vec![1, 1, 1, 8],
        );
        assert_close(&got, &[1., 1.25, 1.75, 2.25, 2.75, 3.25, 3.75, 4.], 1e-6);
    }

    #[test]
    fn resize_nhwc_matches_nchw() {
        let mut rng = Rng(50);
        let (n, c, h, w) = (2, 5, 6, 7);
        let x = rng.vec(n * c * h * w);
        let nhwc = |v: &[f32], hh: usize, ww: usize| {
            let mut o = vec![0.0; v.len()];
            for ni in 0..n {
                for ci in 0..c {
                    for i in 0..hh * ww {
                        o[(ni * hh * ww + i) * c + ci] = v[(ni * c + ci) * hh * ww + i];
                    }
                }
            }
            o
        };
        for (mode, coord) in [
            (ResizeMode::Linear, CoordMode::HalfPixel),
            (ResizeMode::Nearest, CoordMode::Asymmetric),
            (ResizeMode::Linear, CoordMode::AlignCorners),
        ] {
            let scales = Some(vec![1.0, 1.0, 2.0, 1.5]);
            let (oh, ow) = (12, 10);
            let a = |l| attrs(mode, coord, NearestMode::RoundPreferFloor, l);
            let want = resize(
                a(Layout::Nchw),
                vec![n, c, h, w],
                x.clone(),
                scales.clone(),
                vec![n, c, oh, ow],
            );
            let got = resize(
                a(Layout::Nhwc),
                vec![n, h, w, c],
                nhwc(&x, h, w),
                scales,
                vec![n, oh, ow, c],
            );
            assert_close(&got, &nhwc(&want, oh, ow), 1e-6);
        }
    }
}
