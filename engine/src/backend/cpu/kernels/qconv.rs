//! INT8 convolution (a folded `DQ -> Conv -> Q`), requantization fused: NHWC or NCHW 8-bit
//! activations, int8 OIHW weights packed at build time for the [`qgemm`](super::qgemm)
//! micro-kernels. Paths: pointwise (1x1, stride 1, unpadded NHWC, C % 4 == 0, u8) runs the
//! packed product on the input in place; depthwise (group == C) runs a direct kernel over
//! channels (i32 accumulation, auto-vectorised with AVX-512BW / AVX2 where present); everything
//! else gathers im2col tiles (padding holds the input zero point) per worker.

use rayon::prelude::*;

use super::elementwise::{input, output};
use super::qgemm::{bias_i32, copy_row, u8_params, weights_i8, PackedQB, QEpilogue, QIsa};
use super::{Kernel, TensorMut, TensorRef};
use crate::error::{Error, Result};
use crate::ir::{AutoPad, DataType, Graph, Layout, Node, Op};

/// Output rows (pixels) per im2col tile.
const TILE_ROWS: usize = 96;

/// 2-D geometry of one convolution.
#[derive(Clone, Copy, Debug)]
struct Geom {
    n: usize,
    cin: usize,
    h: usize,
    w: usize,
    cout: usize,
    oh: usize,
    ow: usize,
    kh: usize,
    kw: usize,
    sh: usize,
    sw: usize,
    dh: usize,
    dw: usize,
    pt: usize,
    pl: usize,
    groups: usize,
    cin_g: usize,
    cout_g: usize,
    nhwc: bool,
}

enum Imp {
    Pointwise,
    Depthwise { w: Vec<i16> },
    Im2col,
}

struct QConvKernel {
    g: Geom,
    imp: Imp,
    /// One packed weight matrix per group (GEMM paths).
    packed: Vec<PackedQB>,
    /// One epilogue per group (GEMM paths) or one over all channels (depthwise).
    epis: Vec<QEpilogue>,
    /// Input zero point in the u8 domain, and whether i8 input bytes are flipped to u8.
    za: u8,
    flip: bool,
    slots: usize,
    slot: usize,
    name: String,
}

