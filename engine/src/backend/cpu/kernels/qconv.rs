//! INT8 convolution (a folded `DQ -> Conv -> Q`), requantization fused: NHWC or NCHW 8-bit
//! activations, int8 OIHW weights packed at build time for the [`qgemm`](super::qgemm)
//! micro-kernels. Paths: pointwise (1x1, stride 1, unpadded NHWC, C % 4 == 0, u8) runs the
//! packed product on the input in place; depthwise (group == C) runs a direct kernel with
//! channels in vector lanes over tap-interleaved input rows ([`TapGroups`], rows interleaved
//! once per worker band): four horizontal taps per `vpdpbusd` lane with AVX-512 VNNI + VBMI, two
//! zero-extended i16 taps per `vpmaddwd` lane with AVX2; geometries it does not take (dilated
//! columns, general activations) run `vpmaddwd` of zero-extended bytes against i32 weights per
//! tap, all requantized in registers (portable scalar fallback); everything else gathers im2col
//! tiles (padding holds the input zero point) per worker.

use rayon::prelude::*;

use super::elementwise::{input, output};
#[cfg(target_arch = "x86_64")]
use super::qgemm::store_avx2;
use super::qgemm::{bias_i32, copy_row, u8_params, weights_i8, PackedQB, QEpilogue, QIsa};
use super::{Kernel, TensorMut, TensorRef};
use crate::error::{Error, Result};
use crate::ir::{DataType, Graph, Layout, Node, Op};

/// Output rows (pixels) per im2col tile.
const TILE_ROWS: usize = 96;

/// Fewest multiply-adds in one parallel part of a pointwise conv: handing a part to a worker
/// costs microseconds, so small layers keep one part a worker.
const MIN_PART_WORK: usize = 2 << 20;

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
    cin_g: usize,
    cout_g: usize,
    nhwc: bool,
}

/// The tap-grouped depthwise layout: for each padded input row and each position `ix` a
/// conv window can start a tap group at, the values `x[ix + j][c]` for the group's `taps`
/// horizontal taps side by side per channel, in one 32-bit lane. With AVX-512 VNNI a lane
/// holds four bytes, so one `vpdpbusd` multiplies four taps of 16 channels; with AVX2 it holds
/// two zero-extended i16, so one `vpmaddwd` multiplies two taps of 8 channels (exact, where
/// `vpmaddubsw` would saturate). Either way the weights are lanes of the same shape.
#[derive(Debug)]
// Built only for x86 ISAs, whose kernels are the only readers of every field.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct TapGroups {
    /// Taps per lane: 4 (bytes, AVX-512 VNNI) or 2 (i16, AVX2).
    taps: usize,
    /// Padded input rows the conv reads (`pt` rows above the input included): rows of
    /// image `n` are keyed `n * hp + row` in a worker's ring.
    hp: usize,
    /// Interleaved positions per row, `se` padded columns apart.
    nx: usize,
    se: usize,
    /// Tap groups per kernel row (`ceil(kw / taps)`).
    ng: usize,
    /// Channels rounded up to a vector's: 16 (64-byte zmm) or 8 (32-byte ymm). Channel block
    /// `k` of position `p` lies at vector `k * nx + p` of a row.
    cp: usize,
    /// Weight lanes `[ky][group][cp]`, 4 bytes each (taps past `kw` and channels past C are
    /// zero).
    w: Vec<u8>,
}

impl TapGroups {
    /// The layout for a depthwise conv of geometry `g` (horizontal dilation 1) with int8
    /// weights `wt` in `[c][ky][kx]` order: `taps` 4 for AVX-512 VNNI, 2 for AVX2.
    fn new(g: &Geom, wt: &[i8], taps: usize) -> TapGroups {
        let ng = g.kw.div_ceil(taps);
        let cv = if taps == 4 { 16 } else { 8 };
        let cp = g.cin.next_multiple_of(cv);
        // Windows start at `ox * sw` and groups `taps` columns apart: when the stride divides
        // `taps` only every `sw`-th column is ever a start.
        let se = if taps.is_multiple_of(g.sw) { g.sw } else { 1 };
        let last = (g.ow - 1) * g.sw + taps * (ng - 1);
        let mut w = vec![0u8; g.kh * ng * cp * 4];
        for ky in 0..g.kh {
            for kx in 0..g.kw {
                let (gi, j) = (kx / taps, kx % taps);
                for c in 0..g.cin {
                    let v = wt[(c * g.kh + ky) * g.kw + kx];
                    let at = ((ky * ng + gi) * cp + c) * 4 + j * (4 / taps);
                    if taps == 4 {
                        w[at] = v as u8;
                    } else {
                        w[at..at + 2].copy_from_slice(&(v as i16).to_le_bytes());
                    }
                }
            }
        }
        TapGroups {
            taps,
            hp: (g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1,
            nx: last / se + 1,
            se,
            ng,
            cp,
            w,
        }
    }

    /// Bytes of one interleaved row.
    fn line_bytes(&self) -> usize {
        self.nx * self.cp * 4
    }

    /// Bytes of one worker's ring of interleaved rows (one per input row a window spans).
    fn ring_bytes(&self, g: &Geom) -> usize {
        ((g.kh - 1) * g.dh + 1) * self.line_bytes()
    }

    /// Where the `J` taps of interleaved position `p` read input row `rp`: the first byte of
    /// each tap's column, null for a column outside the image (padding).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn sources<const J: usize>(&self, g: &Geom, rp: *const u8, p: usize) -> [*const u8; J] {
        std::array::from_fn(|j| {
            let col = (p * self.se + j).wrapping_sub(g.pl);
            if col < g.w {
                rp.wrapping_add(col * g.cin)
            } else {
                std::ptr::null()
            }
        })
    }

    /// Fills `line` as an all-padding row: every tap reads the zero point `za`.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn fill_padding(&self, line: &mut [u8], za: u8) {
        if self.taps == 4 {
            line.fill(za);
        } else {
            for lane in line.chunks_exact_mut(2) {
                lane.copy_from_slice(&(za as u16).to_le_bytes());
            }
        }
    }
}

/// Depthwise weights as sparse byte lanes, for `vpdpbusd` on input bytes read in place: per
/// tap and block of 64 channels, four 64-byte vectors, vector `s` holding the weight of channel
/// `4j + s` in byte `4j + s` (zeros elsewhere), so lane `j` of product `s` adds exactly
/// `x[4j + s] * w[4j + s]`. No input byte is moved before the products; the four accumulators
/// are requantized by an epilogue whose channels are permuted to match (`s * 16 + j` within a
/// block) and their bytes put back in channel order by one `vpermb`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct DwLanes {
    /// `[tap][block][s][64]` bytes (channels past C zero).
    w: Vec<u8>,
    /// Channel blocks of 64.
    blocks: usize,
    /// The node's epilogue over permuted channels (`blocks * 64` of them, zeros past C).
    epi: QEpilogue,
}

impl DwLanes {
    /// The lanes of depthwise weights `wt` (`[c][tap]`), with the epilogue of `x`, `q`, `bias`,
    /// `sums` (per-channel tap sums) and `act` permuted to the lane order.
    fn new(
        g: &Geom,
        wt: &[i8],
        x: crate::ir::QParams,
        q: &crate::ir::QConvAttrs,
        bias: &[i32],
        sums: &[i32],
        act: Option<crate::ir::Activation>,
    ) -> DwLanes {
        let (c, taps) = (g.cin, g.kh * g.kw);
        let blocks = c.div_ceil(64);
        let mut w = vec![0u8; taps * blocks * 256];
        for ch in 0..c {
            let (b, j, s) = (ch / 64, (ch % 64) / 4, ch % 4);
            for t in 0..taps {
                w[((t * blocks + b) * 4 + s) * 64 + 4 * j + s] = wt[ch * taps + t] as u8;
            }
        }
        // Position `b * 64 + s * 16 + j` of the permuted order holds channel `b * 64 + 4j + s`.
        let cp = blocks * 64;
        let channel = |p: usize| (p / 64) * 64 + 4 * (p % 16) + (p % 64) / 16;
        fn permuted<T: Copy + Default>(
            v: &[T],
            cp: usize,
            channel: impl Fn(usize) -> usize,
        ) -> Vec<T> {
            (0..cp)
                .map(|p| v.get(channel(p)).copied().unwrap_or_default())
                .collect()
        }
        let epi = QEpilogue::new(
            x,
            &permuted(&q.w_scales, cp, channel),
            q.y,
            &permuted(bias, cp, channel),
            &permuted(sums, cp, channel),
            act,
        );
        DwLanes { w, blocks, epi }
    }
}

