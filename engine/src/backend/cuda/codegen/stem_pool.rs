//! A stride-2 stem and the max pool after it as one kernel: the stem's space-to-depth blocks
//! are multiplied in shared memory with `mma.sync` (the stem's weights stay in shared memory
//! for every tile), the integer sums are pooled there, and only the pooled pixels are
//! requantized and stored. The stem's output, the network's largest activation, is never
//! written or read back, and the pool's kernel disappears. Every code is the one the separate
//! kernels give: the same integer sums, requantization and max.
//!
//! A tile is 7×8 pooled pixels, all channels. Its 3x3 stride-2 windows cover 15×17 stem
//! pixels (255 GEMM rows: 8 warps of 2 `m16` tiles), recomputed where neighbouring tiles'
//! windows overlap. Persistent blocks walk the tiles, and each copies the next tile's blocks
//! into shared memory (`cp.async`) while it multiplies and pools the current one.
//!
//! The pool runs on the integer sums, before the requantization: with positive multipliers
//! and a non-decreasing activation the requantization is non-decreasing in the sum, so the
//! max of the codes is the code of the max sum, and only the pooled pixels (a quarter of the
//! stem's) are requantized.

use super::igemm::{mma_slice, ring_smem};
use super::quant::{requant_value, QConvParts, REQUANT_BYTE};
use super::{Arg, Gen, GenKernel, LaunchDims};
use crate::ir::{AutoPad, DataType, Layout, PoolAttrs, ValueId};
use std::fmt::Write;

/// Pooled rows and columns per tile.
const PH: usize = 7;
const PW: usize = 8;
/// Stem rows and columns per tile: the pooled tile's windows.
const SR: usize = 2 * PH + 1;
const SC: usize = 2 * PW + 1;
/// GEMM rows per tile (stem pixels), at most 8 warps × 2 `m16` tiles.
const M: usize = SR * SC;
/// Threads per block: 8 warps along M, each over all channels.
const THREADS: usize = 256;

/// The max pool a stem kernel absorbs: 3x3, stride 2, padding 1 at the top and left (the
/// ResNet and ShuffleNet pool), over the stem's NHWC codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StemPool {
    /// Pooled rows and columns.
    pub oh: usize,
    pub ow: usize,
    /// The codes are i8 (else u8).
    pub signed: bool,
}

/// The pool the fused stem kernel can take from QConv `p` (the stride-2 stem, before
/// space-to-depth) into MaxPool `a` with output shape `pooled` (NHWC) over codes of type
/// `dt`, or None: a stem with a space-to-depth form, no residual, at most 64 channels (a
/// multiple of 4) whose requantization is non-decreasing in the sum (positive multipliers, no
/// activation beyond clamps and non-negative slopes); a 3x3 stride-2 pool padded by 1 at the
/// top and left.
pub fn stem_pool_fits(
    p: &QConvParts,
    a: &PoolAttrs,
    pooled: &[usize],
    dt: DataType,
) -> Option<StemPool> {
    let c = &p.geom;
    let s2d = p.space_to_depth()?;
    let pool_ok = a.layout == Layout::Nhwc
        && a.auto_pad == AutoPad::NotSet
        && a.kernel_shape == [3, 3]
        && a.strides == [2, 2]
        && a.dilations.iter().all(|&d| d == 1)
        && a.pads.len() == 4
        && a.pads[..2] == [1, 1];
    let [n, oh, ow, cout] = *pooled else {
        return None;
    };
    let fits = pool_ok
        && matches!(dt, DataType::U8 | DataType::I8)
        && p.residual.is_none()
        && p.epi.general.is_none()
        && p.epi.slope >= 0.0
        && p.mult.iter().all(|&m| m > 0.0)
        && (n, cout) == (c.n, c.cout)
        && c.cout.is_multiple_of(4)
        && c.cout <= 64
        && oh > 0
        && ow > 0
        && s2d.geom.kh * s2d.geom.kw * 16 <= 1024
        && c.n * c.h * c.w * c.cin < i32::MAX as usize;
    fits.then_some(StemPool {
        oh,
        ow,
        signed: dt == DataType::I8,
    })
}

