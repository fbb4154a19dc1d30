//! Space-to-depth for strided stems. A stride-2 convolution over at most 4 channels (an RGB
//! stem) equals a stride-1 convolution with half the kernel over the input's 2×2 pixel blocks
//! stacked as 16 channels. The implicit GEMM then copies whole 16-byte channel rows
//! (`cp.async`) instead of gathering the stem's 3-byte pixels a byte at a time.
//!
//! Block `(Y, X)` holds the padded input's pixels `(2Y + dy, 2X + dx)` at channels
//! `(dy·2 + dx)·cin + c`; the bytes past `4·cin`, and pixels in the padding, are the input zero
//! point's signed byte (their weights are zero, or they stand for padded taps as before).

use super::quant::QConvParts;
use super::{
    code_range, ctype, input, output, quantize_code, zero_point_param, Arg, Gen, GenKernel,
};
use crate::backend::cpu::kernels::ConvGeometry;
use crate::error::Result;
use crate::ir::{DataType, Graph, Node, ValueId};

impl QConvParts {
    /// The stride-1 convolution over the space-to-depth input that equals this stride-2 one
    /// (same sums, bias and requantization), or None where it does not apply: other strides,
    /// dilation, groups, a 1-wide kernel or more than 4 input channels.
    pub fn space_to_depth(&self) -> Option<QConvParts> {
        let c = self.geom;
        if (c.sh, c.sw, c.dh, c.dw, c.groups) != (2, 2, 1, 1, 1)
            || c.cin > 4
            || c.kh < 2
            || c.kw < 2
        {
            return None;
        }
        let (kh, kw) = (c.kh.div_ceil(2), c.kw.div_ceil(2));
        let geom = ConvGeometry {
            cin: 16,
            h: c.oh + kh - 1,
            w: c.ow + kw - 1,
            kh,
            kw,
            sh: 1,
            sw: 1,
            pt: 0,
            pl: 0,
            cin_g: 16,
            ..c
        };
        let mut packed = vec![0u8; c.cout * kh * kw * 16];
        for o in 0..c.cout {
            for (ky, kx) in (0..c.kh).flat_map(|ky| (0..c.kw).map(move |kx| (ky, kx))) {
                let src = (o * c.kh * c.kw + ky * c.kw + kx) * self.c4;
                let tap = (o * kh + ky / 2) * kw + kx / 2;
                let dst = tap * 16 + ((ky % 2) * 2 + kx % 2) * c.cin;
                packed[dst..dst + c.cin].copy_from_slice(&self.packed[src..src + c.cin]);
            }
        }
        Some(QConvParts {
            geom,
            packed,
            c4: 16,
            bias: self.bias.clone(),
            mult: self.mult.clone(),
            epi: self.epi.clone(),
            pad_s: self.pad_s,
            flip: false,
            residual: self.residual,
        })
    }
}

/// Bytes of the space-to-depth copy that `s2d` (from [`QConvParts::space_to_depth`]) reads.
pub fn space_to_depth_bytes(s2d: &QConvParts) -> usize {
    let c = s2d.geom;
    c.n * c.h * c.w * 16
}

impl Gen {
    /// The space-to-depth copy of `x` (QConv `p`'s input, NHWC) for `s2d` into the node's
    /// scratch at byte `at`: one thread per 16-byte block, u8 inputs flipped to signed.
    pub fn space_to_depth_into_scratch(
        &mut self,
        x: ValueId,
        p: &QConvParts,
        s2d: &QConvParts,
        at: usize,
    ) -> GenKernel {
        let (h, w, cin) = (p.geom.h, p.geom.w, p.geom.cin);
        let params = [
            (Arg::Val(x), "const u8".to_string()),
            (Arg::ScratchAt(at), "u8".into()),
        ];
        self.space_to_depth_kernel(
            &params,
            p,
            s2d,
            "",
            &format!("const u8* src = p0 + ((q0 * {h} + y) * {w} + xx) * {cin};"),
            "const unsigned int v = (unsigned int)(u8)src[c];",
        )
    }

