//! Int8 GEMMs with few rows (a classifier's fully connected layer: `M` = the batch, at most
//! 64), as tensor-core `mma.sync` with the operands swapped: the weights `[N][K]` are the A
//! operand (16 output channels a tile) and the activation rows are B (16 rows a tile, two
//! `n8` halves), so no tile is padded to 64 or 128 rows. A block's warps split K, one 64-byte
//! chunk each (up to 32 warps: no warp waits on a chain of loads), add their int32 sums through
//! shared memory and requantize with the CPU's arithmetic
//! ([`requant_value`]), then apply the DequantizeLinear that reads the codes, so a
//! classifier's logits leave as f32 from this one kernel.
//!
//! Each lane loads 16 consecutive bytes of a weight row and of an activation row: words 0–1
//! feed one `m16n8k32` (fragment K positions `4·tig..` and `16 + 4·tig..`), words 2–3 the
//! next. A and B take the same K permutation, so the sums are unchanged.

use super::quant::{requant_value, QConvParts};
use super::{ctype, input, output, Arg, Gen, GenKernel, LaunchDims};
use crate::error::Result;
use crate::ir::{DataType, Graph, Node, Op, QGemmAttrs, ValueId};

/// The most rows (`M`) the narrow kernel takes: past it the weights are read from L2 once per
/// 16 rows and the implicit GEMM's tiles fill up.
pub const NARROW_MAX_ROWS: usize = 64;

/// The most warps a narrow block runs (1024 threads), each over one 64-byte K chunk.
const NARROW_MAX_WARPS: usize = 32;

/// Whether QGemm `p` (from [`QConvParts::for_gemm`]) fits the narrow kernel: at most
/// [`NARROW_MAX_ROWS`] rows, K a whole number of 16-byte pieces (aligned row loads) and at most
/// 8192 (a lane holds its weights for all of K in registers), no residual.
pub fn narrow_gemm_fits(p: &QConvParts) -> bool {
    let c = &p.geom;
    (c.kh, c.kw, c.h, c.w, c.groups) == (1, 1, 1, 1, 1)
        && (1..=NARROW_MAX_ROWS).contains(&c.n)
        && c.cin.is_multiple_of(16)
        && c.cin <= 8192
        && p.c4 == c.cin
        && p.residual.is_none()
        && c.n * c.cout <= i32::MAX as usize
}

/// Whether DequantizeLinear `dq` of QGemm `qg`'s codes may run inside the narrow kernel
/// ([`Gen::narrow_qgemm_dequantize`]): a constant per-tensor f32 scale, a constant per-tensor
/// zero point of the codes' type (or none), f32 out. (The kernel reads them before it waits
/// for the previous kernel.) The caller checks that `dq` is the codes' only reader, that
/// they are not a graph output and that the QGemm fits ([`narrow_gemm_fits`]).
pub fn narrow_dequantize_fits(g: &Graph, qg: &Node, dq: &Node) -> bool {
    let (Op::QGemm(_), Op::DequantizeLinear { .. }) = (&qg.op, &dq.op) else {
        return false;
    };
    let (Some(&codes), Some(sv), Some(&y)) = (qg.outputs.first(), dq.input(1), dq.outputs.first())
    else {
        return false;
    };
    let one = |v: ValueId| {
        g.constant(v).is_some()
            && g.values[v]
                .shape
                .as_ref()
                .is_some_and(|s| s.iter().product::<usize>() == 1)
    };
    dq.input(0) == Some(codes)
        && one(sv)
        && g.values[sv].dtype == DataType::F32
        && dq
            .input(2)
            .is_none_or(|z| one(z) && g.values[z].dtype == g.values[codes].dtype)
        && g.values[y].dtype == DataType::F32
}

/// The DequantizeLinear the narrow kernel applies to its codes, writing f32:
/// `(float)(code - zero point) * scale`, as the DequantizeLinear kernel computes it.
pub struct Dequantize {
    /// The output (f32).
    pub y: ValueId,
    /// The per-tensor scale (a value or constant table) and its C element type.
    pub scale: (Arg, String),
    /// The per-tensor zero point (a value) and its C element type; None: zero.
    pub zero_point: Option<(Arg, String)>,
}