/// Where the kernel's shared memory goes: the weights, two space-to-depth tiles (the current
/// one and the next one arriving), the stem's integer sums.
struct StemPoolPlan {
    /// Output channels padded to 16 (pairs of `n8` tiles).
    np: usize,
    /// 64-byte K slices of the weights.
    ks: usize,
    /// Space-to-depth tile rows, columns used and columns stored (the stored row length keeps
    /// consecutive stem pixels in consecutive banks across a row's end).
    tr: usize,
    tcu: usize,
    tc: usize,
    /// 32-bit words of a row of sums: the channels padded to 32, so that the XOR swizzle of
    /// 8-word groups by the row stays in the row.
    rw: usize,
    x_at: usize,
    /// Bytes of one space-to-depth tile.
    xbytes: usize,
    o_at: usize,
    smem: usize,
}

impl StemPoolPlan {
    fn new(s2d: &QConvParts) -> StemPoolPlan {
        let d = &s2d.geom;
        let np = d.cout.next_multiple_of(16);
        let ks = (d.kh * d.kw).div_ceil(4);
        let (tr, tcu) = (SR + d.kh - 1, SC + d.kw - 1);
        let tc = tcu + (SC + 8 - tcu % 8) % 8;
        let rw = d.cout.next_multiple_of(32);
        let x_at = ks * np * 64;
        let xbytes = tr * tc * 16;
        let o_at = x_at + 2 * xbytes;
        StemPoolPlan {
            np,
            ks,
            tr,
            tcu,
            tc,
            rw,
            x_at,
            xbytes,
            o_at,
            smem: o_at + 256 * rw * 4 + 1024,
        }
    }
}

/// Dynamic shared-memory bytes of the fused stem kernel of `s2d` (a stem's space-to-depth
/// form).
pub fn stem_pool_smem(s2d: &QConvParts) -> usize {
    StemPoolPlan::new(s2d).smem
}

