//! CPU kernels: Conv (NHWC fast paths: 1x1 GEMM, direct depthwise, tiled im2col + GEMM; NCHW
//! im2col + GEMM) with fused bias and activation, and ConvTranspose (GEMM + col2im).

use rayon::prelude::*;

mod depthwise;

use super::gemm::packed::{Epilogue, Isa, PackedB};
use super::gemm::{
    apply_act, check_f32, in_shape, input_f32, out_shape, output_f32, parallelism, scratch_f32,
    sgemm, Mat,
};
use super::{Kernel, TensorMut, TensorRef};
use crate::error::{Error, Result};
use crate::ir::{Activation, AutoPad, ConvAttrs, ConvTransposeAttrs, Graph, Layout, Node, Op};

/// Total scratch budget for im2col tiles (all worker slots together).
const SCRATCH_BUDGET: usize = 4 << 20;

/// Compiles a Conv or ConvTranspose node.
pub fn build(graph: &Graph, node: &Node) -> Result<Box<dyn Kernel>> {
    match &node.op {
        Op::Conv(a) => build_conv(graph, node, a),
        Op::ConvTranspose(a) => build_conv_transpose(graph, node, a),
        other => Err(Error::Unsupported(format!(
            "conv kernels do not handle {}",
            other.name()
        ))),
    }
}

/// 2-D convolution geometry (1-D is H = 1).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Geom {
    pub(crate) n: usize,
    pub(crate) cin: usize,
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) cout: usize,
    pub(crate) oh: usize,
    pub(crate) ow: usize,
    pub(crate) kh: usize,
    pub(crate) kw: usize,
    pub(crate) sh: usize,
    pub(crate) sw: usize,
    pub(crate) dh: usize,
    pub(crate) dw: usize,
    pub(crate) pt: usize,
    pub(crate) pl: usize,
    pub(crate) groups: usize,
    pub(crate) cin_g: usize,
    pub(crate) cout_g: usize,
}

#[cfg(all(test, feature = "cuda"))]
impl Geom {
    /// An ungrouped `k`×`k` convolution with equal stride and padding on every side and no
    /// dilation, over `n` images of `cin` channels and `h`×`w` pixels (the CUDA kernels' tests).
    pub(crate) fn plain(
        n: usize,
        (cin, cout): (usize, usize),
        (h, w): (usize, usize),
        (k, stride, pad): (usize, usize, usize),
    ) -> Geom {
        let out = |x: usize| (x + 2 * pad - k) / stride + 1;
        Geom {
            n,
            cin,
            h,
            w,
            cout,
            oh: out(h),
            ow: out(w),
            kh: k,
            kw: k,
            sh: stride,
            sw: stride,
            dh: 1,
            dw: 1,
            pt: pad,
            pl: pad,
            groups: 1,
            cin_g: cin,
            cout_g: cout,
        }
    }
}

/// Splits an activation shape into (N, C, H, W) for the given layout (rank 3 = 1-D, rank 4 = 2-D).
fn split_shape(s: &[usize], layout: Layout, what: &str) -> Result<(usize, usize, usize, usize)> {
    match (s.len(), layout) {
        (3, Layout::Nchw) => Ok((s[0], s[1], 1, s[2])),
        (3, Layout::Nhwc) => Ok((s[0], s[2], 1, s[1])),
        (4, Layout::Nchw) => Ok((s[0], s[1], s[2], s[3])),
        (4, Layout::Nhwc) => Ok((s[0], s[3], s[1], s[2])),
        _ => Err(Error::Unsupported(format!(
            "{what}: only 1-D and 2-D convolutions are supported (shape {s:?})"
        ))),
    }
}

/// Per-axis (H, W) attribute values; 1-D attributes give the W entry and H gets `default`.
fn hw(v: &[usize], spatial: usize, default: usize) -> (usize, usize) {
    match (spatial, v.len()) {
        (1, 1) => (default, v[0]),
        (2, 2) => (v[0], v[1]),
        _ => (default, default),
    }
}

/// (top, left, bottom, right) pads from ONNX order.
fn pads4(p: &[usize], spatial: usize) -> (usize, usize, usize, usize) {
    match (spatial, p.len()) {
        (1, 2) => (0, p[0], 0, p[1]),
        (2, 4) => (p[0], p[1], p[2], p[3]),
        _ => (0, 0, 0, 0),
    }
}

fn conv_out_len(inp: usize, pad: usize, k: usize, d: usize, s: usize) -> Option<usize> {
    let eff = (k.checked_sub(1)?) * d + 1;
    (inp + pad).checked_sub(eff).map(|x| x / s.max(1) + 1)
}

fn weights<'g>(graph: &'g Graph, node: &Node) -> Result<&'g [f32]> {
    graph
        .const_input(node, 1)
        .ok_or_else(|| {
            Error::Unsupported(format!(
                "{} '{}': weights must be a constant",
                node.op.name(),
                node.name
            ))
        })?
        .as_f32()
}

fn bias_vec(graph: &Graph, node: &Node, cout: usize) -> Result<Vec<f32>> {
    match node.input(2) {
        None => Ok(vec![0.0; cout]),
        Some(v) => {
            let t = graph.constant(v).ok_or_else(|| {
                Error::Unsupported(format!(
                    "{} '{}': bias must be a constant",
                    node.op.name(),
                    node.name
                ))
            })?;
            let b = t.as_f32()?;
            if b.len() != cout {
                return Err(Error::Shape(format!(
                    "{} '{}': bias has {} elements, expected {cout}",
                    node.op.name(),
                    node.name,
                    b.len()
                )));
            }
            Ok(b.to_vec())
        }
    }
}

