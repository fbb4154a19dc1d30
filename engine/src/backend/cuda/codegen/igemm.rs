//! The int8 implicit-GEMM convolution: NHWC signed-byte input read straight from the
//! activation (no patch matrix), tensor-core `mma.sync.m16n8k32` with i32 accumulators, and the
//! requantization (plus an optional int8 residual) applied to the accumulators before one
//! int8 store. The epilogue is [`super::quant`]'s (same float operations), so without a
//! residual the result equals the CPU backend's bit for bit.
//!
//! Tiles: a block computes `BM` pixels × `BN` output channels; K (taps × channels, tap-major
//! like the packed weights) advances 64 bytes at a time through a `stages`-deep `cp.async`
//! ring in shared memory. A tile row is four 16-byte chunks stored XOR-swizzled by
//! `(row >> 1) & 3`, so the `ldmatrix` reads of eight rows hit eight different bank groups.
//! Each 16-byte chunk of A lies inside one tap (channels are a multiple of 16); taps that fall
//! in the padding are the input zero point's byte, as in the unfold.
//!
//! On Hopper the same ring feeds `wgmma` instead (that XOR pattern is the hardware's 64-byte
//! swizzle, so shared-memory descriptors address the tiles as stored), and any tiling may split
//! K across blocks that write int32 partial sums for [`Gen::qrequant`] to add up.

use std::fmt::Write as _;

use super::quant::{i32_bytes, requant_saturating, requant_value, QConvParts};
use super::{f32_bytes, Arg, Gen, GenKernel, LaunchDims, TensorMap2d};
use crate::ir::ValueId;

/// A block's shape: `warps_m × warps_n` warps, each computing `wm` 16-row by `wn` 8-column
/// mma tiles, over a `stages`-deep shared-memory ring. `wgmma` tilings (Hopper) issue one
/// `wgmma` per warpgroup of 4 warps along M (`warps_n = wm = 1`) reading both operands from
/// shared memory; their accumulators land in the same rows and columns as the mma tiles'.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tiling {
    pub warps_m: usize,
    pub warps_n: usize,
    pub wm: usize,
    pub wn: usize,
    pub stages: usize,
    pub wgmma: bool,
    /// K split across `splits` blocks (grid z), each writing its int32 sums to its own
    /// partial buffer for [`Gen::qrequant`] to add up (1: the kernel requantizes itself).
    pub splits: usize,
    /// The K split's blocks form one thread-block cluster (sm_90) per output tile instead:
    /// block 0 adds the others' sums from their shared memory and requantizes itself.
    pub cluster: bool,
    /// The K split's blocks leave their int32 sums in a workspace and count themselves in on
    /// a per-tile counter; the last one adds the others' sums and requantizes (no
    /// requantization pass, no cluster; any loop).
    pub serial: bool,
    /// Persistent blocks: `ctas` blocks loop over the output tiles, loading the next tile (and
    /// its residual) while the current one is requantized and stored (0: a block per tile).
    pub ctas: usize,
    /// Warp-specialized (wgmma only) when nonzero: this many more warps only load the ring,
    /// and the warpgroups that multiply wait on per-slot mbarriers, not a block barrier.
    pub loaders: usize,
    /// A 3x3 convolution over halo tiles ([`super::halo`]): `warps_m / 4` squares of 8×8
    /// output pixels, each loaded once with its one-pixel border for all nine taps.
    pub halo: bool,
    /// Blocks per SM the kernel is compiled for (`__launch_bounds__`' second argument, which
    /// caps registers so they fit; 0: the compiler's choice).
    pub min_blocks: usize,
    /// The ring is filled by TMA (a warp-specialized tiling with one loader warp, whose first
    /// lane copies each slot's A and B tiles with two `cp.async.bulk.tensor`s); 1x1 stride-1
    /// convolutions only ([`tma_fits`]).
    pub tma: bool,
    /// A TMA tiling whose two channel blocks of one pixel tile are in one thread-block
    /// cluster: each block's loader copies half of their shared A tile and multicasts it
    /// into both blocks' rings, so A crosses L2 once for both; a slot is refilled once every
    /// block that writes it has released it.
    pub multicast: bool,
    /// The same for B: two pixel blocks of one channel tile share each weight tile (with
    /// [`Tiling::multicast`] too, a 2×2 cluster). A grid of an odd number of pixel blocks gets
    /// one more, which loads zeros and stores nothing.
    pub multicast_b: bool,
}

impl Tiling {
    /// Output pixels per block.
    pub fn bm(&self) -> usize {
        self.warps_m * self.wm * 16
    }
    /// Output channels per block.
    pub fn bn(&self) -> usize {
        self.warps_n * self.wn * 8
    }
    /// Threads per block: those that multiply, plus a warp-specialized tiling's loaders.
    pub fn threads(&self) -> usize {
        self.math_threads() + 32 * self.loaders
    }
    /// Threads that hold accumulators (warps `0..warps_m·warps_n`).
    pub(super) fn math_threads(&self) -> usize {
        32 * self.warps_m * self.warps_n
    }
    /// Threads that fill the ring: a warp-specialized tiling's loader warps, else all.
    fn load_threads(&self) -> usize {
        if self.loaders > 0 {
            32 * self.loaders
        } else {
            self.math_threads()
        }
    }
    /// The launch grid for `m` pixels and `n` channels.
    pub fn grid(&self, m: usize, n: usize) -> (usize, usize) {
        (m.div_ceil(self.bm()), n.div_ceil(self.bn()))
    }
    /// Bytes of one ring stage (A and B tiles, 64-byte rows).
    fn stage_bytes(&self) -> usize {
        (self.bm() + self.bn()) * 64
    }
    /// Dynamic shared-memory bytes of the ring, aligned in the kernel to 1024 bytes (the
    /// wgmma swizzle is address-based).
    pub fn smem(&self) -> usize {
        self.stages * self.stage_bytes() + 1024
    }
    /// Bytes of a warp-specialized tiling's mbarriers: a "full" and an "empty" one per slot.
    fn barrier_bytes(&self) -> usize {
        if self.loaders > 0 {
            16 * self.stages
        } else {
            0
        }
    }
    /// This tiling with its ring cut to what `kcnt` K tiles per block can fill (a 1x1
    /// convolution over 64 channels has one): less shared memory, more blocks per SM.
    fn for_k_tiles(self, kcnt: usize) -> Tiling {
        let (gap, least) = if self.wgmma { (2, 3) } else { (1, 2) };
        Tiling {
            stages: self.stages.min(kcnt + gap).max(least),
            ..self
        }
    }
    /// K tiles loaded ahead of the one being multiplied: a wgmma tiling keeps one group of
    /// wgmmas in flight, so the slot it reads is refilled one iteration later.
    fn ahead(&self) -> usize {
        if self.wgmma {
            self.stages - 2
        } else {
            self.stages - 1
        }
    }
    /// An `mma.sync` tiling: `warps_m × warps_n` warps of `wm × wn` mma tiles each.
    pub(super) const fn mma(
        warps_m: usize,
        warps_n: usize,
        wm: usize,
        wn: usize,
        stages: usize,
    ) -> Tiling {
        Tiling {
            warps_m,
            warps_n,
            wm,
            wn,
            stages,
            wgmma: false,
            splits: 1,
            cluster: false,
            serial: false,
            ctas: 0,
            loaders: 0,
            halo: false,
            min_blocks: 0,
            tma: false,
            multicast: false,
            multicast_b: false,
        }
    }
    /// A wgmma tiling: `groups` warpgroups along M, each `m64 × bn`, over `stages` stages.
    pub(super) const fn wg(groups: usize, bn: usize, stages: usize) -> Tiling {
        Tiling {
            warps_m: 4 * groups,
            warps_n: 1,
            wm: 1,
            wn: bn / 8,
            stages,
            wgmma: true,
            splits: 1,
            cluster: false,
            serial: false,
            ctas: 0,
            loaders: 0,
            halo: false,
            min_blocks: 0,
            tma: false,
            multicast: false,
            multicast_b: false,
        }
    }
    /// This wgmma tiling fed by TMA (see [`Tiling::tma`]): one loader warp.
    pub fn with_tma(self) -> Tiling {
        Tiling {
            loaders: 1,
            tma: true,
            ..self
        }
    }
    /// This TMA tiling with its A tiles multicast across a cluster of two channel blocks
    /// (see [`Tiling::multicast`]).
    pub fn with_multicast(self) -> Tiling {
        Tiling {
            multicast: self.tma,
            ..self
        }
    }
    /// This TMA tiling with its B tiles multicast across a cluster of two pixel blocks
    /// (see [`Tiling::multicast_b`]).
    pub fn with_multicast_b(self) -> Tiling {
        Tiling {
            multicast_b: self.tma,
            ..self
        }
    }
    /// Whether the blocks form multicast clusters.
    pub fn clustered(&self) -> bool {
        self.multicast || self.multicast_b
    }
    /// The multicast cluster's blocks along pixels and along channels.
    pub(super) fn cluster_dims(&self) -> (usize, usize) {
        (
            1 + usize::from(self.multicast_b),
            1 + usize::from(self.multicast),
        )
    }
    /// Blocks that write into each block's ring: itself, and its A and B peers.
    fn writers(&self) -> usize {
        1 + usize::from(self.multicast) + usize::from(self.multicast_b)
    }
    /// This tiling with K split `s` ways.
    pub fn split(self, s: usize) -> Tiling {
        Tiling { splits: s, ..self }
    }
    /// This tiling with K split `s` ways over a cluster of `s` blocks (see [`Tiling::cluster`]).
    pub fn split_in_cluster(self, s: usize) -> Tiling {
        Tiling {
            splits: s,
            cluster: true,
            ..self
        }
    }
    /// This tiling with K split `s` ways, the last block of each tile adding up (see
    /// [`Tiling::serial`]).
    pub fn split_serial(self, s: usize) -> Tiling {
        Tiling {
            splits: s,
            serial: true,
            ..self
        }
    }
    /// Whether the blocks write int32 partial sums for a separate requantization.
    pub fn partials(&self) -> bool {
        self.splits > 1 && !self.cluster && !self.serial
    }
    /// Bytes of a serial K split's workspace for `m` pixels and `n` channels: every block's
    /// sums, whole tiles (0 for other tilings).
    pub fn serial_bytes(&self, m: usize, n: usize) -> usize {
        if !self.serial {
            return 0;
        }
        let (gx, gy) = self.grid(m, n);
        gx * gy * self.splits * self.bm() * self.bn() * 4
    }
    /// This wgmma tiling warp-specialized with `warps` loader warps (see [`Tiling::loaders`]).
    pub fn warp_specialized(self, warps: usize) -> Tiling {
        Tiling {
            loaders: if self.wgmma { warps } else { 0 },
            ..self
        }
    }
    /// This tiling compiled for `blocks` blocks per SM (see [`Tiling::min_blocks`]).
    pub fn resident(self, blocks: usize) -> Tiling {
        Tiling {
            min_blocks: blocks,
            ..self
        }
    }
    /// The kernel's `__launch_bounds__` arguments.
    pub(super) fn launch_bounds(&self) -> String {
        match self.min_blocks {
            0 => self.threads().to_string(),
            b => format!("{}, {b}", self.threads()),
        }
    }
    /// This tiling as `ctas` persistent blocks (see [`Tiling::ctas`]).
    pub fn persistent(self, ctas: usize) -> Tiling {
        Tiling { ctas, ..self }
    }
    /// The output tile's shared bytes: `BM` rows of `BN + 16` (padded against bank conflicts).
    fn out_tile_bytes(&self) -> usize {
        self.bm() * (self.bn() + 16)
    }
    /// Dynamic shared-memory bytes of a persistent kernel of this tiling with `kt` K tiles:
    /// the ring and two output tiles (the current one's and the next one's residual).
    pub fn persistent_smem(&self, kt: usize) -> usize {
        self.for_k_tiles(kt).smem() + 2 * self.out_tile_bytes()
    }
}

