//! Two chained pointwise int8 convolutions in one kernel ("back to back"): a bottleneck's
//! last 1x1 (`p1`, with its folded residual) and the next bottleneck's first 1x1 (`p2`), which
//! reads nothing but `p1`'s output. A block of 64 output pixels keeps its input rows in
//! shared memory, walks `p1`'s output channels 128 at a time, requantizes each chunk (exactly
//! as the implicit GEMM does), stores it to `y1` (the next residual still needs it) and at once
//! multiplies it, still in shared memory, into `p2`'s accumulators, so `p2`'s kernel, its
//! launch and its re-read of `y1` disappear. Both GEMMs are `mma.sync.m16n8k32` over one
//! `cp.async` ring of weight K slices (`p1`'s, then two of `p2`'s per chunk). The integer
//! sums and the requantizations are those of the separate kernels, so the outputs are the
//! same bytes.

use super::igemm::{mma_slice, requant_into_tile, ring_smem, Tiling};
use super::{Arg, Gen, GenKernel, LaunchDims};
use crate::backend::cuda::codegen::quant::QConvParts;
use crate::ir::ValueId;
use std::fmt::Write;

/// Output pixels per block.
const BM: usize = 64;
/// `p1` output channels per chunk (the second GEMM's K per chunk).
const CHUNK: usize = 128;
/// Threads per block: 8 warps, 2 along M by 4 along N.
const THREADS: usize = 256;
/// Bytes of a shared chunk row (128 codes, padded by 16 against bank conflicts).
const YS: usize = CHUNK + 16;

/// How a back-to-back kernel is compiled: its ring's depth in weight K slices, and the blocks
/// per SM its registers are capped for (0: the compiler's choice).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct B2bShape {
    pub stages: usize,
    pub min_blocks: usize,
}

impl std::fmt::Display for B2bShape {
    /// `x<blocks>/<stages>`, as the profile's notes show it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "x{}/{}", self.min_blocks, self.stages)
    }
}

/// The shapes the back-to-back kernel is timed in: 4- and 8-deep rings (each K slice is a
/// short multiply, so loads must run far ahead), each with the compiler's register choice and
/// capped for 2 and 3 resident blocks per SM (its phases wait on barriers, so more blocks may
/// hide more of that).
pub const B2B_SHAPES: [B2bShape; 6] = [
    B2bShape {
        stages: 4,
        min_blocks: 0,
    },
    B2bShape {
        stages: 4,
        min_blocks: 2,
    },
    B2bShape {
        stages: 4,
        min_blocks: 3,
    },
    B2bShape {
        stages: 8,
        min_blocks: 0,
    },
    B2bShape {
        stages: 8,
        min_blocks: 2,
    },
    B2bShape {
        stages: 8,
        min_blocks: 3,
    },
];

/// Whether 1x1 convolution `p1` followed by 1x1 convolution `p2` (reading `p1`'s output) fit
/// the back-to-back kernel: both stride 1, unpadded, ungrouped, signed inputs; `p1`'s K a
/// multiple of 64 up to 512 (its rows stay in shared memory), its channels a multiple of
/// 128; `p2` without a residual and with 64, 128 or 256 channels (its accumulators stay in
/// registers).
pub fn b2b_fits(p1: &QConvParts, p2: &QConvParts) -> bool {
    let (a, b) = (&p1.geom, &p2.geom);
    p1.reads_input_in_place()
        && p2.reads_input_in_place()
        && a.cin.is_multiple_of(64)
        && a.cin <= 512
        && a.cout.is_multiple_of(CHUNK)
        && b.cin == a.cout
        && (b.n, b.h, b.w) == (a.n, a.h, a.w)
        && matches!(b.cout, 64 | 128 | 256)
        && p2.residual.is_none()
        && a.n * a.h * a.w * a.cout < i32::MAX as usize / 2
}

/// Where the kernel's shared memory goes: `p1`'s input rows, the ring, two chunk tiles.
struct B2bPlan {
    /// K slices of 64 bytes in `p1`'s input rows.
    kt1: usize,
    /// Bytes of one ring slot (the larger of `p1`'s 128 and `p2`'s rows, 64 bytes each).
    slot: usize,
    ring_at: usize,
    y_at: usize,
    smem: usize,
}