enum ConvImpl {
    /// 1x1, stride 1, unpadded NHWC: packed GEMM straight on the input.
    Pointwise,
    /// NHWC depthwise (group == Cin == Cout): direct kernel vectorised across channels.
    Depthwise,
    /// NHWC general: per-worker im2col tiles of `tile_rows` output pixels + GEMM per group.
    Im2col {
        tile_rows: usize,
        slot: usize,
        slots: usize,
    },
    /// NCHW: im2col of `tile` output pixels per (image, group) + GEMM (none for 1x1/s1/p0).
    Nchw { tile: usize, direct: bool },
}

struct ConvKernel {
    g: Geom,
    /// Packed weights (layout depends on `imp`).
    w: Vec<f32>,
    bias: Vec<f32>,
    act: Option<Activation>,
    imp: ConvImpl,
    /// NHWC pointwise / im2col: per-group packed weights with the bias folded in.
    packed: Vec<PackedB>,
}

/// Validates a convolution's input, weight and output shapes against its attributes and derives
/// its geometry; the float and the int8 kernels both build from it.
pub(crate) fn geometry(graph: &Graph, node: &Node, a: &ConvAttrs, name: &str) -> Result<Geom> {
    let (n, cin, h, w) = split_shape(in_shape(graph, node, 0)?, a.layout, name)?;
    let spatial = in_shape(graph, node, 0)?.len() - 2;
    let ws = in_shape(graph, node, 1)?;
    if ws.len() != spatial + 2 {
        return Err(Error::Shape(format!(
            "{name}: weight shape {ws:?} does not match the input rank"
        )));
    }
    let groups = a.group.max(1);
    let cout = ws[0];
    let cin_g = ws[1];
    let (kh, kw) = if spatial == 1 {
        (1, ws[2])
    } else {
        (ws[2], ws[3])
    };
    if cin_g * groups != cin || cout % groups != 0 {
        return Err(Error::Shape(format!(
            "{name}: {cin} input channels, weight {ws:?} and group {groups} do not fit"
        )));
    }
    if a.auto_pad != AutoPad::NotSet && a.auto_pad != AutoPad::Valid {
        return Err(Error::Unsupported(format!(
            "{name}: auto_pad must be resolved by shape inference first"
        )));
    }
    let (sh, sw) = hw(&a.strides, spatial, 1);
    let (dh, dw) = hw(&a.dilations, spatial, 1);
    let (pt, pl, pb, pr) = pads4(&a.pads, spatial);
    let (oh, ow) = match (
        conv_out_len(h, pt + pb, kh, dh, sh),
        conv_out_len(w, pl + pr, kw, dw, sw),
    ) {
        (Some(oh), Some(ow)) if sh > 0 && sw > 0 && dh > 0 && dw > 0 => (oh, ow),
        _ => {
            return Err(Error::Shape(format!(
                "{name}: kernel larger than the padded input or zero stride/dilation"
            )))
        }
    };
    let (on, oc, ohh, oww) = split_shape(out_shape(graph, node, 0)?, a.layout, name)?;
    if (on, oc, ohh, oww) != (n, cout, oh, ow) {
        return Err(Error::Shape(format!(
            "{name}: output shape {:?} disagrees with computed [{n}, {cout}, {oh}, {ow}]",
            out_shape(graph, node, 0)?
        )));
    }
    Ok(Geom {
        n,
        cin,
        h,
        w,
        cout,
        oh,
        ow,
        kh,
        kw,
        sh,
        sw,
        dh,
        dw,
        pt,
        pl,
        groups,
        cin_g,
        cout_g: cout / groups,
    })
}

fn build_conv(graph: &Graph, node: &Node, a: &ConvAttrs) -> Result<Box<dyn Kernel>> {
    check_f32(graph, node, &[0, 1, 2])?;
    let name = format!("Conv '{}'", node.name);
    let g = geometry(graph, node, a, &name)?;
    let Geom {
        n,
        cin,
        cout,
        oh,
        ow,
        kh,
        kw,
        h,
        w,
        sh,
        sw,
        groups,
        cin_g,
        ..
    } = g;
    let wsrc = weights(graph, node)?;
    if wsrc.len() != cout * cin_g * kh * kw {
        return Err(Error::Shape(format!(
            "{name}: weight data does not match its shape"
        )));
    }
    let bias = bias_vec(graph, node, cout)?;
    let threads = rayon::current_num_threads().clamp(1, 64);
    let rows = n * oh * ow;
    let kk = kh * kw;
    // A 1x1, stride-1 conv keeps the spatial size exactly when it has no padding: a plain GEMM.
    let pointwise = kk == 1 && sh == 1 && sw == 1 && oh == h && ow == w;
    let (wp, imp) = if a.layout == Layout::Nchw {
        let kg = cin_g * kk;
        let p = oh * ow;
        let direct = pointwise;
        let tile = if direct {
            0
        } else {
            (SCRATCH_BUDGET / (kg * 4).max(1))
                .clamp(16, p.max(16))
                .min(p.max(1))
        };
        (wsrc.to_vec(), ConvImpl::Nchw { tile, direct })
    } else if groups == cin && cout == cin && cin_g == 1 {
        let mut wp = vec![0.0; kk * cin];
        for c in 0..cin {
            for t in 0..kk {
                wp[t * cin + c] = wsrc[c * kk + t];
            }
        }
        (wp, ConvImpl::Depthwise)
    } else {
        // [G][KH*KW*Cin_g][Cout_g]
        let kg = kk * cin_g;
        let cout_g = g.cout_g;
        let mut wp = vec![0.0; groups * kg * cout_g];
        for gi in 0..groups {
            for co in 0..cout_g {
                for ci in 0..cin_g {
                    for t in 0..kk {
                        wp[gi * kg * cout_g + (t * cin_g + ci) * cout_g + co] =
                            wsrc[((gi * cout_g + co) * cin_g + ci) * kk + t];
                    }
                }
            }
        }
        let per_thread = rows.div_ceil(threads).max(1);
        if pointwise {
            (wp, ConvImpl::Pointwise)
        } else {
            let tile_rows = (SCRATCH_BUDGET / threads / (kg * 4).max(1))
                .max(8)
                .min(per_thread)
                .min(512);
            let slot = (tile_rows * kg).next_multiple_of(16).max(16);
            (
                wp,
                ConvImpl::Im2col {
                    tile_rows,
                    slot,
                    slots: threads,
                },
            )
        }
    };
    let (wp, packed) = match imp {
        ConvImpl::Pointwise | ConvImpl::Im2col { .. } => {
            let isa = Isa::detect();
            let kg = kk * cin_g;
            let cg = g.cout_g;
            let packed = (0..groups)
                .map(|gi| {
                    PackedB::new(
                        isa,
                        kg,
                        cg,
                        &wp[gi * kg * cg..(gi + 1) * kg * cg],
                        cg,
                        1,
                        1.0,
                        Some(&bias[gi * cg..(gi + 1) * cg]),
                    )
                })
                .collect::<Result<Vec<_>>>()?;
            (Vec::new(), packed)
        }
        _ => (wp, Vec::new()),
    };
    Ok(Box::new(ConvKernel {
        g,
        w: wp,
        bias,
        act: a.activation,
        imp,
        packed,
    }))
}