    /// QuantizeLinear `q` of an NCHW float image, its NHWC transpose and the space-to-depth
    /// copy for `s2d` (QConv `p` reads the transpose) as one kernel into the node's scratch at
    /// byte `at`: each code as [`Gen::quantize_to_nhwc`] computes it, placed as
    /// [`Gen::space_to_depth_into_scratch`] places it, without the NHWC codes in between.
    pub fn quantize_space_to_depth_into_scratch(
        &mut self,
        g: &Graph,
        q: &Node,
        p: &QConvParts,
        s2d: &QConvParts,
        at: usize,
    ) -> Result<GenKernel> {
        let x = input(q, 0)?;
        let yt = g.values[output(q, 0)?].dtype;
        let (lo, hi) = code_range(yt);
        let mut params = vec![
            (Arg::Val(x), format!("const {}", ctype(DataType::F32))),
            (Arg::ScratchAt(at), "u8".into()),
        ];
        params.push(self.scale_param(g, input(q, 1)?));
        let (h, w, cin, pt, pl) = (p.geom.h, p.geom.w, p.geom.cin, p.geom.pt, p.geom.pl);
        // All of the block's floats are loaded first (unpredicated, from a valid address, then
        // zeroed outside the image): the quantization's division has a slow-path branch,
        // which would otherwise leave each load waiting on the one before.
        let prelude = format!(
            r#"float s = (float)p2[0]; {}
  float xv[{n}];
#pragma unroll
  for (int sub = 0; sub < 4; ++sub) {{
    const i64 y = q1 * 2 + (sub >> 1) - {pt}, xx = q2 * 2 + (sub & 1) - {pl};
    const bool in = y >= 0 && y < {h} && xx >= 0 && xx < {w};
    const i64 px = (q0 * {cin} * {h} + (in ? y : 0)) * {w} + (in ? xx : 0);
#pragma unroll
    for (int c = 0; c < {cin}; ++c) {{ const float f = (float)p0[px + c * {hw}LL]; xv[sub * {cin} + c] = in ? f : 0.f; }}
  }}"#,
            zero_point_param(g, q, &mut params, "z"),
            n = 4 * cin,
            hw = h * w,
        );
        Ok(self.space_to_depth_kernel(
            &params,
            p,
            s2d,
            &prelude,
            "",
            &format!(
                "{} q; {} const unsigned int v = (unsigned int)(u8)q;",
                ctype(yt),
                quantize_code("xv[b]", yt, lo, hi)
            ),
        ))
    }