impl std::fmt::Display for Tiling {
    /// `BMxBN` (mma.sync), `wgBMxBN/stages` (wgmma) or `haloBMxBN/stages`, plus any K split,
    /// as the profile's notes show it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.halo {
            write!(f, "halo{}x{}/{}", self.bm(), self.bn(), self.stages)?;
        } else if self.wgmma {
            write!(f, "wg{}x{}/{}", self.bm(), self.bn(), self.stages)?;
        } else {
            write!(f, "{}x{}", self.bm(), self.bn())?;
        }
        if self.splits > 1 {
            write!(f, " split-k {}", self.splits)?;
        }
        if self.cluster {
            write!(f, " cluster")?;
        }
        if self.serial {
            write!(f, " serial")?;
        }
        if self.ctas > 0 {
            write!(f, " persistent {}", self.ctas)?;
        }
        if self.tma {
            write!(f, " tma")?;
            match (self.multicast, self.multicast_b) {
                (true, true) => write!(f, " mcAB")?,
                (true, false) => write!(f, " mcA")?,
                (false, true) => write!(f, " mcB")?,
                (false, false) => {}
            }
        } else if self.loaders > 0 && !self.halo {
            write!(f, " ws{}", self.loaders)?;
        }
        if self.min_blocks > 0 {
            write!(f, " x{}", self.min_blocks)?;
        }
        Ok(())
    }
}

/// The block shapes tried per convolution (the fastest measured one is kept): 128×128 for
/// large GEMMs, 128×64 for 64-channel outputs, 64×128 and 64×64 for GEMMs whose larger
/// grids would leave SMs idle.
pub const TILINGS: [Tiling; 4] = [
    Tiling::mma(2, 4, 4, 4, 3),
    Tiling::mma(2, 4, 2, 4, 4),
    Tiling::mma(2, 2, 2, 4, 4),
    Tiling::mma(4, 2, 2, 4, 4),
];

/// The Hopper (sm_90a) tilings, tried besides [`TILINGS`]: deeper rings in dynamic shared
/// memory and tiles up to 128×256. (Rings of 12 and 16 stages, ~193 KiB, were never faster on
/// ResNet-50's long-K layers: the K loop is not waiting on its loads.)
pub const WG_TILINGS: [Tiling; 5] = [
    Tiling::wg(2, 256, 5),
    Tiling::wg(2, 128, 6),
    Tiling::wg(2, 64, 6),
    Tiling::wg(1, 128, 6),
    Tiling::wg(1, 256, 5),
];

/// Deeper-ring versions of the workhorse wgmma tilings (8 slots instead of 5–6: two more K
/// tiles in flight), timed only with `VIGIL_CUDA_DEEP`.
pub const DEEP_WG_TILINGS: [Tiling; 3] = [
    Tiling::wg(2, 128, 8),
    Tiling::wg(2, 64, 8),
    Tiling::wg(1, 128, 8),
];

/// The part counts worth timing for a serial K split ([`Tiling::split_serial`]) of `tiles`
/// output tiles over `kt` K tiles on `slots` resident blocks: the two from 2 to 8 (every part
/// 2 K tiles or more, none empty) whose blocks come closest to whole waves, if they fill the
/// slots 5% better than the unsplit grid (a grid of a few tiles, at batch 1, takes the most
/// parts); none at more than two waves unsplit.
pub fn serial_parts(tiles: usize, slots: usize, kt: usize) -> Vec<usize> {
    let slots = slots.max(1);
    let fill = |blocks: usize| blocks as f64 / (blocks.div_ceil(slots) * slots) as f64;
    if tiles == 0 || tiles >= 2 * slots {
        return Vec::new();
    }
    let mut parts: Vec<usize> = (2..=8)
        .filter(|&s| kt / s >= 2 && (s - 1) * kt.div_ceil(s) < kt)
        .filter(|&s| fill(tiles * s) > fill(tiles) * 1.05)
        .collect();
    parts.sort_by(|&a, &b| fill(tiles * b).total_cmp(&fill(tiles * a)).then(a.cmp(&b)));
    parts.truncate(2);
    parts
}

/// Serial K splits worth timing for `p`: K of 8 tiles of 64 or more over the 128×128 and
/// 128×64 wgmma tiles (TMA-fed too when `tma`), each split into the part counts
/// [`serial_parts`] picks for its grid on `slots(t)` resident blocks of tiling `t`.
pub fn serial_tilings(p: &QConvParts, tma: bool, slots: impl Fn(Tiling) -> usize) -> Vec<Tiling> {
    let c = &p.geom;
    let (m, n) = (c.n * c.oh * c.ow, c.cout);
    let kt = (c.kh * c.kw * p.c4).div_ceil(64);
    if kt < 8 {
        return Vec::new();
    }
    let mut base = vec![WG_TILINGS[1], WG_TILINGS[2]];
    if tma {
        base.extend([WG_TILINGS[1].with_tma(), WG_TILINGS[2].with_tma()]);
    }
    base.into_iter()
        .flat_map(|t| {
            let (gx, gy) = t.grid(m, n);
            serial_parts(gx * gy, slots(t), kt)
                .into_iter()
                .map(move |s| t.split_serial(s))
        })
        .collect()
}

/// The multicast versions of the unsplit TMA tilings among `tilings` for an `m` × `n` output:
/// B tiles shared by pixel-block pairs, and where the channel blocks pair up, A tiles shared
/// by them, alone and with B in a 2×2 cluster.
pub fn multicast_versions(tilings: &[Tiling], m: usize, n: usize) -> Vec<Tiling> {
    let mut out = Vec::new();
    for t in tilings
        .iter()
        .filter(|t| t.tma && t.splits == 1 && !t.clustered())
    {
        out.push(t.with_multicast_b());
        if t.grid(m, n).1.is_multiple_of(2) {
            out.extend([t.with_multicast(), t.with_multicast().with_multicast_b()]);
        }
    }
    out
}

/// Convolutions with at most this many K tiles fetch their residual with the first one.
const PREFETCH_K_TILES: usize = 4;

/// Whether `p` fits the implicit GEMM: one group, output channels a multiple of 8, and every
/// index within 31 bits. Signed inputs with channels a multiple of 16 are copied into shared
/// memory 16 bytes at a time; others (RGB stems, u8 inputs) are gathered a byte at a time.
pub fn igemm_fits(p: &QConvParts) -> bool {
    let c = &p.geom;
    let m = c.n * c.oh * c.ow;
    let k = c.kh * c.kw * p.c4;
    let big = |v: usize| v >= i32::MAX as usize / 2;
    c.groups == 1
        && c.cout.is_multiple_of(8)
        && !big(c.n * c.h * c.w * c.cin)
        && !big(m * c.cout)
        && !big(c.cout * k.next_multiple_of(64))
}

/// Whether `p` can take a TMA tiling ([`Tiling::tma`]): a 1x1, stride-1, unpadded convolution
/// over signed inputs with channels a multiple of 16, so its A operand is the plain matrix of
/// input pixels by channels (and B the padded weight rows) that 2-D tensor maps tile.
pub fn tma_fits(p: &QConvParts) -> bool {
    let c = &p.geom;
    igemm_fits(p)
        && !gathers(p)
        && (c.kh, c.kw, c.sh, c.sw, c.pt, c.pl) == (1, 1, 1, 1, 0, 0)
        && (c.oh, c.ow) == (c.h, c.w)
        && p.c4 == c.cin
}

/// Whether `p`'s input rows are gathered byte by byte instead of copied in 16-byte pieces.
fn gathers(p: &QConvParts) -> bool {
    p.flip || !p.geom.cin.is_multiple_of(16)
}

/// The kernels' shared memory: dynamic, its base rounded up to 1024 bytes so the wgmma
/// hardware's address-based 64-byte swizzle matches the stored XOR pattern.
pub(super) fn ring_smem() -> String {
    "  extern __shared__ __align__(16) u8 smem_raw[];\n  unsigned int sraw;\n  \
     asm(\"{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }\" : \"=r\"(sraw) : \"l\"(smem_raw));\n  \
     const unsigned int sbase = (sraw + 1023u) & ~1023u;\n  \
     u8* smem = smem_raw + (sbase - sraw);"
        .into()
}

/// The multiply of one ring slot by a warpgroup: `steps` `m64nBNk32` wgmmas, the `ks`-th
/// reading the shared-memory descriptors `da` and `db` that `descs` declares, committed as
/// one group; it returns once the previous slot's group is done, so one group stays in
/// flight. The accumulators are fenced on both sides.
pub(super) fn wgmma_multiply(t: Tiling, steps: usize, descs: &str) -> String {
    let regs = t.bn() / 2;
    let outs = wgmma_acc_operands(t);
    let list = (0..regs)
        .map(|i| format!("%{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    let fence = format!("asm volatile(\"\" : {outs} :: \"memory\");");
    format!(
        r#"    {fence}
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int ks = 0; ks < {steps}; ++ks) {{
      {descs}
      asm volatile("{{ .reg .pred p; setp.ne.b32 p, %{p}, 0; wgmma.mma_async.sync.aligned.m64n{bn}k32.s32.s8.s8 {{{list}}}, %{da}, %{db}, p; }}"
                   : {outs} : "l"(da), "l"(db), "r"(1) : "memory");
    }}
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
    {fence}
"#,
        bn = t.bn(),
        p = regs + 2,
        da = regs,
        db = regs + 1,
    )
}

/// The implicit GEMM's multiply of a slot at `sa`: two k32 steps through its 64-byte rows
/// (64-byte swizzle, 8-row groups 512 bytes apart).
fn igemm_multiply(t: Tiling) -> String {
    let descs =
        "const unsigned long long da = gdesc(sa + wg_off + ks * 32), db = gdesc(sb + ks * 32);";
    format!(
        "    const unsigned int sb = sa + {} * 64;\n{}",
        t.bm(),
        wgmma_multiply(t, 2, descs)
    )
}

/// What a wgmma K loop needs first: the shared-memory descriptor of a tile address and the
/// warpgroup's offset into the A tile.
const WGMMA_PRELUDE: &str = r#"  auto gdesc = [](unsigned int a) -> unsigned long long {
    return (unsigned long long)((a & 0x3FFFFu) >> 4) | (1ull << 16) | (32ull << 32) | (2ull << 62);
  };
  const unsigned int wg_off = (warp >> 2) * 64 * 64;
"#;

/// A warpgroup's `m64nBN` accumulators as inline-asm read-write operands (`BN / 2` registers).
fn wgmma_acc_operands(t: Tiling) -> String {
    (0..t.bn() / 2)
        .map(|i| format!("\"+r\"(acc[0][{}][{}])", i / 4, i % 4))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Waits for the last wgmma group and fences the accumulators after it.
fn wgmma_drain(t: Tiling) -> String {
    let outs = wgmma_acc_operands(t);
    format!(
        "  asm volatile(\"wgmma.wait_group.sync.aligned 0;\" ::: \"memory\");\n  asm volatile(\"\" : {outs} :: \"memory\");\n"
    )
}

/// The K loop of a wgmma tiling: each warpgroup multiplies its 64 rows of A by all of B per
/// 64-byte K tile ([`wgmma_multiply`]); every thread loads, and the slot read two tiles back
/// is refilled once the block barrier shows every warpgroup done with it.
fn wgmma_loop(t: Tiling, tile: usize) -> String {
    format!(
        r#"{WGMMA_PRELUDE}  for (int it = 0; it < kcnt; ++it) {{
    asm volatile("cp.async.wait_group {wait};" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    if (it + {ahead} < kcnt) load((it + {ahead}) % {st}, kbeg + it + {ahead});
    asm volatile("cp.async.commit_group;");
    const unsigned int sa = sbase + (it % {st}) * {tile};
{multiply}  }}
{drain}"#,
        ahead = t.ahead(),
        wait = t.ahead() - 1,
        st = t.stages,
        multiply = igemm_multiply(t),
        drain = wgmma_drain(t),
    )
}

/// A warp-specialized tiling's mbarriers at `bar0` (shared offset `at` past the base): slot
/// `s`'s "full" one at `bar0 + 8s` completes when the loaders' copies into it have landed
/// (each loader arrives once for its `cp.async`s, once for its plain stores of padding), its
/// "empty" one at `bar0 + 8(stages + s)` when every math warp is done reading it (of every
/// block of a multicast cluster whose loader writes this ring; the cluster then waits for
/// all its blocks' barriers before any copy).
pub(super) fn ws_barriers(t: Tiling, at: usize) -> String {
    format!(
        r#"  const unsigned int bar0 = sbase + {at};
  auto bar_wait = [](unsigned int bar, unsigned int parity) {{
    asm volatile("{{ .reg .pred P; WAIT: mbarrier.try_wait.parity.shared::cta.b64 P, [%0], %1; @!P bra WAIT; }}" :: "r"(bar), "r"(parity) : "memory");
  }};
  if (tid == 0) {{
    for (int s = 0; s < {st}; ++s) {{
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar0 + s * 8), "r"({full}));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar0 + ({st} + s) * 8), "r"({empty}));
    }}
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }}
  {sync}
