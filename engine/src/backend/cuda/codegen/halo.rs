//! The int8 3x3 convolution over halo tiles (stride 1, padding 1), for Hopper's wgmma.
//!
//! The implicit GEMM ([`super::igemm`]) reads each input pixel once per tap, nine times for
//! a 3x3 kernel, and on ResNet-50's 3x3 layers its time goes to moving those bytes from L2.
//! Here a block's output pixels are 8×8 squares, one per math warpgroup (one `m64` wgmma tile).
//! For each 32-channel K step the loaders copy every square's 10×10 input pixels (the square
//! and its one-pixel border) once, and each of the nine taps multiplies a shifted view of them:
//! in the unswizzled K-major layout a wgmma operand is 8-row groups of 16-byte rows, and the
//! square's rows are its 8-pixel lines, so tap (ky, kx) is the same descriptor moved by
//! `(10·ky + kx)·16` bytes. The nine taps' weight tiles follow in the same layout.
//!
//! A slot holds, per square, the 32 channels as two 16-byte chunks of 100 pixels
//! (`chunk · 1600 + (10·hy + hx) · 16`), then per tap the weights as two chunks of `BN` rows
//! (`tap · 32·BN + chunk · 16·BN + row · 16`). Loader warps fill the slots and math warpgroups
//! multiply them ([`super::igemm::ws_loop`]); the requantization is the implicit GEMM's.

use super::igemm::{requant_into_tile, ring_smem, wgmma_multiply, ws_barriers, ws_loop, Tiling};
use super::quant::QConvParts;
use super::{Arg, Gen, GenKernel, LaunchDims};
use crate::ir::ValueId;

/// Input channels per K step (two 16-byte chunks).
const STEP: usize = 32;
/// Bytes of one square's halo in a slot: 10×10 pixels of `STEP` channels.
const SQUARE_BYTES: usize = 100 * STEP;

/// Whether `p` fits the halo kernel: a dense 3x3, stride 1, padding 1 convolution of signed
/// NHWC int8 (output as large as the input) over a multiple of 32 channels into a multiple of
/// 64, with no fused residual, every index within 31 bits.
pub fn halo_fits(p: &QConvParts) -> bool {
    let c = &p.geom;
    super::igemm_fits(p)
        && (c.kh, c.kw, c.sh, c.sw, c.dh, c.dw, c.pt, c.pl) == (3, 3, 1, 1, 1, 1, 1, 1)
        && (c.oh, c.ow) == (c.h, c.w)
        && c.cin.is_multiple_of(STEP)
        && p.c4 == c.cin
        && c.cout.is_multiple_of(64)
        && !p.flip
        && p.residual.is_none()
}

/// A halo tiling: `squares` 8×8 output squares (a math warpgroup each) by `bn` channels, over
/// `stages` slots, with a warpgroup of loaders.
pub const fn halo_tiling(squares: usize, bn: usize, stages: usize) -> Tiling {
    Tiling {
        loaders: 4,
        halo: true,
        ..Tiling::wg(squares, bn, stages)
    }
}

/// The halo tilings tried for a convolution that fits: two or four squares by 64 or 128
/// channels (those dividing its output channels), four slots.
pub const HALO_TILINGS: [Tiling; 4] = [
    halo_tiling(2, 64, 4),
    halo_tiling(2, 128, 4),
    halo_tiling(4, 64, 4),
    halo_tiling(4, 128, 4),
];

/// How the halo kernel of one convolution uses shared memory.
pub(super) struct HaloPlan {
    /// The tiling with its ring cut to the K steps (at least two slots: see `ws_loop`).
    t: Tiling,
    /// Bytes of one slot: the squares' halos, then the nine taps' weights.
    slot: usize,
    /// Where the mbarriers start, after the ring (which the output tile reuses).
    bars: usize,
    /// Dynamic shared-memory bytes the kernel asks for (with 1024 bytes of alignment slack).
    pub(super) smem: usize,
}

impl HaloPlan {
    pub(super) fn new(p: &QConvParts, t: Tiling) -> HaloPlan {
        let steps = p.geom.cin / STEP;
        let t = Tiling {
            stages: t.stages.min(steps).max(2),
            ..t
        };
        let slot = t.warps_m / 4 * SQUARE_BYTES + 9 * STEP * t.bn();
        let bars = (t.stages * slot).max(t.bm() * (t.bn() + 16));
        HaloPlan {
            t,
            slot,
            bars,
            smem: bars + 16 * t.stages + 1024,
        }
    }
}