impl Kernel for ConvKernel {
    fn scratch_bytes(&self) -> usize {
        let g = &self.g;
        match self.imp {
            ConvImpl::Im2col { slot, slots, .. } => slot * slots * 4,
            ConvImpl::Nchw {
                tile,
                direct: false,
            } => tile * g.cin_g * g.kh * g.kw * 4,
            _ => 0,
        }
    }

    fn run(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        scratch: &mut [u8],
    ) -> Result<()> {
        let g = &self.g;
        let x = input_f32(inputs, 0, g.n * g.cin * g.h * g.w)?;
        let out = output_f32(outputs, 0, g.n * g.cout * g.oh * g.ow)?;
        if out.is_empty() {
            return Ok(());
        }
        match self.imp {
            ConvImpl::Pointwise => self.run_pointwise(x, out),
            ConvImpl::Depthwise => {
                self.run_depthwise(x, out);
                Ok(())
            }
            ConvImpl::Im2col {
                tile_rows, slot, ..
            } => self.run_im2col(x, out, scratch, tile_rows, slot),
            ConvImpl::Nchw { tile, direct } => self.run_nchw(x, out, scratch, tile, direct),
        }
    }
}

impl ConvKernel {
    fn run_pointwise(&self, x: &[f32], out: &mut [f32]) -> Result<()> {
        let g = &self.g;
        let rows = g.n * g.h * g.w;
        let epi = Epilogue::new(self.act);
        for (gi, pb) in self.packed.iter().enumerate() {
            pb.run(
                rows,
                &x[gi * g.cin_g..],
                g.cin,
                &mut out[gi * g.cout_g..],
                g.cout,
                false,
                epi,
                true,
            )?;
        }
        Ok(())
    }

    fn run_im2col(
        &self,
        x: &[f32],
        out: &mut [f32],
        scratch: &mut [u8],
        tile_rows: usize,
        slot: usize,
    ) -> Result<()> {
        let g = &self.g;
        let rows = g.n * g.oh * g.ow;
        let slots = (scratch.len() / 4 / slot.max(1)).max(1);
        let scratch = scratch_f32(scratch, slots * slot)?;
        let ntiles = rows.div_ceil(tile_rows);
        let workers = slots.min(rayon::current_num_threads()).min(ntiles).max(1);
        let per_worker = ntiles.div_ceil(workers) * tile_rows;
        let kg = g.kh * g.kw * g.cin_g;
        let epi = Epilogue::new(self.act);
        out.par_chunks_mut(per_worker * g.cout)
            .zip(scratch.par_chunks_mut(slot))
            .enumerate()
            .try_for_each(|(wi, (o, col))| {
                let r_begin = wi * per_worker;
                let nrows = o.len() / g.cout;
                let mut done = 0;
                while done < nrows {
                    let rows = tile_rows.min(nrows - done);
                    let ot = &mut o[done * g.cout..(done + rows) * g.cout];
                    let r0 = r_begin + done;
                    for (gi, pb) in self.packed.iter().enumerate() {
                        im2col_nhwc(g, x, gi, r0, rows, col);
                        pb.run(
                            rows,
                            col,
                            kg,
                            &mut ot[gi * g.cout_g..],
                            g.cout,
                            false,
                            epi,
                            false,
                        )?;
                    }
                    done += rows;
                }
                Ok(())
            })
    }

    fn run_depthwise(&self, x: &[f32], out: &mut [f32]) {
        let g = &self.g;
        let c = g.cin;
        let epi = Epilogue::new(self.act);
        let fast = depthwise::avx512_usable(g.kh, g.kw);
        out.par_chunks_mut(g.ow * c)
            .enumerate()
            .for_each(|(row, o)| {
                if fast && depthwise::row_avx512(g, x, &self.w, &self.bias, row, o, &epi) {
                    apply_act(epi.post(), o);
                    return;
                }
                #[cfg(target_arch = "x86_64")]
                {
                    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
                    {
                        // SAFETY: the required CPU features were detected at run time.
                        unsafe { dw_row_avx2(g, x, &self.w, &self.bias, row, o) };
                        apply_act(self.act, o);
                        return;
                    }
                }
                dw_row(g, x, &self.w, &self.bias, row, o);
                apply_act(self.act, o);
            });
    }