impl Gen {
    /// The fused kernel of the stem whose space-to-depth form is `s2d` (its blocks at `x`, as
    /// [`Gen::space_to_depth_into_scratch`] writes them) and the max pool `pool` into `y` (the
    /// pool's NHWC output), over at most `blocks` persistent blocks; check [`stem_pool_fits`]
    /// first.
    pub fn stem_pool(
        &mut self,
        x: Arg,
        s2d: &QConvParts,
        (pool, y): (StemPool, ValueId),
        blocks: usize,
    ) -> GenKernel {
        let plan = StemPoolPlan::new(s2d);
        let StemPoolPlan {
            np,
            ks,
            tr,
            tcu,
            tc,
            ..
        } = plan;
        let d = &s2d.geom;
        let (kp, params) = self.igemm_params(x, Arg::Val(y), s2d);
        let name = self.next_name();
        let plist = Self::param_list(&params);
        let wn = np / 8;
        let taps = d.kh * d.kw;
        let (ty, tx) = (pool.oh.div_ceil(PH), pool.ow.div_ceil(PW));
        let jobs = d.n * ty * tx;
        let gemm = mma_slice("acc", (2, wn), "xs + abase[i] + tap_at(r * 4 + ch)");
        let requant = requant_value(&s2d.epi, None);
        // A window without a stem pixel in the image gives the lowest code, as in the separate
        // pool kernel.
        let lo = if pool.signed { -128 } else { 0 };
        let cq = d.cout / 4;
        let int_min = "(-2147483647 - 1)";
        let mut s = String::new();
        let _ = write!(
            s,
            r#"
extern "C" __global__ void __launch_bounds__({THREADS}, 2) {name}({plist}) {{
{smem_decl}
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wmi = warp, wni = 0;
  const unsigned int ws = sbase;
  int* ssm = (int*)(smem + {o_at});
  const int* bias2 = (const int*)p3;
  const float* mult = (const float*)p4;
  // The weights stay for every tile: K slices of {np} rows by 64 bytes, swizzled as the
  // multiply reads them, rows past the channels zero. Constants: loaded before the wait.
  for (int q = tid; q < {wq}; q += {THREADS}) {{
    const int col = q & 3, row = (q >> 2) % {np}, r = (q >> 2) / {np};
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (row < {cout}) v = *(const uint4*)(p2 + row * {kp} + r * 64 + col * 16);
    *(uint4*)(smem + r * {slice} + row * 64 + ((col ^ ((row >> 1) & 3)) << 4)) = v;
  }}
  // A row's stem pixel in the space-to-depth tile (rows past the tile's pixels repeat its
  // last), and a tap's block offset from it (taps past the kernel's read its last; their
  // weights are zero).
  unsigned int abase[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {{
    const int pr = min(wmi * 32 + i * 16 + (lane & 15), {mlast});
    abase[i] = (unsigned int)(((pr / {SC}) * {tc} + pr % {SC}) * 16);
  }}
  auto tap_at = [](int tp) -> unsigned int {{
    tp = tp < {taps} ? tp : {taps} - 1;
    return (unsigned int)(((tp / {kw2}) * {tc} + tp % {kw2}) * 16);
  }};
  // Tile `job`'s image and first pooled row and column.
  auto origin = [](int job, int& tn, int& py0, int& px0) {{
    tn = job / {txy};
    const int trem = job - tn * {txy}, tyy = trem / {tx};
    py0 = tyy * {PH};
    px0 = (trem - tyy * {tx}) * {PW};
  }};
  // Copies tile `job`'s space-to-depth blocks into tile buffer `buf` (zeros for blocks
  // outside the copy: they only feed stem pixels outside the image).
  auto stage = [&](int job, int buf) {{
    int tn, py0, px0;
    origin(job, tn, py0, px0);
    const int sy0 = 2 * py0 - 1, sx0 = 2 * px0 - 1;
    for (int b = tid; b < {tb}; b += {THREADS}) {{
      const int br = b / {tcu}, bc = b - br * {tcu}, yy = sy0 + br, xx = sx0 + bc;
      const bool ok = yy >= 0 && yy < {dh} && xx >= 0 && xx < {dw};
      const u8* src = p0 + (((i64)tn * {dh} + (ok ? yy : 0)) * {dw} + (ok ? xx : 0)) * 16;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(sbase + {x_at} + buf * {xbytes} + (br * {tc} + bc) * 16), "l"(src), "r"(ok ? 16 : 0));
    }}
    asm volatile("cp.async.commit_group;");
  }};
  // The max over stem row `r` of the tile (its sums, channels 4·cq..) at the three columns
  // of pooled column `lx`, skipping stem pixels outside the image.
  auto row_max = [&](int r, int lx, int cq, int sy0, int sx0, bool& any) -> int4 {{
    int4 m = make_int4({int_min}, {int_min}, {int_min}, {int_min});
    if (sy0 + r < 0 || sy0 + r >= {oh}) return m;
#pragma unroll
    for (int kx = 0; kx < 3; ++kx) {{
      const int sx = sx0 + 2 * lx + kx;
      if (sx < 0 || sx >= {ow}) continue;
      const int row = r * {SC} + 2 * lx + kx;
      const int4 v = *(const int4*)(ssm + row * {rw} + ((cq * 4) ^ ((row & 3) << 3)));
      m.x = max(m.x, v.x); m.y = max(m.y, v.y); m.z = max(m.z, v.z); m.w = max(m.w, v.w);
      any = true;
    }}
    return m;
  }};
  GRID_SYNC();
  if (blockIdx.x < {jobs}) stage(blockIdx.x, 0);
  int buf = 0;
  for (int job = blockIdx.x; job < {jobs}; job += gridDim.x, buf ^= 1) {{
    int tn, py0, px0;
    origin(job, tn, py0, px0);
    const int sy0 = 2 * py0 - 1, sx0 = 2 * px0 - 1;
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    // The next tile's blocks arrive while this one is multiplied and pooled.
    if (job + gridDim.x < {jobs}) stage(job + gridDim.x, buf ^ 1);
    const unsigned int xs = sbase + {x_at} + buf * {xbytes};
    int acc[2][{wn}][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < {wn}; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0;
#pragma unroll
    for (int r = 0; r < {ks}; ++r) {{
      const unsigned int sb = ws + r * {slice};
{gemm}    }}
    // The sums into shared memory, two channels a store; a row's 8-word groups are swizzled
    // by the row, so a half warp's stores fall in distinct banks.
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < {wn}; ++j)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {{
          const int rl = wmi * 32 + i * 16 + (lane >> 2) + hh * 8, cl = j * 8 + (lane & 3) * 2;
          *(int2*)(ssm + rl * {rw} + (cl ^ ((rl & 3) << 3))) = make_int2(acc[i][j][hh * 2], acc[i][j][hh * 2 + 1]);
        }}
    __syncthreads();
    // The pool, a pooled column and four channels a thread, down the tile: each stem row's
    // max over the window's three columns serves the one or two pooled rows it belongs to;
    // then the bias and the requantization of each pooled max.
    for (int e = tid; e < {pe}; e += {THREADS}) {{
      const int lx = e / {cq}, cq = e - lx * {cq}, px = px0 + lx;
      if (px >= {pow}) continue;
      bool any_top = false;
      int4 top = row_max(0, lx, cq, sy0, sx0, any_top);
#pragma unroll 1
      for (int ly = 0; ly < {PH}; ++ly) {{
        const int py = py0 + ly;
        if (py >= {poh}) break;
        bool any = any_top, any_bottom = false;
        const int4 mid = row_max(2 * ly + 1, lx, cq, sy0, sx0, any);
        const int4 bottom = row_max(2 * ly + 2, lx, cq, sy0, sx0, any_bottom);
        const int m[4] = {{max(max(top.x, mid.x), bottom.x), max(max(top.y, mid.y), bottom.y),
                          max(max(top.z, mid.z), bottom.z), max(max(top.w, mid.w), bottom.w)}};
        any = any || any_bottom;
        unsigned int word = 0;
#pragma unroll
        for (int e4 = 0; e4 < 4; ++e4) {{
          const int co = cq * 4 + e4;
          int t = (int)((unsigned int)m[e4] + (unsigned int)bias2[co]);
          {requant}
          if (!any) q = {lo};
          word |= (unsigned int)({REQUANT_BYTE}) << (8 * e4);
        }}
        *(unsigned int*)(p1 + (((i64)tn * {poh} + py) * {pow} + px) * {cout} + cq * 4) = word;
        top = bottom;
        any_top = any_bottom;
      }}
    }}
  }}
}}
"#,
            smem_decl = ring_smem(),
            x_at = plan.x_at,
            xbytes = plan.xbytes,
            o_at = plan.o_at,
            rw = plan.rw,
            wq = ks * np * 4,
            cout = d.cout,
            slice = np * 64,
            mlast = M - 1,
            kw2 = d.kw,
            txy = ty * tx,
            tb = tr * tcu,
            dh = d.h,
            dw = d.w,
            pe = PW * cq,
            poh = pool.oh,
            pow = pool.ow,
            oh = d.oh,
            ow = d.ow,
        );
        self.src.push_str(&s);
        GenKernel {
            name,
            threads: d.n * pool.oh * pool.ow * d.cout,
            args: params.iter().map(|(a, _)| *a).collect(),
            launch: Some(LaunchDims {
                grid: (jobs.min(blocks.max(1)) as u32, 1, 1),
                block: THREADS as u32,
                smem: plan.smem as u32,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::kernels::ConvGeometry;

    /// ResNet's stem: 3 channels, 7x7 stride 2 padding 3, `cout` channels, over `hw`².
    fn resnet_stem(cout: usize, hw: usize) -> QConvParts {
        let geom = ConvGeometry::plain(2, (3, cout), (hw, hw), (7, 2, 3));
        let packed = (0..cout * 49 * 4).map(|i| (i * 7) as u8).collect();
        QConvParts::for_test(geom, packed, 4, -3, true)
    }

    fn pool(k: usize, s: usize, pad: usize) -> PoolAttrs {
        PoolAttrs {
            kernel_shape: vec![k, k],
            strides: vec![s, s],
            pads: vec![pad; 4],
            dilations: vec![1, 1],
            ceil_mode: false,
            auto_pad: AutoPad::NotSet,
            count_include_pad: false,
            layout: Layout::Nhwc,
        }
    }

    #[test]
    fn only_a_three_by_three_stride_two_pool_after_a_small_stem_fits() {
        let p = resnet_stem(64, 224);
        let shape = [2, 56, 56, 64];
        let fit = stem_pool_fits(&p, &pool(3, 2, 1), &shape, DataType::U8);
        assert_eq!(
            fit,
            Some(StemPool {
                oh: 56,
                ow: 56,
                signed: false
            })
        );
        assert!(stem_pool_fits(&p, &pool(3, 2, 1), &shape, DataType::I8).is_some_and(|f| f.signed));
        // Other pools, float codes, a wider stem, or an NCHW pool take the separate kernels.
        assert!(stem_pool_fits(&p, &pool(2, 2, 0), &shape, DataType::U8).is_none());
        assert!(stem_pool_fits(&p, &pool(3, 1, 1), &shape, DataType::U8).is_none());
        assert!(stem_pool_fits(&p, &pool(3, 2, 1), &shape, DataType::F32).is_none());
        let mut nchw = pool(3, 2, 1);
        nchw.layout = Layout::Nchw;
        assert!(stem_pool_fits(&p, &nchw, &shape, DataType::U8).is_none());
        let wide = resnet_stem(96, 224);
        assert!(stem_pool_fits(&wide, &pool(3, 2, 1), &[2, 56, 56, 96], DataType::U8).is_none());
        // The pool's output must be the stem's batch and channels.
        assert!(stem_pool_fits(&p, &pool(3, 2, 1), &[2, 56, 56, 32], DataType::U8).is_none());
    }

    #[test]
    fn the_kernel_keeps_weights_resident_and_pools_the_stems_sums() {
        let p = resnet_stem(64, 224);
        let s2d = p.space_to_depth().expect("stem");
        let fit = stem_pool_fits(&p, &pool(3, 2, 1), &[2, 56, 56, 64], DataType::U8).expect("fits");
        let mut gen = Gen::new(false);
        let k = gen.stem_pool(Arg::ScratchAt(0), &s2d, (fit, 9), 264);
        // The blocks, the pooled output, then the stem's three tables.
        assert_eq!(k.args[..2], [Arg::ScratchAt(0), Arg::Val(9)]);
        assert_eq!(k.args.len(), 5);
        assert_eq!(gen.extras.len(), 3);
        // 2 images × 8 × 7 tiles of 7×8 pooled pixels, fewer than the blocks allowed.
        let d = k.launch.expect("tiled");
        assert_eq!(d.grid, (112, 1, 1));
        assert_eq!(d.smem as usize, stem_pool_smem(&s2d));
        // 16 taps: 4 K slices; the weights are read once, before the wait for the blocks.
        let src = &gen.src;
        assert!(src.contains("for (int r = 0; r < 4; ++r)"), "{src}");
        let wait = src.find("GRID_SYNC();").expect("wait");
        assert!(src.find("p2 + row * 256").expect("weights") < wait);
        // Each tile's 18×20 blocks (of the 115×115 the copy holds) are staged ahead, the
        // first after the wait; rows stored 25 blocks long (17 mod 8 = 25 mod 8).
        assert!(
            wait < src
                .find("if (blockIdx.x < 112) stage(blockIdx.x, 0);")
                .expect("first")
        );
        assert!(src.contains("b < 360;") && src.contains("(br * 25 + bc) * 16"));
        assert!(src.contains("yy < 115 && xx >= 0 && xx < 115"));
        // The sums pooled over the window's pixels in the image (the stem's 112×112), then
        // requantized; an empty window gives u8's lowest code.
        assert!(src.contains("sy0 + r >= 112") && src.contains("sx >= 112"));
        assert!(src.contains("m.w = max(m.w, v.w)") && src.contains("if (!any) q = 0;"));
        let pool = src.find("m.w = max(m.w, v.w)").expect("pool");
        assert!(pool < src.find("__int2float_rn(t)").expect("requantization"));
        if let Ok(p) = std::env::var("DUMP") {
            std::fs::write(p, src).ok();
        }
    }
}