impl B2bPlan {
    fn new(p1: &QConvParts, p2: &QConvParts, stages: usize) -> B2bPlan {
        let kt1 = p1.geom.cin / 64;
        let slot = CHUNK.max(p2.geom.cout) * 64;
        let ring_at = kt1 * BM * 64;
        let y_at = ring_at + stages * slot;
        // Two chunk tiles; the last phase reuses them for `p2`'s output tile.
        let ybytes = (2 * BM * YS).max(BM * (p2.geom.cout + 16));
        B2bPlan {
            kt1,
            slot,
            ring_at,
            y_at,
            smem: y_at + ybytes + 1024,
        }
    }
}

/// Dynamic shared-memory bytes the back-to-back kernel of `p1` and `p2` with a ring of
/// `stages` asks for.
pub fn b2b_smem(p1: &QConvParts, p2: &QConvParts, stages: usize) -> usize {
    B2bPlan::new(p1, p2, stages).smem
}

impl Gen {
    /// The back-to-back kernel of 1x1 convolutions `p1` (input `x`, output `y1`) and `p2`
    /// (input `y1`, output `y2`) in `shape` (see [`B2B_SHAPES`]); check [`b2b_fits`] first.
    pub fn qb2b(
        &mut self,
        x: Arg,
        (y1, y2): (ValueId, ValueId),
        (p1, p2): (&QConvParts, &QConvParts),
        shape: B2bShape,
    ) -> GenKernel {
        let B2bShape {
            stages: st,
            min_blocks,
        } = shape;
        let plan = B2bPlan::new(p1, p2, st);
        let (a, b) = (&p1.geom, &p2.geom);
        let m = a.n * a.h * a.w;
        let (k1, n1, n2) = (a.cin, a.cout, b.cout);
        let (kt1, chunks) = (plan.kt1, n1 / CHUNK);
        // Steps per chunk: p1's K slices, then p2's two over the chunk.
        let per = kt1 + 2;
        let steps = chunks * per;
        let (_, wt1, bt1, mt1) = self.igemm_tables(p1);
        let (_, wt2, bt2, mt2) = self.igemm_tables(p2);
        let mut params = vec![
            (x, "const u8"),
            (Arg::Val(y1), "u8"),
            (wt1, "const u8"),
            (bt1, "const u8"),
            (mt1, "const u8"),
            (Arg::Val(y2), "u8"),
            (wt2, "const u8"),
            (bt2, "const u8"),
            (mt2, "const u8"),
        ];
        if let Some(r) = p1.residual.as_ref() {
            params.push((Arg::Val(r.z), "const u8"));
        }
        let name = self.next_name();
        let plist = Self::param_list(&params);
        // The warp layouts, as the requantization helpers read them.
        let (wn2, w2rows) = (n2 / 32, n2 * 4 / THREADS);
        let t1 = Tiling::mma(2, 4, 2, 4, st);
        let t2 = Tiling::mma(2, 4, 2, wn2, st);
        let requant1 = requant_into_tile(t1, p1, YS);
        let requant2 = requant_into_tile(t2, p2, n2 + 16);
        let residual = p1.residual.is_some();
        // The residual of chunk c goes into its tile (the cells the requantization replaces):
        // chunk 0's with the input rows, each later one's right after the chunk before it is
        // stored, so a whole chunk's steps hide its load.
        let fetch_z = |c: &str| {
            if residual {
                format!(
                    r#"
#pragma unroll
    for (int it = 0; it < {zp}; ++it) {{
      const int q = tid + it * {THREADS}, row = q >> 3, cc = (q & 7) * 16;
      const bool ok = m0 + row < {m};
      const u8* src = ok ? p9 + (i64)(m0 + row) * {n1} + ({c}) * {CHUNK} + cc : p9;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(ys + (({c}) & 1) * {yt} + row * {YS} + cc), "l"(src), "r"(ok ? 16 : 0));
    }}
"#,
                    zp = BM * CHUNK / 16 / THREADS,
                    yt = BM * YS,
                )
            } else {
                String::new()
            }
        };
        let z_first = fetch_z("0");
        let z_next = if residual {
            format!(
                "      if (c + 1 < {chunks}) {{{}      asm volatile(\"cp.async.commit_group;\");\n      }}\n",
                fetch_z("c + 1")
            )
        } else {
            String::new()
        };
        // Chunk 0's residual came with the input rows (waited for at the first step); chunk
        // c's later one was committed `per` groups ago (a wait for fewer is only stricter).
        let zwait = if residual {
            format!(
                "        if (c > 0) asm volatile(\"cp.async.wait_group {};\" ::: \"memory\");\n        __syncthreads();\n",
                per.min(7)
            )
        } else {
            String::new()
        };
        let gemm1 = mma_slice(
            "acc1",
            (2, 4),
            &format!(
                "xs + r * {} + row * 64 + ((ch ^ ((row >> 1) & 3)) << 4)",
                BM * 64
            ),
        );
        let gemm2 = mma_slice(
            "acc2",
            (2, wn2),
            &format!(
                "ys + (c & 1) * {} + row * {YS} + (r - {kt1}) * 64 + ch * 16",
                BM * YS
            ),
        );
        let mut s = String::new();
        let _ = write!(
            s,
            r#"
extern "C" __global__ void __launch_bounds__({bounds}) {name}({plist}) {{
{smem_decl}
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wmi = warp & 1, wni = warp >> 1;
  const int m0 = blockIdx.x * {BM};
  const unsigned int xs = sbase, ring = sbase + {ring_at}, ys = sbase + {y_at};
  u8* ytile = smem + {y_at};
  // Step st's weight slice into ring slot `slot`: p1's rows of chunk c, or p2's rows over
  // the chunk's K.
  auto load = [&](int slot, int st) {{
    const int c = st / {per}, r = st - c * {per};
    const unsigned int sb = ring + slot * {slot_bytes};
    const int col = tid & 3;
    if (r < {kt1}) {{
#pragma unroll
      for (int it = 0; it < {w1p}; ++it) {{
        const int row = (tid >> 2) + it * {rows_per};
        const u8* src = p2 + (i64)(c * {CHUNK} + row) * {k1} + r * 64 + col * 16;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(sb + row * 64 + ((col ^ ((row >> 1) & 3)) << 4)), "l"(src));
      }}
    }} else {{
#pragma unroll
      for (int it = 0; it < {w2rows}; ++it) {{
        const int row = (tid >> 2) + it * {rows_per};
        const u8* src = p6 + (i64)row * {n1} + c * {CHUNK} + (r - {kt1}) * 64 + col * 16;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(sb + row * 64 + ((col ^ ((row >> 1) & 3)) << 4)), "l"(src));
      }}
    }}
  }};
  int acc1[2][4][4], acc2[2][{wn2}][4];
#pragma unroll
  for (int i = 0; i < 2; ++i) {{
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc1[i][j][e] = 0;
#pragma unroll
    for (int j = 0; j < {wn2}; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc2[i][j][e] = 0;
  }}
  GRID_SYNC();
  // The block's input rows stay in shared memory: K slices of 64 rows by 64 bytes, swizzled.
#pragma unroll
  for (int it = 0; it < {xp}; ++it) {{
    const int q = tid + it * {THREADS}, row = q % {BM}, kc = q / {BM}, r = kc >> 2, col = kc & 3;
    const bool ok = m0 + row < {m};
    const u8* src = ok ? p0 + (i64)(m0 + row) * {k1} + kc * 16 : p0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(xs + r * {xtile} + row * 64 + ((col ^ ((row >> 1) & 3)) << 4)), "l"(src), "r"(ok ? 16 : 0));
  }}{z_first}
#pragma unroll
  for (int s = 0; s < {ahead}; ++s) {{
    if (s < {steps}) load(s, s);
    asm volatile("cp.async.commit_group;");
  }}
  for (int st = 0; st < {steps}; ++st) {{
    asm volatile("cp.async.wait_group {wait};" ::: "memory");
    __syncthreads();
    if (st + {ahead} < {steps}) load((st + {ahead}) % {st}, st + {ahead});
    asm volatile("cp.async.commit_group;");
    const int c = st / {per}, r = st - c * {per};
    const unsigned int sb = ring + (st % {st}) * {slot_bytes};
    if (r < {kt1}) {{
{gemm1}    }} else {{
{gemm2}    }}
    if (r == {kt1} - 1) {{
      // The chunk is summed: requantize it into its tile, store it, and clear the sums.
{zwait}      {{
        u8* tile = ytile + (c & 1) * {yt};
        const int n0 = c * {CHUNK};
        const int* bias2 = (const int*)p3;
        const float* mult = (const float*)p4;
{requant1}
      }}
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc1[i][j][e] = 0;
      __syncthreads();
#pragma unroll
      for (int it = 0; it < {yp}; ++it) {{
        const int q = tid + it * {THREADS}, row = q >> 3, cc = (q & 7) * 16;
        if (m0 + row < {m})
          *(uint4*)(p1 + (i64)(m0 + row) * {n1} + c * {CHUNK} + cc) = *(const uint4*)(ytile + (c & 1) * {yt} + row * {YS} + cc);
      }}
{z_next}    }}
  }}
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();
  {{
    auto& acc = acc2;
    u8* tile = ytile;
    const int n0 = 0;
    const int* bias2 = (const int*)p7;
    const float* mult = (const float*)p8;
{requant2}
  }}
  __syncthreads();
#pragma unroll
  for (int it = 0; it < {op}; ++it) {{
    const int q = tid + it * {THREADS}, row = q / {opr}, cc = (q % {opr}) * 16;
    if (m0 + row < {m})
      *(uint4*)(p5 + (i64)(m0 + row) * {n2} + cc) = *(const uint4*)(ytile + row * {ots} + cc);
  }}
}}
"#,
            smem_decl = ring_smem(),
            bounds = match min_blocks {
                0 => THREADS.to_string(),
                b => format!("{THREADS}, {b}"),
            },
            ring_at = plan.ring_at,
            y_at = plan.y_at,
            slot_bytes = plan.slot,
            w1p = CHUNK * 4 / THREADS,
            rows_per = THREADS / 4,
            xp = BM * k1 / 16 / THREADS,
            xtile = BM * 64,
            ahead = st - 1,
            wait = st - 2,
            yt = BM * YS,
            yp = BM * CHUNK / 16 / THREADS,
            op = BM * n2 / 16 / THREADS,
            opr = n2 / 16,
            ots = n2 + 16,
            requant1 = requant1.replace("acc[", "acc1["),
        );
        self.src.push_str(&s);
        GenKernel {
            name,
            threads: m * n2,
            args: params.iter().map(|(a, _)| *a).collect(),
            launch: Some(LaunchDims {
                grid: (m.div_ceil(BM) as u32, 1, 1),
                block: THREADS as u32,
                smem: plan.smem as u32,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::igemm::tests::parts;
    use super::*;

    /// A 1x1 convolution's parts: `cin` in, `cout` out, over 2×7×7 pixels.
    fn pointwise(cin: usize, cout: usize) -> QConvParts {
        let mut p = parts(cin, cin, cout, false);
        let g = &mut p.geom;
        (g.kh, g.kw, g.pt, g.pl) = (1, 1, 0, 0);
        (g.oh, g.ow) = (g.h, g.w);
        p.packed.truncate(cout * cin);
        p
    }

    #[test]
    fn only_chained_pointwise_convolutions_within_the_registers_fit() {
        assert!(b2b_fits(&pointwise(64, 256), &pointwise(256, 64)));
        assert!(b2b_fits(&pointwise(256, 1024), &pointwise(1024, 256)));
        // p2's 512 accumulators a block row do not fit; p2 must read p1's channels.
        assert!(!b2b_fits(&pointwise(512, 2048), &pointwise(2048, 512)));
        assert!(!b2b_fits(&pointwise(64, 256), &pointwise(128, 64)));
        // A 3x3 either side does not fit.
        assert!(!b2b_fits(&parts(64, 64, 256, false), &pointwise(256, 64)));
        assert!(!b2b_fits(&pointwise(64, 256), &parts(256, 256, 64, false)));
        // u8 inputs (flipped bytes) take the separate kernels.
        let mut u8_in = pointwise(64, 256);
        u8_in.flip = true;
        assert!(!b2b_fits(&u8_in, &pointwise(256, 64)));
    }

    #[test]
    fn the_kernel_walks_every_chunk_and_waits_before_its_first_load() {
        let (p1, p2) = (pointwise(256, 1024), pointwise(1024, 256));
        let mut g = Gen::new(false);
        let k = g.qb2b(Arg::Val(0), (1, 2), (&p1, &p2), B2B_SHAPES[0]);
        // 8 chunks of 4 + 2 K slices; 98 pixels a block of 64: 2 blocks.
        assert!(g.src.contains("st < 48;"), "{}", g.src);
        assert_eq!(k.launch.map(|d| d.grid), Some((2, 1, 1)));
        assert!(k
            .launch
            .is_some_and(|d| d.smem as usize == b2b_smem(&p1, &p2, 4)));
        let wait = g.src.find("GRID_SYNC();").expect("wait");
        let first = g.src.find("p0 + (i64)(m0 + row)").expect("input load");
        assert!(wait < first);
        // Both requantizations, the first into the chunk's tile.
        assert!(g.src.contains("const int* bias2 = (const int*)p3;"));
        assert!(g.src.contains("const int* bias2 = (const int*)p7;"));
        assert!(g.src.contains("acc1[i][j][hh * 2 + e]"));
        // Six tables (weights, bias, multiplier of each) as extras.
        assert_eq!(g.extras.len(), 6);
    }
}
