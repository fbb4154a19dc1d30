//! The int8 convolution over halo tiles (stride 1), for Hopper's wgmma: 3x3 convolutions
//! with padding 1, and the space-to-depth stems' even-sided kernels over 16 channels.
//!
//! The implicit GEMM ([`super::igemm`]) reads each input pixel once per tap, nine times for
//! a 3x3 kernel, and on ResNet-50's 3x3 layers its time goes to moving those bytes from L2.
//! Here a block's output pixels are 8×8 squares, one per math warpgroup (one `m64` wgmma tile).
//! For each K step the loaders copy every square's input pixels (the square and its border:
//! `7 + k` pixels a side for a `k`×`k` kernel) once, and each tap multiplies a shifted view of
//! them: in the unswizzled K-major layout a wgmma operand is 8-row groups of 16-byte rows, and
//! the square's rows are its 8-pixel lines, so tap (ky, kx) is the same descriptor moved by
//! `(side·ky + kx)·16` bytes. The taps' weight tiles follow in the same layout.
//!
//! A slot holds per square two 16-byte chunks of `side²` pixels (`chunk · side² · 16 +
//! (side·hy + hx) · 16`), the wgmma's two 16-byte K halves. With 32 channels a step they are
//! a pixel's two channel halves and a wgmma's K is one tap. With 16 channels (a space-to-depth
//! stem) chunk 1 holds the halo one pixel to the right, so a wgmma's K is two neighbouring
//! taps of one kernel row. Per wgmma the weights are two chunks of `BN` rows
//! (`i · 32·BN + chunk · 16·BN + row · 16`). Loader warps fill the slots
//! and math warpgroups multiply them ([`super::igemm::ws_loop`]); the requantization is the
//! implicit GEMM's.
//!
//! Persistent blocks ([`Tiling::ctas`]) walk several tiles ([`super::igemm::ws_tile_loop`]):
//! the loaders fill the next tile's slots while each math warpgroup requantizes and stores its
//! own square from an output tile past the ring, and weights that all of a block's tiles share
//! (one channel block per block) load once and stay in shared memory.

use super::igemm::{
    requant_into_tile, ring_smem, wgmma_multiply, ws_barriers, ws_loop, ws_tile_loop, Tiling,
};
use super::quant::QConvParts;
use super::{Arg, Gen, GenKernel, LaunchDims};
use crate::ir::ValueId;

/// The halo geometry of a convolution: kernel side, padding and how a K step's channels
/// fill each wgmma's 32-byte K.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct HaloShape {
    /// Kernel side (square kernels only).
    k: usize,
    /// Padding on every side.
    pad: usize,
    /// Channels' 16-byte chunks per pixel and K step: 2 (32 channels, a tap per wgmma) or 1
    /// (16 channels; the slot's second chunk is the next pixel's, for two taps per wgmma).
    chunks: usize,
}

impl HaloShape {
    /// The shape of `p`, or None unless it fits: a dense, square, stride-1 convolution of
    /// signed NHWC int8, with no fused residual, into a multiple of 64 channels, either 3x3
    /// with padding 1 over a multiple of 32 channels or 2x2/4x4 without padding over 16 (a
    /// space-to-depth stem), every index within 31 bits.
    fn of(p: &QConvParts) -> Option<HaloShape> {
        let c = &p.geom;
        let (k, pad) = (c.kh, c.pt);
        let same = c.kw == k
            && (c.sh, c.sw, c.dh, c.dw) == (1, 1, 1, 1)
            && c.pl == pad
            && c.oh + k == c.h + 2 * pad + 1
            && c.ow + k == c.w + 2 * pad + 1;
        if !(super::igemm_fits(p)
            && same
            && p.c4 == c.cin
            && c.cout.is_multiple_of(64)
            && !p.flip
            && p.residual.is_none())
        {
            return None;
        }
        let chunks = if (k, pad) == (3, 1) && c.cin.is_multiple_of(32) {
            2
        } else if pad == 0 && c.cin == 16 && matches!(k, 2 | 4) {
            1
        } else {
            return None;
        };
        Some(HaloShape { k, pad, chunks })
    }
    /// Pixels along a square's halo side.
    fn side(&self) -> usize {
        7 + self.k
    }
    /// Pixels of a square's halo.
    fn pixels(&self) -> usize {
        self.side() * self.side()
    }
    /// Input channels per K step.
    fn step(&self) -> usize {
        16 * self.chunks
    }
    /// Bytes of one square's halo in a slot: two 16-byte chunks a pixel.
    fn square_bytes(&self) -> usize {
        self.pixels() * 32
    }
    /// wgmmas per square and K step: one per tap, or per pair of taps.
    fn wgmmas(&self) -> usize {
        self.k * self.k * self.chunks / 2
    }
    /// Bytes one weight row skips from a wgmma's K to the next one's: a tap's channels, or a
    /// pair of taps' (the stem's one K step).
    fn tap_bytes(&self, cin: usize) -> usize {
        if self.chunks == 2 {
            cin
        } else {
            32
        }
    }
    /// The 3x3 shape: what [`HaloPlan`] sizes a convolution that does not fit as.
    const THREE_BY_THREE: HaloShape = HaloShape {
        k: 3,
        pad: 1,
        chunks: 2,
    };
}