/// Largest kernel height of the [`TapGroups`] path (its ring bookkeeping lives on the stack).
const TAP_GROUPS_MAX_KH: usize = 16;

enum Imp {
    Pointwise,
    Depthwise { w: Vec<i32> },
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
    /// Scratch slots of `slot` bytes: one per parallel part (im2col tiles, depthwise rings).
    slots: usize,
    slot: usize,
    /// Depthwise on AVX-512 VNNI with padding: the geometry over a scratch copy of the input
    /// with its zero-point border written out, so no output pixel takes the border path.
    dw_pad: Option<Geom>,
    /// Depthwise over a tap-interleaved scratch copy of the input: four horizontal taps per
    /// `vpdpbusd` lane (AVX-512 VNNI + VBMI) or two per `vpmaddwd` lane (AVX2); preferred over
    /// `dw_pad` when present.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    taps: Option<TapGroups>,
    /// Depthwise products on input bytes in place ([`DwLanes`], AVX-512 VNNI + VBMI);
    /// preferred over `taps` and `dw_pad` when present.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    lanes: Option<DwLanes>,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    isa: QIsa,
    name: String,
}

/// Compiles a QConv node for the best instruction set of this CPU.
pub fn build(graph: &Graph, node: &Node) -> Result<Box<dyn Kernel>> {
    build_with(graph, node, QIsa::detect())
}