"#,
        st = t.stages,
        // TMA: the first loader lane arrives once, and the copies' bytes complete the phase.
        full = if t.tma { 1 } else { 2 * t.load_threads() },
        empty = t.writers() * t.math_threads() / 32,
        sync = if t.clustered() {
            format!("{CLUSTER_ARRIVE}\n  {CLUSTER_WAIT}")
        } else {
            "__syncthreads();".into()
        },
    )
}

/// A loader's turn at item `it` (a running count of the block's K steps) of a warp-specialized
/// ring: it waits until the math warps have released slot `it % stages` (from its second
/// round on), fills it with `load(slot, k)` and signals the slot's "full" barrier once its
/// copies have landed.
fn ws_fill(t: Tiling, k: &str) -> String {
    if t.tma {
        return format!(
            r#"      const int s = it % {st};
      if (it >= {st}) bar_wait(bar0 + ({st} + s) * 8, ((it / {st}) - 1) & 1);
      if (lane == 0) {{
        if (it < {st}) tma_load_a(s, {k});
        else tma_load(s, {k});
      }}
"#,
            st = t.stages,
        );
    }
    format!(
        r#"      const int s = it % {st};
      if (it >= {st}) bar_wait(bar0 + ({st} + s) * 8, ((it / {st}) - 1) & 1);
      load(s, {k});
      asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" :: "r"(bar0 + s * 8) : "memory");
      asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" :: "r"(bar0 + s * 8) : "memory");
"#,
        st = t.stages,
    )
}

/// A TMA tiling's loads, by one thread: `tma_load(slot, k)` announces the slot's bytes on its
/// "full" mbarrier and copies the A tile at (pixel `lm0`, K tile `k`) and the B tile at
/// (channel `ln0`, `k`) through the tensor maps `p{a}` and `p{b}`; the copies complete the
/// phase. `tma_early()` runs before the kernel waits for its predecessor: it prefetches both
/// maps and, for the ring's first round, announces each slot and copies its B tile (weights
/// are constants, so they load while the previous kernel finishes), leaving `tma_load_a`
/// to copy those slots' A tiles after the wait. Needs `bar0` ([`ws_barriers`]).
///
/// A multicast tiling's loader copies only its half of a shared tile (the A tile's rows
/// `cy · BM/2` on, the B tile's `cx · BN/2` on, by its place in the cluster) into the same
/// place in both sharing blocks' rings, whose "full" barriers each count its bytes.
fn tma_loader(t: Tiling, (a, b): (usize, usize)) -> String {
    let copy = |dst: &str, map: usize, row: &str| {
        format!(
            r#"    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {{%2, %3}}], [%4];"
                 :: "r"({dst}), "l"(p{map}), "r"(kt * 64), "r"({row}), "r"(fb) : "memory");
"#
        )
    };
    // Half a tile of `rows` at `dst`, by the block at place `at` of the pair, to both.
    let multicast = |dst: &str, map: usize, row: &str, (rows, at, mask): (usize, &str, &str)| {
        let half = rows / 2;
        format!(
            r#"    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {{%2, %3}}], [%4], %5;"
                 :: "r"({dst} + {at} * {}), "l"(p{map}), "r"(kt * 64), "r"({row} + {at} * {half}), "r"(fb), "h"((unsigned short)({mask})) : "memory");
"#,
            half * 64
        )
    };
    let ca = if t.multicast {
        multicast("sa", a, "lm0", (t.bm(), "cy", "amask"))
    } else {
        copy("sa", a, "lm0")
    };
    let announce = format!(
        r#"    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(fb), "r"({}) : "memory");
"#,
        t.stage_bytes()
    );
    let slot = format!(
        "    const unsigned int sa = sbase + stage * {}, fb = bar0 + stage * 8;
",
        t.stage_bytes()
    );
    let sb = format!("sa + {} * 64", t.bm());
    let cb = if t.multicast_b {
        multicast(&sb, b, "ln0", (t.bn(), "cx", "bmask"))
    } else {
        copy(&sb, b, "ln0")
    };
    format!(
        r#"  auto tma_load = [&](int stage, int kt) {{
{slot}{announce}{ca}{cb}  }};
  auto tma_load_a = [&](int stage, int kt) {{
{slot}{ca}  }};
  auto tma_early = [&](int kbeg, int kcnt) {{
    asm volatile("prefetch.tensormap [%0];" :: "l"(p{a}) : "memory");
    asm volatile("prefetch.tensormap [%0];" :: "l"(p{b}) : "memory");
    for (int stage = 0; stage < {st} && stage < kcnt; ++stage) {{
      const int kt = kbeg + stage;
{slot}{announce}{cb}    }}
  }};
"#,
        st = t.stages,
    )
}

/// A math warp's turn at item `it`: it waits for the slot's "full" barrier and multiplies the
/// slot at `sa` (slots `slot` bytes apart) with `multiply`.
fn ws_take(t: Tiling, slot: usize, multiply: &str) -> String {
    format!(
        r#"      const int s = it % {st};
      bar_wait(bar0 + s * 8, (it / {st}) & 1);
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      const unsigned int sa = sbase + s * {slot};
{multiply}"#,
        st = t.stages,
    )
}

/// A math warp's release of item `it - 1`'s slot (lane 0 arrives on its "empty" barrier for
/// the warp, and on its multicast peers' too, whose loaders write this slot as well), once
/// `when` holds and that item's wgmmas are done.
fn ws_release(t: Tiling, when: &str) -> String {
    let empty = format!("bar0 + ({st} + (it - 1) % {st}) * 8", st = t.stages);
    if t.clustered() {
        let remote = |peer: &str| {
            format!(
                r#"        asm volatile("{{ .reg .b32 r; mapa.shared::cluster.u32 r, %0, %1; mbarrier.arrive.release.cluster.shared::cluster.b64 _, [r]; }}" :: "r"(e), "r"({peer}) : "memory");
"#
            )
        };
        let peers = [(t.multicast, "apeer"), (t.multicast_b, "bpeer")]
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, peer)| remote(peer))
            .collect::<String>();
        return format!(
            r#"      if ({when}) {{
        const unsigned int e = {empty};
        asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" :: "r"(e) : "memory");
{peers}      }}
"#
        );
    }
    format!(
        r#"      if ({when})
        asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" :: "r"({empty}) : "memory");
"#
    )
}

/// A multicast block's threads arrive at the cluster barrier (release: what they did before,
/// such as mbarrier initialisation or remote arrivals, is seen by the blocks that wait) ...
const CLUSTER_ARRIVE: &str = "asm volatile(\"barrier.cluster.arrive.release;\" ::: \"memory\");";
/// ... and wait until every thread of every block of the cluster has arrived.
const CLUSTER_WAIT: &str = "asm volatile(\"barrier.cluster.wait.acquire;\" ::: \"memory\");";

/// A multicast block's place in its cluster (`cx`, `cy`; ranks run x-major) and, per shared
/// operand, its peer's rank (`apeer` differs in y, `bpeer` in x) and the mask of the two blocks
/// its half-tile copies go to (`amask`, `bmask`); nothing for other tilings.
fn cluster_places(t: Tiling) -> String {
    if !t.clustered() {
        return String::new();
    }
    let cm = t.cluster_dims().0;
    let mut s = String::from(
        "  unsigned int crank, cx, cy;\n  \
         asm(\"mov.u32 %0, %%cluster_ctarank;\" : \"=r\"(crank));\n  \
         asm(\"mov.u32 %0, %%cluster_ctaid.x;\" : \"=r\"(cx));\n  \
         asm(\"mov.u32 %0, %%cluster_ctaid.y;\" : \"=r\"(cy));\n",
    );
    if t.multicast {
        let _ = writeln!(
            s,
            "  const unsigned int apeer = cx + (cy ^ 1u) * {cm}, amask = (1u << crank) | (1u << apeer);"
        );
    }
    if t.multicast_b {
        let _ = writeln!(
            s,
            "  const unsigned int bpeer = (cx ^ 1u) + cy * {cm}, bmask = (1u << crank) | (1u << bpeer);"
        );
    }
    s
}

/// The K loop of a warp-specialized wgmma tiling: the loader warps fill slot `it % stages`
/// (`load(slot, k step)`) once the math warps have released it and signal its "full" barrier;
/// the math warpgroups wait on that barrier alone (no block barrier), `multiply` the slot at
/// `sa` ([`wgmma_multiply`]) and release the slot before, whose wgmmas are then done. So the
/// loads' address arithmetic never stalls the tensor cores, and the loaders run up to
/// `stages - 1` slots ahead. Needs `bar_wait` and `bar0` ([`ws_barriers`]).
pub(super) fn ws_loop(t: Tiling, tile: usize, multiply: &str) -> String {
    format!(
        r#"  if (warp >= {mw}) {{
    for (int it = 0; it < kcnt; ++it) {{
{fill}    }}
  }} else {{
    for (int it = 0; it < kcnt; ++it) {{
{take}{release}    }}
{drain}  }}
"#,
        mw = t.math_threads() / 32,
        fill = ws_fill(t, "kbeg + it"),
        take = ws_take(t, tile, multiply),
        release = ws_release(t, "it > 0 && lane == 0"),
        drain = wgmma_drain(t),
    )
}

/// The tile loop of a persistent warp-specialized wgmma kernel: block `b` takes tiles `b`,
/// `b + gridDim.x`, ... of `tiles` (a C expression), each `kcnt` K steps. The loaders run
/// [`ws_loop`]'s protocol over the block's K steps of all its tiles in one sequence, so
/// they fill the next tile's first slots while the math warpgroups requantize and store the
/// current one. `setup` (loaders) and `enter` (math warps) start a tile `tt`; `epilogue`
/// (math warps only, their accumulators drained and every slot released) finishes it. Needs
/// `bar_wait` and `bar0` ([`ws_barriers`]).
pub(super) fn ws_tile_loop(
    t: Tiling,
    slot: usize,
    multiply: &str,
    (setup, enter, epilogue): (&str, &str, &str),
) -> String {
    format!(
        r#"  if (warp >= {mw}) {{
    int it = 0;
    for (int tt = blockIdx.x; tt < tiles; tt += gridDim.x) {{
{setup}
      for (int kk = 0; kk < kcnt; ++kk, ++it) {{
{fill}      }}
    }}
  }} else {{
    int it = 0;
    for (int tt = blockIdx.x; tt < tiles; tt += gridDim.x) {{
{enter}
      int acc[1][{wn}][4];
#pragma unroll
      for (int j = 0; j < {wn}; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[0][j][e] = 0;
      for (int kk = 0; kk < kcnt; ++kk, ++it) {{
{take}{release_prev}      }}
{drain}{release_last}{epilogue}
    }}
  }}
"#,
        mw = t.math_threads() / 32,
        wn = t.wn,
        fill = ws_fill(t, "kk"),
        take = ws_take(t, slot, multiply),
        release_prev = ws_release(t, "kk > 0 && lane == 0"),
        drain = wgmma_drain(t),
        release_last = ws_release(t, "lane == 0"),
    )
}

/// Shared bytes a block of a cluster K split leaves its int32 sums in (a thread's sums are
/// `BM·BN / threads` integers).
fn cluster_sum_bytes(t: Tiling) -> usize {
    t.bm() * t.bn() * 4
}