/// Whether `p` fits the halo kernel (see [`HaloShape::of`]).
pub fn halo_fits(p: &QConvParts) -> bool {
    HaloShape::of(p).is_some()
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

/// Halo tilings over six slots instead of four, timed only with `VIGIL_CUDA_DEEP`.
pub const DEEP_HALO_TILINGS: [Tiling; 2] = [halo_tiling(2, 64, 6), halo_tiling(4, 64, 6)];

/// Most bytes of weights a persistent halo block keeps for all its tiles.
const STAY_BYTES: usize = 80 << 10;

/// How the halo kernel of one convolution uses shared memory.
pub(super) struct HaloPlan {
    /// The tiling with its ring cut to the K steps (at least two slots: see `ws_loop`);
    /// persistent blocks keep theirs, as their slots run on into the next tile.
    t: Tiling,
    /// The convolution's halo geometry.
    shape: HaloShape,
    /// Bytes of one slot: the squares' halos, then the taps' weights unless they stay.
    slot: usize,
    /// Where the output tile starts: over the ring (free after the K loop), or after it in
    /// a persistent block (whose ring then holds the next tile's loads).
    out: usize,
    /// Where a persistent block's weights stay for all its tiles, loaded once, K step after
    /// K step: when the blocks are a multiple of the channel blocks, every tile of a block
    /// has the same channels (tiles go channel block fastest), so it multiplies the same
    /// weights, if they fit in [`STAY_BYTES`] (the stems, layers 1 and 2's 3x3s).
    weights: Option<usize>,
    /// Output squares over all images.
    squares: usize,
    /// Bytes of one K step's weights: the taps' tiles of `BN` rows.
    taps: usize,
    /// Square groups (`warps_m / 4` squares each) and channel blocks: the tiles.
    tiles: (usize, usize),
    /// The launch grid's x and y: the tiles, or the persistent blocks (at most one per tile)
    /// and 1.
    grid: (usize, usize),
    /// Where the mbarriers start.
    bars: usize,
    /// Dynamic shared-memory bytes the kernel asks for (with 1024 bytes of alignment slack).
    pub(super) smem: usize,
}

impl HaloPlan {
    pub(super) fn new(p: &QConvParts, t: Tiling) -> HaloPlan {
        // Callers check `halo_fits` first; one that does not fit is sized as a 3x3.
        let shape = HaloShape::of(p).unwrap_or(HaloShape::THREE_BY_THREE);
        let steps = p.geom.cin / shape.step();
        let persist = t.ctas > 0;
        let t = Tiling {
            stages: if persist {
                t.stages.max(2)
            } else {
                t.stages.min(steps).max(2)
            },
            ..t
        };
        let c = &p.geom;
        let squares = c.n * c.oh.div_ceil(8) * c.ow.div_ceil(8);
        let tiles = (squares.div_ceil(t.warps_m / 4), c.cout / t.bn());
        let halos = t.warps_m / 4 * shape.square_bytes();
        let taps = shape.wgmmas() * 32 * t.bn();
        let grid = if persist {
            (t.ctas.min(tiles.0 * tiles.1), 1)
        } else {
            tiles
        };
        let stay = persist && grid.0.is_multiple_of(tiles.1) && steps * taps <= STAY_BYTES;
        let slot = if stay { halos } else { halos + taps };
        let ring = t.stages * slot;
        let tile = t.bm() * (t.bn() + 16);
        let (out, weights, bars) = if persist {
            let out = ring.next_multiple_of(128);
            let after = (out + tile).next_multiple_of(128);
            if stay {
                (out, Some(after), after + steps * taps)
            } else {
                (out, None, after)
            }
        } else {
            (0, None, ring.max(tile))
        };
        HaloPlan {
            t,
            shape,
            slot,
            out,
            weights,
            squares,
            taps,
            tiles,
            grid,
            bars,
            smem: bars + 16 * t.stages + 1024,
        }
    }
}

impl Gen {
    /// The halo kernel of QConv `parts` from NHWC int8 `x` into `y` with halo tiling `t` (see
    /// the module docs), a block per tile, or persistent blocks looping over the tiles when
    /// `t.ctas` is set; check [`halo_fits`] first.
    pub fn qhalo(&mut self, x: Arg, y: ValueId, p: &QConvParts, t: Tiling) -> GenKernel {
        let c = &p.geom;
        let HaloPlan {
            t,
            shape,
            slot,
            out,
            weights,
            squares,
            taps,
            tiles: (gx, gy),
            grid,
            bars,
            smem,
        } = HaloPlan::new(p, t);
        let persist = t.ctas > 0;
        let (n, cin) = (c.cout, c.cin);
        let (h, w, oh, ow) = (c.h, c.w, c.oh, c.ow);
        let (side, px_count, chunks, sqb) = (
            shape.side(),
            shape.pixels(),
            shape.chunks,
            shape.square_bytes(),
        );
        let (pad, wgmmas, tap_bytes) = (shape.pad, shape.wgmmas(), shape.tap_bytes(cin));
        let (bm, bn, th) = (t.bm(), t.bn(), t.threads());
        let sq = t.warps_m / 4;
        let lth = 32 * t.loaders;
        let (kp, params) = self.igemm_params(x, Arg::Val(y), p);
        let name = self.next_name();
        let plist = Self::param_list(&params);
        let pad_word = u32::from(p.pad_s as i8 as u8) * 0x0101_0101;
        // Squares: per image ceil(oh/8) rows of ceil(ow/8).
        let (sy, sx) = (oh.div_ceil(8), ow.div_ceil(8));
        let a_bytes = sq * sqb;
        let pieces_a = px_count * 2;
        let (ai, bi) = (
            (sq * pieces_a).div_ceil(lth),
            (2 * wgmmas * bn).div_ceil(lth),
        );
        let (step, kcnt) = (shape.step(), cin / shape.step());
        // The wgmma's first row: tap (ky, kx) of the kernel, or the pair starting at (ky, 2j).
        let tap = if chunks == 2 {
            format!("(ks / {k}) * {side} + ks % {k}", k = shape.k)
        } else {
            format!("(ks / {h}) * {side} + (ks % {h}) * 2", h = shape.k / 2)
        };
        let descs = format!(
            "const unsigned long long da = adesc(qa + ({tap}) * 16), db = bdesc(qb + ks * (32 * BN));"
        );
        let qb = match weights {
            Some(at) => format!("sbase + {at} + kk * {taps}"),
            None => format!("sa + {a_bytes}"),
        };
        let multiply = format!(
            "    const unsigned int qa = sa + (warp >> 2) * {sqb}, qb = {qb};\n{}",
            wgmma_multiply(t, wgmmas, &descs)
        );
        // A piece's second chunk: the pixel's other 16 channels, or the next pixel's 16.
        let (shift, chunk_ch) = if chunks == 2 { (0, 16) } else { (1, 0) };
        let ts = bn + 16;
        let pieces = bm * bn / 16;
        // The output tile of square group `bx` leaves in 16-byte pieces to each row's pixel
        // (rows of squares past the image are dropped): `count` pieces from piece `first`,
        // `threads` threads at a time, from thread `lead`.
        let store = |first: &str, lead: &str, count: usize, threads: usize| {
            format!(
                r#"#pragma unroll
  for (int pc = 0; pc < {iters}; ++pc) {{
    const int q = {first} + {lead} + pc * {threads};
    const int r = q / {bnv}, cpos = (q % {bnv}) * 16;
    int img, y0, x0;
    square(bx, r >> 6, img, y0, x0);
    const int y = y0 + ((r >> 3) & 7), x = x0 + (r & 7);
    if (q < {pieces} && img >= 0 && y < {oh} && x < {ow})
      *(uint4*)(p1 + (i64)((img * {oh} + y) * {ow} + x) * {n} + n0 + cpos) = *(const uint4*)(tile + r * {ts} + cpos);
  }}"#,
                iters = count.div_ceil(threads),
                bnv = bn / 16,
            )
        };
        let requant = requant_into_tile(t, p, ts);
        let body = if persist {
            // Each warpgroup requantizes and stores its own square's 64 rows, so one can
            // multiply while another stores.
            let rows = 64 * bn / 16;
            let epilogue = format!(
                r#"      // The output tile has its own shared memory: the ring is already taking the
      // next tile's loads. The first barrier waits for the warpgroup's last stores to leave it.
      asm volatile("bar.sync %0, 128;" :: "r"(1 + (warp >> 2)) : "memory");
{requant}
      asm volatile("bar.sync %0, 128;" :: "r"(1 + (warp >> 2)) : "memory");
{store}"#,
                store = store(&format!("(warp >> 2) * {rows}"), "(tid & 127)", rows, 128),
            );
            let stay = match weights {
                Some(at) => format!(
                    "  ln0 = (blockIdx.x % {gy}) * BN;\n  if (lt >= 0)\n    for (int k = 0; k < {kcnt}; ++k) load_taps(sbase + {at} + k * {taps}, k * {step});\n  asm volatile(\"cp.async.wait_all;\" ::: \"memory\");\n"
                ),
                None => String::new(),
            };
            format!(
                r#"  u8* tile = smem + {out};
  const int* bias2 = (const int*)p3;
  const float* mult = (const float*)p4;
  const int tiles = {tiles}, kcnt = {kcnt};
{stay}{barriers}  GRID_SYNC();
{tile_loop}"#,
                tiles = gx * gy,
                barriers = ws_barriers(t, bars),
                tile_loop = ws_tile_loop(
                    t,
                    slot,
                    &multiply,
                    (
                        &format!("      setup(tt / {gy}, (tt % {gy}) * BN);"),
                        &format!("      const int bx = tt / {gy}, n0 = (tt % {gy}) * BN;"),
                        &epilogue,
                    ),
                ),
            )
        } else {
            format!(
                r#"  const int bx = blockIdx.x, n0 = blockIdx.y * {bn};
  setup(bx, n0);
{barriers}  const int kbeg = 0, kcnt = {kcnt};
  GRID_SYNC();
  int acc[1][{wn}][4];
#pragma unroll
  for (int j = 0; j < {wn}; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[0][j][e] = 0;
{mainloop}  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();
  // The output tile goes through shared memory ([BM][BN + 16] bytes over the free ring).
  u8* tile = smem;
  const int* bias2 = (const int*)p3;
  const float* mult = (const float*)p4;
{requant}
  __syncthreads();
{store}
"#,
                wn = t.wn,
                barriers = ws_barriers(t, bars),
                mainloop = ws_loop(t, slot, &multiply),
                store = store("0", "tid", pieces, th),
            )
        };
        let load_taps = if weights.is_some() {
            String::new()
        } else {
            format!("    load_taps(sa + {a_bytes}, c0);\n")
        };
        let src = format!(
            r#"
extern "C" __global__ void __launch_bounds__({bounds}) {name}({plist}) {{
{smem_decl}
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wmi = warp % {warps_m}, wni = 0;
  const int lt = tid - {math};
  constexpr int BN = {bn};
  // Square `q` of square group `bx`: its image and top-left output pixel (img < 0: none).
  auto square = [&](int bx, int q, int& img, int& y0, int& x0) {{
    const int s = bx * {sq} + q;
    img = s < {squares} ? s / {syx} : -1;
    const int rem = s - img * {syx};
    y0 = (rem / {sx}) * 8;
    x0 = (rem % {sx}) * 8;
  }};
  // Each loader's halo pieces: source offset without the K step's channels (-1: padding,
  // -2: none) and slot offset. Neighbouring loaders take a pixel's two chunks (with 32
  // channels, each pair reads one whole 32-byte sector).
  int a_src[{ai}], a_dst[{ai}];
  int ln0 = 0;
  // The tile of square group `bx` and channels from `nb` becomes the one the loaders read.
  auto setup = [&](int bx, int nb) {{
    ln0 = nb;
#pragma unroll
    for (int i = 0; i < {ai}; ++i) {{
      const int idx = lt + i * {lth};
      const int q = idx / {pieces_a}, r = idx - q * {pieces_a}, px = r >> 1, ch = r & 1;
      const int hy = px / {side}, hx = px - hy * {side} + ch * {shift};
      int img, y0, x0;
      square(bx, q, img, y0, x0);
      const int iy = y0 - {pad} + hy, ix = x0 - {pad} + hx;
      a_dst[i] = q * {sqb} + ch * {chunk_bytes} + px * 16;
      a_src[i] = (lt < 0 || idx >= {sq} * {pieces_a}) ? -2
               : (img >= 0 && hx < {side} && (unsigned)iy < {h}u && (unsigned)ix < {w}u) ? ((img * {h} + iy) * {w} + ix) * {cin} + ch * {chunk_ch}
               : -1;
    }}
  }};
  // The taps' weight tiles of K step channels `c0` on, for channels from `ln0`, at `sb`.
  auto load_taps = [&](unsigned int sb, int c0) {{
#pragma unroll
    for (int i = 0; i < {bi}; ++i) {{
      const int idx = lt + i * {lth};
      const int tap = idx / (2 * BN), r = idx - tap * (2 * BN), row = r >> 1, ch = r & 1;
      if (idx < {b_pieces}) {{
        const unsigned int dst = sb + tap * (32 * BN) + ch * (16 * BN) + row * 16;
        const u8* src = p2 + (i64)(ln0 + row) * {kp} + tap * {tap_bytes} + c0 + ch * 16;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(src));
      }}
    }}
  }};
  auto load = [&](int stage, int ks) {{
    const unsigned int sa = sbase + stage * {slot};
    const int c0 = ks * {step};
#pragma unroll
    for (int i = 0; i < {ai}; ++i) {{
      if (a_src[i] >= 0) {{
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(sa + a_dst[i]), "l"(p0 + (i64)(a_src[i] + c0)));
      }} else if (a_src[i] == -1) {{
        asm volatile("st.shared.v4.u32 [%0], {{%1, %1, %1, %1}};" :: "r"(sa + a_dst[i]), "r"({pad_word}u));
      }}
    }}
{load_taps}  }};
  // Unswizzled K-major descriptors: a square's 8-pixel lines are 8-row groups {side} 16-byte
  // rows apart, its chunks {px_count}; the weights' 8-row groups are 128 bytes apart, their
  // chunks 16·BN.
  auto adesc = [](unsigned int a) -> unsigned long long {{
    return (unsigned long long)((a & 0x3FFFFu) >> 4) | ({px_count}ull << 16) | ({side}ull << 32);
  }};
  auto bdesc = [](unsigned int a) -> unsigned long long {{
    return (unsigned long long)((a & 0x3FFFFu) >> 4) | ((unsigned long long)BN << 16) | (8ull << 32);
  }};
{body}}}
"#,
            smem_decl = ring_smem(),
            warps_m = t.warps_m,
            math = t.math_threads(),
            syx = sy * sx,
            bounds = t.launch_bounds(),
            chunk_bytes = px_count * 16,
            b_pieces = 2 * wgmmas * bn,
        );
        self.src.push_str(&src);
        GenKernel {
            name,
            threads: c.n * c.oh * c.ow * n,
            args: params.iter().map(|(a, _)| *a).collect(),
            launch: Some(LaunchDims {
                grid: (grid.0 as u32, grid.1 as u32, 1),
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

    /// ResNet's 7x7 stride-2 stem over 3 channels of `n` images of 224×224, into 64.
    fn stem(n: usize) -> QConvParts {
        let mut p = super::super::igemm::tests::parts(3, 4, 64, true);
        let g = &mut p.geom;
        (g.n, g.h, g.w, g.kh, g.kw, g.sh, g.sw, g.pt, g.pl) = (n, 224, 224, 7, 7, 2, 2, 3, 3);
        (g.oh, g.ow) = (112, 112);
        p.packed = vec![1; 64 * 7 * 7 * 4];
        p
    }

    #[test]
    fn space_to_depth_stems_fit_as_tap_pairs_over_16_channels() {
        // The stem itself (u8, stride 2) does not fit; its space-to-depth form (4x4 over 16
        // signed channels of 115x115, no padding) does.
        let p = stem(2);
        assert!(!halo_fits(&p));
        let s = p.space_to_depth().expect("stem");
        let shape = HaloShape::of(&s).expect("fits");
        assert_eq!(
            shape,
            HaloShape {
                k: 4,
                pad: 0,
                chunks: 1
            }
        );
        assert_eq!(
            (shape.side(), shape.wgmmas(), shape.square_bytes()),
            (11, 8, 121 * 32)
        );
        // A 3x3 stride-2 stem (EfficientNet's, with 64 outputs) becomes 2x2: one pair a row.
        let mut small = stem(1);
        let g = &mut small.geom;
        (g.kh, g.kw, g.pt, g.pl) = (3, 3, 1, 1);
        small.packed = vec![1; 64 * 3 * 3 * 4];
        let small = small.space_to_depth().expect("stem");
        let shape = HaloShape::of(&small).expect("fits");
        assert_eq!((shape.k, shape.side(), shape.wgmmas()), (2, 9, 2));
        // Odd kernels over 16 channels, 3x3 over 16, and padded 4x4 do not.
        let mut odd = p.space_to_depth().expect("stem");
        (odd.geom.kh, odd.geom.kw, odd.geom.h, odd.geom.w) = (3, 3, 114, 114);
        assert!(!halo_fits(&odd));
        let mut padded = p.space_to_depth().expect("stem");
        (padded.geom.pt, padded.geom.pl, padded.geom.h, padded.geom.w) = (1, 1, 113, 113);
        assert!(!halo_fits(&padded));

        let t = HALO_TILINGS[2];
        let mut g = Gen::new(false);
        let k = g.qhalo(Arg::ScratchAt(0), 1, &s, t);
        let d = k.launch.expect("tiled launch");
        // 2 images of 14x14 squares, 4 per block; 64 channels.
        assert_eq!(d.grid, (98, 1, 1));
        // One K step (two slots): 4 halos of 121 pixels in two chunks and 8 weight tiles of
        // 64 x 32 bytes.
        let slot = 4 * 121 * 32 + 8 * 32 * 64;
        assert_eq!(d.smem as usize, super::super::igemm_smem(&s, t));
        assert!(g
            .src
            .contains(&format!("const unsigned int sa = sbase + stage * {slot};")));
        // Pair j of kernel row ky starts at halo pixel (ky, 2j); its second K half is the
        // second chunk (121 16-byte rows on), which holds each pixel's right neighbour; the
        // 8-row groups are one 11-pixel halo row apart.
        assert!(g
            .src
            .contains("adesc(qa + ((ks / 2) * 11 + (ks % 2) * 2) * 16)"));
        assert!(g.src.contains("for (int ks = 0; ks < 8; ++ks)"));
        assert!(g.src.contains("(121ull << 16) | (11ull << 32)"));
        assert!(g.src.contains("hx = px - hy * 11 + ch * 1;"));
        assert!(g.src.contains("+ ch * 0\n"));
        // Weights: a pair's 32 bytes follow the previous pair's in each 256-byte row.
        assert!(g.src.contains("tap * 32 + c0 + ch * 16"));
        assert!(g.src.contains("const int iy = y0 - 0 + hy"));
    }

    #[test]
    fn persistent_blocks_keep_a_stems_weights_and_store_from_their_own_tile() {
        // 32 images' stems: 14x14 squares each, 2 per tile -> 3136 tiles over 264 blocks.
        let s = stem(32).space_to_depth().expect("stem");
        let t = HALO_TILINGS[0].persistent(264);
        let plan = HaloPlan::new(&s, t);
        // Four slots of two halos only; the output tile and the weights (8 pairs of taps x
        // 64 rows x 32 bytes) after the ring, then the mbarriers.
        let slot = 2 * 121 * 32;
        assert_eq!((plan.t.stages, plan.slot), (4, slot));
        assert_eq!(plan.out, (4 * slot).next_multiple_of(128));
        let weights = (plan.out + 128 * 80).next_multiple_of(128);
        assert_eq!(plan.weights, Some(weights));
        assert_eq!(plan.bars, weights + 8 * 32 * 64);
        assert_eq!(plan.smem, super::super::igemm_smem(&s, t));
        let mut g = Gen::new(false);
        let d = g.qhalo(Arg::ScratchAt(0), 1, &s, t).launch.expect("launch");
        assert_eq!(
            (d.grid, d.block, d.smem as usize),
            ((264, 1, 1), 384, plan.smem)
        );
        // The weights load once, before the loop; the slots hold halos alone.
        assert!(g.src.contains(&format!(
            "for (int k = 0; k < 1; ++k) load_taps(sbase + {weights} + k * 16384, k * 16);"
        )));
        assert!(g
            .src
            .contains(&format!("qb = sbase + {weights} + kk * 16384;")));
        assert!(!g.src.contains("load_taps(sa +"));
        assert!(g.src.contains("const int tiles = 3136, kcnt = 1;"));
        assert!(g.src.contains(&format!("u8* tile = smem + {};", plan.out)));
        // Each math warpgroup stores its own square's rows, after a barrier of its own.
        assert!(g
            .src
            .contains(r#"bar.sync %0, 128;" :: "r"(1 + (warp >> 2))"#));
        assert!(g
            .src
            .contains("const int q = (warp >> 2) * 256 + (tid & 127) + pc * 128;"));

        // Layer 1's 3x3 (64 channels into 64, 56x56): two K steps of nine taps' weights
        // (2 x 9 x 32 x 64 bytes) stay; the slots hold the two K steps' halos.
        let p = parts(32, 56, 64, 64);
        let plan = HaloPlan::new(&p, t);
        let weights = (plan.out + 128 * 80).next_multiple_of(128);
        assert_eq!((plan.slot, plan.weights), (2 * 3200, Some(weights)));
        assert_eq!(plan.bars, weights + 2 * 9 * 32 * 64);
        let mut g = Gen::new(false);
        g.qhalo(Arg::ScratchAt(0), 1, &p, t);
        assert!(g.src.contains(&format!(
            "for (int k = 0; k < 2; ++k) load_taps(sbase + {weights} + k * 18432, k * 32);"
        )));
        assert!(g
            .src
            .contains(&format!("qb = sbase + {weights} + kk * 18432;")));

        // Layer 2's 3x3 (128 into 128, 28x28): 512 tiles over two channel blocks. With 264
        // blocks each keeps one channel block, whose four K steps' weights stay; with 263
        // blocks a block's tiles change channel block, so they load with the halos.
        let p = parts(32, 28, 128, 128);
        let plan = HaloPlan::new(&p, t);
        assert_eq!(plan.tiles, (256, 2));
        assert_eq!(plan.bars - plan.weights.expect("stays"), 4 * 9 * 32 * 64);
        let mut g = Gen::new(false);
        g.qhalo(Arg::ScratchAt(0), 1, &p, t);
        assert!(g.src.contains("ln0 = (blockIdx.x % 2) * BN;"));
        assert_eq!(
            HaloPlan::new(&p, HALO_TILINGS[0].persistent(263)).weights,
            None
        );

        // A 3x3 over 256 channels into 256: 8 K steps of weights (147 KiB) do not stay;
        // they load into the slots, and tiles walk the channel blocks fastest.
        let p = parts(32, 14, 256, 256);
        let plan = HaloPlan::new(&p, t);
        assert_eq!(plan.weights, None);
        assert_eq!(plan.slot, 2 * 3200 + 9 * 32 * 64);
        let mut g = Gen::new(false);
        let d = g.qhalo(Arg::ScratchAt(0), 1, &p, t).launch.expect("launch");
        // 32 x 4 squares in pairs, by 4 channel blocks: 256 tiles, fewer than the 264 asked.
        assert_eq!(d.grid, (256, 1, 1));
        assert!(g.src.contains("load_taps(sa + 6400, c0);"));
        assert!(g.src.contains("setup(tt / 4, (tt % 4) * BN);"));
    }

    #[test]
    fn six_slot_halo_rings_fit_resnet50s_3x3s_at_batch_32() {
        // Hopper's 227 KiB a block: each of ResNet-50's stride-1 3x3 layers takes the deep
        // halo tilings, per tile and persistent, with six slots in the ring.
        for (hw, c) in [(56, 64), (28, 128), (14, 256), (7, 512)] {
            let p = parts(32, hw, c, c);
            for t in DEEP_HALO_TILINGS {
                for t in [t, t.persistent(132)] {
                    let plan = HaloPlan::new(&p, t);
                    assert!(plan.smem <= 227 << 10, "{hw} {c} {t}: {}", plan.smem);
                    let mut g = Gen::new(false);
                    g.qhalo(Arg::ScratchAt(0), 1, &p, t);
                    // Persistent blocks keep six slots; a block per tile cuts them to its K
                    // steps (2 for 64 channels).
                    let slots = if t.ctas > 0 { 6 } else { (c / 32).min(6) };
                    assert_eq!(plan.t.stages, slots, "{hw} {c} {t}");
                    assert!(g.src.contains(&format!("it % {slots}")), "{hw} {c} {t}");
                }
            }
        }
    }
}