impl Gen {
    /// The halo kernel of QConv `parts` from NHWC int8 `x` into `y` with halo tiling `t` (see
    /// the module docs); check [`halo_fits`] first.
    pub fn qhalo(&mut self, x: Arg, y: ValueId, p: &QConvParts, t: Tiling) -> GenKernel {
        let c = &p.geom;
        let HaloPlan {
            t,
            slot,
            bars,
            smem,
        } = HaloPlan::new(p, t);
        let (n, cin) = (c.cout, c.cin);
        let (h, w) = (c.h, c.w);
        let (bm, bn, th) = (t.bm(), t.bn(), t.threads());
        let sq = t.warps_m / 4;
        let lth = 32 * t.loaders;
        let (kp, wt, bt, mt) = self.igemm_tables(p);
        let params = [
            (x, "const u8"),
            (Arg::Val(y), "u8"),
            (wt, "const u8"),
            (bt, "const u8"),
            (mt, "const u8"),
        ];
        let name = self.next_name();
        let plist = Self::param_list(&params);
        let pad_word = u32::from(p.pad_s as i8 as u8) * 0x0101_0101;
        // Squares: per image ceil(h/8) rows of ceil(w/8).
        let (sy, sx) = (h.div_ceil(8), w.div_ceil(8));
        let squares = c.n * sy * sx;
        let a_bytes = sq * SQUARE_BYTES;
        let (ai, bi) = ((sq * 200).div_ceil(lth), (18 * bn).div_ceil(lth));
        let kcnt = cin / STEP;
        let descs = "const unsigned long long da = adesc(qa + ((ks / 3) * 10 + ks % 3) * 16), \
                     db = bdesc(qb + ks * (32 * BN));";
        let multiply = format!(
            "    const unsigned int qa = sa + (warp >> 2) * {SQUARE_BYTES}, qb = sa + {a_bytes};\n{}",
            wgmma_multiply(t, 9, descs)
        );
        let ts = bn + 16;
        let pieces = bm * bn / 16;
        let src = format!(
            r#"
extern "C" __global__ void __launch_bounds__({th}) {name}({plist}) {{
{smem_decl}
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wmi = warp % {warps_m}, wni = 0;
  const int lt = tid - {math};
  const int n0 = blockIdx.y * {bn};
  constexpr int BN = {bn};
  // The square of tile row block q: its image and top-left output pixel (img < 0: none).
  auto square = [&](int q, int& img, int& y0, int& x0) {{
    const int s = blockIdx.x * {sq} + q;
    img = s < {squares} ? s / {syx} : -1;
    const int rem = s - img * {syx};
    y0 = (rem / {sx}) * 8;
    x0 = (rem % {sx}) * 8;
  }};
  // Each loader's halo pieces: source offset without the K step's channels (-1: padding,
  // -2: none) and slot offset. Neighbouring loaders take a pixel's two chunks, so each
  // pair reads one whole 32-byte sector.
  int a_src[{ai}], a_dst[{ai}];
#pragma unroll
  for (int i = 0; i < {ai}; ++i) {{
    const int idx = lt + i * {lth};
    const int q = idx / 200, r = idx - q * 200, px = r >> 1, ch = r & 1;
    const int hy = px / 10, hx = px - hy * 10;
    int img, y0, x0;
    square(q, img, y0, x0);
    const int iy = y0 - 1 + hy, ix = x0 - 1 + hx;
    a_dst[i] = q * {SQUARE_BYTES} + ch * 1600 + px * 16;
    a_src[i] = (lt < 0 || idx >= {sq} * 200) ? -2
             : (img >= 0 && (unsigned)iy < {h}u && (unsigned)ix < {w}u) ? ((img * {h} + iy) * {w} + ix) * {cin} + ch * 16
             : -1;
  }}
  auto load = [&](int stage, int ks) {{
    const unsigned int sa = sbase + stage * {slot};
    const int c0 = ks * {STEP};
#pragma unroll
    for (int i = 0; i < {ai}; ++i) {{
      if (a_src[i] >= 0) {{
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(sa + a_dst[i]), "l"(p0 + (i64)(a_src[i] + c0)));
      }} else if (a_src[i] == -1) {{
        asm volatile("st.shared.v4.u32 [%0], {{%1, %1, %1, %1}};" :: "r"(sa + a_dst[i]), "r"({pad_word}u));
      }}
    }}
#pragma unroll
    for (int i = 0; i < {bi}; ++i) {{
      const int idx = lt + i * {lth};
      const int tap = idx / (2 * BN), r = idx - tap * (2 * BN), row = r >> 1, ch = r & 1;
      if (idx < 18 * BN) {{
        const unsigned int dst = sa + {a_bytes} + tap * (32 * BN) + ch * (16 * BN) + row * 16;
        const u8* src = p2 + (i64)(n0 + row) * {kp} + tap * {cin} + c0 + ch * 16;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(src));
      }}
    }}
  }};
  // Unswizzled K-major descriptors: a square's 8-pixel lines are 8-row groups 160 bytes apart,
  // its chunks 1600; the weights' 8-row groups are 128 bytes apart, their chunks 16·BN.
  auto adesc = [](unsigned int a) -> unsigned long long {{
    return (unsigned long long)((a & 0x3FFFFu) >> 4) | (100ull << 16) | (10ull << 32);
  }};
  auto bdesc = [](unsigned int a) -> unsigned long long {{
    return (unsigned long long)((a & 0x3FFFFu) >> 4) | ((unsigned long long)BN << 16) | (8ull << 32);
  }};
{barriers}  const int kbeg = 0, kcnt = {kcnt};
  GRID_SYNC();
  int acc[1][{wn}][4];
#pragma unroll
  for (int j = 0; j < {wn}; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[0][j][e] = 0;
{mainloop}  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();
  // The output tile goes through shared memory ([BM][BN + 16] bytes over the free ring) and
  // leaves in 16-byte pieces to each row's pixel (rows of squares past the image are dropped).
  u8* tile = smem;
  const int* bias2 = (const int*)p3;
  const float* mult = (const float*)p4;
{requant}
  __syncthreads();
#pragma unroll
  for (int it = 0; it < {iters}; ++it) {{
    const int q = tid + it * {th};
    const int r = q / {bnv}, cpos = (q % {bnv}) * 16;
    int img, y0, x0;
    square(r >> 6, img, y0, x0);
    const int y = y0 + ((r >> 3) & 7), x = x0 + (r & 7);
    if (q < {pieces} && img >= 0 && y < {h} && x < {w})
      *(uint4*)(p1 + (i64)((img * {h} + y) * {w} + x) * {n} + n0 + cpos) = *(const uint4*)(tile + r * {ts} + cpos);
  }}
}}
"#,
            smem_decl = ring_smem(),
            warps_m = t.warps_m,
            math = t.math_threads(),
            syx = sy * sx,
            wn = t.wn,
            barriers = ws_barriers(t, bars),
            mainloop = ws_loop(t, slot, &multiply),
            requant = requant_into_tile(t, p, ts),
            iters = pieces.div_ceil(th),
            bnv = bn / 16,
        );
        self.src.push_str(&src);
        GenKernel {
            name,
            threads: c.n * c.oh * c.ow * n,
            args: params.iter().map(|(a, _)| *a).collect(),
            launch: Some(LaunchDims {
                grid: (squares.div_ceil(sq) as u32, (n / bn) as u32, 1),
                block: th as u32,
                smem: smem as u32,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 3x3 same-size QConv over `cin` channels of `n` images of `hw`×`hw` into `cout`.
    fn parts(n: usize, hw: usize, cin: usize, cout: usize) -> QConvParts {
        let mut p = super::super::igemm::tests::parts(cin, cin, cout, false);
        (p.geom.n, p.geom.h, p.geom.w, p.geom.oh, p.geom.ow) = (n, hw, hw, hw, hw);
        p
    }

    #[test]
    fn only_same_size_3x3_convolutions_over_whole_steps_fit() {
        assert!(halo_fits(&parts(2, 14, 64, 128)));
        // Channels not a multiple of 32 in, 64 out; u8 inputs; a fused residual; stride 2.
        assert!(!halo_fits(&parts(2, 14, 48, 128)));
        assert!(!halo_fits(&parts(2, 14, 64, 96)));
        let mut u8_input = parts(2, 14, 64, 128);
        u8_input.flip = true;
        assert!(!halo_fits(&u8_input));
        let mut residual = parts(2, 14, 64, 128);
        residual.residual = Some(super::super::quant::Residual {
            z: 7,
            beta: 0.5,
            zero_point: 0,
        });
        assert!(!halo_fits(&residual));
        let mut strided = parts(2, 14, 64, 128);
        (
            strided.geom.sh,
            strided.geom.sw,
            strided.geom.oh,
            strided.geom.ow,
        ) = (2, 2, 7, 7);
        assert!(!halo_fits(&strided));
    }

    #[test]
    fn blocks_cover_every_square_once_and_slots_hold_halos_then_taps() {
        // 3 images of 14x14: 2x2 squares each, 12 squares; 4 per block -> 3 blocks; 256
        // channels in 128-channel blocks -> 2.
        let p = parts(3, 14, 64, 256);
        let t = HALO_TILINGS[3];
        let mut g = Gen::new(false);
        let k = g.qhalo(Arg::Val(0), 1, &p, t);
        let d = k.launch.expect("tiled launch");
        assert_eq!(d.grid, (3, 2, 1));
        assert_eq!(d.block, 4 * 128 + 128);
        // 64 channels: two K steps, so two slots of 4 halos (3200 bytes) and 9 weight tiles
        // (128 rows x 32 bytes); the mbarriers after them, then the alignment slack.
        let slot = 4 * 3200 + 9 * 32 * 128;
        assert_eq!(d.smem as usize, 2 * slot + 16 * 2 + 1024);
        assert_eq!(d.smem as usize, super::super::igemm_smem(&p, t));
        assert!(g
            .src
            .contains(&format!("const unsigned int sa = sbase + stage * {slot};")));
        // Tap (ky, kx) moves the square's descriptor by (10 ky + kx) 16-byte rows.
        assert!(g.src.contains("adesc(qa + ((ks / 3) * 10 + ks % 3) * 16)"));
        assert!(g.src.contains("for (int ks = 0; ks < 9; ++ks)"));
        assert_eq!(t.to_string(), "halo256x128/4");
        // The output tile fits in the ring it reuses, even with a single K step.
        for t in HALO_TILINGS {
            let one = HaloPlan::new(&parts(1, 8, 32, 128), t);
            assert_eq!(one.t.stages, 2);
            assert!(one.bars >= one.t.bm() * (one.t.bn() + 16));
        }
    }
}