/// Compiles a QConv node for the given instruction set (which must be available).
fn build_with(graph: &Graph, node: &Node, isa: QIsa) -> Result<Box<dyn Kernel>> {
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
    if q.residual.is_some() {
        return Err(bad("a fused residual (a CUDA backend fusion)"));
    }
    if graph.shape(xv)?.len() != 4 {
        return Err(bad("only 2-D convolutions are supported"));
    }
    let c = super::conv::geometry(graph, node, a, &name)?;
    let (cin, cout, groups) = (c.cin, c.cout, c.groups);
    if q.w_scales.len() != cout || !matches!(graph.values[xv].dtype, DataType::U8 | DataType::I8) {
        return Err(bad(
            "needs one weight scale per output channel and an 8-bit input",
        ));
    }
    let nhwc = a.layout == Layout::Nhwc;
    let g = Geom {
        n: c.n,
        cin,
        h: c.h,
        w: c.w,
        cout,
        oh: c.oh,
        ow: c.ow,
        kh: c.kh,
        kw: c.kw,
        sh: c.sh,
        sw: c.sw,
        dh: c.dh,
        dw: c.dw,
        pt: c.pt,
        pl: c.pl,
        cin_g: c.cin_g,
        cout_g: c.cout_g,
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
        // Depthwise: weights as i32 [tap][c] (the operand of `vpmaddwd` against
        // zero-extended bytes). Padded taps read the zero point, so the correction
        // `-za * sum_taps w` goes into the bias like the GEMM paths' column sums.
        let mut dw_w = vec![0i32; taps * cout];
        let mut sums = vec![0i32; cout];
        for c in 0..cout {
            for t in 0..taps {
                dw_w[t * cout + c] = wt[c * taps + t] as i32;
                sums[c] += wt[c * taps + t] as i32;
            }
        }
        let epi = QEpilogue::new(x, &q.w_scales, q.y, &bias, &sums, act);
        let padded = g.pt > 0
            || g.pl > 0
            || (g.oh - 1) * g.sh + (g.kh - 1) * g.dh >= g.h
            || (g.ow - 1) * g.sw + (g.kw - 1) * g.dw >= g.w;
        #[cfg(target_arch = "x86_64")]
        let vbmi = super::quantize::vbmi_available();
        #[cfg(not(target_arch = "x86_64"))]
        let vbmi = false;
        let group_taps = match isa {
            QIsa::Avx512Vnni if vbmi => Some(4),
            QIsa::AvxVnni | QIsa::Avx2 => Some(2),
            _ => None,
        };
        // Lanes do 3x the products of tap groups on a 3-wide kernel (and more on wider ones),
        // but move no input byte: they pay off where tap groups interleave the most per product,
        // at a stride of 2 or more (measured on EfficientNet-Lite0: 3x3 stride 2 1.5x faster;
        // 3x3 stride 1 and 5x5 kernels slower).
        let lanes = (isa == QIsa::Avx512Vnni
            && vbmi
            && g.sw > 1
            && g.kw <= 3
            && epi.general.is_none()
            && std::env::var("VIGIL_DWL").map_or(true, |v| v != "0"))
        .then(|| DwLanes::new(&g, wt, x, q, &bias, &sums, act));
        let taps = group_taps
            .filter(|_| {
                lanes.is_none() && epi.general.is_none() && g.dw == 1 && g.kh <= TAP_GROUPS_MAX_KH
            })
            .map(|t| TapGroups::new(&g, wt, t));
        // Bands of output rows, each with its own ring: more bands than workers balance
        // unequal cores, while a band keeps enough rows that re-interleaving the `kh - sh` input
        // rows it shares with the band above costs at most a quarter more.
        let band_rows = (4 * g.kh.saturating_sub(g.sh)).div_ceil(g.sh).max(1);
        let (slots, slot) = match &taps {
            Some(d) => (super::part_count(g.n * g.oh, band_rows), d.ring_bytes(&g)),
            None => (0, 0),
        };
        let dw_pad = (taps.is_none()
            && lanes.is_none()
            && padded
            && isa == QIsa::Avx512Vnni
            && epi.general.is_none())
        .then(|| Geom {
            h: (g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1,
            w: (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1,
            pt: 0,
            pl: 0,
            ..g
        });
        return Ok(Box::new(QConvKernel {
            g,
            imp: Imp::Depthwise { w: dw_w },
            packed: Vec::new(),
            epis: vec![epi],
            za,
            flip,
            slots,
            slot,
            dw_pad,
            taps,
            lanes,
            isa,
            name: name_s,
        }));
    }
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
        && (g.sh, g.sw, g.pt, g.pl) == (1, 1, 0, 0)
        && (g.oh, g.ow) == (g.h, g.w)
        && groups == 1
        && cin % 4 == 0
        && !flip;
    let kp = packed.first().map_or(4, |p| p.kp);
    // im2col parts of at least two tiles each (one part a worker, or more to balance unequal
    // cores); a pointwise conv reads its input in place and needs no scratch.
    let parts = if pointwise {
        0
    } else {
        super::part_count((g.n * g.oh * g.ow).div_ceil(TILE_ROWS), 2)
    };
    // Per part: an im2col tile, plus (NCHW) an output tile to scatter from.
    // NHWC tiles keep 64 bytes of slack: the im2col fast path moves 16/32-byte blocks that may
    // run past a row's end (into the next row, rewritten after, or the slack).
    let slot = (TILE_ROWS * kp + if nhwc { 64 } else { TILE_ROWS * cout }).next_multiple_of(64);
    Ok(Box::new(QConvKernel {
        g,
        imp: if pointwise {
            Imp::Pointwise
        } else {
            Imp::Im2col
        },
        packed,
        epis,
        za,
        flip,
        slots: parts,
        slot,
        dw_pad: None,
        taps: None,
        lanes: None,
        isa,
        name: name_s,
    }))
}

impl QConvKernel {
    /// Gathers `rows` output pixels from `r0` of group `gi` into K-padded rows of `col`.
    fn im2col(&self, x: &[u8], gi: usize, r0: usize, rows: usize, kp: usize, col: &mut [u8]) {
        let g = &self.g;
        let (za, flip) = (self.za, self.flip);
        // Output coordinates of the first row, then stepped (no divisions per row).
        let (mut ni, rem) = (r0 / (g.oh * g.ow), r0 % (g.oh * g.ow));
        let (mut oy, mut ox) = (rem / g.ow, rem % g.ow);
        for r in 0..rows {
            if r > 0 {
                ox += 1;
                if ox == g.ow {
                    ox = 0;
                    oy += 1;
                    if oy == g.oh {
                        oy = 0;
                        ni += 1;
                    }
                }
            }
            let mut k = 0;
            let span = g.kw * g.cin_g;
            for ky in 0..g.kh {
                let iy = (oy * g.sh + ky * g.dh).wrapping_sub(g.pt);
                let ix0 = (ox * g.sw).wrapping_sub(g.pl);
                if g.nhwc
                    && !flip
                    && g.cin_g == g.cin
                    && g.dw == 1
                    && iy < g.h
                    && ix0 < g.w
                    && ix0 + g.kw <= g.w
                {
                    // The whole kernel row is one contiguous run of the input.
                    let s = ((ni * g.h + iy) * g.w + ix0) * g.cin;
                    let d = r * kp + k;
                    copy_run(&mut col[..], d, x, s, span);
                    k += span;
                    continue;
                }
                for kx in 0..g.kw {
                    let ix = (ox * g.sw + kx * g.dw).wrapping_sub(g.pl);
                    if g.nhwc && !flip && iy < g.h && ix < g.w {
                        let s = ((ni * g.h + iy) * g.w + ix) * g.cin + gi * g.cin_g;
                        copy_run(&mut col[..], r * kp + k, x, s, g.cin_g);
                        k += g.cin_g;
                        continue;
                    }
                    let d = &mut col[r * kp + k..r * kp + k + g.cin_g];
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
            col[r * kp + k..(r + 1) * kp].fill(0);
        }
    }

    fn run_gemm(&self, x: &[u8], out: &mut [u8], scratch: &mut [u8]) -> Result<()> {
        let g = &self.g;
        let rows = g.n * g.oh * g.ow;
        if let Imp::Pointwise = self.imp {
            let p = &self.packed[0];
            // Parts of at least 64 rows and MIN_PART_WORK multiply-adds.
            let min_rows = (MIN_PART_WORK / (g.cin * g.cout).max(1)).max(64);
            let per = rows.div_ceil(super::part_count(rows, min_rows));
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
        let workers = slots.min(ntiles).max(1);
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

    /// Copies the NHWC input into `xp` laid out as `pg` (the padded geometry): the border and
    /// any rows or columns the conv never reads past the input hold the zero point (in the
    /// input's byte domain, so the kernel's flip of i8 bytes maps it back).
    fn pad_input(&self, x: &[u8], xp: &mut [u8], pg: &Geom) {
        let g = &self.g;
        let c = g.cin;
        let zb = if self.flip { self.za ^ 0x80 } else { self.za };
        let cols = g.w.min(pg.w.saturating_sub(g.pl));
        for (r, dst) in xp.chunks_exact_mut(pg.w * c).enumerate() {
            let (ni, y) = (r / pg.h, (r % pg.h).wrapping_sub(g.pt));
            if y >= g.h {
                dst.fill(zb);
                continue;
            }
            let src = &x[((ni * g.h + y) * g.w) * c..][..cols * c];
            dst[..g.pl * c].fill(zb);
            dst[g.pl * c..(g.pl + cols) * c].copy_from_slice(src);
            dst[(g.pl + cols) * c..].fill(zb);
        }
    }

    fn run_depthwise(&self, g: &Geom, x: &[u8], out: &mut [u8], w: &[i32]) {
        let epi = &self.epis[0];
        let (za, flip) = (self.za, self.flip);
        out.par_chunks_mut(g.ow * g.cout)
            .enumerate()
            .for_each(|(row, o)| {
                #[cfg(target_arch = "x86_64")]
                if epi.general.is_none() {
                    // SAFETY: `isa` was checked available when the kernel was built (VNNI
                    // AVX-512 implies AVX-512BW, AVX-VNNI implies AVX2); `run` checked the
                    // input size, `w` holds taps * C values and `o` is one output row.
                    match self.isa {
                        QIsa::Avx512Vnni => {
                            unsafe { dw_row_vnni512(g, x, w, (row, (0, g.ow)), o, epi, za, flip) };
                            return;
                        }
                        QIsa::AvxVnni | QIsa::Avx2 => {
                            unsafe { dw_row_avx2(g, x, w, row, o, epi, za, flip) };
                            return;
                        }
                        QIsa::Portable => {}
                    }
                }
                dw_row(g, x, w, row, o, epi, za, flip);
            });
    }
}

#[cfg(target_arch = "x86_64")]
impl QConvKernel {
    /// Depthwise through [`DwLanes`], one output row per parallel item; pixels whose window
    /// leaves the image take the zero-extending path of [`dw_row_vnni512`].
    fn run_lanes(&self, x: &[u8], out: &mut [u8], w: &[i32]) {
        let (g, epi) = (&self.g, &self.epis[0]);
        let Some(l) = &self.lanes else { return };
        let (za, flip) = (self.za, self.flip);
        out.par_chunks_mut(g.ow * g.cout)
            .enumerate()
            .for_each(|(row, o)| {
                // SAFETY: the lanes were built only where AVX-512 VNNI and VBMI are available;
                // `run` checked the input size, `w` holds taps * C values, `o` is one output row
                // and the epilogues are not general.
                unsafe { dw_row_lanes(g, x, w, l, row, o, epi, za, flip) }
            });
    }

    /// Depthwise through [`TapGroups`]: output rows in bands, one per worker slot, each
    /// interleaving the input rows its windows read into its ring. The caller checked the
    /// input and output sizes; a scratch shorter than `scratch_bytes` is an error.
    fn run_tap_groups(&self, x: &[u8], out: &mut [u8], scratch: &mut [u8]) -> Result<()> {
        let (g, epi) = (&self.g, &self.epis[0]);
        let Some(d) = &self.taps else {
            return Err(Error::Unsupported(format!(
                "{}: no depthwise layout",
                self.name
            )));
        };
        let line = d.line_bytes();
        let span = (g.kh - 1) * g.dh + 1;
        let total = g.n * g.oh;
        // One band of output rows per worker slot, each with a ring of the `span` interleaved
        // input rows its current window reads (a row is interleaved once per band).
        let bands = self.slots.min(total).max(1);
        let per = total.div_ceil(bands);
        let fl = if self.flip { 0x80 } else { 0 };
        let rings = scratch
            .get_mut(..bands * self.slot)
            .ok_or_else(|| Error::Shape(format!("{}: scratch too small", self.name)))?;
        let ring_rows = rings.par_chunks_mut(self.slot);
        let out_rows = out.par_chunks_mut(per * g.ow * g.cout);
        ring_rows
            .zip(out_rows)
            .enumerate()
            .for_each(|(b, (ring, ob))| {
                let mut have = [usize::MAX; TAP_GROUPS_MAX_KH];
                let mut lines = [std::ptr::null(); TAP_GROUPS_MAX_KH];
                for (k, o) in ob.chunks_exact_mut(g.ow * g.cout).enumerate() {
                    let r = b * per + k;
                    let (ni, oy) = (r / g.oh, r % g.oh);
                    for (ky, l) in lines.iter_mut().enumerate().take(g.kh) {
                        let iy = oy * g.sh + ky * g.dh;
                        let slot = iy % span;
                        let dst = &mut ring[slot * line..(slot + 1) * line];
                        if have[slot] != ni * d.hp + iy {
                            have[slot] = ni * d.hp + iy;
                            let y = iy.wrapping_sub(g.pt);
                            if y < g.h {
                                let row = &x[(ni * g.h + y) * g.w * g.cin..][..g.w * g.cin];
                                // SAFETY: the layout's instruction set was checked available
                                // when it was built (four taps: AVX-512 VNNI + VBMI; two: AVX2);
                                // `row` is one input row and `dst` one interleaved row.
                                unsafe {
                                    if d.taps == 4 {
                                        dw4_interleave(d, g, row, dst, fl, self.za)
                                    } else {
                                        dw2_interleave(d, g, row, dst, fl, self.za)
                                    }
                                };
                            } else {
                                d.fill_padding(dst, self.za);
                            }
                        }
                        *l = dst.as_ptr();
                    }
                    // SAFETY: as above; `lines` point at the kh interleaved rows output row `r`
                    // reads (alive in `ring` until this row is done) and `o` is that row.
                    unsafe {
                        if d.taps == 4 {
                            dw4_row(d, g, &lines[..g.kh], o, epi)
                        } else {
                            dw2_row(d, g, &lines[..g.kh], o, epi)
                        }
                    };
                }
            });
        Ok(())
    }
}

/// Writes one four-tap [`TapGroups`] row from input row `row`: at position `p` and channel `c`, the four
/// bytes `row[p * se + j - pl][c] ^ fl` (the zero point `za` outside the image) side by side,
/// 64 channels per step with two rounds of `vpermt2b`/`vpermt2w`; channels up to the next
/// multiple of 16 are written too.
///
/// # Safety
/// AVX-512F/BW and VBMI must be available; `row` holds `g.w * g.cin` bytes and `dst`
/// `d.nx * d.cp * 4`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn dw4_interleave(d: &TapGroups, g: &Geom, row: &[u8], dst: &mut [u8], fl: u8, za: u8) {
    use std::arch::x86_64::*;
    // Byte i of a pair interleave takes byte i / 2 of the first operand (even i) or of the
    // second (odd i, bit 6); the word interleave likewise with bit 5.
    let pair = |base: usize| -> __m512i {
        let v: [u8; 64] = std::array::from_fn(|i| (base + i / 2) as u8 | ((i as u8 & 1) << 6));
        _mm512_loadu_si512(v.as_ptr() as *const _)
    };
    let word = |base: usize| -> __m512i {
        let v: [u16; 32] = std::array::from_fn(|i| (base + i / 2) as u16 | ((i as u16 & 1) << 5));
        _mm512_loadu_si512(v.as_ptr() as *const _)
    };
    let (b_lo, b_hi, w_lo, w_hi) = (pair(0), pair(32), word(0), word(16));
    let flv = _mm512_set1_epi8(fl as i8);
    let zav = _mm512_set1_epi8(za as i8);
    let c = g.cin;
    let (rp, dp) = (row.as_ptr(), dst.as_mut_ptr());
    for p in 0..d.nx {
        let src: [*const u8; 4] = d.sources(g, rp, p);
        // Channel block k of position p lies at block k * nx + p of the row.
        let out = dp.add(p * 64) as *mut __m512i;
        let mut cb = 0;
        while cb < c {
            let nb = (c - cb).min(64);
            let m: __mmask64 = if nb == 64 { !0 } else { (1u64 << nb) - 1 };
            let v: [__m512i; 4] = std::array::from_fn(|j| {
                if src[j].is_null() {
                    zav
                } else {
                    _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, src[j].add(cb) as *const i8), flv)
                }
            });
            let ab = _mm512_permutex2var_epi8(v[0], b_lo, v[1]);
            let cd = _mm512_permutex2var_epi8(v[2], b_lo, v[3]);
            let o = out.add(cb / 16 * d.nx);
            _mm512_storeu_si512(o, _mm512_permutex2var_epi16(ab, w_lo, cd));
            if nb > 16 {
                _mm512_storeu_si512(o.add(d.nx), _mm512_permutex2var_epi16(ab, w_hi, cd));
            }
            if nb > 32 {
                let ab = _mm512_permutex2var_epi8(v[0], b_hi, v[1]);
                let cd = _mm512_permutex2var_epi8(v[2], b_hi, v[3]);
                _mm512_storeu_si512(o.add(2 * d.nx), _mm512_permutex2var_epi16(ab, w_lo, cd));
                if nb > 48 {
                    _mm512_storeu_si512(o.add(3 * d.nx), _mm512_permutex2var_epi16(ab, w_hi, cd));
                }
            }
            cb += nb;
        }
    }
}

/// One output row of a depthwise conv over the four-tap [`TapGroups`] rows `lines` (one per kernel row):
/// per group of eight pixels
/// and 16 channels, one `vpdpbusd` per kernel row and tap group (the weight vector shared by
/// the four pixels' independent chains), requantized in registers.
///
/// # Safety
/// AVX-512F/BW/VL/VNNI must be available; each of the `kh` lines holds `d.nx * d.cp * 4`
/// bytes written by [`dw4_interleave`], `o` the `ow * C` bytes of the output row, and
/// `epi.general` is `None`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dw4_row(d: &TapGroups, g: &Geom, lines: &[*const u8], o: &mut [u8], epi: &QEpilogue) {
    use std::arch::x86_64::*;
    const PX: usize = 8;
    let c = g.cin;
    // Positions between tap groups (`se` divides 4), hoisted: a division here would cost
    // more than the group's four `vpdpbusd`.
    let (gstep, pstep) = (4 / d.se, g.sw / d.se);
    let (wp, op) = (d.w.as_ptr(), o.as_mut_ptr());
    // Channel blocks outside, so the rows' positions of one block (kh * nx * 64 bytes) stay in
    // L1 across the pixel groups.
    let mut cb = 0;
    while cb < c {
        let nb = (c - cb).min(16);
        let m: __mmask16 = if nb == 16 { 0xffff } else { (1u16 << nb) - 1 };
        let mut ox0 = 0;
        while ox0 < g.ow {
            let np = PX.min(g.ow - ox0);
            // Start position of each pixel's window (the last group repeats its final pixel).
            let pos: [usize; PX] = std::array::from_fn(|p| (ox0 + p.min(np - 1)) * pstep);
            let mut acc = [_mm512_setzero_si512(); PX];
            for (ky, &line) in lines.iter().enumerate() {
                let rb = line.add(cb / 16 * d.nx * 64);
                for gi in 0..d.ng {
                    let wv =
                        _mm512_loadu_si512(wp.add(((ky * d.ng + gi) * d.cp + cb) * 4) as *const _);
                    let step = gi * gstep;
                    for p in 0..PX {
                        let a = _mm512_loadu_si512(rb.add((pos[p] + step) * 64) as *const _);
                        acc[p] = _mm512_dpbusd_epi32(acc[p], a, wv);
                    }
                }
            }
            for (p, &a) in acc.iter().enumerate().take(np) {
                let q = epi.requant16(a, cb, m);
                _mm_mask_storeu_epi8(op.add((ox0 + p) * c + cb) as *mut i8, m, q);
            }
            ox0 += np;
        }
        cb += nb;
    }
}

/// Writes one two-tap [`TapGroups`] row from input row `row`: at position `p` and channel
/// `c`, the pair `row[p * se + j - pl][c] ^ fl` for `j` in 0..2 (the zero point `za` outside
/// the image), each byte zero-extended to i16; 16 channels per step with one byte unpack;
/// channels up to the next multiple of 8 are written too.
///
/// # Safety
/// AVX2 must be available; `row` holds `g.w * g.cin` bytes and `dst` `d.line_bytes()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dw2_interleave(d: &TapGroups, g: &Geom, row: &[u8], dst: &mut [u8], fl: u8, za: u8) {
    use std::arch::x86_64::*;
    let flv = _mm_set1_epi8(fl as i8);
    let zav = _mm_set1_epi8(za as i8);
    let c = g.cin;
    let (rp, dp) = (row.as_ptr(), dst.as_mut_ptr());
    let block = d.nx * 32;
    for p in 0..d.nx {
        let src: [*const u8; 2] = d.sources(g, rp, p);
        let out = dp.add(p * 32);
        let mut cb = 0;
        while cb < c {
            let nb = (c - cb).min(16);
            let v: [__m128i; 2] = std::array::from_fn(|j| {
                if src[j].is_null() {
                    zav
                } else if nb == 16 {
                    _mm_xor_si128(_mm_loadu_si128(src[j].add(cb) as *const __m128i), flv)
                } else {
                    // Channel tail: copy what exists (the lanes past C meet zero weights).
                    let mut t = [0u8; 16];
                    std::ptr::copy_nonoverlapping(src[j].add(cb), t.as_mut_ptr(), nb);
                    _mm_xor_si128(_mm_loadu_si128(t.as_ptr() as *const __m128i), flv)
                }
            });
            let o = out.add(cb / 8 * block);
            let lo = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(v[0], v[1]));
            _mm256_storeu_si256(o as *mut __m256i, lo);
            if nb > 8 {
                let hi = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(v[0], v[1]));
                _mm256_storeu_si256(o.add(block) as *mut __m256i, hi);
            }
            cb += nb;
        }
    }
}