/// Compiles a QConv node.
pub fn build(graph: &Graph, node: &Node) -> Result<Box<dyn Kernel>> {
    let Op::QConv(q) = &node.op else {
        return Err(Error::Unsupported(format!(
            "qconv kernel does not handle {}",
            node.op.name()
        )));
    };
    let name = format!("QConv '{}'", node.name);
    let a = &q.conv;
    let bad = |what: &str| Error::Unsupported(format!("{name}: {what}"));
    let xv = node.input(0).ok_or_else(|| bad("no input"))?;
    let xs = graph.shape(xv)?;
    let ws = graph.shape(node.input(1).ok_or_else(|| bad("no weights"))?)?;
    let os = graph.shape(*node.outputs.first().ok_or_else(|| bad("no output"))?)?;
    if xs.len() != 4 || ws.len() != 4 || os.len() != 4 {
        return Err(bad("only 2-D convolutions are supported"));
    }
    if a.auto_pad != AutoPad::NotSet && a.auto_pad != AutoPad::Valid {
        return Err(bad("auto_pad must be resolved by shape inference first"));
    }
    let nhwc = a.layout == Layout::Nhwc;
    let (n, cin, h, w) = if nhwc {
        (xs[0], xs[3], xs[1], xs[2])
    } else {
        (xs[0], xs[1], xs[2], xs[3])
    };
    let (cout, oh, ow) = if nhwc {
        (os[3], os[1], os[2])
    } else {
        (os[1], os[2], os[3])
    };
    let groups = a.group.max(1);
    let two = |v: &[usize], d: usize| match v {
        [a, b] => (*a, *b),
        _ => (d, d),
    };
    let (sh, sw) = two(&a.strides, 1);
    let (dh, dw) = two(&a.dilations, 1);
    let (pt, pl) = match a.pads.as_slice() {
        [t, l, _, _] => (*t, *l),
        _ => (0, 0),
    };
    if ws[0] != cout || ws[1] * groups != cin || cout % groups != 0 || sh == 0 || sw == 0 {
        return Err(Error::Shape(format!(
            "{name}: weight {ws:?}, input {xs:?} and group {groups} do not fit"
        )));
    }
    if q.w_scales.len() != cout || !matches!(graph.values[xv].dtype, DataType::U8 | DataType::I8) {
        return Err(bad("needs one weight scale per output channel and an 8-bit input"));
    }
    let g = Geom {
        n,
        cin,
        h,
        w,
        cout,
        oh,
        ow,
        kh: ws[2],
        kw: ws[3],
        sh,
        sw,
        dh,
        dw,
        pt,
        pl,
        groups,
        cin_g: cin / groups,
        cout_g: cout / groups,
        nhwc,
    };
    let wt = weights_i8(graph, node)?;
    let bias = bias_i32(graph, node, 2, cout)?;
    let x = u8_params(q.x);
    let flip = q.x.dtype == DataType::I8;
    let za = x.zero_point.clamp(0, 255) as u8;
    let act = a.activation;
    let taps = g.kh * g.kw;
    let name_s = node.name.clone();
    if nhwc && groups == cin && groups == cout && groups > 1 {
        // Depthwise: weights as i16 [tap][c]; the zero point is subtracted from the input.
        let mut dw_w = vec![0i16; taps * cout];
        for c in 0..cout {
            for t in 0..taps {
                dw_w[t * cout + c] = wt[c * taps + t] as i16;
            }
        }
        let epi = QEpilogue::new(x, &q.w_scales, q.y, &bias, &vec![0; cout], act);
        return Ok(Box::new(QConvKernel {
            g,
            imp: Imp::Depthwise { w: dw_w },
            packed: Vec::new(),
            epis: vec![epi],
            za,
            flip,
            slots: 0,
            slot: 0,
            name: name_s,
        }));
    }
    let isa = QIsa::detect();
    let kg = taps * g.cin_g;
    let mut packed = Vec::with_capacity(groups);
    let mut epis = Vec::with_capacity(groups);
    for gi in 0..groups {
        let (kw_, cin_g) = (g.kw, g.cin_g);
        let p = PackedQB::pack(
            kg,
            g.cout_g,
            |kk, j| {
                let o = gi * g.cout_g + j;
                let (ky, kx, c) = (kk / (kw_ * cin_g), (kk / cin_g) % kw_, kk % cin_g);
                wt[((o * cin_g + c) * g.kh + ky) * g.kw + kx]
            },
            isa,
        );
        let r = gi * g.cout_g..(gi + 1) * g.cout_g;
        epis.push(QEpilogue::new(
            x,
            &q.w_scales[r.clone()],
            q.y,
            &bias[r],
            &p.col_sums,
            act,
        ));
        packed.push(p);
    }
    let pointwise = nhwc
        && taps == 1
        && (sh, sw, pt, pl) == (1, 1, 0, 0)
        && (oh, ow) == (h, w)
        && groups == 1
        && cin % 4 == 0
        && !flip;
    let kp = packed.first().map_or(4, |p| p.kp);
    let threads = rayon::current_num_threads().max(1);
    // Per worker: an im2col tile, plus (NCHW) an output tile to scatter from.
    let slot = (TILE_ROWS * kp + if nhwc { 0 } else { TILE_ROWS * cout }).next_multiple_of(64);
    Ok(Box::new(QConvKernel {
        g,
        imp: if pointwise { Imp::Pointwise } else { Imp::Im2col },
        packed,
        epis,
        za,
        flip,
        slots: threads,
        slot,
        name: name_s,
    }))
}

