//! INT8 kernels for the folded QConv and QGemm ops: one thread per output element, 8-bit
//! operands multiplied four at a time with `__dp4a`, i32 accumulation, and the CPU backend's
//! requantization ([`QEpilogue`], same arithmetic) fused, so GPU and CPU outputs agree exactly
//! (activations other than clamps and slopes within one unit of rounding).
//!
//! Accumulation uses signed bytes: with `xu` the input in the u8 domain (i8 inputs flipped),
//! `Σ xu·w = Σ (xu - 128)·w + 128·Σ w`, so the `128·Σ w` term goes into the per-channel bias
//! with the zero-point correction. Padded taps read the input zero point, as on the CPU.

use std::fmt::Write as _;

use super::{act_expr, f32_bytes, flit, input, output, shape_of, unsupported, Arg, Gen, GenKernel};
use crate::backend::cpu::kernels::{
    bias_i32, conv_geometry, u8_params, weights_i8, ConvGeometry, QEpilogue,
};
use crate::error::Result;
use crate::ir::{
    DataType, Graph, Layout, Node, QAddAttrs, QConvAttrs, QGemmAttrs, QParams, ValueId,
};

pub(super) fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The requantization of the i32 sum `t` (bias included) of output channel `co`, stored as
/// byte `i` of `p1`, as CUDA statements.
fn requant(epi: &QEpilogue) -> String {
    format!("{} p1[i] = {REQUANT_BYTE};", requant_value(epi, None))
}

/// The stored byte of the code `q` from [`requant_value`]: its low byte, for u8 and i8 alike.
pub(super) const REQUANT_BYTE: &str = "(u8)q";

/// The requantization of the i32 sum `t` (bias included) of output channel `co` into the int
/// `q` holding the 8-bit code, as CUDA statements; with a residual, its int8 code (an
/// expression) joins the sum in output units first.
///
/// Clamps and slopes round in the integer domain: `__float2int_rn` (round half to even, like
/// `rintf`) and then the integer clamp, which equals the CPU's clamp-then-round because the
/// bounds are integers, in three instructions instead of six (a `min.relu` when the lower
/// bound is the zero point).
pub(super) fn requant_value(epi: &QEpilogue, residual: Option<(&Residual, &str)>) -> String {
    let mut s = requant_float(residual);
    if let Some((act, ys)) = epi.general {
        let real = format!("__fmul_rn(f, {})", flit(ys));
        let _ = write!(
            s,
            " int q; {{ float r = {real}; q = (int)fminf(fmaxf(rintf(__fdiv_rn({}, {})) + {}, {}), {}); }}",
            act_expr(act, "r"),
            flit(ys),
            flit(epi.zy),
            flit(epi.lo),
            flit(epi.hi)
        );
        return s;
    }
    push_slope(&mut s, epi);
    // The bounds and zero point are integers held in f32 (QEpilogue::new).
    let (lo, hi, zy) = (
        (epi.lo - epi.zy) as i32,
        (epi.hi - epi.zy) as i32,
        epi.zy as i32,
    );
    let clamped = if lo == 0 {
        format!("__vimin_s32_relu(__float2int_rn(f), {hi})")
    } else {
        format!("min(max(__float2int_rn(f), {lo}), {hi})")
    };
    if zy == 0 {
        let _ = write!(s, " int q = {clamped};");
    } else {
        let _ = write!(s, " int q = {clamped} + ({zy});");
    }
    s
}

/// The float `f` of [`requant_value`]: the sum in output units, plus the residual's.
fn requant_float(residual: Option<(&Residual, &str)>) -> String {
    let mut s = String::from("float f = __fmul_rn(__int2float_rn(t), mult[co]);");
    if let Some((r, code)) = residual {
        let _ = write!(
            s,
            " f = fmaf({}, (float)((int)({code}) - ({})), f);",
            flit(r.beta),
            r.zero_point
        );
    }
    s
}

/// A LeakyRelu's negative-side slope on `f`, as [`requant_value`] applies it.
fn push_slope(s: &mut String, epi: &QEpilogue) {
    if epi.slope != 1.0 {
        let _ = write!(s, " if (f < 0.f) f = __fmul_rn(f, {});", flit(epi.slope));
    }
}