/// Output pixels per step of [`dw2_row`] (independent accumulation chains per vector).
#[cfg(target_arch = "x86_64")]
const DW2_PX: usize = 4;

/// One output row of a depthwise conv over the two-tap [`TapGroups`] rows `lines` (one per
/// kernel row): per 16 channels (two vectors; 8 at an odd end) and four pixels, one
/// `vpmaddwd` + `vpaddd` per kernel row, tap pair and vector, requantized in registers.
///
/// # Safety
/// AVX2 must be available; each of the `kh` lines holds `d.line_bytes()` bytes written by
/// [`dw2_interleave`], `o` the `ow * C` bytes of the output row, and `epi.general` is `None`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dw2_row(d: &TapGroups, g: &Geom, lines: &[*const u8], o: &mut [u8], epi: &QEpilogue) {
    let blocks = d.cp / 8;
    let mut k = 0;
    while k < blocks {
        if k + 1 < blocks {
            dw2_block::<2>(d, g, lines, k, o, epi);
            k += 2;
        } else {
            dw2_block::<1>(d, g, lines, k, o, epi);
            k += 1;
        }
    }
}

/// Channel blocks `k..k + NV` (8 channels each) of one [`dw2_row`] output row.
///
/// # Safety
/// As for [`dw2_row`], and `k + NV <= d.cp / 8`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
#[allow(clippy::needless_range_loop)] // register tiles index several arrays in step
unsafe fn dw2_block<const NV: usize>(
    d: &TapGroups,
    g: &Geom,
    lines: &[*const u8],
    k: usize,
    o: &mut [u8],
    epi: &QEpilogue,
) {
    use std::arch::x86_64::*;
    const PX: usize = DW2_PX;
    let c = g.cin;
    // Positions between tap groups and between pixels (`se` divides 2), hoisted.
    let (gstep, pstep) = (2 / d.se, g.sw / d.se);
    let block = d.nx * 32;
    let wp = d.w.as_ptr();
    let mut ox0 = 0;
    while ox0 < g.ow {
        let np = PX.min(g.ow - ox0);
        // Start position of each pixel's window (the last group repeats its final pixel).
        let pos: [usize; PX] = std::array::from_fn(|p| (ox0 + p.min(np - 1)) * pstep * 32);
        let mut acc = [[_mm256_setzero_si256(); PX]; NV];
        for (ky, &line) in lines.iter().enumerate() {
            for gi in 0..d.ng {
                let step = gi * gstep * 32;
                for v in 0..NV {
                    let wv = _mm256_loadu_si256(
                        wp.add(((ky * d.ng + gi) * d.cp + (k + v) * 8) * 4) as *const __m256i,
                    );
                    let rb = line.add((k + v) * block + step);
                    for p in 0..PX {
                        let a = _mm256_loadu_si256(rb.add(pos[p]) as *const __m256i);
                        acc[v][p] = _mm256_add_epi32(acc[v][p], _mm256_madd_epi16(a, wv));
                    }
                }
            }
        }
        for v in 0..NV {
            let cb = (k + v) * 8;
            let nb = 8.min(c - cb);
            for p in 0..np {
                let at = (ox0 + p) * c + cb;
                store_avx2(&acc[v][p..p + 1], &mut o[at..at + nb], cb, epi);
            }
        }
        ox0 += np;
    }
}