impl Gen {
    /// QGemm `qg` and the DequantizeLinear `dq` that reads its codes as one narrow kernel
    /// (check [`narrow_gemm_fits`] and [`narrow_dequantize_fits`]): the codes never reach memory.
    pub fn narrow_qgemm_dequantize(
        &mut self,
        g: &Graph,
        qg: &Node,
        q: &QGemmAttrs,
        dq: &Node,
    ) -> Result<GenKernel> {
        let p = QConvParts::for_gemm(g, qg, q)?;
        let scale = self.scale_param(g, input(dq, 1)?);
        let zero_point = dq
            .input(2)
            .map(|z| (Arg::Val(z), format!("const {}", ctype(g.values[z].dtype))));
        let out = Dequantize {
            y: output(dq, 0)?,
            scale,
            zero_point,
        };
        Ok(self.narrow_qgemm(input(qg, 0)?, &p, out))
    }

    /// The narrow int8 GEMM of QGemm `p` (check [`narrow_gemm_fits`]) over activation rows `x`
    /// (`[M][K]` 8-bit codes), dequantized by `out`: a block per 16 output channels by 16 rows.
    fn narrow_qgemm(&mut self, x: ValueId, p: &QConvParts, out: Dequantize) -> GenKernel {
        let c = &p.geom;
        let (m, n, k) = (c.n, c.cout, c.cin);
        let tables = [
            self.extra(p.packed.clone()),
            self.extra(super::quant::i32_bytes(&p.bias)),
            self.extra(super::f32_bytes(&p.mult)),
        ];
        // x, y, then the weights, bias and multipliers (p2..p4), then the DQ's scale and
        // zero point.
        let mut params: Vec<(Arg, String)> = vec![
            (Arg::Val(x), "const u8".into()),
            (Arg::Val(out.y), "float".into()),
        ];
        params.extend(tables.map(|a| (a, "const u8".to_string())));
        params.push(out.scale);
        let z = match out.zero_point {
            Some(zp) => {
                params.push(zp);
                "(i64)p6[0]"
            }
            None => "0",
        };
        let store = format!("p1[(i64)row * {n} + co] = (float)((i64)q - dqz) * dqs;");
        let flip = if p.flip { "0x80808080u" } else { "0u" };
        // The channel's multiplier is loaded before the K loop (`mco`), off the epilogue's path.
        let value = requant_value(&p.epi, None).replace("mult[co]", "mco");
        let name = self.next_name();
        let plist = Self::param_list(&params);
        let mma = |acc: &str, a: [&str; 4], b: [&str; 2]| {
            format!(
                r#"asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, {{%8, %9}}, {{%0, %1, %2, %3}};" : "+r"({acc}[0]), "+r"({acc}[1]), "+r"({acc}[2]), "+r"({acc}[3]) : "r"({}), "r"({}), "r"({}), "r"({}), "r"({}), "r"({}));"#,
                a[0], a[1], a[2], a[3], b[0], b[1]
            )
        };
        let mmas = [
            mma("c0", ["a0.x", "a1.x", "a0.y", "a1.y"], ["b0.x", "b0.y"]),
            mma("c0", ["a0.z", "a1.z", "a0.w", "a1.w"], ["b0.z", "b0.w"]),
            mma("c1", ["a0.x", "a1.x", "a0.y", "a1.y"], ["b1.x", "b1.y"]),
            mma("c1", ["a0.z", "a1.z", "a0.w", "a1.w"], ["b1.z", "b1.w"]),
        ]
        .join("\n      ");
        // A warp per 64-byte K chunk, 8 to 32 warps a block (the epilogue's 256 threads at
        // least); past 32 chunks a warp takes several.
        let warps = k.div_ceil(64).clamp(8, NARROW_MAX_WARPS);
        let (per_warp, threads, one_each) =
            (k.div_ceil(64).div_ceil(warps), warps * 32, warps * 64);
        let _ = std::fmt::Write::write_fmt(
            &mut self.src,
            format_args!(
                r#"
extern "C" __global__ void __launch_bounds__({threads}) {name}({plist}) {{
  // Per warp, its int32 sums of the block's 16 channels by 16 rows (row stride 17: no bank
  // conflicts when the block adds them up).
  __shared__ int part[{warps}][16 * 17];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const int n0 = blockIdx.x * 16, m0 = blockIdx.y * 16;
  const u8* wa = p2 + (i64)min(n0 + g, {n} - 1) * {k};
  const u8* wb = p2 + (i64)min(n0 + g + 8, {n} - 1) * {k};
  const u8* xa = p0 + (i64)min(m0 + g, {m} - 1) * {k};
  const u8* xb = p0 + (i64)min(m0 + g + 8, {m} - 1) * {k};
  const bool oka = n0 + g < {n}, okb = n0 + g + 8 < {n}, oxa = m0 + g < {m}, oxb = m0 + g + 8 < {m};
  int c0[4] = {{0, 0, 0, 0}}, c1[4] = {{0, 0, 0, 0}};
  // Weights, tables and the dequantization are constants: loaded while the previous kernel
  // finishes. Warp w takes the 64-byte K chunks w, w + {warps}, ... (one each up to
  // K = {one_each}: no chain of loads waiting on mmas). Loads are unpredicated, from clamped
  // (valid) addresses, and zeroed after (lanes past K, rows past N or M): ptxas issues them
  // together. Every lane runs every chunk (mma.sync is warp-wide).
  const int cl = min(n0 + (int)(threadIdx.x & 15), {n} - 1);
  const int bco = ((const int*)p3)[cl];
  const float mco = ((const float*)p4)[cl];
  const float dqs = (float)p5[0];
  const i64 dqz = {z};
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  uint4 ra0[{per_warp}], ra1[{per_warp}];
#pragma unroll
  for (int kg = 0; kg < {per_warp}; ++kg) {{
    const int kc = min((warp + kg * {warps}) * 64 + tig * 16, {k} - 16);
    ra0[kg] = *(const uint4*)(wa + kc);
    ra1[kg] = *(const uint4*)(wb + kc);
  }}
  GRID_SYNC();
#pragma unroll
  for (int kg = 0; kg < {per_warp}; ++kg) {{
    const int kc = min((warp + kg * {warps}) * 64 + tig * 16, {k} - 16);
    const bool in = (warp + kg * {warps}) * 64 + tig * 16 < {k};
    const uint4 rb0 = *(const uint4*)(xa + kc), rb1 = *(const uint4*)(xb + kc);
    const uint4 a0 = in && oka ? ra0[kg] : zero, a1 = in && okb ? ra1[kg] : zero;
    uint4 b0 = in && oxa ? rb0 : zero, b1 = in && oxb ? rb1 : zero;
    b0.x ^= {flip}; b0.y ^= {flip}; b0.z ^= {flip}; b0.w ^= {flip};
    b1.x ^= {flip}; b1.y ^= {flip}; b1.z ^= {flip}; b1.w ^= {flip};
    {mmas}
  }}
  // Accumulator (r, c): channel g (+8 for c[2], c[3]), row 2·tig (+1) of the n8 half.
  int* mine = part[warp];
#pragma unroll
  for (int e = 0; e < 4; ++e) {{
    const int ch = g + (e >> 1) * 8, r = tig * 2 + (e & 1);
    mine[ch * 17 + r] = c0[e];
    mine[ch * 17 + 8 + r] = c1[e];
  }}
  __syncthreads();
  // The first 256 threads: thread -> (row, channel), channels fastest (consecutive stores).
  const int row = m0 + (threadIdx.x >> 4), chl = threadIdx.x & 15, co = n0 + chl;
  unsigned int s = 0u;
  if (threadIdx.x >= 256) return;
#pragma unroll
  for (int w = 0; w < {warps}; ++w) s += (unsigned int)part[w][chl * 17 + (threadIdx.x >> 4)];
  if (row < {m} && co < {n}) {{
    int t = (int)(s + (unsigned int)bco);
    {value}
    {store}
  }}
}}
"#
            ),
        );
        GenKernel {
            name,
            threads: m * n,
            args: params.iter().map(|(a, _)| *a).collect(),
            launch: Some(LaunchDims {
                grid: (n.div_ceil(16) as u32, m.div_ceil(16) as u32, 1),
                block: threads as u32,
                smem: 0,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::quant::gemm_geometry;
    use super::*;
    use crate::backend::cpu::kernels::QEpilogue;
    use crate::ir::QParams;

    /// A QGemm's parts with `m` rows, `k` deep and `n` outputs.
    fn gemm(m: usize, k: usize, n: usize) -> QConvParts {
        let geom = gemm_geometry(m, k, n);
        let q = QParams {
            scale: 0.1,
            zero_point: 0,
            dtype: DataType::I8,
        };
        let zeros = vec![0; n];
        QConvParts {
            geom,
            packed: vec![1; n * k],
            c4: k,
            bias: zeros.clone(),
            mult: vec![0.1; n],
            epi: QEpilogue::new(q, &vec![0.01; n], q, &zeros, &zeros, None),
            pad_s: 0,
            flip: false,
            residual: None,
        }
    }

    #[test]
    fn narrow_gemms_take_few_rows_and_whole_16_byte_rows() {
        // ResNet-50's and EfficientNet-Lite0's classifiers at batch 1 and 32.
        for (m, k) in [(1, 2048), (32, 2048), (32, 1280), (NARROW_MAX_ROWS, 1280)] {
            assert!(narrow_gemm_fits(&gemm(m, k, 1000)), "m {m} k {k}");
        }
        assert!(!narrow_gemm_fits(&gemm(NARROW_MAX_ROWS + 1, 2048, 1000)));
        assert!(!narrow_gemm_fits(&gemm(32, 2040, 1000)));
    }

    #[test]
    fn only_a_constant_per_tensor_dequantize_joins_the_kernel() {
        use crate::ir::{QGemmAttrs, Tensor, TensorData};
        // codes (i8 [2, 8]) from a QGemm -> DequantizeLinear (scale, zero point) -> f32.
        let graph = |scales: usize, constant: bool, zp: DataType| {
            let mut g = Graph::default();
            let a = g.add_value("a", DataType::I8);
            let codes = g.add_value("codes", DataType::I8);
            let q = QParams {
                scale: 0.1,
                zero_point: 0,
                dtype: DataType::I8,
            };
            g.nodes.push(Node {
                name: "fc".into(),
                op: Op::QGemm(QGemmAttrs {
                    trans_b: true,
                    a: q,
                    y: q,
                    w_scales: vec![0.01; 8],
                    activation: None,
                }),
                inputs: vec![Some(a)],
                outputs: vec![codes],
            });
            let s = Tensor::from_f32(vec![scales], vec![0.5; scales]).expect("scale");
            let s = if constant {
                g.add_constant("s", s)
            } else {
                let v = g.add_value("s", DataType::F32);
                g.values[v].shape = Some(vec![scales]);
                v
            };
            let z = match zp {
                DataType::I8 => TensorData::I8(vec![0]),
                _ => TensorData::U8(vec![0]),
            };
            let z = g.add_constant("z", Tensor::new(vec![1], z).expect("zero point"));
            let y = g.add_value("y", DataType::F32);
            g.nodes.push(Node {
                name: "dq".into(),
                op: Op::DequantizeLinear { axis: 1 },
                inputs: vec![Some(codes), Some(s), Some(z)],
                outputs: vec![y],
            });
            g
        };
        let fits = |g: &Graph| narrow_dequantize_fits(g, &g.nodes[0], &g.nodes[1]);
        assert!(fits(&graph(1, true, DataType::I8)));
        // Per-channel scales, a computed scale, a zero point of another type: separate kernels.
        assert!(!fits(&graph(8, true, DataType::I8)));
        assert!(!fits(&graph(1, false, DataType::I8)));
        assert!(!fits(&graph(1, true, DataType::U8)));
    }

    #[test]
    fn a_block_has_a_warp_per_64_bytes_of_k_between_8_and_32() {
        let block = |k| {
            let mut g = Gen::new(false);
            let out = Dequantize {
                y: 1,
                scale: (Arg::Val(2), "const F".into()),
                zero_point: None,
            };
            let kernel = g.narrow_qgemm(0, &gemm(8, k, 100), out);
            let threads = kernel.launch.expect("a tiled launch").block;
            (
                threads,
                g.src
                    .contains(&format!("kg < {}; ++kg", k.div_ceil(64 * 32))),
            )
        };
        assert_eq!(block(1280), (640, true));
        assert_eq!(block(256), (256, true));
        assert_eq!(block(8192), (1024, true));
    }

    #[test]
    fn the_kernel_covers_every_output_once_and_dequantizes_its_codes() {
        let mut g = Gen::new(false);
        let p = gemm(33, 2048, 1000);
        let dq = |zero_point| Dequantize {
            y: 1,
            scale: (Arg::Val(3), "const F".into()),
            zero_point,
        };
        let k = g.narrow_qgemm(0, &p, dq(None));
        let d = k.launch.expect("a tiled launch");
        // 1000 channels in 63 tiles of 16, 33 rows in 3 tiles of 16; a warp per 64 bytes of K.
        assert_eq!((d.grid, d.block), ((63, 3, 1), 1024));
        assert_eq!(k.args.len(), 6);
        assert_eq!(k.args[..2], [Arg::Val(0), Arg::Val(1)]);
        assert_eq!(k.args[5], Arg::Val(3));
        assert!(g.src.contains("kg < 1; ++kg") && g.src.contains("const i64 dqz = 0;"));
        assert!(g.src.contains("= (float)((i64)q - dqz) * dqs;") && !g.src.contains("mult[co]"));
        let kz = g.narrow_qgemm(0, &p, dq(Some((Arg::Val(4), "const signed char".into()))));
        assert_eq!(kz.args[5..], [Arg::Val(3), Arg::Val(4)]);
        assert!(g.src.contains("const i64 dqz = (i64)p6[0];"));
    }
}