/// A cluster K split's reduction, after the K loop (the ring is free): blocks 1.. store their
/// sums in their own shared memory, block 0 adds them to its accumulators through distributed
/// shared memory, then the others exit; the barriers order the stores before the reads and
/// keep each block's shared memory alive until block 0 is done with it.
fn cluster_sum(t: Tiling) -> String {
    format!(
        r#"  {{
    unsigned int rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    if (rank != 0) {{
#pragma unroll
      for (int i = 0; i < {wm}; ++i)
#pragma unroll
        for (int j = 0; j < {wn}; ++j)
          *(int4*)(smem + ((i * {wn} + j) * {th} + tid) * 16) = make_int4(acc[i][j][0], acc[i][j][1], acc[i][j][2], acc[i][j][3]);
    }}
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    if (rank == 0) {{
      for (unsigned int r = 1; r < {splits}; ++r) {{
        unsigned int remote;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(sbase), "r"(r));
#pragma unroll
        for (int i = 0; i < {wm}; ++i)
#pragma unroll
          for (int j = 0; j < {wn}; ++j) {{
            int v0, v1, v2, v3;
            asm volatile("ld.shared::cluster.v4.s32 {{%0, %1, %2, %3}}, [%4];" : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3) : "r"(remote + (unsigned int)(((i * {wn} + j) * {th} + tid) * 16)));
            acc[i][j][0] += v0; acc[i][j][1] += v1; acc[i][j][2] += v2; acc[i][j][3] += v3;
          }}
      }}
    }}
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    if (rank != 0) return;
  }}
"#,
        wm = t.wm,
        wn = t.wn,
        th = t.threads(),
        splits = t.splits,
    )
}

/// A serial K split's reduction, after the K loop (`gy` tiles along N; the workspace and the
/// counters are parameters `pw` and `pc`): every block stores its sums, 16 bytes per thread
/// and fragment so the stores coalesce, and counts itself in on its tile's counter; the last
/// to arrive resets the counter for the next run, adds the others' sums (integer sums in any
/// order, so exact) and goes on to the epilogue, the others exit. The fences order each
/// block's stores before its count and the count before the last block's reads.
fn serial_sum(t: Tiling, gy: usize, (pw, pc): (usize, usize)) -> String {
    format!(
        r#"  {{
    const int tile = blockIdx.x * {gy} + blockIdx.y;
    int4* sums = (int4*)p{pw} + (i64)tile * {splits} * {frags} * {mth};
    if (tid < {mth}) {{
#pragma unroll
      for (int i = 0; i < {wm}; ++i)
#pragma unroll
        for (int j = 0; j < {wn}; ++j)
          sums[((i64)blockIdx.z * {frags} + i * {wn} + j) * {mth} + tid] = make_int4(acc[i][j][0], acc[i][j][1], acc[i][j][2], acc[i][j][3]);
    }}
    __threadfence();
    __syncthreads();
    unsigned int done = 0u;
    if (tid == 0) done = atomicAdd(p{pc} + tile, 1u);
    if (!__syncthreads_or(tid == 0 && done == {splits}u - 1u)) return;
    if (tid == 0) p{pc}[tile] = 0u;
    __threadfence();
    if (tid < {mth}) {{
      for (int z = 0; z < {splits}; ++z) {{
        if (z == (int)blockIdx.z) continue;
#pragma unroll
        for (int i = 0; i < {wm}; ++i)
#pragma unroll
          for (int j = 0; j < {wn}; ++j) {{
            const int4 v = __ldcg(sums + ((i64)z * {frags} + i * {wn} + j) * {mth} + tid);
            acc[i][j][0] += v.x; acc[i][j][1] += v.y; acc[i][j][2] += v.z; acc[i][j][3] += v.w;
          }}
      }}
    }}
  }}
"#,
        splits = t.splits,
        frags = t.wm * t.wn,
        mth = t.math_threads(),
        wm = t.wm,
        wn = t.wn,
    )
}

/// The loops over a thread's accumulator fragments (the mma and wgmma layouts agree): `body`
/// sees the fragment pair's tile column `cl` (columns past `n` skipped) and tile row `rl`, and
/// reads `acc[i][j][hh * 2 + e]` for `e` in 0..2. A warp-specialized block's loaders hold no
/// accumulators and skip them.
fn fragment_loops(t: Tiling, n: usize, body: &str) -> String {
    format!(
        r#"#pragma unroll
  for (int j = 0; j < {wn}; ++j) {{{math_only}
    const int cl = wni * {wn8} + j * 8 + (lane & 3) * 2;
    if (n0 + cl >= {n}) continue;
#pragma unroll
    for (int i = 0; i < {wm}; ++i)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {{
        const int rl = wmi * {wm16} + i * 16 + (lane >> 2) + hh * 8;
{body}
      }}
  }}"#,
        math_only = if t.loaders > 0 {
            format!("\n    if (warp >= {}) break;", t.math_threads() / 32)
        } else {
            String::new()
        },
        wn = t.wn,
        wm = t.wm,
        wn8 = t.wn * 8,
        wm16 = t.wm * 16,
    )
}

/// Requantizes a thread's accumulators into the shared output tile `tile` (rows of `ts`
/// bytes), two channels to a 2-byte cell; a residual is read from the cell it replaces. Needs
/// `n0` (the tile's first channel), `bias2` and `mult` in scope.
pub(super) fn requant_into_tile(t: Tiling, p: &QConvParts, ts: usize) -> String {
    let residual = p
        .residual
        .as_ref()
        .map(|r| (r, "(signed char)(rz >> (8 * e))"));
    // A saturating pack clamps both codes in one instruction where the epilogue allows it.
    let (value, pack) = match requant_saturating(&p.epi, residual) {
        Some((value, ty)) => (
            value,
            format!(
                r#"unsigned int w; asm("cvt.pack.sat.{ty}.s32.b32 %0, %1, %2, 0;" : "=r"(w) : "r"(code[1]), "r"(code[0]));
        *cell = (unsigned short)w;"#
            ),
        ),
        None => (
            requant_value(&p.epi, residual),
            "*cell = (unsigned short)__byte_perm(code[0], code[1], 0x0040);".to_string(),
        ),
    };
    let body = format!(
        r#"        unsigned short* cell = (unsigned short*)(tile + rl * {ts} + cl);
        {rz}
        int code[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {{
          const int co = n0 + cl + e;
          int t = (int)((unsigned int)acc[i][j][hh * 2 + e] + (unsigned int)bias2[co]);
          {value}
          code[e] = q;
        }}
        {pack}"#,
        rz = if p.residual.is_some() {
            "const unsigned int rz = *cell;"
        } else {
            ""
        },
    );
    fragment_loops(t, p.geom.cout, &body)
}

/// The `mma.sync` steps of one 64-byte K slice of a warp's `wm × wn` tiles: `acc` += A · Bᵀ,
/// the A fragment of row `row`, 16-byte chunk `ch` at `a_addr`, B's rows swizzled at `sb`
/// (warp `wmi`, `wni` of the block; 16-row A tiles, 8-column B tiles).
pub(super) fn mma_slice(acc: &str, (wm, wn): (usize, usize), a_addr: &str) -> String {
    format!(
        r#"#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {{
      unsigned int af[{wm}][4], bf[{wn}][2];
#pragma unroll
      for (int i = 0; i < {wm}; ++i) {{
        const int row = wmi * {wm16} + i * 16 + (lane & 15);
        const int ch = ks * 2 + (lane >> 4);
        const unsigned int a = {a_addr};
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{%0, %1, %2, %3}}, [%4];"
                     : "=r"(af[i][0]), "=r"(af[i][1]), "=r"(af[i][2]), "=r"(af[i][3]) : "r"(a));
      }}
#pragma unroll
      for (int j = 0; j < {wn}; j += 2) {{
        const int mat = lane >> 3;
        const int row = wni * {wn8} + j * 8 + (mat >> 1) * 8 + (lane & 7);
        const int ch = ks * 2 + (mat & 1);
        const unsigned int a = sb + row * 64 + ((ch ^ ((row >> 1) & 3)) << 4);
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{%0, %1, %2, %3}}, [%4];"
                     : "=r"(bf[j][0]), "=r"(bf[j][1]), "=r"(bf[j + 1][0]), "=r"(bf[j + 1][1]) : "r"(a));
      }}
#pragma unroll
      for (int i = 0; i < {wm}; ++i)
#pragma unroll
        for (int j = 0; j < {wn}; ++j)
          asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, {{%8, %9}}, {{%0, %1, %2, %3}};"
                       : "+r"({acc}[i][j][0]), "+r"({acc}[i][j][1]), "+r"({acc}[i][j][2]), "+r"({acc}[i][j][3])
                       : "r"(af[i][0]), "r"(af[i][1]), "r"(af[i][2]), "r"(af[i][3]), "r"(bf[j][0]), "r"(bf[j][1]));
    }}
"#,
        wm16 = wm * 16,
        wn8 = wn * 8,
    )
}

/// How a kernel of a tiling uses shared memory for one convolution.
struct SmemPlan {
    /// The tiling with its ring cut to the K tiles a block gets.
    t: Tiling,
    /// Persistent blocks (two output tiles after the ring).
    persist: bool,
    /// The residual tile is fetched with the first K tile, into its own shared memory after
    /// the ring, instead of after the main loop (short K).
    prefetch: bool,
    /// Where the output tile starts (0: it reuses the ring).
    zsm: usize,
    /// Where a warp-specialized tiling's mbarriers start: after everything else.
    bars: usize,
    /// Dynamic shared-memory bytes the kernel asks for.
    smem: usize,
}

impl SmemPlan {
    fn new(p: &QConvParts, t: Tiling) -> SmemPlan {
        let c = &p.geom;
        let kt = (c.kh * c.kw * p.c4).div_ceil(64);
        let mut t = t.for_k_tiles(kt.div_ceil(t.splits));
        // Persistent blocks and cluster splits keep the block-barrier loop (and cp.async).
        if !t.wgmma || t.ctas > 0 || t.cluster {
            t.loaders = 0;
            t.tma = false;
        }
        // A multicast pair shares the tiles of one whole K range.
        t.multicast &= t.tma && t.splits == 1;
        t.multicast_b &= t.tma && t.splits == 1;
        let persist = t.ctas > 0 && t.splits == 1;
        let prefetch = p.residual.is_some() && t.splits == 1 && (persist || kt <= PREFETCH_K_TILES);
        let ring = t.stages * t.stage_bytes();
        let zbytes = t.out_tile_bytes();
        let (zsm, smem) = if persist {
            (ring, t.smem() + 2 * zbytes)
        } else if prefetch {
            (ring, t.smem() + zbytes)
        } else if t.cluster {
            (0, t.smem().max(cluster_sum_bytes(t) + 1024))
        } else {
            (0, t.smem())
        };
        // `smem` counts the 1024 bytes of alignment slack the base may use up.
        SmemPlan {
            t,
            persist,
            prefetch,
            zsm,
            bars: smem - 1024,
            smem: smem + t.barrier_bytes(),
        }
    }
}

/// Dynamic shared-memory bytes the implicit-GEMM kernel of `p` with tiling `t` asks for (the
/// device must allow one block that much).
pub fn igemm_smem(p: &QConvParts, t: Tiling) -> usize {
    if t.halo {
        return super::halo::HaloPlan::new(p, t).smem;
    }
    SmemPlan::new(p, t).smem
}

impl Gen {
    /// The tables of QConv `p` that the tensor-core kernels read, as extras: the packed weight
    /// rows padded with zeros to `kp` bytes (whole 64-byte K tiles, so every 16-byte copy is
    /// aligned), the int32 bias and the f32 multiplier; returns `kp` and the three.
    pub(super) fn igemm_tables(&mut self, p: &QConvParts) -> (usize, Arg, Arg, Arg) {
        let k = p.geom.kh * p.geom.kw * p.c4;
        let kp = k.next_multiple_of(64);
        let mut padded = vec![0u8; p.geom.cout * kp];
        for (dst, src) in padded.chunks_exact_mut(kp).zip(p.packed.chunks_exact(k)) {
            dst[..k].copy_from_slice(src);
        }
        let wt = self.extra(padded);
        let bt = self.extra(i32_bytes(&p.bias));
        let mt = self.extra(f32_bytes(&p.mult));
        (kp, wt, bt, mt)
    }