/// Copies `len` bytes `x[s..]` to `col[d..]` as 16- or 32-byte blocks when both sides have the
/// rounded-up length in bounds (the bytes written past `len` are rewritten later).
#[inline(always)]
fn copy_run(col: &mut [u8], d: usize, x: &[u8], s: usize, len: usize) {
    let n32 = len.div_ceil(32) * 32;
    if len <= 16 && s + 16 <= x.len() && d + 16 <= col.len() {
        let mut b = [0u8; 16];
        b.copy_from_slice(&x[s..s + 16]);
        col[d..d + 16].copy_from_slice(&b);
    } else if n32 == 32 && s + 32 <= x.len() && d + 32 <= col.len() {
        let mut b = [0u8; 32];
        b.copy_from_slice(&x[s..s + 32]);
        col[d..d + 32].copy_from_slice(&b);
    } else {
        col[d..d + len].copy_from_slice(&x[s..s + len]);
    }
}

/// Channels per accumulation block of the portable depthwise kernel (stack buffer).
const DW_BLOCK: usize = 256;

/// Accumulates channels `cb..cb + acc.len()` of output pixel `(ni, oy, ox)` of an NHWC
/// depthwise conv into `acc`: `sum_taps x * w`, padded taps reading the zero point `za`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn dw_pixel(
    g: &Geom,
    x: &[u8],
    w: &[i32],
    (ni, oy, ox): (usize, usize, usize),
    cb: usize,
    acc: &mut [i32],
    za: u8,
    flip: bool,
) {
    let c = g.cin;
    let nb = acc.len();
    acc.fill(0);
    for ky in 0..g.kh {
        let iy = (oy * g.sh + ky * g.dh).wrapping_sub(g.pt);
        for kx in 0..g.kw {
            let ix = (ox * g.sw + kx * g.dw).wrapping_sub(g.pl);
            let t = ky * g.kw + kx;
            let ws = &w[t * c + cb..t * c + cb + nb];
            if iy >= g.h || ix >= g.w {
                for (a, &wv) in acc.iter_mut().zip(ws) {
                    *a += za as i32 * wv;
                }
                continue;
            }
            let s = ((ni * g.h + iy) * g.w + ix) * c + cb;
            let xs = &x[s..s + nb];
            let f = if flip { 0x80 } else { 0 };
            for ((a, &xv), &wv) in acc.iter_mut().zip(xs).zip(ws) {
                *a += (xv ^ f) as i32 * wv;
            }
        }
    }
}

/// One output row of an NHWC depthwise conv (portable): per pixel and channel block
/// [`dw_pixel`], then the epilogue (whose bias holds `-za * sum_taps w`).
#[allow(clippy::too_many_arguments)]
fn dw_row(
    g: &Geom,
    x: &[u8],
    w: &[i32],
    row: usize,
    o: &mut [u8],
    epi: &QEpilogue,
    za: u8,
    flip: bool,
) {
    let c = g.cin;
    let (ni, oy) = (row / g.oh, row % g.oh);
    let mut acc = [0i32; DW_BLOCK];
    for ox in 0..g.ow {
        let mut cb = 0;
        while cb < c {
            let nb = DW_BLOCK.min(c - cb);
            dw_pixel(g, x, w, (ni, oy, ox), cb, &mut acc[..nb], za, flip);
            epi.store(&acc[..nb], cb, &mut o[ox * c + cb..ox * c + cb + nb]);
            cb += nb;
        }
    }
}