/// The requantization as [`requant_value`] computes it, but leaving the clamp to a saturating
/// pack of two codes into bytes (`cvt.pack.sat.{type}.s32.b32`: one `I2IP` for two outputs,
/// which ptxas fuses with their conversions into one `F2IP`);
/// `Some((statements, type))` when the epilogue's clamp is one the pack and a saturating
/// conversion can do, which saves the two integer clamps a code (the epilogue is issue-bound).
///
/// - The output type's whole range (no activation, or a u8 ReLU with zero point 0): the code
///   `q = rn(f) + zy` saturated to the type equals the clamp of [`requant_value`]. `f` is kept
///   from ±1e9 on the side `zy` moves towards, so the add cannot wrap.
/// - An s8 ReLU with zero point 0 (`[0, 127]`): `cvt.rni.sat.u8.f32` rounds and clamps to
///   `[0, 255]`, and the s8 pack then cuts it at 127.
pub(super) fn requant_saturating(
    epi: &QEpilogue,
    residual: Option<(&Residual, &str)>,
) -> Option<(String, &'static str)> {
    if epi.general.is_some() {
        return None;
    }
    let (ty, tlo, thi) = if epi.signed {
        ("s8", -128.0, 127.0)
    } else {
        ("u8", 0.0, 255.0)
    };
    let mut s = requant_float(residual);
    push_slope(&mut s, epi);
    let zy = epi.zy as i32;
    if epi.lo == tlo && epi.hi == thi {
        let f = match zy.signum() {
            1 => "fminf(f, 1e9f)",
            -1 => "fmaxf(f, -1e9f)",
            _ => "f",
        };
        let add = if zy == 0 {
            String::new()
        } else {
            format!(" + ({zy})")
        };
        let _ = write!(s, " int q = __float2int_rn({f}){add};");
        return Some((s, ty));
    }
    if epi.signed && zy == 0 && epi.lo == 0.0 && epi.hi == 127.0 {
        s.push_str(r#" int q; asm("cvt.rni.sat.u8.f32 %0, %1;" : "=r"(q) : "f"(f));"#);
        return Some((s, "s8"));
    }
    None
}

/// A GEMM `[m, k] × [k, n]` as the 1x1 convolution of `m` pixels it is.
pub(super) fn gemm_geometry(m: usize, k: usize, n: usize) -> ConvGeometry {
    ConvGeometry {
        n: m,
        cin: k,
        h: 1,
        w: 1,
        cout: n,
        oh: 1,
        ow: 1,
        kh: 1,
        kw: 1,
        sh: 1,
        sw: 1,
        dh: 1,
        dw: 1,
        pt: 0,
        pl: 0,
        groups: 1,
        cin_g: k,
        cout_g: n,
    }
}

/// Per-channel bias (zero-point correction and the `128·Σ w` term folded in) and multiplier.
fn channel_tables(epi: &QEpilogue, col_sums: &[i32]) -> (Vec<i32>, Vec<f32>) {
    let bias = epi
        .bias
        .iter()
        .zip(col_sums)
        .map(|(&b, &s)| b.wrapping_add(s.wrapping_mul(128)))
        .collect();
    (bias, epi.mult.clone())
}

/// A QConv's constants in the GPU kernels' form: weights as `[cout][tap][cin_g padded to 4]`
/// signed bytes, the per-channel bias (see the module docs) and multiplier, the requantization.
pub struct QConvParts {
    pub geom: ConvGeometry,
    pub packed: Vec<u8>,
    /// `cin_g` rounded up to a multiple of 4 (the packed row length per tap).
    pub c4: usize,
    pub bias: Vec<i32>,
    pub mult: Vec<f32>,
    pub epi: QEpilogue,
    /// The signed byte that padded taps contribute (the input zero point, minus 128).
    pub pad_s: i32,
    /// The input is u8 (its bytes are flipped to signed by `^ 0x80`).
    pub flip: bool,
    /// A fused int8 residual (input 3): `beta · (z - zero point)` joins the sum in output
    /// units before the activation.
    pub residual: Option<Residual>,
}

/// The residual of a QConv that absorbed a `QAdd` (int8 `z`, same shape as the output).
#[derive(Clone, Copy, Debug)]
pub struct Residual {
    pub z: ValueId,
    /// `z`'s scale over the output's.
    pub beta: f32,
    pub zero_point: i32,
}

impl QConvParts {
    /// Whether this is a signed 1x1, stride-1, unpadded, ungrouped convolution over whole
    /// 4-byte channel groups: its input is already the GEMM's `[pixels, K]` operand, read in
    /// place (no patch matrix, no copy).
    pub fn reads_input_in_place(&self) -> bool {
        let c = &self.geom;
        !self.flip
            && (c.kh, c.kw, c.sh, c.sw, c.pt, c.pl, c.groups) == (1, 1, 1, 1, 0, 0, 1)
            && (c.oh, c.ow) == (c.h, c.w)
            && self.c4 == c.cin
    }

    /// Validates and packs a QConv node.
    pub fn new(g: &Graph, node: &Node, q: &QConvAttrs) -> Result<QConvParts> {
        let name = format!("QConv '{}'", node.name);
        let x = input(node, 0)?;
        let ok8 = |d: DataType| matches!(d, DataType::U8 | DataType::I8);
        if !ok8(g.values[x].dtype) || !ok8(q.y.dtype) {
            return Err(unsupported(node, "needs 8-bit input and output"));
        }
        let c: ConvGeometry = conv_geometry(g, node, &q.conv, &name)?;
        if q.w_scales.len() != c.cout {
            return Err(unsupported(
                node,
                "needs one weight scale per output channel",
            ));
        }
        let w = weights_i8(g, node)?;
        let bias = bias_i32(g, node, 2, c.cout)?;
        let taps = c.kh * c.kw;
        if w.len() != c.cout * taps * c.cin_g {
            return Err(unsupported(node, "weights do not match the geometry"));
        }
        let c4 = c.cin_g.div_ceil(4) * 4;
        let mut packed = vec![0u8; c.cout * taps * c4];
        let mut sums = vec![0i32; c.cout];
        for o in 0..c.cout {
            for ci in 0..c.cin_g {
                for t in 0..taps {
                    let v = w[(o * c.cin_g + ci) * taps + t];
                    packed[(o * taps + t) * c4 + ci] = v as u8;
                    sums[o] += i32::from(v);
                }
            }
        }
        let xq = u8_params(q.x);
        let epi = QEpilogue::new(xq, &q.w_scales, q.y, &bias, &sums, q.conv.activation);
        let (bias, mult) = channel_tables(&epi, &sums);
        let residual = match q.residual {
            None => None,
            Some(zq) => {
                let z = input(node, 3)?;
                if g.values[z].dtype != DataType::I8 || zq.dtype != DataType::I8 || !epi.signed {
                    return Err(unsupported(node, "a residual needs int8 tensors"));
                }
                Some(Residual {
                    z,
                    beta: zq.scale / q.y.scale,
                    zero_point: zq.zero_point,
                })
            }
        };
        Ok(QConvParts {
            geom: c,
            packed,
            c4,
            bias,
            mult,
            epi,
            pad_s: xq.zero_point.clamp(0, 255) - 128,
            flip: g.values[x].dtype == DataType::U8,
            residual,
        })
    }
}

#[cfg(test)]
impl QConvParts {
    /// Parts for codegen tests: `geom` with `packed` weights (`c4` bytes a tap), zero biases,
    /// multiplier 0.1, an int8 requantization, padding byte `pad_s`, no residual.
    pub(crate) fn for_test(
        geom: ConvGeometry,
        packed: Vec<u8>,
        c4: usize,
        pad_s: i32,
        flip: bool,
    ) -> QConvParts {
        let xq = crate::ir::QParams {
            scale: 0.1,
            zero_point: 0,
            dtype: DataType::I8,
        };
        let cout = geom.cout;
        let zeros = vec![0; cout];
        QConvParts {
            geom,
            packed,
            c4,
            bias: zeros.clone(),
            mult: vec![0.1; cout],
            epi: QEpilogue::new(xq, &vec![0.01; cout], xq, &zeros, &zeros, None),
            pad_s,
            flip,
            residual: None,
        }
    }
}

impl QConvParts {
    /// Validates and packs a QGemm node as the 1x1 convolution it is (`[M, K]` rows as M
    /// pixels of K channels; B as `[N][K padded to 4]`).
    pub fn for_gemm(g: &Graph, node: &Node, q: &QGemmAttrs) -> Result<QConvParts> {
        let a = input(node, 0)?;
        let ok8 = |d: DataType| matches!(d, DataType::U8 | DataType::I8);
        if !ok8(g.values[a].dtype) || !ok8(q.y.dtype) {
            return Err(unsupported(node, "needs 8-bit input and output"));
        }
        let (sa, sb) = (shape_of(g, a)?, shape_of(g, input(node, 1)?)?);
        if sa.len() != 2 || sb.len() != 2 {
            return Err(unsupported(node, "2-D operands needed"));
        }
        let (m, k) = (sa[0], sa[1]);
        let (kb, n) = if q.trans_b {
            (sb[1], sb[0])
        } else {
            (sb[0], sb[1])
        };
        if kb != k || q.w_scales.len() != n {
            return Err(unsupported(node, "operand shapes differ"));
        }
        let w = weights_i8(g, node)?;
        if w.len() != k * n {
            return Err(unsupported(node, "weights do not match the operands"));
        }
        let bias = bias_i32(g, node, 2, n)?;
        let k4 = k.div_ceil(4) * 4;
        let mut packed = vec![0u8; n * k4];
        let mut sums = vec![0i32; n];
        for j in 0..n {
            for kk in 0..k {
                let v = if q.trans_b {
                    w[j * k + kk]
                } else {
                    w[kk * n + j]
                };
                packed[j * k4 + kk] = v as u8;
                sums[j] += i32::from(v);
            }
        }
        let aq = u8_params(q.a);
        let epi = QEpilogue::new(aq, &q.w_scales, q.y, &bias, &sums, q.activation);
        let (bias, mult) = channel_tables(&epi, &sums);
        Ok(QConvParts {
            geom: gemm_geometry(m, k, n),
            packed,
            c4: k4,
            bias,
            mult,
            epi,
            pad_s: aq.zero_point.clamp(0, 255) - 128,
            flip: g.values[a].dtype == DataType::U8,
            residual: None,
        })
    }
}

impl Gen {
    /// An int8 convolution (NCHW or NHWC, any group count, stride, padding and dilation).
    pub fn qconv(&mut self, g: &Graph, node: &Node, q: &QConvAttrs) -> Result<GenKernel> {
        let x = input(node, 0)?;
        let y = output(node, 0)?;
        let parts = QConvParts::new(g, node, q)?;
        let (c, c4, pad_s, flip) = (parts.geom, parts.c4, parts.pad_s, parts.flip);
        let taps = c.kh * c.kw;
        let epi = parts.epi.clone();
        let nhwc = q.conv.layout == Layout::Nhwc;
        let wt = self.extra(parts.packed);
        let bt = self.extra(i32_bytes(&parts.bias));
        let mt = self.extra(f32_bytes(&parts.mult));
        let ConvGeometry {
            n,
            cin,
            h,
            w: wd,
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
            cin_g,
            cout_g,
            ..
        } = c;
        let (shape, qn, qc, qy, qx) = if nhwc {
            ([n, oh, ow, cout], 0, 3, 1, 2)
        } else {
            ([n, cout, oh, ow], 0, 1, 2, 3)
        };
        // The signed byte the input element `e` (u8 bits) contributes.
        let xs = if flip {
            "(int)(signed char)(e ^ 0x80)"
        } else {
            "(int)(signed char)e"
        };
        let vector = nhwc && cin_g % 4 == 0 && cin % 4 == 0;
        let inner = if vector {
            let word = if flip { " ^ 0x80808080u" } else { "" };
            let pad_word = (pad_s as i8 as u8 as u32) * 0x0101_0101;
            format!(
                "const unsigned int* xr = (const unsigned int*)(p0 + ((q{qn}*{h}LL + iy)*{wd}LL + ix)*{cin}LL + c0); \
                 for (int c = 0; c < {cw}; ++c) {{ unsigned int e = inb ? (xr[c]{word}) : {pad_word}u; \
                 acc = __dp4a((int)e, wr[c], acc); }}",
                cw = cin_g / 4
            )
        } else {
            let at = if nhwc {
                format!("((q{qn}*{h}LL + iy)*{wd}LL + ix)*{cin}LL + c0 + c")
            } else {
                format!("((q{qn}*{cin}LL + c0 + c)*{h}LL + iy)*{wd}LL + ix")
            };
            format!(
                "const signed char* wb = (const signed char*)wr; for (int c = 0; c < {cin_g}; ++c) {{ \
                 int v = {pad_s}; if (inb) {{ unsigned int e = p0[{at}]; v = {xs}; }} acc += v * (int)wb[c]; }}"
            )
        };
        let body = format!(
            "{} const int* w4 = (const int*)p2; const int* bias2 = (const int*)p3; const float* mult = (const float*)p4; \
             i64 co = q{qc}; i64 c0 = (co / {cout_g}) * {cin_g}; int acc = 0; \
             for (int ky = 0; ky < {kh}; ++ky) for (int kx = 0; kx < {kw}; ++kx) {{ \
             i64 iy = q{qy}*{sh}LL - {pt}LL + ky*{dh}LL; i64 ix = q{qx}*{sw}LL - {pl}LL + kx*{dw}LL; \
             bool inb = iy >= 0 && iy < {h}LL && ix >= 0 && ix < {wd}LL; if (!inb) {{ iy = 0; ix = 0; }} \
             const int* wr = w4 + (co*{taps} + ky*{kw} + kx)*{c4w}; {inner} }} \
             int t = (int)((unsigned int)acc + (unsigned int)bias2[co]); {}",
            super::decompose(&shape, "q"),
            requant(&epi),
            c4w = c4 / 4,
        );
        Ok(self.kernel(
            &[
                (Arg::Val(x), "const u8".into()),
                (Arg::Val(y), "u8".into()),
                (wt, "const u8".into()),
                (bt, "const u8".into()),
                (mt, "const u8".into()),
            ],
            shape_of(g, y)?.iter().product(),
            &body,
        ))
    }

    /// The QConv's input unfolded into the node's scratch slot (from byte 0) as the signed
    /// `[N·OH·OW, KH·KW·C4]` matrix of a cuBLASLt int8 GEMM (NHWC, one group; C4 is C rounded
    /// up to 4, whose extra bytes meet zero weights): u8 inputs flipped to signed, padded taps
    /// the zero point's signed byte. Four bytes a thread when C % 4 == 0, else one.
    pub fn qim2col_into_scratch(&mut self, x: ValueId, p: &QConvParts) -> GenKernel {
        let c = &p.geom;
        let (sh, sw, pt, pl, dh, dw, h, w) = (c.sh, c.sw, c.pt, c.pl, c.dh, c.dw, c.h, c.w);
        let window = format!(
            "i64 y = q1*{sh}LL - {pt}LL + q3*{dh}LL; i64 xx = q2*{sw}LL - {pl}LL + q4*{dw}LL; \
             bool inb = y >= 0 && y < {h}LL && xx >= 0 && xx < {w}LL;"
        );
        let flip16 = if p.flip {
            " v.x ^= 0x80808080u; v.y ^= 0x80808080u; v.z ^= 0x80808080u; v.w ^= 0x80808080u;"
        } else {
            ""
        };
        let one_by_one = (c.kh, c.kw, sh, sw, pt, pl, c.oh, c.ow) == (1, 1, 1, 1, 0, 0, h, w);
        let (shape, body) = if c.cin.is_multiple_of(16) && one_by_one {
            // The patch matrix is the input itself: a flat 16-byte copy (sign-flipped).
            let shape = [c.n * h * w * c.cin / 16];
            let body = format!("uint4 v = ((const uint4*)p0)[i];{flip16} ((uint4*)p1)[i] = v;");
            (shape.to_vec(), body)
        } else if c.cin.is_multiple_of(16) {
            let c16 = c.cin / 16;
            let pad_word = u32::from(p.pad_s as i8 as u8) * 0x0101_0101;
            let shape = [c.n, c.oh, c.ow, c.kh, c.kw, c16];
            let body = format!(
                "{} {window} uint4 v = make_uint4({pad_word}u, {pad_word}u, {pad_word}u, {pad_word}u); \
                 if (inb) {{ v = ((const uint4*)p0)[((q0*{h}LL + y)*{w}LL + xx)*{c16}LL + q5];{flip16} }} \
                 ((uint4*)p1)[i] = v;",
                super::decompose(&shape, "q"),
            );
            (shape.to_vec(), body)
        } else if c.cin.is_multiple_of(4) {
            let cw = c.cin / 4;
            let flip = if p.flip { " ^ 0x80808080u" } else { "" };
            let pad_word = u32::from(p.pad_s as i8 as u8) * 0x0101_0101;
            let shape = [c.n, c.oh, c.ow, c.kh, c.kw, cw];
            let body = format!(
                "{} {window} unsigned int v = {pad_word}u; \
                 if (inb) v = ((const unsigned int*)p0)[((q0*{h}LL + y)*{w}LL + xx)*{cw}LL + q5]{flip}; \
                 ((unsigned int*)p1)[i] = v;",
                super::decompose(&shape, "q"),
            );
            (shape.to_vec(), body)
        } else {
            // Channels not in whole words (an RGB stem): one thread per output pixel and
            // kernel row, assembling each tap's `c4` bytes into words (4-byte stores; a
            // thread per byte made ResNet-50's 7x7 stem unfold 12% of the batch-32 time).
            let (cin, cw, kw) = (c.cin, p.c4 / 4, c.kw);
            let flip = if p.flip { 0x80 } else { 0 };
            let pad = u32::from(p.pad_s as i8 as u8);
            let shape = [c.n, c.oh, c.ow, c.kh];
            let body = format!(
                "{} i64 y = q1*{sh}LL - {pt}LL + q3*{dh}LL; bool yin = y >= 0 && y < {h}LL; \
                 unsigned int* out = (unsigned int*)p1 + i * {row}LL; \
                 for (int kx = 0; kx < {kw}; ++kx) {{ \
                   i64 xx = q2*{sw}LL - {pl}LL + kx*{dw}LL; bool inb = yin && xx >= 0 && xx < {w}LL; \
                   const u8* src = p0 + ((q0*{h}LL + y)*{w}LL + xx)*{cin}LL; \
                   for (int j = 0; j < {cw}; ++j) {{ unsigned int v = 0u; \
                     for (int b = 0; b < 4; ++b) {{ int ch = j*4 + b; \
                       unsigned int e = ch < {cin} ? (inb ? (unsigned int)(u8)(src[ch] ^ {flip}) : {pad}u) : 0u; \
                       v |= e << (8*b); }} \
                     out[kx*{cw} + j] = v; }} }}",
                super::decompose(&shape, "q"),
                row = kw * cw,
            );
            (shape.to_vec(), body)
        };
        self.kernel(
            &[
                (Arg::Val(x), "const u8".into()),
                (Arg::Scratch, "u8".into()),
            ],
            shape.iter().product(),
            &body,
        )
    }

    /// Requantizes the int32 GEMM result at scratch byte `acc_at` (`[M, cout]`, or the sum of
    /// `splits` such buffers one after another: a split K) into `y`.
    pub fn qrequant(
        &mut self,
        y: ValueId,
        acc_at: usize,
        p: &QConvParts,
        splits: usize,
    ) -> GenKernel {
        let n = p.geom.cout;
        let m = p.geom.n * p.geom.oh * p.geom.ow;
        // Wrapping adds: the partial sums add up to exactly the unsplit int32 sum.
        let sum4: String = (1..splits)
            .map(|s| {
                format!(
                    " {{ int4 b = ((const int4*)p0)[i + {}]; a.x = (int)((unsigned int)a.x + (unsigned int)b.x); \
                     a.y = (int)((unsigned int)a.y + (unsigned int)b.y); a.z = (int)((unsigned int)a.z + (unsigned int)b.z); \
                     a.w = (int)((unsigned int)a.w + (unsigned int)b.w); }}",
                    s * m * n / 4
                )
            })
            .collect();
        let sum1: String = (1..splits)
            .map(|s| format!(" + (unsigned int)((const int*)p0)[i + {}LL]", s * m * n))
            .collect();
        let bt = self.extra(i32_bytes(&p.bias));
        let mt = self.extra(f32_bytes(&p.mult));
        let mut params = vec![
            (Arg::ScratchAt(acc_at), "const u8".to_string()),
            (Arg::Val(y), "u8".into()),
            (bt, "const u8".into()),
            (mt, "const u8".into()),
        ];
        if let Some(r) = &p.residual {
            params.push((Arg::Val(r.z), "const u8".into()));
        }
        if n.is_multiple_of(4) && m * n <= i32::MAX as usize {
            // Four outputs per thread: one 16-byte load of sums, one 4-byte store.
            let mut body = format!(
                "const int* bias2 = (const int*)p2; const float* mult = (const float*)p3; \
                 int4 a = ((const int4*)p0)[i];{sum4} unsigned int co0 = ((unsigned int)i * 4u) % {n}u; \
                 unsigned int out = 0u;"
            );
            if p.residual.is_some() {
                body.push_str(" unsigned int rz = ((const unsigned int*)p4)[i];");
            }
            let byte = REQUANT_BYTE;
            for (lane, comp) in ["x", "y", "z", "w"].iter().enumerate() {
                let code = format!("(signed char)(rz >> {})", 8 * lane);
                let value = requant_value(&p.epi, p.residual.as_ref().map(|r| (r, code.as_str())));
                let _ = write!(
                    body,
                    " {{ unsigned int co = co0 + {lane}u; \
                     int t = (int)((unsigned int)a.{comp} + (unsigned int)bias2[co]); {value} \
                     out |= (unsigned int){byte} << {}; }}",
                    8 * lane
                );
            }
            body.push_str(" ((unsigned int*)p1)[i] = out;");
            return self.kernel(&params, m * n / 4, &body);
        }
        let value = requant_value(
            &p.epi,
            p.residual.as_ref().map(|r| (r, "(signed char)p4[i]")),
        );
        let body = format!(
            "const int* bias2 = (const int*)p2; const float* mult = (const float*)p3; i64 co = i % {n}LL; \
             int t = (int)((unsigned int)((const int*)p0)[i]{sum1} + (unsigned int)bias2[co]); {value} p1[i] = {REQUANT_BYTE};"
        );
        self.kernel(&params, m * n, &body)
    }

    /// An int8 Gemm `y[m, n] = requant(Σ_k a[m, k]·b[k, n] + bias[n])` (B constant).
    pub fn qgemm(&mut self, g: &Graph, node: &Node, q: &QGemmAttrs) -> Result<GenKernel> {
        let a = input(node, 0)?;
        let y = output(node, 0)?;
        let p = QConvParts::for_gemm(g, node, q)?;
        let (m, n, k, k4, flip) = (p.geom.n, p.geom.cout, p.geom.cin, p.c4, p.flip);
        let epi = p.epi.clone();
        let (packed, b2, mult) = (p.packed, p.bias, p.mult);
        let xs = if flip {
            "(int)(signed char)(e ^ 0x80)"
        } else {
            "(int)(signed char)e"
        };
        let wt = self.extra(packed);
        let bt = self.extra(i32_bytes(&b2));
        let mt = self.extra(f32_bytes(&mult));
        let body = format!(
            "const signed char* wb = (const signed char*)p2 + (i % {n}LL) * {k4}LL; const int* bias2 = (const int*)p3; \
             const float* mult = (const float*)p4; i64 co = i % {n}LL; const u8* ar = p0 + (i / {n}LL) * {k}LL; int acc = 0; \
             for (int c = 0; c < {k}; ++c) {{ unsigned int e = ar[c]; acc += {xs} * (int)wb[c]; }} \
             int t = (int)((unsigned int)acc + (unsigned int)bias2[co]); {}",
            requant(&epi)
        );
        Ok(self.kernel(
            &[
                (Arg::Val(a), "const u8".into()),
                (Arg::Val(y), "u8".into()),
                (wt, "const u8".into()),
                (bt, "const u8".into()),
                (mt, "const u8".into()),
            ],
            m * n,
            &body,
        ))
    }
}

impl Gen {
    /// The quantized sum of two 8-bit tensors of one shape: dequantize, add, activation,
    /// requantize, with the CPU kernels' f32 operations (no contraction into FMAs), so the
    /// result matches the CPU exactly for ReLU and no activation.
    pub fn qadd(&mut self, g: &Graph, node: &Node, q: &QAddAttrs) -> Result<GenKernel> {
        let (a, b, y) = (input(node, 0)?, input(node, 1)?, output(node, 0)?);
        let ok8 = |v: ValueId| matches!(g.values[v].dtype, DataType::U8 | DataType::I8);
        if !ok8(a) || !ok8(b) || !ok8(y) || shape_of(g, a)? != shape_of(g, b)? {
            return Err(unsupported(node, "needs 8-bit tensors of one shape"));
        }
        // Element `e` of input `k` (its byte `xb`), dequantized.
        let dq = |xb: &str, p: &QParams| {
            let code = if p.dtype == DataType::I8 {
                format!("(int)(signed char){xb}")
            } else {
                format!("(int){xb}")
            };
            format!(
                "__fmul_rn((float)({code} - ({})), {})",
                p.zero_point,
                flit(p.scale)
            )
        };
        let (lo, hi) = q.y.range();
        let z = q.y.zero_point;
        let act = q.activation.map_or("v".to_string(), |a| act_expr(a, "v"));
        // The requantized sum of bytes `xa`, `xb` as an int (the output byte's value).
        let sum = |xa: &str, xb: &str| {
            format!(
                "{{ float v = __fadd_rn({}, {}); v = {act}; v = __fdiv_rn(v, {}); \
                 if (v != v) v = 0.f; v = fminf(fmaxf(v, {}), {}); r = (int)rintf(v) + ({z}); }}",
                dq(xa, &q.a),
                dq(xb, &q.b),
                flit(q.y.scale),
                flit((lo - z) as f32),
                flit((hi - z) as f32),
            )
        };
        let n: usize = shape_of(g, y)?.iter().product();
        let params = [
            (Arg::Val(a), "const u8".to_string()),
            (Arg::Val(b), "const u8".into()),
            (Arg::Val(y), "u8".into()),
        ];
        if n.is_multiple_of(4) {
            // Four elements per thread: 4-byte loads and store.
            let mut body = String::from(
                "unsigned int wa = ((const unsigned int*)p0)[i], wb = ((const unsigned int*)p1)[i]; \
                 unsigned int out = 0u; int r;",
            );
            for lane in 0..4 {
                let (xa, xb) = (
                    format!("(u8)(wa >> {})", 8 * lane),
                    format!("(u8)(wb >> {})", 8 * lane),
                );
                let _ = write!(
                    body,
                    " {} out |= (unsigned int)(u8)r << {};",
                    sum(&xa, &xb),
                    8 * lane
                );
            }
            body.push_str(" ((unsigned int*)p2)[i] = out;");
            return Ok(self.kernel(&params, n / 4, &body));
        }
        let body = format!("int r; {} p2[i] = (u8)r;", sum("p0[i]", "p1[i]"));
        Ok(self.kernel(&params, n, &body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Activation, QParams};

    /// An s8 → `y` epilogue with activation `act` (one channel).
    fn epilogue(y: QParams, act: Option<Activation>) -> QEpilogue {
        let x = QParams {
            scale: 0.02,
            zero_point: 0,
            dtype: DataType::I8,
        };
        QEpilogue::new(x, &[0.01], y, &[0], &[0], act)
    }

    /// `__float2int_rn` on the host: round half to even, saturating at the i32 range.
    fn float2int_rn(f: f32) -> i32 {
        f.round_ties_even() as i32
    }

    /// An output's parameters, its activation and their epilogue.
    type RequantCase = (QParams, Option<Activation>, QEpilogue);

    /// The epilogues both requantization tests run through (s8 and u8 zero points, with no
    /// activation, ReLU and Clip) and the sums they requantize: ties, values just around the
    /// bounds, and sums far outside the 8-bit range, past the i32 range too.
    fn requant_cases() -> (Vec<RequantCase>, Vec<f32>) {
        let q = |zero_point, dtype| QParams {
            scale: 0.05,
            zero_point,
            dtype,
        };
        let acts = [
            None,
            Some(Activation::Relu),
            Some(Activation::Clip { min: 0.0, max: 6.0 }),
        ];
        let ys = [
            q(0, DataType::I8),
            q(-128, DataType::I8),
            q(7, DataType::I8),
            q(0, DataType::U8),
            q(128, DataType::U8),
            q(3, DataType::U8),
        ];
        let epis = ys
            .iter()
            .flat_map(|&y| acts.map(|act| (y, act, epilogue(y, act))))
            .collect();
        let mut fs: Vec<f32> = (-1200..=1200).map(|i| i as f32 * 0.25).collect();
        fs.extend([
            -3e9, -2.2e9, -1e7, -129.5, -128.5, 127.5, 128.5, 254.5, 255.5, 1e7, 2.2e9, 3e9,
        ]);
        (epis, fs)
    }

    /// The CPU's stored byte for sum `f`: clamp the float, round half to even, add the zero
    /// point.
    fn cpu_code(epi: &QEpilogue, f: f32) -> u8 {
        (f.max(epi.lo - epi.zy)
            .min(epi.hi - epi.zy)
            .round_ties_even()
            + epi.zy) as i32 as u8
    }

    #[test]
    fn integer_clamp_after_rounding_equals_the_cpu_requantization() {
        let (epis, fs) = requant_cases();
        for (y, act, epi) in epis {
            // What requant_value emits for this epilogue, evaluated on the host.
            let (lo, hi, zy) = (
                (epi.lo - epi.zy) as i32,
                (epi.hi - epi.zy) as i32,
                epi.zy as i32,
            );
            for &f in &fs {
                let got = (float2int_rn(f).clamp(lo, hi) + zy) as u8;
                assert_eq!(got, cpu_code(&epi, f), "f {f} y {y:?} act {act:?}");
            }
            let src = requant_value(&epi, None);
            if lo == 0 {
                assert!(src.contains(&format!("__vimin_s32_relu(__float2int_rn(f), {hi})")));
            } else {
                assert!(src.contains(&format!("min(max(__float2int_rn(f), {lo}), {hi})")));
            }
        }
    }

    /// `cvt.pack.sat` on the host: a code saturated to the byte type's range.
    fn pack_sat(q: i32, signed: bool) -> u8 {
        if signed {
            q.clamp(-128, 127) as i8 as u8
        } else {
            q.clamp(0, 255) as u8
        }
    }

    #[test]
    fn saturating_packs_equal_the_cpu_requantization_where_they_apply() {
        let (epis, fs) = requant_cases();
        let mut applied = Vec::new();
        for (y, act, epi) in epis {
            let Some((src, ty)) = requant_saturating(&epi, None) else {
                continue;
            };
            applied.push((y.zero_point, y.dtype, act.is_some()));
            assert_eq!(ty, if epi.signed { "s8" } else { "u8" });
            let zy = epi.zy as i32;
            let relu_s8 = src.contains("cvt.rni.sat.u8.f32");
            for &f in &fs {
                // What the statements and the pack do, evaluated on the host.
                let got = if relu_s8 {
                    pack_sat(float2int_rn(f).clamp(0, 255), true)
                } else {
                    let kept = match zy.signum() {
                        1 => f.min(1e9),
                        -1 => f.max(-1e9),
                        _ => f,
                    };
                    pack_sat(float2int_rn(kept) + zy, epi.signed)
                };
                assert_eq!(got, cpu_code(&epi, f), "f {f} y {y:?} act {act:?}");
            }
            if !relu_s8 {
                let kept = match zy.signum() {
                    1 => "fminf(f, 1e9f)",
                    -1 => "fmaxf(f, -1e9f)",
                    _ => "f",
                };
                assert!(src.contains(&format!("__float2int_rn({kept})")), "{src}");
            }
        }
        // Unclamped s8 and u8 outputs of any zero point, s8 ReLU at zero point 0 and u8 ReLU
        // at zero point 0; never a clamp inside the type's range (Clip, other ReLUs).
        let (s8t, u8t) = (DataType::I8, DataType::U8);
        assert_eq!(
            applied,
            [
                (0, s8t, false),
                (0, s8t, true),
                (-128, s8t, false),
                (-128, s8t, true),
                (7, s8t, false),
                (0, u8t, false),
                (0, u8t, true),
                (128, u8t, false),
                (3, u8t, false),
            ]
        );
    }
}