    /// The space-to-depth kernel over `params` (p1 the destination): after `prelude`, each
    /// input pixel `(q0, y, xx)` in range runs `pixel`, then `code` per channel `c`, which
    /// declares the pixel's code `v` (flipped to signed here for u8 inputs).
    fn space_to_depth_kernel(
        &mut self,
        params: &[(Arg, String)],
        p: &QConvParts,
        s2d: &QConvParts,
        prelude: &str,
        pixel: &str,
        code: &str,
    ) -> GenKernel {
        let (c, d) = (p.geom, s2d.geom);
        let (h, w, cin, pt, pl) = (c.h, c.w, c.cin, c.pt, c.pl);
        let pad_word = u32::from(p.pad_s as i8 as u8) * 0x0101_0101;
        let flip = if p.flip { 0x80 } else { 0 };
        let shape = [d.n, d.h, d.w];
        let body = format!(
            r#"{decompose} {prelude}
  unsigned int wv[4] = {{{pad_word}u, {pad_word}u, {pad_word}u, {pad_word}u}};
#pragma unroll
  for (int sub = 0; sub < 4; ++sub) {{
    const i64 y = q1 * 2 + (sub >> 1) - {pt}, xx = q2 * 2 + (sub & 1) - {pl};
    if (y >= 0 && y < {h} && xx >= 0 && xx < {w}) {{
      {pixel}
#pragma unroll
      for (int c = 0; c < {cin}; ++c) {{
        const int b = sub * {cin} + c;
        {{ {code}
          wv[b >> 2] = (wv[b >> 2] & ~(0xFFu << (8 * (b & 3)))) | ((v ^ {flip}u) << (8 * (b & 3))); }}
      }}
    }}
  }}
  ((uint4*)p1)[i] = make_uint4(wv[0], wv[1], wv[2], wv[3]);"#,
            decompose = super::decompose(&shape, "q"),
        );
        self.kernel(params, shape.iter().product(), &body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Tensor, TensorData};

    /// A stem-like QConv: `cin` channels (4 bytes a tap), `k`×`k` kernel, stride 2, padding
    /// `pad` (top/left), over an `h`×`w` image; weights and zero point from `seed`.
    fn stem(cin: usize, k: usize, pad: usize, (h, w): (usize, usize), seed: u32) -> QConvParts {
        let cout = 8;
        let geom = ConvGeometry::plain(2, (cin, cout), (h, w), (k, 2, pad));
        let mut r = seed;
        let mut next = move || {
            r = r.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            (r >> 16) as u8
        };
        let mut packed = vec![0u8; cout * k * k * 4];
        for (i, b) in packed.iter_mut().enumerate() {
            if i % 4 < cin {
                *b = next();
            }
        }
        let pad_s = i32::from(next() as i8);
        QConvParts::for_test(geom, packed, 4, pad_s, seed.is_multiple_of(2))
    }

    /// The signed sums `[pixel][cout]` of `p` over the NHWC bytes `x`, as the implicit GEMM
    /// forms them: inputs flipped when `p.flip`, padded taps `p.pad_s`, extra channels zero.
    fn sums(p: &QConvParts, x: &[u8]) -> Vec<i32> {
        let c = p.geom;
        let flip = if p.flip { 0x80 } else { 0 };
        let mut out = Vec::new();
        for (n, oy, ox) in (0..c.n)
            .flat_map(|n| (0..c.oh).flat_map(move |oy| (0..c.ow).map(move |ox| (n, oy, ox))))
        {
            for o in 0..c.cout {
                let mut s = 0i32;
                for ky in 0..c.kh {
                    for kx in 0..c.kw {
                        let iy = (oy * c.sh + ky * c.dh) as isize - c.pt as isize;
                        let ix = (ox * c.sw + kx * c.dw) as isize - c.pl as isize;
                        let inside =
                            (0..c.h as isize).contains(&iy) && (0..c.w as isize).contains(&ix);
                        for ci in 0..p.c4 {
                            let v = match (inside, ci < c.cin) {
                                (false, _) => p.pad_s,
                                (true, false) => 0,
                                (true, true) => {
                                    let at = ((n * c.h + iy as usize) * c.w + ix as usize) * c.cin;
                                    i32::from((x[at + ci] ^ flip) as i8)
                                }
                            };
                            let wt = p.packed[((o * c.kh + ky) * c.kw + kx) * p.c4 + ci];
                            s += v * i32::from(wt as i8);
                        }
                    }
                }
                out.push(s);
            }
        }
        out
    }

    /// What the space-to-depth kernel writes, on the CPU (the GPU tests check the kernel
    /// itself against the CPU backend).
    fn blocks(p: &QConvParts, s2d: &QConvParts, x: &[u8]) -> Vec<u8> {
        let (c, d) = (p.geom, s2d.geom);
        let flip = if p.flip { 0x80 } else { 0 };
        let mut out = vec![p.pad_s as i8 as u8; space_to_depth_bytes(s2d)];
        for (n, by, bx) in
            (0..d.n).flat_map(|n| (0..d.h).flat_map(move |y| (0..d.w).map(move |x| (n, y, x))))
        {
            for sub in 0..4 {
                let y = (by * 2 + sub / 2) as isize - c.pt as isize;
                let xx = (bx * 2 + sub % 2) as isize - c.pl as isize;
                if (0..c.h as isize).contains(&y) && (0..c.w as isize).contains(&xx) {
                    for ch in 0..c.cin {
                        let src = ((n * c.h + y as usize) * c.w + xx as usize) * c.cin + ch;
                        out[((n * d.h + by) * d.w + bx) * 16 + sub * c.cin + ch] = x[src] ^ flip;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn strided_stems_equal_their_space_to_depth_form() {
        // ResNet's 7x7/2 pad 3, the 3x3/2 stems (pad 1, and TF-style pad 0), odd image sizes.
        for (i, &(cin, k, pad, hw)) in [
            (3, 7, 3, (23, 18)),
            (3, 3, 1, (16, 16)),
            (3, 3, 0, (17, 15)),
            (4, 5, 2, (11, 12)),
            (1, 3, 1, (9, 10)),
        ]
        .iter()
        .enumerate()
        {
            let p = stem(cin, k, pad, hw, i as u32 + 7);
            let s2d = p.space_to_depth().expect("a stride-2 stem");
            let d = s2d.geom;
            assert_eq!((d.sh, d.pt, d.cin, s2d.c4, s2d.flip), (1, 0, 16, 16, false));
            assert_eq!((d.oh, d.ow), (p.geom.oh, p.geom.ow));
            let c = p.geom;
            let x: Vec<u8> = (0..c.n * c.h * c.w * c.cin)
                .map(|j| (j * 37 + i * 11) as u8)
                .collect();
            let want = sums(&p, &x);
            assert!(want.iter().any(|&s| s != 0));
            assert_eq!(sums(&s2d, &blocks(&p, &s2d, &x)), want, "case {i}");
        }
    }

    #[test]
    fn only_small_stride_two_convolutions_are_rewritten() {
        assert!(stem(3, 7, 3, (20, 20), 1).space_to_depth().is_some());
        let mut p = stem(3, 3, 1, (20, 20), 1);
        p.geom.sh = 1;
        assert!(p.space_to_depth().is_none());
        let mut p = stem(3, 3, 1, (20, 20), 1);
        p.geom.dh = 2;
        assert!(p.space_to_depth().is_none());
        let mut p = stem(3, 1, 0, (20, 20), 1);
        p.geom.cin = 8;
        assert!(p.space_to_depth().is_none());
        assert!(stem(3, 1, 0, (20, 20), 1).space_to_depth().is_none());
    }

    #[test]
    fn the_copy_kernel_writes_whole_blocks_into_scratch() {
        let p = stem(3, 7, 3, (23, 18), 2);
        let s2d = p.space_to_depth().expect("a stride-2 stem");
        let mut g = Gen::new(false);
        let k = g.space_to_depth_into_scratch(5, &p, &s2d, 4096);
        assert_eq!(k.args, vec![Arg::Val(5), Arg::ScratchAt(4096)]);
        assert_eq!(k.threads, space_to_depth_bytes(&s2d) / 16);
        assert!(g.src.contains("(u8)src[c];") && g.src.contains("(v ^ 128u)"));
    }

    #[test]
    fn an_image_quantizes_straight_into_the_stems_blocks() {
        // x [2, 3, 23, 18] f32 -> QuantizeLinear (u8, per tensor, zero point 128) -> the stem.
        let p = stem(3, 7, 3, (23, 18), 2);
        let s2d = p.space_to_depth().expect("a stride-2 stem");
        let mut g = Graph::default();
        let x = g.add_value("x", DataType::F32);
        g.values[x].shape = Some(vec![2, 3, 23, 18]);
        let scale = Tensor::from_f32(vec![1], vec![0.02]).expect("scale");
        let zero = Tensor::new(vec![1], TensorData::U8(vec![128])).expect("zero point");
        let inputs = vec![
            Some(x),
            Some(g.add_constant("s", scale)),
            Some(g.add_constant("z", zero)),
        ];
        let y = g.add_value("xq", DataType::U8);
        g.values[y].shape = Some(vec![2, 3, 23, 18]);
        g.nodes.push(Node {
            name: "q".into(),
            op: crate::ir::Op::QuantizeLinear {
                axis: 1,
                dtype: None,
            },
            inputs: inputs.clone(),
            outputs: vec![y],
        });
        let mut gen = Gen::new(false);
        let k = gen
            .quantize_space_to_depth_into_scratch(&g, &g.nodes[0], &p, &s2d, 512)
            .expect("kernel");
        // The float image in, the blocks out (one 16-byte block a thread, as the copy kernel),
        // then the scale (a constant table) and the zero point.
        assert_eq!(k.args[..2], [Arg::Val(x), Arg::ScratchAt(512)]);
        assert!(matches!(k.args[2], Arg::Extra(_)));
        assert_eq!(k.args[3], Arg::Val(inputs[2].expect("zero point")));
        assert_eq!(k.threads, space_to_depth_bytes(&s2d) / 16);
        // Channel c of pixel (y, x) is read from its plane of 23 x 18 floats (all twelve
        // first), quantized, then flipped.
        let px = "const i64 px = (q0 * 3 * 23 + (in ? y : 0)) * 18 + (in ? xx : 0);";
        assert!(gen.src.contains(px) && gen.src.contains("xv[12]"));
        assert!(gen.src.contains("(float)p0[px + c * 414LL]"));
        assert!(gen.src.contains("float v = xv[b] / s;") && gen.src.contains("(v ^ 128u)"));
    }
}