/// Output pixels `cols.0..cols.1` of one row of an NHWC depthwise conv with AVX-512: 16
/// channels in the lanes of one accumulator, per tap the bytes zero-extended to i32 and
/// `vpmaddwd` against the i32 weights (an exact `x * w`), requantized in registers; the
/// channel tail is masked.
///
/// # Safety
/// AVX-512F/BW/VL/VNNI must be available; `x` holds the whole NHWC input, `w` taps * C values,
/// `o` the `ow * C` bytes of output row `row`, `cols.1 <= ow`, and `epi.general` is `None`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn dw_row_vnni512(
    g: &Geom,
    x: &[u8],
    w: &[i32],
    (row, cols): (usize, (usize, usize)),
    o: &mut [u8],
    epi: &QEpilogue,
    za: u8,
    flip: bool,
) {
    use std::arch::x86_64::*;
    let c = g.cin;
    let (ni, oy) = (row / g.oh, row % g.oh);
    let (xp, wp, op) = (x.as_ptr(), w.as_ptr(), o.as_mut_ptr());
    let zav = _mm512_set1_epi32(za as i32);
    let fl = _mm_set1_epi8(if flip { i8::MIN } else { 0 });
    // Four output pixels share each weight load (the last group repeats its final pixel and
    // drops the copies); channel blocks inside, so one group's weights stay in L1.
    const PX: usize = 4;
    // Interior fast path: byte offsets of each tap from a pixel's top-left input, when the
    // whole window of this output row lies inside the image rows.
    let taps = g.kh * g.kw;
    let mut toff = [0usize; 64];
    let rows_ok = oy * g.sh >= g.pt && oy * g.sh - g.pt + (g.kh - 1) * g.dh < g.h;
    let fast = rows_ok && taps <= toff.len();
    if fast {
        for ky in 0..g.kh {
            for kx in 0..g.kw {
                toff[ky * g.kw + kx] = (ky * g.dh * g.w + kx * g.dw) * c;
            }
        }
    }
    let span_x = (g.kw - 1) * g.dw;
    let mut ox0 = cols.0;
    while ox0 < cols.1 {
        let np = PX.min(cols.1 - ox0);
        let mut oxs = [0usize; PX];
        for (p, v) in oxs.iter_mut().enumerate() {
            *v = ox0 + p.min(np - 1);
        }
        if fast && ox0 * g.sw >= g.pl && oxs[PX - 1] * g.sw - g.pl + span_x < g.w {
            let top = (ni * g.h + oy * g.sh - g.pt) * g.w;
            let mut base = [0usize; PX];
            for p in 0..PX {
                base[p] = (top + oxs[p] * g.sw - g.pl) * c;
            }
            let mut cb = 0;
            while cb < c {
                let nb = (c - cb).min(16);
                let m: __mmask16 = if nb == 16 { 0xffff } else { (1u16 << nb) - 1 };
                let mut acc = [_mm512_setzero_si512(); PX];
                let full = nb == 16;
                for (t, &off) in toff[..taps].iter().enumerate() {
                    let wv = _mm512_maskz_loadu_epi32(m, wp.add(t * c + cb));
                    for p in 0..PX {
                        let src = xp.add(base[p] + off + cb);
                        let b = if full {
                            _mm_loadu_si128(src as *const __m128i)
                        } else {
                            _mm_maskz_loadu_epi8(m, src as *const i8)
                        };
                        let b = if flip { _mm_xor_si128(b, fl) } else { b };
                        // Four independent pixel chains hide `vpdpwssd`'s latency.
                        acc[p] = _mm512_dpwssd_epi32(acc[p], _mm512_cvtepu8_epi32(b), wv);
                    }
                }
                for p in 0..np {
                    let q = epi.requant16(acc[p], cb, m);
                    _mm_mask_storeu_epi8(op.add(oxs[p] * c + cb) as *mut i8, m, q);
                }
                cb += nb;
            }
            ox0 += np;
            continue;
        }
        let mut cb = 0;
        while cb < c {
            let nb = (c - cb).min(16);
            let m: __mmask16 = if nb == 16 { 0xffff } else { (1u16 << nb) - 1 };
            let mut acc = [_mm512_setzero_si512(); PX];
            for ky in 0..g.kh {
                let iy = (oy * g.sh + ky * g.dh).wrapping_sub(g.pt);
                let row_ok = iy < g.h;
                let xrow = xp.add((ni * g.h + iy.min(g.h.saturating_sub(1))) * g.w * c + cb);
                for kx in 0..g.kw {
                    let t = ky * g.kw + kx;
                    let wv = _mm512_maskz_loadu_epi32(m, wp.add(t * c + cb));
                    for p in 0..PX {
                        let ix = (oxs[p] * g.sw + kx * g.dw).wrapping_sub(g.pl);
                        let xv = if row_ok && ix < g.w {
                            let b = _mm_maskz_loadu_epi8(m, xrow.add(ix * c) as *const i8);
                            _mm512_cvtepu8_epi32(_mm_xor_si128(b, fl))
                        } else {
                            zav
                        };
                        // `vpmaddwd` + `vpaddd`: exact, and a 1-cycle accumulation chain.
                        acc[p] = _mm512_add_epi32(acc[p], _mm512_madd_epi16(xv, wv));
                    }
                }
            }
            for p in 0..np {
                let q = epi.requant16(acc[p], cb, m);
                _mm_mask_storeu_epi8(op.add(oxs[p] * c + cb) as *mut i8, m, q);
            }
            cb += nb;
        }
        ox0 += np;
    }
}

/// The `vpermb` that puts [`DwLanes`] results back in channel order: byte `4j + s` of the
/// output takes byte `s * 16 + j` of the four requantized vectors laid side by side.
#[cfg(target_arch = "x86_64")]
const LANE_ORDER: [u8; 64] = {
    let mut o = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        o[i] = ((i % 4) * 16 + i / 4) as u8;
        i += 1;
    }
    o
};

/// One output row of an NHWC depthwise conv through [`DwLanes`]: per group of four pixels and
/// 64 channels, one 64-byte load of each tap's input bytes and four `vpdpbusd` against the
/// tap's sparse lanes (16 accumulators), requantized in registers over the permuted epilogue and
/// reordered by one `vpermb`. Rows whose window leaves the image, and the border pixels of the
/// others, go through [`dw_row_vnni512`].
///
/// # Safety
/// AVX-512F/BW/VL/VNNI and VBMI must be available; buffers as for [`dw_row_vnni512`], `l` built
/// for this geometry, and neither epilogue general.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
#[allow(clippy::too_many_arguments)]
unsafe fn dw_row_lanes(
    g: &Geom,
    x: &[u8],
    w: &[i32],
    l: &DwLanes,
    row: usize,
    o: &mut [u8],
    epi: &QEpilogue,
    za: u8,
    flip: bool,
) {
    use std::arch::x86_64::*;
    const PX: usize = 4;
    let c = g.cin;
    let (ni, oy) = (row / g.oh, row % g.oh);
    let taps = g.kh * g.kw;
    let span_x = (g.kw - 1) * g.dw;
    let rows_ok = oy * g.sh >= g.pt && oy * g.sh - g.pt + (g.kh - 1) * g.dh < g.h;
    // Interior pixels: the window's columns inside the image.
    let first = g.pl.div_ceil(g.sw).min(g.ow);
    let end = if g.w + g.pl > span_x {
        ((g.w + g.pl - span_x - 1) / g.sw + 1).clamp(first, g.ow)
    } else {
        first
    };
    if !rows_ok || taps > 64 || first >= end {
        dw_row_vnni512(g, x, w, (row, (0, g.ow)), o, epi, za, flip);
        return;
    }
    if first > 0 {
        dw_row_vnni512(g, x, w, (row, (0, first)), o, epi, za, flip);
    }
    if end < g.ow {
        dw_row_vnni512(g, x, w, (row, (end, g.ow)), o, epi, za, flip);
    }
    let mut toff = [0usize; 64];
    for ky in 0..g.kh {
        for kx in 0..g.kw {
            toff[ky * g.kw + kx] = (ky * g.dh * g.w + kx * g.dw) * c;
        }
    }
    let (xp, wp, op) = (x.as_ptr(), l.w.as_ptr(), o.as_mut_ptr());
    let fl = _mm512_set1_epi8(if flip { i8::MIN } else { 0 });
    let order = _mm512_loadu_si512(LANE_ORDER.as_ptr() as *const _);
    let top = (ni * g.h + oy * g.sh - g.pt) * g.w;
    let le = &l.epi;
    let mut ox0 = first;
    while ox0 < end {
        let np = PX.min(end - ox0);
        let base: [usize; PX] =
            std::array::from_fn(|p| (top + (ox0 + p.min(np - 1)) * g.sw - g.pl) * c);
        for b in 0..l.blocks {
            let cb = b * 64;
            let nb = (c - cb).min(64);
            let m: __mmask64 = if nb == 64 { !0 } else { (1u64 << nb) - 1 };
            let mut acc = [[_mm512_setzero_si512(); 4]; PX];
            for (t, &off) in toff[..taps].iter().enumerate() {
                let wl = wp.add((t * l.blocks + b) * 256);
                let ws: [__m512i; 4] =
                    std::array::from_fn(|s| _mm512_loadu_si512(wl.add(s * 64) as *const _));
                for p in 0..PX {
                    let xv = _mm512_maskz_loadu_epi8(m, xp.add(base[p] + off + cb) as *const i8);
                    let xv = _mm512_xor_si512(xv, fl);
                    for s in 0..4 {
                        acc[p][s] = _mm512_dpbusd_epi32(acc[p][s], xv, ws[s]);
                    }
                }
            }
            for (p, a) in acc.iter().enumerate().take(np) {
                let q: [__m128i; 4] =
                    std::array::from_fn(|s| le.requant16(a[s], cb + s * 16, 0xffff));
                let z = _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_set_m128i(q[1], q[0])),
                    _mm256_set_m128i(q[3], q[2]),
                );
                let z = _mm512_permutexvar_epi8(order, z);
                _mm512_mask_storeu_epi8(op.add((ox0 + p) * c + cb) as *mut i8, m, z);
            }
        }
        ox0 += np;
    }
}