impl QConvKernel {
    /// Gathers `rows` output pixels from `r0` of group `gi` into K-padded rows of `col`.
    fn im2col(&self, x: &[u8], gi: usize, r0: usize, rows: usize, kp: usize, col: &mut [u8]) {
        let g = &self.g;
        let (za, flip) = (self.za, self.flip);
        for r in 0..rows {
            let p = r0 + r;
            let (ni, rem) = (p / (g.oh * g.ow), p % (g.oh * g.ow));
            let (oy, ox) = (rem / g.ow, rem % g.ow);
            let dst = &mut col[r * kp..(r + 1) * kp];
            let mut k = 0;
            for ky in 0..g.kh {
                let iy = (oy * g.sh + ky * g.dh).wrapping_sub(g.pt);
                for kx in 0..g.kw {
                    let ix = (ox * g.sw + kx * g.dw).wrapping_sub(g.pl);
                    let d = &mut dst[k..k + g.cin_g];
                    if iy >= g.h || ix >= g.w {
                        d.fill(za);
                    } else if g.nhwc {
                        let s = ((ni * g.h + iy) * g.w + ix) * g.cin + gi * g.cin_g;
                        copy_row(d, &x[s..s + g.cin_g], flip);
                    } else {
                        for (c, dv) in d.iter_mut().enumerate() {
                            let s = ((ni * g.cin + gi * g.cin_g + c) * g.h + iy) * g.w + ix;
                            *dv = if flip { x[s] ^ 0x80 } else { x[s] };
                        }
                    }
                    k += g.cin_g;
                }
            }
            dst[k..].fill(0);
        }
    }

    fn run_gemm(&self, x: &[u8], out: &mut [u8], scratch: &mut [u8]) -> Result<()> {
        let g = &self.g;
        let rows = g.n * g.oh * g.ow;
        if let Imp::Pointwise = self.imp {
            let p = &self.packed[0];
            let per = rows.div_ceil(rayon::current_num_threads().max(1)).max(1);
            return out
                .par_chunks_mut(per * g.cout)
                .enumerate()
                .try_for_each(|(wi, o)| {
                    let r0 = wi * per;
                    let m = o.len() / g.cout;
                    let a = &x[r0 * g.cin..(r0 + m) * g.cin];
                    p.run(m, a, g.cin, o, g.cout, &self.epis[0])
                });
        }
        let kp = self.packed.first().map_or(4, |p| p.kp);
        let slot = self.slot;
        let slots = (scratch.len() / slot.max(1)).max(1);
        if scratch.len() < slot {
            return Err(Error::Shape(format!("{}: scratch too small", self.name)));
        }
        let ntiles = rows.div_ceil(TILE_ROWS);
        let workers = slots.min(rayon::current_num_threads()).min(ntiles).max(1);
        let per_worker = ntiles.div_ceil(workers) * TILE_ROWS;
        let hw = g.oh * g.ow;
        if g.nhwc {
            return out
                .par_chunks_mut(per_worker * g.cout)
                .zip(scratch.par_chunks_mut(slot))
                .enumerate()
                .try_for_each(|(wi, (o, col))| {
                    let r_begin = wi * per_worker;
                    let nrows = o.len() / g.cout;
                    let mut done = 0;
                    while done < nrows {
                        let m = TILE_ROWS.min(nrows - done);
                        for (gi, p) in self.packed.iter().enumerate() {
                            self.im2col(x, gi, r_begin + done, m, kp, col);
                            let o = &mut o[done * g.cout + gi * g.cout_g..];
                            p.run(m, col, kp, o, g.cout, &self.epis[gi])?;
                        }
                        done += m;
                    }
                    Ok(())
                });
        }
        // NCHW (layouts the layout pass left alone): one worker, tile by tile, scattered.
        let sc = &mut scratch[..slot];
        let (col, otile) = sc.split_at_mut(TILE_ROWS * kp);
        let mut done = 0;
        while done < rows {
            let m = TILE_ROWS.min(rows - done);
            for (gi, p) in self.packed.iter().enumerate() {
                self.im2col(x, gi, done, m, kp, col);
                let o = &mut otile[gi * g.cout_g..];
                p.run(m, col, kp, o, g.cout, &self.epis[gi])?;
            }
            for r in 0..m {
                let (ni, rem) = ((done + r) / hw, (done + r) % hw);
                for c in 0..g.cout {
                    out[(ni * g.cout + c) * hw + rem] = otile[r * g.cout + c];
                }
            }
            done += m;
        }
        Ok(())
    }