    /// The parameters of a tensor-core convolution kernel of `p` reading `x` and writing
    /// `out`: those two, then `p`'s tables ([`Self::igemm_tables`]); returns their `kp` too.
    pub(super) fn igemm_params(
        &mut self,
        x: Arg,
        out: Arg,
        p: &QConvParts,
    ) -> (usize, Vec<(Arg, &'static str)>) {
        let (kp, wt, bt, mt) = self.igemm_tables(p);
        let params = vec![
            (x, "const u8"),
            (out, "u8"),
            (wt, "const u8"),
            (bt, "const u8"),
            (mt, "const u8"),
        ];
        (kp, params)
    }

    /// The implicit-GEMM kernel of QConv `parts` from NHWC int8 `x` (a value, or the
    /// space-to-depth copy in scratch) into `y` with block shape `t` (see the module docs);
    /// check [`igemm_fits`] first.
    pub fn qigemm(&mut self, x: Arg, y: ValueId, p: &QConvParts, t: Tiling) -> GenKernel {
        if t.halo {
            return self.qhalo(x, y, p, t);
        }
        let c = &p.geom;
        let (m, n, k) = (c.n * c.oh * c.ow, c.cout, c.kh * c.kw * p.c4);
        let kt = k.div_ceil(64);
        let SmemPlan {
            t,
            persist,
            prefetch,
            zsm,
            bars,
            smem,
        } = SmemPlan::new(p, t);
        let partials = t.partials();
        let (bm, bn, th, st) = (t.bm(), t.bn(), t.threads(), t.stages);
        let (wm, wn, warps_m) = (t.wm, t.wn, t.warps_m);
        // A split K writes int32 partial sums into the node's scratch instead of `y`.
        let out = if partials {
            Arg::ScratchAt(0)
        } else {
            Arg::Val(y)
        };
        let (kp, mut params) = self.igemm_params(x, out, p);
        if let Some(r) = p.residual.as_ref().filter(|_| !partials) {
            params.push((Arg::Val(r.z), "const u8"));
        }
        // A serial K split's workspace (the node's scratch) and its own tile counters.
        let serial = if t.serial {
            let (gx, gy) = t.grid(m, n);
            let at = self.counter_bytes;
            self.counter_bytes += (gx * gy * 4).next_multiple_of(256);
            let ip = params.len();
            params.extend([
                (Arg::ScratchAt(0), "int"),
                (Arg::Counters(at), "unsigned int"),
            ]);
            serial_sum(t, gy, (ip, ip + 1))
        } else {
            String::new()
        };
        // TMA tilings read x and the weight rows through two tensor maps, the last parameters.
        let tma = if t.tma {
            let ia = params.len();
            let a = self.map(TensorMap2d {
                base: x,
                node: 0,
                rows: m,
                row_bytes: c.cin,
                box_rows: t.bm() / t.cluster_dims().1,
            });
            let b = self.map(TensorMap2d {
                base: params[2].0,
                node: 0,
                rows: n,
                row_bytes: kp,
                box_rows: t.bn() / t.cluster_dims().0,
            });
            params.extend([(a, "const u8"), (b, "const u8")]);
            tma_loader(t, (ia, ia + 1))
        } else {
            String::new()
        };
        let name = self.next_name();
        let plist = Self::param_list(&params);
        let pad_word = u32::from(p.pad_s as i8 as u8) * 0x0101_0101;
        let (h, w, cin, c4, oh, ow) = (c.h, c.w, c.cin, p.c4, c.oh, c.ow);
        let (kw, sh, sw, pt, pl, dh, dw) = (c.kw, c.sh, c.sw, c.pt, c.pl, c.dh, c.dw);
        // Output rows leave in 16-byte pieces (8 when the channel count is not a multiple of 16).
        let (v, vt) = if n.is_multiple_of(16) {
            (16, "uint4")
        } else {
            (8, "uint2")
        };
        let (bnv, ts) = (bn / v, bn + 16);
        // The loaders: rows of 64 bytes, four threads (16 bytes each) to a row.
        let lth = t.load_threads();
        let (al, bl) = ((bm * 4).div_ceil(lth), (bn * 4).div_ceil(lth));
        let a_loader = if gathers(p) {
            format!(
                r#"
#pragma unroll
    for (int r = 0; r < {al}; ++r) {{
      const int row = (lt >> 2) + r * {th4};
      if (row < {bm}) {{
        const unsigned int dst = sa + row * 64 + ((col ^ ((row >> 1) & 3)) << 4);
        unsigned int wv[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {{
          const int kq = k + q * 4;
          const int tap = kq / {c4}, c0 = kq - tap * {c4}, ky = tap / {kw}, kx = tap - ky * {kw};
          const int iy = a_iy[r] + ky * {dh}, ix = a_ix[r] + kx * {dw};
          unsigned int v = 0u;
          if (kq < {k}) {{
            if ((unsigned)iy < {h}u && (unsigned)ix < {w}u) {{
              const u8* src = p0 + (i64)((a_pix[r] + iy * {w} + ix) * {cin});
#pragma unroll
              for (int b = 0; b < 4; ++b)
                if (c0 + b < {cin}) v |= (unsigned int)(u8)(src[c0 + b] ^ {flip}) << (8 * b);
            }} else {{
              v = {pad_word}u;
            }}
          }}
          wv[q] = v;
        }}
        asm volatile("st.shared.v4.u32 [%0], {{%1, %2, %3, %4}};" :: "r"(dst), "r"(wv[0]), "r"(wv[1]), "r"(wv[2]), "r"(wv[3]));
      }}
    }}
"#,
                flip = if p.flip { "0x80" } else { "0" },
                th4 = lth / 4,
            )
        } else {
            format!(
                r#"
    const int tap = k / {cin}, ci = k - tap * {cin}, ky = tap / {kw}, kx = tap - ky * {kw};
#pragma unroll
    for (int r = 0; r < {al}; ++r) {{
      const int row = (lt >> 2) + r * {th4};
      if (row < {bm}) {{
        const unsigned int dst = sa + row * 64 + ((col ^ ((row >> 1) & 3)) << 4);
        const int iy = a_iy[r] + ky * {dh}, ix = a_ix[r] + kx * {dw};
        if (k < {k} && (unsigned)iy < {h}u && (unsigned)ix < {w}u) {{
          const u8* src = p0 + (i64)((a_pix[r] + iy * {w} + ix) * {cin} + ci);
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(src));
        }} else {{
          asm volatile("st.shared.v4.u32 [%0], {{%1, %1, %1, %1}};" :: "r"(dst), "r"({pad_word}u));
        }}
      }}
    }}
"#,
                th4 = lth / 4,
            )
        };
        // Walks the tile at (`m0`, `n0`) `v` bytes per thread and step, unrolled: `body` sees
        // its row `r`, column `c` and global byte offset `g`. Out-of-range pieces are skipped,
        // with a test only where the tile count or an edge tile calls for one.
        let pieces = bm * bnv;
        // Pixel blocks sharing B tiles come in pairs: an odd grid gets one block past the end.
        let (gx, gy) = t.grid(m, n);
        let gx_launch = gx.next_multiple_of(t.cluster_dims().0);
        let mut guards = Vec::new();
        if !pieces.is_multiple_of(th) {
            guards.push(format!("q < {pieces}u"));
        }
        let tile_loop = |m0: &str, n0: &str, body: &str| {
            let mut guards = guards.clone();
            if !m.is_multiple_of(bm) || gx_launch > gx {
                guards.push(format!("{m0} + r < {m}"));
            }
            if !n.is_multiple_of(bn) {
                guards.push(format!("{n0} + c < {n}"));
            }
            let guard = if guards.is_empty() {
                String::new()
            } else {
                format!("if ({}) ", guards.join(" && "))
            };
            format!(
                "\n#pragma unroll\n  for (int it = 0; it < {iters}; ++it) {{ \
                 const unsigned int q = tid + it * {th}; \
                 const int r = q / {bnv}u, c = (q % {bnv}u) * {v}; \
                 const i64 g = (i64)({m0} + r) * {n} + {n0} + c; \
                 {guard}{{ {body} }} }}",
                iters = pieces.div_ceil(th)
            )
        };
        // Copies the block's output tile between global memory and the shared tile.
        let shared = format!("tile + r * {ts} + c");
        let tile_copy = |dst: &str, src: &str| {
            tile_loop(
                "m0",
                "n0",
                &format!("*({vt}*)({dst}) = *(const {vt}*)({src});"),
            )
        };
        let tile = t.stage_bytes();
        let zbytes = t.out_tile_bytes();
        let mainloop = if t.loaders > 0 {
            format!("{WGMMA_PRELUDE}{}", ws_loop(t, tile, &igemm_multiply(t)))
        } else if t.wgmma {
            wgmma_loop(t, tile)
        } else {
            format!(
                r#"  for (int it = 0; it < kcnt; ++it) {{
    asm volatile("cp.async.wait_group {wait};" ::: "memory");
    __syncthreads();
    if (it + {st} - 1 < kcnt) load((it + {st} - 1) % {st}, kbeg + it + {st} - 1);
    asm volatile("cp.async.commit_group;");
    const unsigned int sa = sbase + (it % {st}) * {tile};
    const unsigned int sb = sa + {bm} * 64;
{slice}  }}
"#,
                wait = st - 2,
                slice = mma_slice(
                    "acc",
                    (wm, wn),
                    "sa + row * 64 + ((ch ^ ((row >> 1) & 3)) << 4)"
                ),
            )
        };
        let epilogue = if partials {
            let store = format!(
                "        if (m0 + rl < {m}) *(int2*)(part + (i64)(m0 + rl) * {n} + n0 + cl) = \
                 make_int2(acc[i][j][hh * 2], acc[i][j][hh * 2 + 1]);"
            );
            format!(
                "  // K is split: this block's int32 sums go to its own partial buffer (grid z).\n  \
                 int* part = (int*)p1 + (i64)blockIdx.z * {};\n{}\n",
                m * n,
                fragment_loops(t, n, &store)
            )
        } else {
            format!(
                r#"  // The block's output tile goes through shared memory ([BM][TS] bytes, rows padded by 16
  // so the 2-byte writes of eight rows hit different banks: the free ring, or the prefetched
  // residual's own tile) and leaves in {v}-byte pieces; a late residual comes in the same way.
  u8* tile = smem + {zsm}{zpar};
  {zload}
  const int* bias2 = (const int*)p3;
  const float* mult = (const float*)p4;
{requant}
  __syncthreads();
  {ystore}
"#,
                requant = requant_into_tile(t, p, ts),
                zpar = if persist {
                    format!(" + par * {zbytes}")
                } else {
                    String::new()
                },
                zload = if p.residual.is_some() && !prefetch {
                    format!("{} __syncthreads();", tile_copy(&shared, "p5 + g"))
                } else {
                    String::new()
                },
                ystore = tile_copy("p1 + g", &shared),
            )
        };
        let tiles = gx * gy;
        let zfetch = if prefetch {
            let op = if v == 16 { "cg" } else { "ca" };
            let copy = format!(
                r#"asm volatile("cp.async.{op}.shared.global [%0], [%1], {v};" :: "r"(zs + r * {ts} + c), "l"(p5 + g));"#
            );
            format!(
                "  auto fetch_z = [&](unsigned int zs) {{
    {}
  }};
",
                tile_loop("lm0", "ln0", &copy)
            )
        } else {
            String::new()
        };
        let fetch = |at: &str| {
            if prefetch {
                format!("fetch_z(sbase + {zsm}{at});")
            } else {
                String::new()
            }
        };
        // A warp-specialized block's loaders start on their own (see [`ws_loop`]).
        let prologue = if t.loaders > 0 {
            String::new()
        } else {
            format!(
                r#"#pragma unroll
  for (int s = 0; s < {ahead}; ++s) {{
    if (s < kcnt) load(s, kbeg + s);
    asm volatile("cp.async.commit_group;");
  }}
"#,
                ahead = t.ahead()
            )
        };
        let tile_body = format!(
            r#"  int acc[{wm}][{wn}][4];
#pragma unroll
  for (int i = 0; i < {wm}; ++i)
#pragma unroll
    for (int j = 0; j < {wn}; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0;
{mainloop}  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();
"#
        );
        let body = if persist {
            // Tiles in M-major order with N fastest, so blocks running together share A rows.
            format!(
                r#"  const int kbeg = 0, kcnt = {kt};
  int tt = blockIdx.x, par = 0;
  setup((tt / {gy}) * {bm}, (tt % {gy}) * {bn});
  GRID_SYNC();
  {fetch0}
{prologue}  for (; tt < {tiles}; tt += gridDim.x, par ^= 1) {{
  const int m0 = lm0, n0 = ln0;
{tile_body}  // The ring is free: the next tile's first K tiles and residual load during this epilogue.
  const int next = tt + gridDim.x;
  if (next < {tiles}) {{
    setup((next / {gy}) * {bm}, (next % {gy}) * {bn});
    {fetch1}
{prologue}  }}
{epilogue}  }}
"#,
                fetch0 = fetch(""),
                fetch1 = fetch(&format!(" + (par ^ 1) * {zbytes}")),
            )
        } else {
            format!(
                r#"  setup(blockIdx.x * {bm}, blockIdx.y * {bn});
  {krange}
  {early}GRID_SYNC();
  {fetch0}
{prologue}  const int m0 = lm0, n0 = ln0;
{tile_body}{arrive}{reduce}{epilogue}{wait}"#,
                // A multicast block may leave only once its peers' math warps have released
                // their last slots on its barriers.
                arrive = if t.clustered() {
                    format!("  {CLUSTER_ARRIVE}\n")
                } else {
                    String::new()
                },
                wait = if t.clustered() {
                    format!("  {CLUSTER_WAIT}\n")
                } else {
                    String::new()
                },
                fetch0 = fetch(""),
                early = if t.tma {
                    format!(
                        "if (warp == {} && lane == 0) tma_early(kbeg, kcnt);\n  ",
                        t.math_threads() / 32
                    )
                } else {
                    String::new()
                },
                reduce = if t.cluster { cluster_sum(t) } else { serial },
                krange = if t.splits > 1 {
                    let kts = kt.div_ceil(t.splits);
                    format!("const int kbeg = blockIdx.z * {kts}, kcnt = min({kt} - kbeg, {kts});")
                } else {
                    format!("const int kbeg = 0, kcnt = {kt};")
                },
            )
        };
        let mut s = String::new();
        let _ = write!(
            s,
            r#"
extern "C" __global__ void __launch_bounds__({bounds}){cluster_dims} {name}({plist}) {{
{smem_decl}
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wmi = warp % {warps_m}, wni = warp / {warps_m};
{crank}  // The thread's place among the loaders (negative in a warp-specialized block's math warps).
  const int lt = tid - {lt0}, col = lt & 3;
  int a_pix[{al}], a_iy[{al}], a_ix[{al}];
  int lm0 = 0, ln0 = 0;
  // The tile at output pixel tm, channel tn becomes the one the loaders read.
  auto setup = [&](int tm, int tn) {{
    lm0 = tm;
    ln0 = tn;
#pragma unroll
    for (int r = 0; r < {al}; ++r) {{
      int m = tm + (lt >> 2) + r * {th4};
      int img = m / {ohw}, rem = m - img * {ohw}, oy = rem / {ow}, ox = rem - oy * {ow};
      bool live = m < {m};
      a_pix[r] = img * {hw};
      a_iy[r] = live ? oy * {sh} - {pt} : -(1 << 28);
      a_ix[r] = ox * {sw} - {pl};
    }}
  }};
  auto load = [&](int stage, int kt) {{
    const unsigned int sa = sbase + stage * {tile};
    const unsigned int sb = sa + {bm} * 64;
    const int k = kt * 64 + col * 16;
{a_loader}#pragma unroll
    for (int r = 0; r < {bl}; ++r) {{
      const int row = (lt >> 2) + r * {th4};
      if (row < {bn}) {{
        const unsigned int dst = sb + row * 64 + ((col ^ ((row >> 1) & 3)) << 4);
        const bool ok = ln0 + row < {n};
        const u8* src = ok ? p2 + (i64)(ln0 + row) * {kp} + k : p2;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(ok ? 16 : 0));
      }}
    }}
  }};
{zfetch}{barriers}{tma}{body}}}
"#,
            th4 = lth / 4,
            lt0 = th - lth,
            bounds = t.launch_bounds(),
            barriers = if t.loaders > 0 {
                ws_barriers(t, bars)
            } else {
                String::new()
            },
            cluster_dims = if t.cluster {
                format!(" __cluster_dims__(1, 1, {})", t.splits)
            } else if t.clustered() {
                let (cm, cn) = t.cluster_dims();
                format!(" __cluster_dims__({cm}, {cn}, 1)")
            } else {
                String::new()
            },
            crank = cluster_places(t),
            ohw = oh * ow,
            hw = h * w,
            smem_decl = ring_smem(),
        );
        self.src.push_str(&s);
        let grid = if persist {
            (t.ctas.min(tiles) as u32, 1, 1)
        } else {
            (gx_launch as u32, gy as u32, t.splits as u32)
        };
        GenKernel {
            name,
            threads: m * n,
            args: params.iter().map(|(a, _)| *a).collect(),
            launch: Some(LaunchDims {
                grid,
                block: th as u32,
                smem: smem as u32,
            }),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::backend::cpu::kernels::ConvGeometry;

    /// A fused residual read from value 7 (beta 0.5, zero point 0).
    fn residual() -> Option<super::super::quant::Residual> {
        Some(super::super::quant::Residual {
            z: 7,
            beta: 0.5,
            zero_point: 0,
        })
    }

    /// A QConv's parts with `cin` channels (padded to `c4`), `cout` outputs and a 3x3 kernel.
    pub(in crate::backend::cuda::codegen) fn parts(
        cin: usize,
        c4: usize,
        cout: usize,
        flip: bool,
    ) -> QConvParts {
        let geom = ConvGeometry {
            n: 2,
            cin,
            h: 9,
            w: 7,
            cout,
            oh: 9,
            ow: 7,
            kh: 3,
            kw: 3,
            sh: 1,
            sw: 1,
            dh: 1,
            dw: 1,
            pt: 1,
            pl: 1,
            groups: 1,
            cin_g: cin,
            cout_g: cout,
        };
        let k = 9 * c4;
        let packed = (0..cout * k).map(|i| (i % 251) as u8).collect();
        QConvParts::for_test(geom, packed, c4, 0, flip)
    }

    #[test]
    fn weight_rows_are_padded_to_whole_k_tiles() {
        // K = 9 taps x 4 bytes = 36 -> rows of 64 with zeros after byte 36.
        let p = parts(3, 4, 16, true);
        let mut g = Gen::new(false);
        let k = g.qigemm(Arg::Val(0), 1, &p, TILINGS[0]);
        let w = &g.extras[0];
        assert_eq!(w.len(), 16 * 64);
        for (row, src) in w.chunks_exact(64).zip(p.packed.chunks_exact(36)) {
            assert_eq!(&row[..36], src);
            assert!(row[36..].iter().all(|&b| b == 0));
        }
        // 16 x 126 outputs in 128 x 128 tiles: a 1 x 1 grid of 256 threads; one K tile, so
        // a ring of two stages (16 KiB each) plus the 1024 bytes of alignment.
        let dims = LaunchDims {
            grid: (1, 1, 1),
            block: 256,
            smem: 2 * 16384 + 1024,
        };
        assert_eq!(k.launch, Some(dims));
        assert!(g.src.contains(&k.name));
    }

    #[test]
    fn split_k_writes_int32_partials_to_scratch() {
        let mut p = parts(32, 32, 16, false);
        p.residual = residual();
        let mut g = Gen::new(false);
        let whole = g.qigemm(Arg::Val(0), 1, &p, TILINGS[0]);
        let split = g.qigemm(Arg::Val(0), 1, &p, TILINGS[0].split(3));
        // Unsplit: writes y and reads the residual; split: partial sums into scratch, no
        // residual (the requantization adds it), one grid layer per part.
        assert_eq!(whole.args[1], Arg::Val(1));
        assert!(whole.args.contains(&Arg::Val(7)));
        assert_eq!(split.args[1], Arg::ScratchAt(0));
        assert!(!split.args.contains(&Arg::Val(7)));
        assert_eq!(split.launch.map(|d| d.grid.2), Some(3));
        // K = 9 x 32 = 288 bytes: 5 tiles of 64, 2 per part.
        assert!(g
            .src
            .contains("kbeg = blockIdx.z * 2, kcnt = min(5 - kbeg, 2)"));
        assert_eq!(TILINGS[0].split(3).to_string(), "128x128 split-k 3");
    }

    #[test]
    fn the_implicit_gemm_waits_for_its_predecessor_before_its_first_load() {
        let mut p = parts(64, 64, 128, false);
        p.residual = residual();
        (p.geom.kh, p.geom.kw, p.geom.pt, p.geom.pl) = (1, 1, 0, 0);
        for t in [TILINGS[0], WG_TILINGS[1], TILINGS[1].persistent(8)] {
            let mut g = Gen::new(false);
            g.qigemm(Arg::Val(0), 1, &p, t);
            // The lambdas are defined first; the first call of any of them (the residual's
            // fetch, then the ring's prologue) comes after the wait.
            let wait = g.src.find("GRID_SYNC();").expect("wait");
            let fetch = g.src.find("fetch_z(sbase").expect("residual fetch");
            let first = g.src.find("load(s, kbeg + s)").expect("prologue");
            assert!(wait < fetch && fetch < first, "{t}");
        }
    }

    #[test]
    fn resident_tilings_bound_registers_for_their_blocks_and_nothing_else() {
        let p = parts(64, 64, 128, false);
        for t in [TILINGS[1], WG_TILINGS[2]] {
            let (mut plain, mut resident) = (Gen::new(false), Gen::new(false));
            plain.qigemm(Arg::Val(0), 1, &p, t);
            resident.qigemm(Arg::Val(0), 1, &p, t.resident(5));
            let bounds = format!("__launch_bounds__({}, 5)", t.threads());
            assert!(resident.src.contains(&bounds), "{t}");
            assert!(!plain.src.contains(&bounds), "{t}");
            // The kernels differ only in that bound.
            let unbound = format!("__launch_bounds__({})", t.threads());
            assert_eq!(resident.src.replace(&bounds, &unbound), plain.src, "{t}");
        }
        assert_eq!(TILINGS[1].resident(5).to_string(), "64x128 x5");
    }

    #[test]
    fn whole_range_clamps_pack_with_saturation_and_others_clamp_in_integers() {
        use crate::backend::cpu::kernels::QEpilogue;
        use crate::ir::{Activation, DataType, QParams};
        let q = |zero_point| QParams {
            scale: 0.1,
            zero_point,
            dtype: DataType::I8,
        };
        let mut p = parts(32, 32, 64, false);
        let src = |p: &QConvParts| {
            let mut g = Gen::new(false);
            g.qigemm(Arg::Val(0), 1, p, WG_TILINGS[2]);
            g.src
        };
        // s8 at zero point 0 without an activation: the type's range, one pack per cell.
        let packed = src(&p);
        assert!(packed.contains("cvt.pack.sat.s8.s32.b32"));
        assert!(!packed.contains("__byte_perm(code[0], code[1]"));
        // ReLU6 clamps inside the range: integer clamps and a byte permute.
        let relu6 = Some(Activation::Clip { min: 0.0, max: 6.0 });
        p.epi = QEpilogue::new(q(0), &[0.01; 64], q(0), &[0; 64], &[0; 64], relu6);
        let clamped = src(&p);
        assert!(!clamped.contains("cvt.pack.sat"));
        assert!(clamped.contains("__byte_perm(code[0], code[1], 0x0040)"));
    }

    #[test]
    fn cluster_split_k_adds_up_in_block_zero_and_requantizes_there() {
        let mut p = parts(64, 64, 128, false);
        p.residual = residual();
        let t = WG_TILINGS[1].split_in_cluster(2);
        let mut g = Gen::new(false);
        let k = g.qigemm(Arg::Val(0), 1, &p, t);
        // Like an unsplit kernel it writes y and reads the residual itself (no partial
        // buffers), one grid layer per part, in clusters of the parts.
        assert!(!t.partials() && WG_TILINGS[1].split(2).partials());
        assert_eq!(k.args[1], Arg::Val(1));
        assert!(k.args.contains(&Arg::Val(7)));
        let d = k.launch.expect("tiled launch");
        assert_eq!(d.grid, (1, 1, 2));
        assert!(g.src.contains("__cluster_dims__(1, 1, 2)"));
        // K = 9 x 64 = 576 bytes: 9 tiles, 5 per part; the other block's 128 x 128 sums
        // (64 KiB) come through distributed shared memory, within the ring's 99 KiB.
        assert!(g
            .src
            .contains("kbeg = blockIdx.z * 5, kcnt = min(9 - kbeg, 5)"));
        assert!(g.src.contains("mapa.shared::cluster.u32"));
        assert_eq!(d.smem as usize, t.smem());
        assert!(t.smem() > cluster_sum_bytes(t) + 1024);
        // A ring smaller than the sums grows to hold them.
        let small = TILINGS[0].split_in_cluster(2);
        let k = g.qigemm(Arg::Val(0), 1, &p, small);
        let smem = k.launch.expect("tiled launch").smem as usize;
        assert_eq!(smem, 128 * 128 * 4 + 1024);
        assert!(smem > small.smem());
        assert_eq!(t.to_string(), "wg128x128/6 split-k 2 cluster");
    }

    #[test]
    fn serial_split_k_counts_in_and_the_last_block_adds_up_and_requantizes() {
        let mut p = parts(64, 64, 128, false);
        p.residual = residual();
        let t = WG_TILINGS[2].split_serial(3);
        let mut g = Gen::new(false);
        let k = g.qigemm(Arg::Val(0), 1, &p, t);
        // Like an unsplit kernel it writes y and reads the residual itself; after those come
        // the workspace (the node's scratch) and its own tile counters.
        assert!(!t.partials());
        assert_eq!(k.args[1], Arg::Val(1));
        assert_eq!(k.args[5], Arg::Val(7));
        assert_eq!(k.args[6..8], [Arg::ScratchAt(0), Arg::Counters(0)]);
        // m = 126 pixels, n = 128 channels: 1 x 2 tiles of 128 x 64, 3 parts of K's 9 tiles.
        assert_eq!(k.launch.expect("tiled launch").grid, (1, 2, 3));
        assert!(g
            .src
            .contains("kbeg = blockIdx.z * 3, kcnt = min(9 - kbeg, 3)"));
        assert!(g.src.contains("done = atomicAdd(p7 + tile, 1u)"));
        assert!(g.src.contains("if (tid == 0) p7[tile] = 0u;"));
        assert!(g.src.contains("__ldcg(sums"));
        assert_eq!(t.serial_bytes(126, 128), 2 * 3 * 128 * 64 * 4);
        // Two tiles' counters, padded to 256 bytes; the next serial kernel counts in its own.
        assert_eq!(g.counter_bytes, 256);
        let k2 = g.qigemm(Arg::Val(0), 1, &p, t);
        assert_eq!(k2.args[7], Arg::Counters(256));
        assert_eq!(g.counter_bytes, 512);
        // A split through the requantization pass claims no counters.
        let mut plain = Gen::new(false);
        let k3 = plain.qigemm(Arg::Val(0), 1, &p, WG_TILINGS[2].split(3));
        assert_eq!(plain.counter_bytes, 0);
        assert!(!k3.args.iter().any(|a| matches!(a, Arg::Counters(_))));
        assert!(!plain.src.contains("atomicAdd"));
        assert_eq!(t.to_string(), "wg128x64/6 split-k 3 serial");
        // Warp-specialized and TMA-fed loops take the same reduction.
        for t in [
            WG_TILINGS[1].warp_specialized(2).split_serial(2),
            WG_TILINGS[1].with_tma().split_serial(2),
        ] {
            let mut g = Gen::new(false);
            let mut p1 = parts(64, 64, 128, false);
            p1.geom.kh = 1;
            p1.geom.kw = 1;
            p1.geom.pt = 0;
            p1.geom.pl = 0;
            g.qigemm(Arg::Val(0), 1, &p1, t);
            assert!(
                g.src
                    .contains("__syncthreads_or(tid == 0 && done == 2u - 1u)"),
                "{t}"
            );
        }
    }

    #[test]
    fn serial_parts_come_closest_to_whole_waves() {
        // Layer 4's strided 3x3 at batch 32 (m1568 n512 k4608): 52 tiles of 128 x 128, two
        // blocks per SM on 132 SMs: 5 parts fill 260 of 264 slots, 4 fill 208.
        assert_eq!(serial_parts(52, 264, 72), [5, 4]);
        // Layer 3's (m6272 n256, 98 tiles) on one block per SM: 4 and 8 parts both fill 99%.
        assert_eq!(serial_parts(98, 132, 36), [4, 8]);
        // A grid of one tile takes the most parts its K allows.
        assert_eq!(serial_parts(1, 132, 72), [8, 7]);
        // Short K leaves fewer choices: every part at least 2 K tiles, none empty (9 tiles
        // in 4 parts of 3 would leave the last one none).
        assert_eq!(serial_parts(52, 264, 8), [4, 3]);
        assert_eq!(serial_parts(52, 264, 9), [3, 2]);
        // A grid of two waves or more is not split.
        assert!(serial_parts(264, 132, 64).is_empty());
        assert!(serial_parts(0, 132, 64).is_empty());
        // The tilings: the 128x128 and 128x64 wgmma ones (TMA-fed too when asked), each with
        // its grid's part counts; none for K under 8 tiles. m = 126, n = 128: 1 and 2 tiles.
        let p = parts(64, 64, 128, false);
        let t = serial_tilings(&p, true, |_| 132);
        assert_eq!(t.len(), 8);
        assert!(t.iter().all(|t| t.serial && t.wgmma && t.splits > 1));
        assert_eq!(t.iter().filter(|t| t.tma).count(), 4);
        assert_eq!(t[0], WG_TILINGS[1].split_serial(serial_parts(1, 132, 9)[0]));
        assert_eq!(serial_tilings(&p, false, |_| 132).len(), 4);
        assert!(serial_tilings(&parts(16, 16, 128, false), true, |_| 132).is_empty());
    }

    #[test]
    fn deep_wgmma_rings_keep_two_more_k_tiles_in_flight() {
        let p = parts(64, 64, 128, false);
        for (deep, base) in
            DEEP_WG_TILINGS
                .iter()
                .zip([WG_TILINGS[1], WG_TILINGS[2], WG_TILINGS[3]])
        {
            assert_eq!((deep.bm(), deep.bn()), (base.bm(), base.bn()));
            assert_eq!((deep.stages, base.stages), (8, 6));
            assert_eq!(deep.ahead(), base.ahead() + 2);
            let mut g = Gen::new(false);
            let k = g.qigemm(Arg::Val(0), 1, &p, *deep);
            // The loop waits for all but five groups and refills the slot six tiles ahead.
            assert!(g.src.contains("cp.async.wait_group 5;"), "{deep}");
            assert!(
                g.src.contains("load((it + 6) % 8, kbeg + it + 6)"),
                "{deep}"
            );
            assert_eq!(
                k.launch.expect("tiled").smem as usize,
                igemm_smem(&p, *deep)
            );
            assert!(igemm_smem(&p, *deep) <= 227 << 10, "{deep}");
        }
    }

    #[test]
    fn wgmma_tilings_keep_their_ring_in_dynamic_shared_memory() {
        // K = 9 x 256 = 2304 bytes: 36 tiles, more than any ring holds.
        let p = parts(256, 256, 64, false);
        for t in WG_TILINGS {
            let mut g = Gen::new(false);
            let k = g.qigemm(Arg::Val(0), 1, &p, t);
            let d = k.launch.expect("tiled launch");
            assert_eq!(d.smem as usize, t.stages * (t.bm() + t.bn()) * 64 + 1024);
            assert_eq!(d.smem as usize, igemm_smem(&p, t));
            // Within the 227 KiB a Hopper block may opt into.
            assert!(igemm_smem(&p, t) <= 232_448, "{t}");
            assert_eq!(d.block as usize, 128 * t.bm() / 64);
            assert!(g.src.contains(&format!("m64n{}k32.s32.s8.s8", t.bn())));
            // The output tile fits the ring it reuses.
            assert!(t.bm() * (t.bn() + 16) <= t.stages * (t.bm() + t.bn()) * 64);
        }
        assert_eq!(WG_TILINGS[0].to_string(), "wg128x256/5");
        // A 1x1 convolution over 64 channels (one K tile) cuts the ring to 3 stages of 16 KiB.
        let mut short = parts(64, 64, 64, false);
        (short.geom.kh, short.geom.kw, short.geom.pt, short.geom.pl) = (1, 1, 0, 0);
        assert_eq!(igemm_smem(&short, WG_TILINGS[1]), 3 * 16384 + 1024);
    }

    #[test]
    fn warp_specialized_blocks_add_loader_warps_and_slot_barriers() {
        // K = 9 x 256 = 2304 bytes: 36 tiles.
        let mut p = parts(256, 256, 128, false);
        p.residual = residual();
        let t = WG_TILINGS[1].warp_specialized(2);
        let mut g = Gen::new(false);
        let k = g.qigemm(Arg::Val(0), 1, &p, t);
        let d = k.launch.expect("tiled launch");
        // 256 math threads and 64 loaders; a full and an empty barrier per slot after the ring.
        assert_eq!(d.block, 320);
        assert_eq!(d.smem as usize, t.smem() + 16 * t.stages);
        assert_eq!(d.smem as usize, igemm_smem(&p, t));
        assert!(g.src.contains(&format!(
            "const unsigned int bar0 = sbase + {};",
            t.stages * t.stage_bytes()
        )));
        // Each loader arrives twice per slot (its copies, its plain stores); each math warp once.
        assert!(g.src.contains(r#""r"(bar0 + s * 8), "r"(128));"#));
        assert!(g.src.contains(r#""r"(bar0 + (6 + s) * 8), "r"(8));"#));
        assert!(g.src.contains("const int lt = tid - 256, col = lt & 3;"));
        assert!(g.src.contains("if (warp >= 8) {"));
        assert!(g.src.contains("if (warp >= 8) break;"));
        assert!(!g.src.contains("__syncthreads();\n    if (it + "));
        assert_eq!(t.to_string(), "wg128x128/6 ws2");
        // Plain tilings have no loader warps; mma.sync tilings never become warp-specialized.
        let mut g = Gen::new(false);
        g.qigemm(Arg::Val(0), 1, &p, WG_TILINGS[1]);
        assert!(g.src.contains("const int lt = tid - 0, col = lt & 3;"));
        assert!(!g.src.contains("bar0"));
        assert_eq!(TILINGS[0].warp_specialized(2), TILINGS[0]);
        // Persistent blocks keep the block-barrier loop.
        let mut g = Gen::new(false);
        let k = g.qigemm(Arg::Val(0), 1, &p, t.persistent(9));
        assert_eq!(k.launch.expect("tiled launch").block, 256);
        assert!(!g.src.contains("bar0"));
    }

    #[test]
    fn tma_tilings_copy_each_slot_by_tensor_map_from_one_lane() {
        // A 1x1 convolution over 256 channels (4 K tiles) with a residual.
        let mut p = parts(256, 256, 128, false);
        (p.geom.kh, p.geom.kw, p.geom.pt, p.geom.pl) = (1, 1, 0, 0);
        p.residual = residual();
        assert!(tma_fits(&p));
        let t = WG_TILINGS[1].with_tma();
        assert_eq!(t.to_string(), "wg128x128/6 tma");
        let mut g = Gen::new(false);
        let k = g.qigemm(Arg::Val(0), 1, &p, t);
        // One loader warp after the 256 math threads.
        assert_eq!(k.launch.expect("tiled launch").block, 288);
        // Two maps: x as 2 x 9 x 7 pixels by 256 bytes in 128-row boxes, the weight rows
        // (128 of 256 bytes) in 128-row boxes; passed after the residual as p6 and p7.
        let (x, w) = (g.maps[0], g.maps[1]);
        assert_eq!(
            (x.base, x.rows, x.row_bytes, x.box_rows),
            (Arg::Val(0), 126, 256, 128)
        );
        assert_eq!(
            (w.base, w.rows, w.row_bytes, w.box_rows),
            (k.args[2], 128, 256, 128)
        );
        assert_eq!(&k.args[6..], &[Arg::Map(0), Arg::Map(1)]);
        // The first lane announces the slot's 16 KiB, then copies A and B into it.
        assert!(g.src.contains("if (it < 6) tma_load_a(s, kbeg + it);"));
        assert!(g.src.contains("else tma_load(s, kbeg + it);"));
        // Before the wait for the previous kernel: the maps prefetched, the first round's
        // slots announced and their weight tiles on the way.
        let early = g
            .src
            .find("if (warp == 8 && lane == 0) tma_early(kbeg, kcnt);")
            .expect("early");
        assert!(early < g.src.find("GRID_SYNC();").expect("wait"));
        assert!(g.src.contains(r#""r"(fb), "r"(16384) : "memory");"#));
        assert!(g
            .src
            .contains(r#""r"(sa), "l"(p6), "r"(kt * 64), "r"(lm0), "r"(fb)"#));
        assert!(g
            .src
            .contains(r#""r"(sa + 128 * 64), "l"(p7), "r"(kt * 64), "r"(ln0), "r"(fb)"#));
        // Its "full" barriers wait for one arrival (and the bytes); no cp.async fills the ring.
        assert!(g.src.contains(r#""r"(bar0 + s * 8), "r"(1));"#));
        assert!(!g.src.contains("cp.async.mbarrier.arrive"));
        // What does not fit: a 3x3, a strided 1x1, u8 inputs (flipped), 8-channel inputs.
        let one_by_one = |cin: usize, c4: usize, flip: bool| {
            let mut p = parts(cin, c4, 128, false);
            (p.geom.kh, p.geom.kw, p.geom.pt, p.geom.pl) = (1, 1, 0, 0);
            p.flip = flip;
            p
        };
        assert!(tma_fits(&one_by_one(64, 64, false)));
        assert!(!tma_fits(&parts(256, 256, 128, false)));
        let mut strided = one_by_one(256, 256, false);
        (
            strided.geom.sh,
            strided.geom.sw,
            strided.geom.oh,
            strided.geom.ow,
        ) = (2, 2, 5, 4);
        assert!(!tma_fits(&strided));
        assert!(!tma_fits(&one_by_one(256, 256, true)));
        assert!(!tma_fits(&one_by_one(8, 16, false)));
        // Persistent blocks keep cp.async.
        let mut g = Gen::new(false);
        g.qigemm(Arg::Val(0), 1, &p, t.persistent(9));
        assert!(g.maps.is_empty() && !g.src.contains("tma_load"));
    }

    #[test]
    fn multicast_pairs_share_each_a_tile_across_a_two_block_cluster() {
        // A 1x1 convolution over 256 channels into 256 (two 128-channel blocks a pixel tile).
        let mut p = parts(256, 256, 256, false);
        (p.geom.kh, p.geom.kw, p.geom.pt, p.geom.pl) = (1, 1, 0, 0);
        let t = WG_TILINGS[1].with_tma().with_multicast();
        assert!(t.multicast);
        assert_eq!(t.to_string(), "wg128x128/6 tma mcA");
        // Only a TMA tiling multicasts.
        assert!(!WG_TILINGS[1].with_multicast().multicast);
        let mut g = Gen::new(false);
        let k = g.qigemm(Arg::Val(0), 1, &p, t);
        let launch = k.launch.expect("tiled launch");
        assert_eq!((launch.grid, launch.block), ((1, 2, 1), 288));
        assert!(g.src.contains("__cluster_dims__(1, 2, 1)"));
        // Each block copies 64 of the tile's 128 rows: the A map's boxes are half a tile,
        // landing at the block's half of the slot in both rings; the weight tile stays whole.
        assert_eq!((g.maps[0].box_rows, g.maps[1].box_rows), (64, 128));
        assert!(g.src.contains(".multicast::cluster [%0]"));
        assert!(g
            .src
            .contains(r#""r"(sa + cy * 4096), "l"(p5), "r"(kt * 64), "r"(lm0 + cy * 64), "r"(fb), "h"((unsigned short)(amask))"#));
        assert!(g.src.contains("apeer = cx + (cy ^ 1u) * 1,"));
        assert!(!g.src.contains("bpeer"));
        // The slot still expects its whole 16 KiB (half of A from each block, B from itself).
        assert!(g.src.contains(r#""r"(fb), "r"(16384) : "memory");"#));
        // "Empty" barriers count both blocks' eight math warps; each warp releases a slot on
        // its own block's barrier and the other block's.
        assert!(g
            .src
            .contains(r#""r"(bar0 + ({st} + s) * 8), "r"({empty}));"#
                .replace("{st}", "6")
                .replace("{empty}", "16")
                .as_str()));
        assert!(g.src.contains("mapa.shared::cluster.u32 r, %0, %1;"));
        assert!(g.src.contains(r#""r"(e), "r"(apeer)"#));
        assert!(!g.src.contains(r#""r"(e), "r"(bpeer)"#));
        // The cluster meets after the barriers' initialisation and before either block leaves.
        let sync = g.src.find("barrier.cluster.wait.acquire;").expect("sync");
        assert!(sync < g.src.find("GRID_SYNC();").expect("wait"));
        assert!(
            g.src.rfind("barrier.cluster.wait.acquire;").expect("end")
                > g.src.find("bias2").expect("epilogue")
        );
        // Unicast TMA tilings and split ones are unchanged.
        let mut g = Gen::new(false);
        g.qigemm(Arg::Val(0), 1, &p, WG_TILINGS[1].with_tma());
        assert!(!g.src.contains("cluster_ctarank") && !g.src.contains("__cluster_dims__"));
        assert_eq!(g.maps[0].box_rows, 128);
        let mut g = Gen::new(false);
        g.qigemm(Arg::Val(0), 1, &p, t.split_serial(2));
        assert!(!g.src.contains("multicast"));
    }

    #[test]
    fn multicast_b_pairs_pixel_blocks_and_pads_an_odd_grid() {
        // 2 x 8 x 8 = 128 pixels: one 128-row pixel block, which needs no row guard alone.
        let mut p = parts(256, 256, 256, false);
        (p.geom.kh, p.geom.kw, p.geom.pt, p.geom.pl) = (1, 1, 0, 0);
        (p.geom.h, p.geom.w, p.geom.oh, p.geom.ow) = (8, 8, 8, 8);
        let unicast = WG_TILINGS[1].with_tma();
        let mut g = Gen::new(false);
        g.qigemm(Arg::Val(0), 1, &p, unicast);
        assert!(!g.src.contains("m0 + r < 128"));
        let t = unicast.with_multicast_b();
        assert_eq!(t.to_string(), "wg128x128/6 tma mcB");
        let mut g = Gen::new(false);
        let k = g.qigemm(Arg::Val(0), 1, &p, t);
        // A second pixel block past the end pairs with the first: it loads zeros (TMA fills
        // rows past the tensor) and its stores are guarded off.
        assert_eq!(k.launch.expect("tiled launch").grid, (2, 2, 1));
        assert!(g.src.contains("__cluster_dims__(2, 1, 1)"));
        assert!(g.src.contains("m0 + r < 128"));
        // Half weight tiles, by the block's x place, to both pixel blocks' rings.
        assert_eq!((g.maps[0].box_rows, g.maps[1].box_rows), (128, 64));
        assert!(g.src.contains(
            r#""r"(sa + 128 * 64 + cx * 4096), "l"(p6), "r"(kt * 64), "r"(ln0 + cx * 64), "r"(fb), "h"((unsigned short)(bmask))"#
        ));
        assert!(g.src.contains(r#""r"(e), "r"(bpeer)"#));
        assert!(!g.src.contains(r#""r"(e), "r"(apeer)"#));
        // Both: a 2×2 cluster whose "empty" barriers count three blocks' math warps (its own,
        // its A peer's and its B peer's), each of which releases on all three.
        let both = t.with_multicast();
        assert_eq!(both.to_string(), "wg128x128/6 tma mcAB");
        let mut g = Gen::new(false);
        let k = g.qigemm(Arg::Val(0), 1, &p, both);
        assert_eq!(k.launch.expect("tiled launch").grid, (2, 2, 1));
        assert!(g.src.contains("__cluster_dims__(2, 2, 1)"));
        assert!(g.src.contains("apeer = cx + (cy ^ 1u) * 2,"));
        assert!(g.src.contains("bpeer = (cx ^ 1u) + cy * 2,"));
        assert_eq!((g.maps[0].box_rows, g.maps[1].box_rows), (64, 64));
        assert!(g.src.contains(r#""r"(bar0 + (6 + s) * 8), "r"(24));"#));
        assert!(g.src.contains(r#""r"(e), "r"(apeer)"#) && g.src.contains(r#""r"(e), "r"(bpeer)"#));
        // Tilings with either kind: B alone everywhere, A (alone and with B) only where the
        // channel blocks pair up; none of a split or a unicast cp.async tiling.
        let tilings = [unicast, WG_TILINGS[1], unicast.split_serial(2)];
        assert_eq!(
            multicast_versions(&tilings, 128, 256),
            vec![t, unicast.with_multicast(), both]
        );
        assert_eq!(multicast_versions(&tilings, 128, 384), vec![t]);
    }

    #[test]
    fn short_k_trims_the_ring_and_prefetches_the_residual() {
        let smem = |p: &QConvParts, t: Tiling| {
            let mut g = Gen::new(false);
            let k = g.qigemm(Arg::Val(0), 1, p, t);
            let fetch = g.src.contains("fetch_z(sbase + ");
            (k.launch.expect("tiled launch").smem as usize, fetch)
        };
        // A 1x1 conv over 64 channels: one K tile, rings of 2 (mma) and 3 (wgmma) stages,
        // and with a residual its [BM][BN + 16] tile after the ring.
        let mut p = parts(64, 64, 128, false);
        (p.geom.kh, p.geom.kw, p.geom.pt, p.geom.pl) = (1, 1, 0, 0);
        let (t, w) = (TILINGS[0], WG_TILINGS[1]);
        assert_eq!(smem(&p, t), (2 * t.stage_bytes() + 1024, false));
        assert_eq!(smem(&p, w), (3 * w.stage_bytes() + 1024, false));
        p.residual = residual();
        assert_eq!(smem(&p, t), (2 * t.stage_bytes() + 1024 + 128 * 144, true));
        // Nine K tiles (3x3 over 64 channels): full rings, the residual after the loop.
        let mut p = parts(64, 64, 128, false);
        assert_eq!(smem(&p, t), (t.smem(), false));
        p.residual = residual();
        assert_eq!(smem(&p, t), (t.smem(), false));
    }

    #[test]
    fn persistent_blocks_loop_over_tiles_with_two_output_tiles() {
        let mut p = parts(64, 64, 256, false);
        (p.geom.kh, p.geom.kw, p.geom.pt, p.geom.pl) = (1, 1, 0, 0);
        p.residual = residual();
        // 2 x 63 = 126 pixels, 256 channels: 64x128 tiles make a 2 x 2 grid of 4 tiles.
        let t = TILINGS[1];
        for (ctas, blocks) in [(3, 3), (264, 4)] {
            let mut g = Gen::new(false);
            let k = g.qigemm(Arg::Val(0), 1, &p, t.persistent(ctas));
            let d = k.launch.expect("tiled launch");
            assert_eq!(d.grid, (blocks, 1, 1));
            assert_eq!(d.smem as usize, t.persistent_smem(1));
            assert_eq!(
                t.persistent_smem(1),
                2 * t.stage_bytes() + 1024 + 2 * 64 * 144
            );
            // Each block walks the tiles; the next one's residual goes to the other tile.
            assert!(g.src.contains("tt < 4; tt += gridDim.x, par ^= 1"));
            assert!(g.src.contains("fetch_z(sbase + 24576 + (par ^ 1) * 9216);"));
            assert!(g.src.contains("u8* tile = smem + 24576 + par * 9216;"));
        }
        assert_eq!(t.persistent(264).to_string(), "64x128 persistent 264");
    }

    #[test]
    fn stems_and_u8_inputs_gather_others_copy() {
        assert!(gathers(&parts(3, 4, 16, false)));
        assert!(gathers(&parts(32, 32, 16, true)));
        assert!(gathers(&parts(24, 24, 16, false)));
        assert!(!gathers(&parts(32, 32, 16, false)));
        assert!(igemm_fits(&parts(3, 4, 16, true)));
        assert!(!igemm_fits(&parts(32, 32, 12, false)));
        let mut grouped = parts(32, 32, 16, false);
        grouped.geom.groups = 2;
        assert!(!igemm_fits(&grouped));
    }
}