    fn run_nchw(
        &self,
        x: &[f32],
        out: &mut [f32],
        scratch: &mut [u8],
        tile: usize,
        direct: bool,
    ) -> Result<()> {
        let g = &self.g;
        let p = g.oh * g.ow;
        let hw = g.h * g.w;
        let kg = g.cin_g * g.kh * g.kw;
        let col = if direct {
            &mut [][..]
        } else {
            scratch_f32(scratch, tile * kg)?
        };
        for ni in 0..g.n {
            let on = &mut out[ni * g.cout * p..(ni + 1) * g.cout * p];
            for gi in 0..g.groups {
                let wg = Mat {
                    data: &self.w[gi * g.cout_g * kg..(gi + 1) * g.cout_g * kg],
                    rs: kg,
                    cs: 1,
                };
                let og = &mut on[gi * g.cout_g * p..];
                let xg = &x[(ni * g.cin + gi * g.cin_g) * hw..];
                if direct {
                    sgemm(
                        g.cout_g,
                        p,
                        kg,
                        wg,
                        Mat {
                            data: xg,
                            rs: hw,
                            cs: 1,
                        },
                        og,
                        p,
                        false,
                        1.0,
                        parallelism(g.cout_g, p, kg),
                    )?;
                    continue;
                }
                let mut p0 = 0;
                while p0 < p {
                    let pt = tile.min(p - p0);
                    im2col_nchw(g, xg, p0, pt, col);
                    sgemm(
                        g.cout_g,
                        pt,
                        kg,
                        wg,
                        Mat {
                            data: col,
                            rs: pt,
                            cs: 1,
                        },
                        &mut og[p0..],
                        p,
                        false,
                        1.0,
                        parallelism(g.cout_g, pt, kg),
                    )?;
                    p0 += pt;
                }
            }
            on.par_chunks_mut(p)
                .zip(self.bias.par_iter())
                .for_each(|(plane, &b)| {
                    plane.iter_mut().for_each(|v| *v += b);
                    apply_act(self.act, plane);
                });
        }
        Ok(())
    }
}

/// NHWC patches of output rows `r0..r0+rows` for group `gi`: `col[r, (ky*KW+kx)*Cin_g + ci]`.
fn im2col_nhwc(g: &Geom, x: &[f32], gi: usize, r0: usize, rows: usize, col: &mut [f32]) {
    let kg = g.kh * g.kw * g.cin_g;
    let cg = g.cin_g;
    for r in 0..rows {
        let rr = r0 + r;
        let ni = rr / (g.oh * g.ow);
        let oy = (rr / g.ow) % g.oh;
        let ox = rr % g.ow;
        let dst = &mut col[r * kg..(r + 1) * kg];
        for ky in 0..g.kh {
            let iy = (oy * g.sh + ky * g.dh).wrapping_sub(g.pt);
            for kx in 0..g.kw {
                let ix = (ox * g.sw + kx * g.dw).wrapping_sub(g.pl);
                let d = &mut dst[(ky * g.kw + kx) * cg..(ky * g.kw + kx + 1) * cg];
                if iy < g.h && ix < g.w {
                    let s = ((ni * g.h + iy) * g.w + ix) * g.cin + gi * cg;
                    d.copy_from_slice(&x[s..s + cg]);
                } else {
                    d.fill(0.0);
                }
            }
        }
    }
}

/// NCHW patches of output pixels `p0..p0+pt` of one (image, group): `col[(ci*KH+ky)*KW+kx, j]`.
fn im2col_nchw(g: &Geom, xg: &[f32], p0: usize, pt: usize, col: &mut [f32]) {
    let hw = g.h * g.w;
    for ci in 0..g.cin_g {
        let plane = &xg[ci * hw..(ci + 1) * hw];
        for ky in 0..g.kh {
            for kx in 0..g.kw {
                let row = &mut col[((ci * g.kh + ky) * g.kw + kx) * pt..][..pt];
                // Walk the tile one output row segment at a time.
                let mut j = 0;
                while j < pt {
                    let p = p0 + j;
                    let (oy, ox0) = (p / g.ow, p % g.ow);
                    let seg = (g.ow - ox0).min(pt - j);
                    let dst = &mut row[j..j + seg];
                    let iy = (oy * g.sh + ky * g.dh).wrapping_sub(g.pt);
                    if iy >= g.h {
                        dst.fill(0.0);
                    } else {
                        let src = &plane[iy * g.w..(iy + 1) * g.w];
                        for (t, v) in dst.iter_mut().enumerate() {
                            let ix = ((ox0 + t) * g.sw + kx * g.dw).wrapping_sub(g.pl);
                            *v = if ix < g.w { src[ix] } else { 0.0 };
                        }
                    }
                    j += seg;
                }
            }
        }
    }
}

/// Accumulates channels `cb..cb+N` of one depthwise output pixel in registers.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn dw_block<const N: usize>(
    g: &Geom,
    x: &[f32],
    w: &[f32],
    bias: &[f32],
    ni: usize,
    oy: usize,
    ox: usize,
    cb: usize,
    out: &mut [f32],
) {
    let c = g.cin;
    let mut acc = [0.0f32; N];
    acc.copy_from_slice(&bias[cb..cb + N]);
    for ky in 0..g.kh {
        let iy = (oy * g.sh + ky * g.dh).wrapping_sub(g.pt);
        if iy >= g.h {
            continue;
        }
        let xrow = &x[(ni * g.h + iy) * g.w * c..(ni * g.h + iy + 1) * g.w * c];
        for kx in 0..g.kw {
            let ix = (ox * g.sw + kx * g.dw).wrapping_sub(g.pl);
            if ix >= g.w {
                continue;
            }
            let xi = &xrow[ix * c + cb..ix * c + cb + N];
            let t = (ky * g.kw + kx) * c + cb;
            let wi = &w[t..t + N];
            for i in 0..N {
                acc[i] += xi[i] * wi[i];
            }
        }
    }
    out[cb..cb + N].copy_from_slice(&acc);
}