/// One output row of an NHWC depthwise conv with AVX2: 8 channels per accumulator,
/// `vpmaddwd` of zero-extended bytes against i32 weights (exact), requantized in registers;
/// the last `C % 8` channels go through [`dw_pixel`] and the scalar epilogue.
///
/// # Safety
/// AVX2 must be available; buffers as for [`dw_row_vnni512`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn dw_row_avx2(
    g: &Geom,
    x: &[u8],
    w: &[i32],
    row: usize,
    o: &mut [u8],
    epi: &QEpilogue,
    za: u8,
    flip: bool,
) {
    use std::arch::x86_64::*;
    let c = g.cin;
    let c8 = c / 8 * 8;
    let (ni, oy) = (row / g.oh, row % g.oh);
    let (xp, wp) = (x.as_ptr(), w.as_ptr());
    let zav = _mm256_set1_epi32(za as i32);
    let fl = _mm_set1_epi8(if flip { i8::MIN } else { 0 });
    let mut tail = [0i32; 8];
    for ox in 0..g.ow {
        let mut cb = 0;
        while cb < c8 {
            let mut acc = _mm256_setzero_si256();
            for ky in 0..g.kh {
                let iy = (oy * g.sh + ky * g.dh).wrapping_sub(g.pt);
                for kx in 0..g.kw {
                    let ix = (ox * g.sw + kx * g.dw).wrapping_sub(g.pl);
                    let t = ky * g.kw + kx;
                    let wv = _mm256_loadu_si256(wp.add(t * c + cb) as *const __m256i);
                    let xv = if iy < g.h && ix < g.w {
                        let s = ((ni * g.h + iy) * g.w + ix) * c + cb;
                        let b = _mm_loadl_epi64(xp.add(s) as *const __m128i);
                        _mm256_cvtepu8_epi32(_mm_xor_si128(b, fl))
                    } else {
                        zav
                    };
                    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(xv, wv));
                }
            }
            let q = epi.requant8(acc, cb);
            _mm_storel_epi64(o.as_mut_ptr().add(ox * c + cb) as *mut __m128i, q);
            cb += 8;
        }
        if c8 < c {
            let acc = &mut tail[..c - c8];
            dw_pixel(g, x, w, (ni, oy, ox), c8, acc, za, flip);
            epi.store(acc, c8, &mut o[ox * c + c8..ox * c + c]);
        }
    }
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
        if x.bytes.len() != g.n * g.cin * g.h * g.w || out.bytes.len() != g.n * g.cout * g.oh * g.ow
        {
            return Err(Error::Shape(format!("{}: tensor sizes", self.name)));
        }
        match &self.imp {
            #[cfg(target_arch = "x86_64")]
            Imp::Depthwise { w } if self.lanes.is_some() => {
                self.run_lanes(x.bytes, out.bytes, w);
                Ok(())
            }
            #[cfg(target_arch = "x86_64")]
            Imp::Depthwise { .. } if self.taps.is_some() => {
                self.run_tap_groups(x.bytes, out.bytes, scratch)
            }
            Imp::Depthwise { w } => match &self.dw_pad {
                Some(pg) => {
                    let need = pg.n * pg.h * pg.w * pg.cin;
                    let xp = scratch
                        .get_mut(..need)
                        .ok_or_else(|| Error::Shape(format!("{}: scratch too small", self.name)))?;
                    self.pad_input(x.bytes, xp, pg);
                    self.run_depthwise(pg, xp, out.bytes, w);
                    Ok(())
                }
                None => {
                    self.run_depthwise(g, x.bytes, out.bytes, w);
                    Ok(())
                }
            },
            _ => self.run_gemm(x.bytes, out.bytes, scratch),
        }
    }

    fn scratch_bytes(&self) -> usize {
        self.slots * self.slot + self.dw_pad.map_or(0, |p| p.n * p.h * p.w * p.cin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{AutoPad, ConvAttrs, QConvAttrs, QParams, Tensor, TensorData};

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u32 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) as u32
        }
    }

    struct Case {
        nhwc: bool,
        n: usize,
        cin: usize,
        h: usize,
        w: usize,
        cout: usize,
        k: (usize, usize),
        stride: usize,
        pad: [usize; 4],
        dil: usize,
        group: usize,
        signed_in: bool,
        act: Option<crate::ir::Activation>,
    }

    /// Runs one QConv on random data through every available ISA path and compares with a naive
    /// integer reference using the same f32 requantization formula.
    fn check(c: &Case, rng: &mut Rng) {
        let (kh, kw) = c.k;
        let cin_g = c.cin / c.group;
        let xdt = if c.signed_in {
            DataType::I8
        } else {
            DataType::U8
        };
        let x = QParams {
            scale: 0.03,
            zero_point: if c.signed_in { -7 } else { 121 },
            dtype: xdt,
        };
        let y = QParams {
            scale: 0.2,
            zero_point: 9,
            dtype: DataType::U8,
        };
        let xs: Vec<u8> = (0..c.n * c.cin * c.h * c.w)
            .map(|_| rng.next() as u8)
            .collect();
        let wt: Vec<i8> = (0..c.cout * cin_g * kh * kw)
            .map(|_| rng.next() as i8)
            .collect();
        let bias: Vec<i32> = (0..c.cout)
            .map(|_| (rng.next() % 20001) as i32 - 10000)
            .collect();
        let ws: Vec<f32> = (0..c.cout).map(|o| 0.002 + 0.0003 * o as f32).collect();
        let oh = (c.h + c.pad[0] + c.pad[2] - c.dil * (kh - 1) - 1) / c.stride + 1;
        let ow = (c.w + c.pad[1] + c.pad[3] - c.dil * (kw - 1) - 1) / c.stride + 1;
        let xshape = if c.nhwc {
            vec![c.n, c.h, c.w, c.cin]
        } else {
            vec![c.n, c.cin, c.h, c.w]
        };
        let oshape = if c.nhwc {
            vec![c.n, oh, ow, c.cout]
        } else {
            vec![c.n, c.cout, oh, ow]
        };
        // Reference.
        let xat = |ni: usize, ch: usize, yy: usize, xx: usize| -> i32 {
            let i = if c.nhwc {
                ((ni * c.h + yy) * c.w + xx) * c.cin + ch
            } else {
                ((ni * c.cin + ch) * c.h + yy) * c.w + xx
            };
            if c.signed_in {
                xs[i] as i8 as i32
            } else {
                xs[i] as i32
            }
        };
        let (lo, hi) = match c.act {
            Some(crate::ir::Activation::Relu) => (9.0f32, 255.0f32),
            _ => (0.0, 255.0),
        };
        let mut want = vec![0u8; oshape.iter().product()];
        for ni in 0..c.n {
            for o in 0..c.cout {
                let gi = o / (c.cout / c.group);
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut acc = bias[o];
                        for ci in 0..cin_g {
                            for ky in 0..kh {
                                for kx in 0..kw {
                                    let iy =
                                        (oy * c.stride + ky * c.dil) as isize - c.pad[0] as isize;
                                    let ix =
                                        (ox * c.stride + kx * c.dil) as isize - c.pad[1] as isize;
                                    if iy < 0 || ix < 0 || iy >= c.h as isize || ix >= c.w as isize
                                    {
                                        continue;
                                    }
                                    let xv = xat(ni, gi * cin_g + ci, iy as usize, ix as usize)
                                        - x.zero_point;
                                    acc += xv * wt[((o * cin_g + ci) * kh + ky) * kw + kx] as i32;
                                }
                            }
                        }
                        let xu = super::super::qgemm::u8_params(x);
                        let mult = xu.scale * ws[o] / y.scale;
                        let f = acc as f32 * mult;
                        let f = match c.act {
                            Some(crate::ir::Activation::LeakyRelu { alpha }) if f < 0.0 => {
                                f * alpha
                            }
                            _ => f,
                        };
                        let q = (f.round_ties_even() + 9.0).clamp(lo, hi) as u8;
                        let idx = if c.nhwc {
                            ((ni * oh + oy) * ow + ox) * c.cout + o
                        } else {
                            ((ni * c.cout + o) * oh + oy) * ow + ox
                        };
                        want[idx] = q;
                    }
                }
            }
        }
        // Graph with constant input so eval-style running works.
        let mut g = Graph {
            opset: 17,
            ..Default::default()
        };
        let xv = g.add_constant(
            "x",
            Tensor::new(
                xshape,
                if c.signed_in {
                    TensorData::I8(xs.iter().map(|&b| b as i8).collect())
                } else {
                    TensorData::U8(xs.clone())
                },
            )
            .unwrap(),
        );
        let wv = g.add_constant(
            "w",
            Tensor::new(vec![c.cout, cin_g, kh, kw], TensorData::I8(wt.clone())).unwrap(),
        );
        let bv = g.add_constant(
            "b",
            Tensor::new(vec![c.cout], TensorData::I32(bias.clone())).unwrap(),
        );
        let out = g.add_value("y", DataType::U8);
        g.values[out].shape = Some(oshape.clone());
        let node = Node {
            name: "qc".into(),
            op: Op::QConv(QConvAttrs {
                conv: ConvAttrs {
                    kernel_shape: vec![kh, kw],
                    strides: vec![c.stride; 2],
                    pads: c.pad.to_vec(),
                    dilations: vec![c.dil; 2],
                    group: c.group,
                    auto_pad: AutoPad::NotSet,
                    activation: c.act,
                    layout: if c.nhwc { Layout::Nhwc } else { Layout::Nchw },
                },
                x,
                y,
                w_scales: ws.clone(),
                residual: None,
            }),
            inputs: vec![Some(xv), Some(wv), Some(bv)],
            outputs: vec![out],
        };
        assert_eq!(
            crate::ir::shape::infer_node(&g, &node).unwrap()[0].1,
            oshape
        );
        for isa in [QIsa::Portable, QIsa::Avx2, QIsa::AvxVnni, QIsa::Avx512Vnni] {
            if !isa.available() {
                println!("SKIP: QConv {isa:?} path because this CPU lacks it");
                continue;
            }
            let k = build_with(&g, &node, isa).unwrap();
            let mut scratch = vec![0u8; k.scratch_bytes() + 64];
            let xt = g.constant(xv).unwrap();
            let ins = [
                Some(TensorRef {
                    dtype: xdt,
                    shape: &xt.shape,
                    bytes: xt.as_bytes(),
                }),
                None,
                None,
            ];
            let mut got = vec![0u8; want.len()];
            let mut outs = [TensorMut {
                dtype: DataType::U8,
                shape: &oshape,
                bytes: &mut got,
            }];
            k.run(&ins, &mut outs, &mut scratch).unwrap();
            let bad = got.iter().zip(&want).position(|(a, b)| a != b);
            assert!(
                bad.is_none(),
                "{isa:?} nhwc={} group={} k={:?}: element {:?} differs: {} vs {}",
                c.nhwc,
                c.group,
                c.k,
                bad,
                got[bad.unwrap_or(0)],
                want[bad.unwrap_or(0)]
            );
        }
    }

    #[test]
    fn qconv_matches_naive_reference_on_all_paths() {
        let mut rng = Rng(11);
        let base = Case {
            nhwc: true,
            n: 1,
            cin: 8,
            h: 7,
            w: 9,
            cout: 20,
            k: (3, 3),
            stride: 1,
            pad: [1, 1, 1, 1],
            dil: 1,
            group: 1,
            signed_in: false,
            act: None,
        };
        let cases = [
            // im2col with contiguous kernel rows of 24 and 48 bytes (block and slice copies),
            // and an i8 input (flipped, per-tap copies)
            Case { ..base },
            Case {
                cin: 16,
                cout: 40,
                ..base
            },
            Case {
                signed_in: true,
                ..base
            },
            // im2col, odd channel counts, asymmetric padding, stride 2
            Case {
                cin: 3,
                cout: 37,
                pad: [0, 0, 1, 1],
                stride: 2,
                ..base
            },
            // pointwise in place (C % 4 == 0) and with an i8 input (copied and flipped)
            Case {
                k: (1, 1),
                pad: [0; 4],
                cin: 16,
                cout: 33,
                ..base
            },
            Case {
                k: (1, 1),
                pad: [0; 4],
                cin: 16,
                cout: 33,
                signed_in: true,
                act: Some(crate::ir::Activation::Relu),
                ..base
            },
            // depthwise 3x3 and 5x5 stride 2, and more channels than one accumulation block
            Case {
                cin: 24,
                cout: 24,
                group: 24,
                ..base
            },
            Case {
                cin: 300,
                cout: 300,
                group: 300,
                k: (5, 5),
                stride: 2,
                pad: [1, 1, 2, 2],
                signed_in: true,
                ..base
            },
            // depthwise on the tap-interleaved path: a batch of images sharing a worker's
            // ring, a stride that does not divide 4, a kernel two tap groups wide, and a
            // kernel taller than wide over a short image
            Case {
                n: 3,
                cin: 80,
                cout: 80,
                group: 80,
                h: 9,
                w: 11,
                k: (3, 7),
                stride: 3,
                pad: [1, 3, 2, 3],
                signed_in: true,
                ..base
            },
            Case {
                n: 2,
                cin: 20,
                cout: 20,
                group: 20,
                h: 4,
                w: 6,
                k: (5, 2),
                pad: [2, 0, 2, 1],
                ..base
            },
            // one output row per image: every band spans several images' rows
            Case {
                n: 6,
                cin: 24,
                cout: 24,
                group: 24,
                h: 1,
                w: 6,
                k: (3, 2),
                pad: [1, 0, 1, 1],
                ..base
            },
            // depthwise with a channel tail below one vector, stride 2, asymmetric padding,
            // fused activations (the in-register epilogues), and a dilated one
            Case {
                cin: 13,
                cout: 13,
                group: 13,
                stride: 2,
                pad: [0, 1, 2, 0],
                act: Some(crate::ir::Activation::Relu),
                ..base
            },
            Case {
                cin: 40,
                cout: 40,
                group: 40,
                signed_in: true,
                act: Some(crate::ir::Activation::LeakyRelu { alpha: 0.1 }),
                ..base
            },
            Case {
                cin: 32,
                cout: 32,
                group: 32,
                dil: 2,
                pad: [2, 2, 2, 2],
                ..base
            },
            // grouped (not depthwise), dilated
            Case {
                cin: 8,
                cout: 12,
                group: 4,
                dil: 2,
                pad: [2, 2, 2, 2],
                ..base
            },
            // NCHW, batch 2
            Case {
                nhwc: false,
                n: 2,
                cin: 5,
                cout: 7,
                ..base
            },
            Case {
                nhwc: false,
                cin: 6,
                cout: 6,
                group: 6,
                ..base
            },
        ];
        for c in &cases {
            check(c, &mut rng);
        }
    }

    /// Maps large enough to be split into more parts than workers (in a two-worker pool):
    /// depthwise bands (each with its own ring) at stride 1, depthwise rows on the sparse byte
    /// lanes at strides 2 and 3, im2col tiles, and a pointwise conv's rows.
    #[test]
    fn qconv_split_into_more_parts_than_workers_matches_the_reference() {
        let mut rng = Rng(29);
        let base = Case {
            nhwc: true,
            n: 2,
            cin: 24,
            h: 40,
            w: 21,
            cout: 24,
            k: (3, 3),
            stride: 1,
            pad: [1, 1, 1, 1],
            dil: 1,
            group: 24,
            signed_in: false,
            act: None,
        };
        let cases = [
            Case { ..base },
            Case {
                stride: 2,
                pad: [0, 0, 1, 1],
                ..base
            },
            // stride 2 on the sparse byte lanes (AVX-512 VNNI + VBMI): two channel blocks, the
            // second a tail; an i8 input; border pixels on every side; a leaky activation
            Case {
                cin: 100,
                cout: 100,
                group: 100,
                stride: 2,
                signed_in: true,
                act: Some(crate::ir::Activation::LeakyRelu { alpha: 0.1 }),
                ..base
            },
            Case {
                cin: 64,
                cout: 64,
                group: 64,
                stride: 3,
                k: (3, 2),
                pad: [2, 0, 0, 1],
                ..base
            },
            Case {
                cin: 3,
                cout: 16,
                group: 1,
                stride: 2,
                h: 90,
                w: 90,
                ..base
            },
            Case {
                n: 1,
                cin: 64,
                cout: 64,
                group: 1,
                k: (1, 1),
                pad: [0; 4],
                h: 64,
                w: 64,
                ..base
            },
        ];
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        pool.install(|| {
            // The geometries above do split further than one part a worker.
            assert_eq!(super::super::part_count(2 * 40, 8), 8);
            assert_eq!(super::super::part_count(2 * 20, 2), 8);
            assert_eq!(
                super::super::part_count((45 * 45_usize).div_ceil(TILE_ROWS), 2),
                8
            );
            assert_eq!(
                super::super::part_count(64 * 64, MIN_PART_WORK / (64 * 64)),
                8
            );
            for c in &cases {
                check(c, &mut rng);
            }
        });
    }
}