    fn run_depthwise(&self, x: &[u8], out: &mut [u8], w: &[i16]) {
        let g = &self.g;
        let epi = &self.epis[0];
        out.par_chunks_mut(g.ow * g.cout)
            .enumerate()
            .for_each(|(row, o)| {
                #[cfg(target_arch = "x86_64")]
                {
                    if is_x86_feature_detected!("avx512bw") {
                        // SAFETY: the required CPU feature was detected at run time.
                        unsafe { dw_row_avx512(g, x, w, row, o, epi, self.za, self.flip) };
                        return;
                    }
                    if is_x86_feature_detected!("avx2") {
                        // SAFETY: as above.
                        unsafe { dw_row_avx2(g, x, w, row, o, epi, self.za, self.flip) };
                        return;
                    }
                }
                dw_row(g, x, w, row, o, epi, self.za, self.flip);
            });
    }
}

/// Channels per accumulation block of the depthwise kernel (stack buffer).
const DW_BLOCK: usize = 256;

/// One output row of an NHWC depthwise conv: `acc[c] = bias + sum_taps (x - za) * w`, then the
/// epilogue (whose column sums are zero: the zero point is subtracted here).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn dw_row(g: &Geom, x: &[u8], w: &[i16], row: usize, o: &mut [u8], epi: &QEpilogue, za: u8, flip: bool) {
    let c = g.cin;
    let (ni, oy) = (row / g.oh, row % g.oh);
    let za = za as i32;
    let mut acc = [0i32; DW_BLOCK];
    for ox in 0..g.ow {
        let mut cb = 0;
        while cb < c {
            let nb = DW_BLOCK.min(c - cb);
            let acc = &mut acc[..nb];
            acc.fill(0);
            for ky in 0..g.kh {
                let iy = (oy * g.sh + ky * g.dh).wrapping_sub(g.pt);
                if iy >= g.h {
                    continue;
                }
                for kx in 0..g.kw {
                    let ix = (ox * g.sw + kx * g.dw).wrapping_sub(g.pl);
                    if ix >= g.w {
                        continue;
                    }
                    let s = ((ni * g.h + iy) * g.w + ix) * c + cb;
                    let xs = &x[s..s + nb];
                    let t = ky * g.kw + kx;
                    let ws = &w[t * c + cb..t * c + cb + nb];
                    if flip {
                        for ((a, &xv), &wv) in acc.iter_mut().zip(xs).zip(ws) {
                            *a += ((xv ^ 0x80) as i32 - za) * wv as i32;
                        }
                    } else {
                        for ((a, &xv), &wv) in acc.iter_mut().zip(xs).zip(ws) {
                            *a += (xv as i32 - za) * wv as i32;
                        }
                    }
                }
            }
            epi.store(acc, cb, &mut o[ox * c + cb..ox * c + cb + nb]);
            cb += nb;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
#[allow(clippy::too_many_arguments)]
unsafe fn dw_row_avx512(g: &Geom, x: &[u8], w: &[i16], row: usize, o: &mut [u8], epi: &QEpilogue, za: u8, flip: bool) {
    dw_row(g, x, w, row, o, epi, za, flip)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn dw_row_avx2(g: &Geom, x: &[u8], w: &[i16], row: usize, o: &mut [u8], epi: &QEpilogue, za: u8, flip: bool) {
    dw_row(g, x, w, row, o, epi, za, flip)
}

impl Kernel for QConvKernel {
    fn run(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        scratch: &mut [u8],
    ) -> Result<()> {
        let g = &self.g;
        let x = input(inputs, 0, &self.name)?;
        let out = output(outputs, 0, &self.name)?;
        if x.bytes.len() != g.n * g.cin * g.h * g.w || out.bytes.len() != g.n * g.cout * g.oh * g.ow {
            return Err(Error::Shape(format!("{}: tensor sizes", self.name)));
        }
        match &self.imp {
            Imp::Depthwise { w } => {
                self.run_depthwise(x.bytes, out.bytes, w);
                Ok(())
            }
            _ => self.run_gemm(x.bytes, out.bytes, scratch),
        }
    }

    fn scratch_bytes(&self) -> usize {
        self.slots * self.slot
    }
}