/// One NHWC depthwise output row (image/row index `row` = n*OH + oy), bias included, no activation.
#[inline(always)]
fn dw_row_body(g: &Geom, x: &[f32], w: &[f32], bias: &[f32], row: usize, o: &mut [f32]) {
    let c = g.cin;
    let ni = row / g.oh;
    let oy = row % g.oh;
    for ox in 0..g.ow {
        let out = &mut o[ox * c..(ox + 1) * c];
        let mut cb = 0;
        while cb + 16 <= c {
            dw_block::<16>(g, x, w, bias, ni, oy, ox, cb, out);
            cb += 16;
        }
        while cb + 8 <= c {
            dw_block::<8>(g, x, w, bias, ni, oy, ox, cb, out);
            cb += 8;
        }
        while cb < c {
            dw_block::<1>(g, x, w, bias, ni, oy, ox, cb, out);
            cb += 1;
        }
    }
}

fn dw_row(g: &Geom, x: &[f32], w: &[f32], bias: &[f32], row: usize, o: &mut [f32]) {
    dw_row_body(g, x, w, bias, row, o)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dw_row_avx2(g: &Geom, x: &[f32], w: &[f32], bias: &[f32], row: usize, o: &mut [f32]) {
    dw_row_body(g, x, w, bias, row, o)
}

struct ConvTransposeKernel {
    /// Geometry of the forward conv this transposes: `h`/`w` are the input, `oh`/`ow` the output.
    g: Geom,
    nhwc: bool,
    /// [G][Cin_g][KH*KW*Cout_g]
    wp: Vec<f32>,
    bias: Vec<f32>,
    act: Option<Activation>,
    tile: usize,
}

fn build_conv_transpose(
    graph: &Graph,
    node: &Node,
    a: &ConvTransposeAttrs,
) -> Result<Box<dyn Kernel>> {
    check_f32(graph, node, &[0, 1, 2])?;
    let c = &a.conv;
    let name = format!("ConvTranspose '{}'", node.name);
    let xs = in_shape(graph, node, 0)?;
    let spatial = xs.len().saturating_sub(2);
    let (n, cin, h, w) = split_shape(xs, c.layout, &name)?;
    let ws = in_shape(graph, node, 1)?;
    if ws.len() != xs.len() {
        return Err(Error::Shape(format!(
            "{name}: weight shape {ws:?} does not match the input rank"
        )));
    }
    let groups = c.group.max(1);
    let cout_g = ws[1];
    let (kh, kw) = if spatial == 1 {
        (1, ws[2])
    } else {
        (ws[2], ws[3])
    };
    if ws[0] != cin || cin % groups != 0 {
        return Err(Error::Shape(format!(
            "{name}: {cin} input channels, weight {ws:?} and group {groups} do not fit"
        )));
    }
    let cout = cout_g * groups;
    let (sh, sw) = hw(&c.strides, spatial, 1);
    let (dh, dw) = hw(&c.dilations, spatial, 1);
    let (on, oc, oh, ow) = split_shape(out_shape(graph, node, 0)?, c.layout, &name)?;
    if on != n || oc != cout || sh == 0 || sw == 0 || dh == 0 || dw == 0 {
        return Err(Error::Shape(format!(
            "{name}: output shape {:?} does not fit",
            out_shape(graph, node, 0)?
        )));
    }
    let (pt, pl) = if a.output_shape.is_some() {
        // Pads follow from the requested output size (ONNX: output_shape overrides pads).
        let (oph, opw) = hw(&a.output_padding, spatial, 0);
        let begin = |inp: usize, s: usize, op: usize, k: usize, d: usize, out: usize| -> usize {
            let total = (s * (inp.max(1) - 1) + op + (k - 1) * d + 1).saturating_sub(out);
            if c.auto_pad == AutoPad::SameUpper {
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
        let (pt, pl, _, _) = pads4(&c.pads, spatial);
        (pt, pl)
    };
    let wsrc = weights(graph, node)?;
    let kk = kh * kw;
    if wsrc.len() != cin * cout_g * kk {
        return Err(Error::Shape(format!(
            "{name}: weight data does not match its shape"
        )));
    }
    let cin_g = cin / groups;
    let row = kk * cout_g;
    let mut wp = vec![0.0; cin * row];
    for ci in 0..cin {
        for co in 0..cout_g {
            for t in 0..kk {
                wp[ci * row + t * cout_g + co] = wsrc[(ci * cout_g + co) * kk + t];
            }
        }
    }
    let tile = (SCRATCH_BUDGET / (row * 4).max(1)).clamp(1, (h * w).max(1));
    Ok(Box::new(ConvTransposeKernel {
        g: Geom {
            n,
            cin,
            h,
            w,
            cout,
            oh,
            ow,
            kh,
            kw,
            sh,
            sw,
            dh,
            dw,
            pt,
            pl,
            groups,
            cin_g,
            cout_g,
        },
        nhwc: c.layout == Layout::Nhwc,
        wp,
        bias: bias_vec(graph, node, cout)?,
        act: c.activation,
        tile,
    }))
}

impl Kernel for ConvTransposeKernel {
    fn scratch_bytes(&self) -> usize {
        self.tile * self.g.kh * self.g.kw * (self.g.cout_g) * 4
    }

    fn run(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        scratch: &mut [u8],
    ) -> Result<()> {
        let (hw, ohw) = (self.g.h * self.g.w, self.g.oh * self.g.ow);
        let x = input_f32(inputs, 0, self.g.n * self.g.cin * hw)?;
        let out = output_f32(outputs, 0, self.g.n * self.g.cout * ohw)?;
        let cin_g = self.g.cin / self.g.groups;
        let cout_g = self.g.cout_g;
        let row = self.g.kh * self.g.kw * cout_g;
        let col = scratch_f32(scratch, self.tile * row)?;
        // (pixel stride, channel stride) of input and output; image strides are C*H*W.
        let (xp, xc) = if self.nhwc { (self.g.cin, 1) } else { (1, hw) };
        let (op, oc) = if self.nhwc {
            (self.g.cout, 1)
        } else {
            (1, ohw)
        };
        for ni in 0..self.g.n {
            let on = &mut out[ni * self.g.cout * ohw..(ni + 1) * self.g.cout * ohw];
            for pix in 0..ohw {
                for (co, &b) in self.bias.iter().enumerate() {
                    on[pix * op + co * oc] = b;
                }
            }
            for gi in 0..self.g.groups {
                let xg = &x[ni * self.g.cin * hw + gi * cin_g * xc..];
                let wg = &self.wp[gi * cin_g * row..(gi + 1) * cin_g * row];
                let mut p0 = 0;
                while p0 < hw {
                    let pt = self.tile.min(hw - p0);
                    sgemm(
                        pt,
                        row,
                        cin_g,
                        Mat {
                            data: &xg[p0 * xp..],
                            rs: xp,
                            cs: xc,
                        },
                        Mat {
                            data: wg,
                            rs: row,
                            cs: 1,
                        },
                        col,
                        row,
                        false,
                        1.0,
                        parallelism(pt, row, cin_g),
                    )?;
                    for j in 0..pt {
                        let (iy, ix) = ((p0 + j) / self.g.w, (p0 + j) % self.g.w);
                        for ky in 0..self.g.kh {
                            let oy = (iy * self.g.sh + ky * self.g.dh).wrapping_sub(self.g.pt);
                            if oy >= self.g.oh {
                                continue;
                            }
                            for kx in 0..self.g.kw {
                                let ox = (ix * self.g.sw + kx * self.g.dw).wrapping_sub(self.g.pl);
                                if ox >= self.g.ow {
                                    continue;
                                }
                                let src =
                                    &col[j * row + (ky * self.g.kw + kx) * cout_g..][..cout_g];
                                let base = (oy * self.g.ow + ox) * op + gi * cout_g * oc;
                                for (co, &v) in src.iter().enumerate() {
                                    on[base + co * oc] += v;
                                }
                            }
                        }
                    }
                    p0 += pt;
                }
            }
            apply_act(self.act, on);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::gemm::tests::{assert_close, run_node, In, Rng};
    use super::*;

    #[derive(Clone)]
    struct Case {
        n: usize,
        cin: usize,
        h: usize,
        w: usize,
        cout: usize,
        k: (usize, usize),
        s: (usize, usize),
        d: (usize, usize),
        p: [usize; 4],
        group: usize,
        bias: bool,
        act: Option<Activation>,
    }

    fn out_hw(c: &Case) -> (usize, usize) {
        let oh = (c.h + c.p[0] + c.p[2] - (c.k.0 - 1) * c.d.0 - 1) / c.s.0 + 1;
        let ow = (c.w + c.p[1] + c.p[3] - (c.k.1 - 1) * c.d.1 - 1) / c.s.1 + 1;
        (oh, ow)
    }

    /// Direct 7-loop NCHW convolution.
    fn naive_conv(c: &Case, x: &[f32], wt: &[f32], b: &[f32]) -> Vec<f32> {
        let (oh, ow) = out_hw(c);
        let (cin_g, cout_g) = (c.cin / c.group, c.cout / c.group);
        let mut out = vec![0.0; c.n * c.cout * oh * ow];
        for n in 0..c.n {
            for co in 0..c.cout {
                let gi = co / cout_g;
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut acc = if c.bias { b[co] } else { 0.0 };
                        for ci in 0..cin_g {
                            for ky in 0..c.k.0 {
                                for kx in 0..c.k.1 {
                                    let iy = (oy * c.s.0 + ky * c.d.0) as isize - c.p[0] as isize;
                                    let ix = (ox * c.s.1 + kx * c.d.1) as isize - c.p[1] as isize;
                                    if iy < 0 || ix < 0 || iy >= c.h as isize || ix >= c.w as isize
                                    {
                                        continue;
                                    }
                                    let xv = x[((n * c.cin + gi * cin_g + ci) * c.h + iy as usize)
                                        * c.w
                                        + ix as usize];
                                    acc += xv * wt[((co * cin_g + ci) * c.k.0 + ky) * c.k.1 + kx];
                                }
                            }
                        }
                        out[((n * c.cout + co) * oh + oy) * ow + ox] =
                            c.act.map_or(acc, |a| a.apply(acc));
                    }
                }
            }
        }
        out
    }

    fn to_nhwc(x: &[f32], n: usize, c: usize, h: usize, w: usize) -> Vec<f32> {
        let mut o = vec![0.0; x.len()];
        for ni in 0..n {
            for ci in 0..c {
                for y in 0..h {
                    for xx in 0..w {
                        o[((ni * h + y) * w + xx) * c + ci] = x[((ni * c + ci) * h + y) * w + xx];
                    }
                }
            }
        }
        o
    }

    fn attrs(c: &Case, layout: Layout) -> ConvAttrs {
        ConvAttrs {
            kernel_shape: vec![c.k.0, c.k.1],
            strides: vec![c.s.0, c.s.1],
            pads: c.p.to_vec(),
            dilations: vec![c.d.0, c.d.1],
            group: c.group,
            auto_pad: AutoPad::NotSet,
            activation: c.act,
            layout,
        }
    }

    fn check(c: &Case, seed: u64) {
        let mut rng = Rng(seed);
        let x = rng.vec(c.n * c.cin * c.h * c.w);
        let wt = rng.vec(c.cout * (c.cin / c.group) * c.k.0 * c.k.1);
        let b = rng.vec(c.cout);
        let want = naive_conv(c, &x, &wt, &b);
        let (oh, ow) = out_hw(c);
        let ws = vec![c.cout, c.cin / c.group, c.k.0, c.k.1];
        let bias_in = |b: &Vec<f32>| {
            if c.bias {
                In::Const(vec![c.cout], b.clone())
            } else {
                In::Absent
            }
        };
        // NCHW
        let got = run_node(
            Op::Conv(attrs(c, Layout::Nchw)),
            vec![
                In::Val(vec![c.n, c.cin, c.h, c.w], x.clone()),
                In::Const(ws.clone(), wt.clone()),
                bias_in(&b),
            ],
            vec![vec![c.n, c.cout, oh, ow]],
        )
        .unwrap();
        assert_close(&got[0], &want, 1e-4);
        // NHWC, under a multi-threaded pool
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let got = pool
            .install(|| {
                run_node(
                    Op::Conv(attrs(c, Layout::Nhwc)),
                    vec![
                        In::Val(
                            vec![c.n, c.h, c.w, c.cin],
                            to_nhwc(&x, c.n, c.cin, c.h, c.w),
                        ),
                        In::Const(ws.clone(), wt.clone()),
                        bias_in(&b),
                    ],
                    vec![vec![c.n, oh, ow, c.cout]],
                )
            })
            .unwrap();
        assert_close(&got[0], &to_nhwc(&want, c.n, c.cout, oh, ow), 1e-4);
    }

    fn base() -> Case {
        Case {
            n: 2,
            cin: 6,
            h: 9,
            w: 11,
            cout: 8,
            k: (3, 3),
            s: (1, 1),
            d: (1, 1),
            p: [1, 1, 1, 1],
            group: 1,
            bias: true,
            act: None,
        }
    }

    #[test]
    fn conv_general_3x3() {
        check(&base(), 1);
        check(
            &Case {
                s: (2, 2),
                act: Some(Activation::Relu),
                ..base()
            },
            2,
        );
        check(
            &Case {
                p: [0, 2, 1, 0],
                d: (2, 1),
                bias: false,
                ..base()
            },
            3,
        );
        check(
            &Case {
                k: (3, 2),
                s: (2, 1),
                d: (1, 2),
                p: [2, 0, 0, 1],
                act: Some(Activation::Silu),
                ..base()
            },
            4,
        );
    }

    #[test]
    fn conv_pointwise_and_grouped() {
        check(
            &Case {
                k: (1, 1),
                p: [0; 4],
                act: Some(Activation::Clip { min: 0.0, max: 6.0 }),
                ..base()
            },
            5,
        );
        check(
            &Case {
                k: (1, 1),
                p: [0; 4],
                group: 2,
                ..base()
            },
            6,
        );
        check(
            &Case {
                k: (1, 1),
                p: [0; 4],
                s: (2, 2),
                ..base()
            },
            7,
        );
        check(
            &Case {
                group: 2,
                act: Some(Activation::LeakyRelu { alpha: 0.1 }),
                ..base()
            },
            8,
        );
        check(
            &Case {
                group: 3,
                cout: 9,
                s: (2, 2),
                p: [1, 0, 0, 1],
                ..base()
            },
            9,
        );
        // Large enough for several tiles per worker.
        check(
            &Case {
                n: 1,
                cin: 16,
                h: 40,
                w: 37,
                cout: 24,
                ..base()
            },
            10,
        );
        check(
            &Case {
                n: 1,
                cin: 16,
                h: 40,
                w: 37,
                cout: 24,
                k: (1, 1),
                p: [0; 4],
                ..base()
            },
            11,
        );
        // Too few rows for one tile per thread: single threaded-GEMM path.
        check(
            &Case {
                n: 1,
                h: 3,
                w: 3,
                k: (1, 1),
                p: [0; 4],
                group: 2,
                ..base()
            },
            18,
        );
    }

    #[test]
    fn conv_depthwise() {
        let dw = Case {
            cin: 12,
            cout: 12,
            group: 12,
            ..base()
        };
        check(&dw, 12);
        check(
            &Case {
                s: (2, 2),
                act: Some(Activation::Clip { min: 0.0, max: 6.0 }),
                ..dw.clone()
            },
            13,
        );
        check(
            &Case {
                k: (5, 5),
                p: [2, 1, 2, 3],
                d: (1, 2),
                ..dw.clone()
            },
            14,
        );
        check(
            &Case {
                cin: 35,
                cout: 35,
                group: 35,
                act: Some(Activation::HardSwish),
                ..dw.clone()
            },
            15,
        );
        // Channel multiplier 2 (goes through the grouped im2col path).
        check(
            &Case {
                cin: 4,
                cout: 8,
                group: 4,
                ..base()
            },
            16,
        );
    }

    #[test]
    fn conv_1d() {
        let mut rng = Rng(17);
        let (n, cin, w, cout, k) = (2, 3, 10, 4, 3);
        let x = rng.vec(n * cin * w);
        let wt = rng.vec(cout * cin * k);
        let c = Case {
            n,
            cin,
            h: 1,
            w,
            cout,
            k: (1, k),
            s: (1, 2),
            d: (1, 1),
            p: [0, 1, 0, 2],
            group: 1,
            bias: false,
            act: None,
        };
        let want = naive_conv(&c, &x, &wt, &[]);
        let ow = out_hw(&c).1;
        let a = ConvAttrs {
            kernel_shape: vec![k],
            strides: vec![2],
            pads: vec![1, 2],
            dilations: vec![1],
            group: 1,
            auto_pad: AutoPad::NotSet,
            activation: None,
            layout: Layout::Nchw,
        };
        let got = run_node(
            Op::Conv(a),
            vec![
                In::Val(vec![n, cin, w], x),
                In::Const(vec![cout, cin, k], wt),
                In::Absent,
            ],
            vec![vec![n, cout, ow]],
        )
        .unwrap();
        assert_close(&got[0], &want, 1e-4);
    }

    /// Naive NCHW transposed convolution (scatter form).
    #[allow(clippy::too_many_arguments)]
    fn naive_convt(
        x: &[f32],
        wt: &[f32],
        b: &[f32],
        (n, cin, h, w): (usize, usize, usize, usize),
        (cout_g, kh, kw, group): (usize, usize, usize, usize),
        (sh, sw, dh, dw, pt, pl): (usize, usize, usize, usize, usize, usize),
        (oh, ow): (usize, usize),
    ) -> Vec<f32> {
        let cout = cout_g * group;
        let cin_g = cin / group;
        let mut out = vec![0.0; n * cout * oh * ow];
        for ni in 0..n {
            for co in 0..cout {
                for i in 0..oh * ow {
                    out[(ni * cout + co) * oh * ow + i] = b[co];
                }
            }
            for ci in 0..cin {
                let gi = ci / cin_g;
                for iy in 0..h {
                    for ix in 0..w {
                        for cg in 0..cout_g {
                            for ky in 0..kh {
                                for kx in 0..kw {
                                    let oy = (iy * sh + ky * dh) as isize - pt as isize;
                                    let ox = (ix * sw + kx * dw) as isize - pl as isize;
                                    if oy < 0 || ox < 0 || oy >= oh as isize || ox >= ow as isize {
                                        continue;
                                    }
                                    let co = gi * cout_g + cg;
                                    out[((ni * cout + co) * oh + oy as usize) * ow
                                        + ox as usize] += x[((ni * cin + ci) * h + iy) * w + ix]
                                        * wt[((ci * cout_g + cg) * kh + ky) * kw + kx];
                                }
                            }
                        }
                    }
                }
            }
        }
        out
    }

    #[test]
    fn conv_transpose_matches_naive() {
        let mut rng = Rng(20);
        for &(group, s, d, pads, opad, use_out_shape) in &[
            (1usize, 2usize, 1usize, [1usize, 1, 1, 1], 1usize, false),
            (2, 2, 1, [0, 1, 1, 0], 0, false),
            (1, 3, 2, [2, 0, 1, 1], 2, false),
            (1, 2, 1, [0, 0, 0, 0], 0, true),
        ] {
            let (n, cin, h, w, cout_g, kh, kw) = (2, 4, 5, 6, 3, 3, 2);
            let x = rng.vec(n * cin * h * w);
            let wt = rng.vec(cin * cout_g * kh * kw);
            let b = rng.vec(cout_g * group);
            let (oh, ow, pt, pl) = if use_out_shape {
                // output_shape 10 x 12 with stride 2: total pad = 2*(in-1) + k - out.
                let (oh, ow) = (10, 12);
                let th = (s * (h - 1) + kh).saturating_sub(oh);
                let tw = (s * (w - 1) + kw).saturating_sub(ow);
                (oh, ow, th - th / 2, tw - tw / 2)
            } else {
                let oh = s * (h - 1) + opad + (kh - 1) * d + 1 - pads[0] - pads[2];
                let ow = s * (w - 1) + opad + (kw - 1) * d + 1 - pads[1] - pads[3];
                (oh, ow, pads[0], pads[1])
            };
            let cout = cout_g * group;
            let want = naive_convt(
                &x,
                &wt,
                &b,
                (n, cin, h, w),
                (cout_g, kh, kw, group),
                (s, s, d, d, pt, pl),
                (oh, ow),
            );
            let mk = |layout| ConvTransposeAttrs {
                conv: ConvAttrs {
                    kernel_shape: vec![kh, kw],
                    strides: vec![s, s],
                    pads: pads.to_vec(),
                    dilations: vec![d, d],
                    group,
                    auto_pad: AutoPad::NotSet,
                    activation: Some(Activation::Tanh),
                    layout,
                },
                output_padding: vec![opad, opad],
                output_shape: if use_out_shape {
                    Some(vec![oh, ow])
                } else {
                    None
                },
            };
            let want: Vec<f32> = want.iter().map(|v| v.tanh()).collect();
            let ws = vec![cin, cout_g, kh, kw];
            let got = run_node(
                Op::ConvTranspose(mk(Layout::Nchw)),
                vec![
                    In::Val(vec![n, cin, h, w], x.clone()),
                    In::Const(ws.clone(), wt.clone()),
                    In::Const(vec![cout], b.clone()),
                ],
                vec![vec![n, cout, oh, ow]],
            )
            .unwrap();
            assert_close(&got[0], &want, 1e-4);
            let got = run_node(
                Op::ConvTranspose(mk(Layout::Nhwc)),
                vec![
                    In::Val(vec![n, h, w, cin], to_nhwc(&x, n, cin, h, w)),
                    In::Const(ws, wt),
                    In::Const(vec![cout], b),
                ],
                vec![vec![n, oh, ow, cout]],
            )
            .unwrap();
            assert_close(&got[0], &to_nhwc(&want, n, cout, oh, ow), 1e-4);
        }
    }

    #[test]
    fn conv_rejects_bad_output_shape() {
        let c = base();
        let r = run_node(
            Op::Conv(attrs(&c, Layout::Nchw)),
            vec![
                In::Val(vec![2, 6, 9, 11], vec![0.0; 2 * 6 * 99]),
                In::Const(vec![8, 6, 3, 3], vec![0.0; 8 * 54]),
                In::Absent,
            ],
            vec![vec![2, 8, 5, 5]],
        );
        assert!(matches!(r, Err(Error::Shape(_))));
    }
}
