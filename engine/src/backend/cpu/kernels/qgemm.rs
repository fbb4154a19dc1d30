//! INT8 matrix product with fused requantization: `u8 A [M, K] x i8 B [K, N] -> i32`, then
//! `q = clamp(round((acc + bias[n]) * mult[n]) + zero_point)` into u8/i8 (bias already holds
//! the zero-point correction `-za * sum_k B[k][n]`). `B` is packed once at build time into
//! panels of 32 (or a 16-wide tail) columns, K in groups of 4: `[k/4][column][4]`, the operand
//! layout of `vpdpbusd`. Micro-kernels are chosen at run time: AVX-512 VNNI (6 x 32), AVX-VNNI
//! 256-bit (2 x 32), AVX2 and a portable scalar one. AVX2 packs `B` in K pairs instead
//! (16-column panels, `[k/2][column][2]`), widens each block of six A rows to i16 once and each
//! B vector as it is loaded, so its 6 x 16 tile is one `vpmaddwd` + `vpaddd` per 16 products,
//! exact (`vpmaddubsw` would saturate). Also the QGemm node kernel (a folded `DQ -> Gemm -> Q`).

use rayon::prelude::*;

use super::elementwise::{input, output};
use super::{Kernel, TensorMut, TensorRef};
use crate::error::{Error, Result};
use crate::ir::{Activation, DataType, Graph, Node, Op, QParams, TensorData};

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Instruction set of the integer micro-kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QIsa {
    /// AVX-512 with VNNI (`vpdpbusd` on zmm).
    Avx512Vnni,
    /// AVX-VNNI (`vpdpbusd` on ymm, VEX encoded).
    AvxVnni,
    /// AVX2 only: exact widening to i16 and `vpmaddwd`.
    Avx2,
    /// Portable scalar code.
    Portable,
}

impl QIsa {
    /// The best instruction set this CPU supports (`VIGIL_QISA=portable|avx2|avxvnni|avx512vnni`
    /// forces a lower one, for testing and comparisons).
    pub fn detect() -> QIsa {
        let forced = std::env::var("VIGIL_QISA")
            .ok()
            .and_then(|s| match s.as_str() {
                "portable" => Some(QIsa::Portable),
                "avx2" => Some(QIsa::Avx2),
                "avxvnni" => Some(QIsa::AvxVnni),
                "avx512vnni" => Some(QIsa::Avx512Vnni),
                _ => None,
            });
        if let Some(f) = forced.filter(|f| f.available()) {
            return f;
        }
        [QIsa::Avx512Vnni, QIsa::AvxVnni, QIsa::Avx2]
            .into_iter()
            .find(|i| i.available())
            .unwrap_or(QIsa::Portable)
    }

    /// True when this CPU can run `self`.
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                QIsa::Portable => true,
                QIsa::Avx512Vnni => {
                    is_x86_feature_detected!("avx512f")
                        && is_x86_feature_detected!("avx512bw")
                        && is_x86_feature_detected!("avx512vl")
                        && is_x86_feature_detected!("avx512vnni")
                }
                QIsa::AvxVnni => {
                    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("avxvnni")
                }
                QIsa::Avx2 => is_x86_feature_detected!("avx2"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == QIsa::Portable
        }
    }

    /// Rows per micro-tile.
    fn mr(self) -> usize {
        match self {
            QIsa::Avx512Vnni => 6,
            QIsa::AvxVnni => 2,
            QIsa::Avx2 | QIsa::Portable => 1,
        }
    }
}

/// Full panel width (columns).
const NR: usize = 32;

/// K bytes of one AMX step (a panel's depth is a multiple of it when AMX runs it).
const AMX_K: usize = 64;

/// Shortest K packed for AMX by [`PackedQB::pack`]: with less, most of each 64-byte step is
/// padding and the VNNI registers are faster (on a Sapphire Rapids-class Xeon, K = 16-40 ran
/// 1.1-1.4x slower on the tiles, K = 64 and up 1.3-2x faster; docs/benchmarks.md).
const AMX_MIN_K: usize = 64;

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
/// Fewest rows a product runs on the AMX tiles (16-row tiles; fewer rows, such as a
/// classifier's single one, stay on the VNNI registers).
const AMX_MIN_ROWS: usize = 16;

/// Whether AMX int8 tiles can run here (`amx::available`; never off x86-64).
pub fn amx_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::amx::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `B` packed for the micro-kernels, with its column sums.
pub struct PackedQB {
    isa: QIsa,
    /// K rounded up to a multiple of 4 (A rows must provide this many readable bytes).
    pub kp: usize,
    /// K rows a panel holds: `kp`, or `kp` rounded up to a whole AMX step (zero rows past K).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    depth: usize,
    /// Whether products of at least [`AMX_MIN_ROWS`] rows run on the AMX tiles.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    amx: bool,
    /// N, the number of columns of B (and of the output).
    pub n: usize,
    /// Panels: (first column, width 16 or 32, offset into `data`, or into `pairs` for AVX2).
    panels: Vec<(usize, usize, usize)>,
    data: Vec<i8>,
    /// AVX2: 16-column panels in K pairs, `[kp / 2][16][2]` each (empty for other ISAs).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pairs: Vec<i8>,
    /// `sum_k B[k][n]` per column.
    pub col_sums: Vec<i32>,
}

impl PackedQB {
    /// Packs `B` given as `b(k, n)` for a `k x n` product: for AMX too where `isa` is AVX-512
    /// VNNI, the CPU and OS allow AMX ([`amx_available`]) and K is at least `AMX_MIN_K`.
    pub fn pack(k: usize, n: usize, b: impl Fn(usize, usize) -> i8, isa: QIsa) -> Self {
        let amx = isa == QIsa::Avx512Vnni && k >= AMX_MIN_K && amx_available();
        Self::pack_with(k, n, b, isa, amx)
    }

    /// [`Self::pack`] with the AMX choice made by the caller (`amx` needs AVX-512 VNNI and
    /// [`amx_available`]; ignored otherwise).
    pub fn pack_with(
        k: usize,
        n: usize,
        b: impl Fn(usize, usize) -> i8,
        isa: QIsa,
        amx: bool,
    ) -> Self {
        let amx = amx && isa == QIsa::Avx512Vnni && amx_available();
        let kp = k.div_ceil(4) * 4;
        let depth = if amx { kp.next_multiple_of(AMX_K) } else { kp };
        let mut panels = Vec::new();
        let mut data = Vec::new();
        let mut pairs = Vec::new();
        let mut col = 0;
        while col < n {
            let rest = n - col;
            if isa == QIsa::Avx2 {
                let off = pairs.len();
                pairs.resize(off + kp * 16, 0);
                for kk in 0..k {
                    for j in 0..16.min(rest) {
                        pairs[off + (kk / 2) * 32 + j * 2 + kk % 2] = b(kk, col + j);
                    }
                }
                panels.push((col, 16, off));
                col += 16;
                continue;
            }
            let w = if rest > 16 { NR } else { 16 };
            let off = data.len();
            data.resize(off + depth * w, 0);
            for kk in 0..k {
                for j in 0..w.min(rest) {
                    data[off + (kk / 4) * w * 4 + j * 4 + kk % 4] = b(kk, col + j);
                }
            }
            panels.push((col, w, off));
            col += w;
        }
        let col_sums = (0..n)
            .map(|j| (0..k).map(|kk| b(kk, j) as i32).sum())
            .collect();
        PackedQB {
            isa,
            kp,
            depth,
            amx,
            n,
            panels,
            data,
            pairs,
            col_sums,
        }
    }

    /// `out[i * ldc + j] = epi(A[i] . B[:, j])` for `m` rows of `a` (row stride `lda >= kp`,
    /// bytes past K zero or anything: B is zero there).
    pub fn run(
        &self,
        m: usize,
        a: &[u8],
        lda: usize,
        out: &mut [u8],
        ldc: usize,
        epi: &QEpilogue,
    ) -> Result<()> {
        if m == 0 || self.n == 0 {
            return Ok(());
        }
        if lda < self.kp
            || a.len() < (m - 1) * lda + self.kp
            || out.len() < (m - 1) * ldc + self.n
            || ldc < self.n
            || epi.bias.len() < self.n
            || epi.mult.len() < self.n
        {
            return Err(Error::Shape(format!(
                "int8 gemm of {m} rows x {} x {}: operand buffers too small",
                self.kp, self.n
            )));
        }
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: the ISA was checked available when packing; bounds were checked above.
            unsafe {
                match self.isa {
                    QIsa::Avx512Vnni if self.amx && m >= AMX_MIN_ROWS => {
                        self.run_amx(m, a, lda, out, ldc, epi);
                        return Ok(());
                    }
                    QIsa::Avx512Vnni if epi.general.is_none() => {
                        self.run_fused_vnni512(m, a, lda, out, ldc, epi);
                        return Ok(());
                    }
                    QIsa::Avx2 => {
                        self.run_wide_avx2(m, a, lda, out, ldc, epi);
                        return Ok(());
                    }
                    QIsa::AvxVnni if epi.general.is_none() => {
                        self.run_fused_avxvnni(m, a, lda, out, ldc, epi);
                        return Ok(());
                    }
                    QIsa::Avx512Vnni => {
                        self.run_avx512(m, a, lda, out, ldc, epi);
                        return Ok(());
                    }
                    QIsa::AvxVnni => {
                        self.run_avx2(m, a, lda, out, ldc, epi);
                        return Ok(());
                    }
                    QIsa::Portable => {}
                }
            }
        }
        self.run_impl(m, a, lda, out, ldc, epi);
        Ok(())
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn run_avx512(
        &self,
        m: usize,
        a: &[u8],
        lda: usize,
        out: &mut [u8],
        ldc: usize,
        epi: &QEpilogue,
    ) {
        self.run_impl(m, a, lda, out, ldc, epi)
    }

    /// AVX-512 VNNI product with the requantization in registers: each 6 x 32 tile goes
    /// straight from the accumulators to the 8-bit output (masked at the column tail).
    ///
    /// # Safety
    /// AVX-512 VNNI available; operand sizes checked by [`PackedQB::run`]; `epi.general` None.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    #[allow(clippy::needless_range_loop)] // register tiles index several arrays in step
    unsafe fn run_fused_vnni512(
        &self,
        m: usize,
        a: &[u8],
        lda: usize,
        out: &mut [u8],
        ldc: usize,
        epi: &QEpilogue,
    ) {
        let groups = self.kp / 4;
        let op = out.as_mut_ptr();
        for &(c0, w, off) in &self.panels {
            let bp = self.data.as_ptr().add(off);
            let nv = w / 16;
            let mut masks = [0 as __mmask16; 2];
            for (v, mk) in masks.iter_mut().enumerate().take(nv) {
                let col = c0 + v * 16;
                let nb = self.n.saturating_sub(col).min(16);
                *mk = ((1u32 << nb) - 1) as __mmask16;
            }
            // 6 x 32 tiles, or 12 x 16 on a 16-wide panel (12 accumulation chains either way,
            // enough to hide `vpdpbusd`'s latency).
            let mut i = 0;
            while i < m {
                let (ap, orow) = (a.as_ptr().add(i * lda), op.add(i * ldc + c0));
                i += if nv == 2 {
                    tile_vnni512::<6, 2>(m - i, ap, lda, bp, groups, orow, ldc, epi, c0, masks)
                } else {
                    tile_vnni512::<12, 1>(m - i, ap, lda, bp, groups, orow, ldc, epi, c0, masks)
                };
            }
        }
    }

    /// AMX product: 32 x 32 blocks (32 x 16 on a 16-wide panel) of four accumulator tiles,
    /// 64 bytes of K a step, stored to a block of i32 and requantized from there (in registers,
    /// or by the scalar epilogue for a general activation). A block's requantization runs after
    /// the next block's tile work is issued, so the tiles multiply while the vector units
    /// requantize. A tiles read A in place where their 16 rows of `depth` bytes lie inside
    /// `a`; the last tiles of a band (rows past `m`, or reads past the buffer) are staged
    /// through a zeroed copy.
    ///
    /// # Safety
    /// AVX-512 VNNI and AMX available; sizes checked by [`PackedQB::run`]; packed with `amx`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn run_amx(
        &self,
        m: usize,
        a: &[u8],
        lda: usize,
        out: &mut [u8],
        ldc: usize,
        epi: &QEpilogue,
    ) {
        use super::amx::{Block, Stage, Tiles, TILE_ROWS};
        let tiles = Tiles::configure();
        let mut acc = [Block([[0; 32]; 32]), Block([[0; 32]; 32])];
        let mut stage = Stage([[[0; AMX_K]; TILE_ROWS]; 2]);
        let steps = self.depth / AMX_K;
        let op = out.as_mut_ptr();
        // The block stored but not yet requantized: (its buffer, first row, rows, panel).
        let mut pending: Option<(usize, usize, usize, (usize, usize))> = None;
        let mut slot = 0;
        for &(c0, w, off) in &self.panels {
            let bp = self.data.as_ptr().add(off);
            let ldb = w * 4;
            let mut i = 0;
            while i < m {
                let rows = (2 * TILE_ROWS).min(m - i);
                // Whether A tile `t` (rows i + 16t ..) can be read in place for every step.
                let in_place = |t: usize| {
                    let last = i + t * TILE_ROWS + TILE_ROWS - 1;
                    last < m && last * lda + self.depth <= a.len()
                };
                let direct = [in_place(0), in_place(1)];
                tiles.zero();
                for s in 0..steps {
                    let k0 = s * AMX_K;
                    let mut src = [(std::ptr::null::<u8>(), 0usize); 2];
                    for t in 0..2 {
                        let r0 = i + t * TILE_ROWS;
                        src[t] = if direct[t] {
                            (a.as_ptr().add(r0 * lda + k0), lda)
                        } else {
                            // Valid rows copy the bytes they hold (`kp` per row is readable;
                            // B is zero past K), the rest of the tile is zero.
                            let bytes = AMX_K.min(self.kp - k0);
                            for (r, row) in stage.0[t].iter_mut().enumerate() {
                                if r0 + r < m {
                                    let from = (r0 + r) * lda + k0;
                                    row[..bytes].copy_from_slice(&a[from..from + bytes]);
                                    row[bytes..].fill(0);
                                } else {
                                    row.fill(0);
                                }
                            }
                            (stage.0[t].as_ptr() as *const u8, AMX_K)
                        };
                    }
                    let b = bp.add(k0 * w);
                    if w == NR {
                        tiles.step_2x2(src[0], src[1], b, ldb);
                    } else {
                        tiles.step_2x1(src[0], src[1], b, ldb);
                    }
                }
                tiles.store(&mut acc[slot]);
                if let Some((ps, pi, prows, panel)) = pending {
                    self.amx_epilogue(&acc[ps], op.add(pi * ldc), prows, ldc, panel, epi);
                }
                pending = Some((slot, i, rows, (c0, w)));
                slot ^= 1;
                i += rows;
            }
        }
        if let Some((ps, pi, prows, panel)) = pending {
            self.amx_epilogue(&acc[ps], op.add(pi * ldc), prows, ldc, panel, epi);
        }
    }

    /// Requantizes `rows` rows of an AMX block of panel `(c0, w)` into `out` (row stride
    /// `ldc`; the panel's columns start at `out + c0`).
    ///
    /// # Safety
    /// AVX-512F/BW/VL available; `rows` rows of the panel's valid columns writable at `out`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    #[inline]
    unsafe fn amx_epilogue(
        &self,
        acc: &super::amx::Block,
        out: *mut u8,
        rows: usize,
        ldc: usize,
        (c0, w): (usize, usize),
        epi: &QEpilogue,
    ) {
        let valid = w.min(self.n - c0);
        if epi.general.is_some() {
            for r in 0..rows {
                let o = std::slice::from_raw_parts_mut(out.add(r * ldc + c0), valid);
                epi.store(&acc.0[r][..valid], c0, o);
            }
            return;
        }
        let lanes = |v: usize| {
            let nb = valid.saturating_sub(v * 16).min(16);
            ((1u32 << nb) - 1) as __mmask16
        };
        let (m0, m1) = (lanes(0), lanes(1));
        let rq0 = Requant512::new(epi, c0, m0);
        if w == NR {
            let rq1 = Requant512::new(epi, c0 + 16, m1);
            for r in 0..rows {
                let (a, o) = (acc.0[r].as_ptr(), out.add(r * ldc + c0) as *mut i8);
                _mm_mask_storeu_epi8(o, m0, rq0.apply(_mm512_load_si512(a as *const _)));
                _mm_mask_storeu_epi8(
                    o.add(16),
                    m1,
                    rq1.apply(_mm512_load_si512(a.add(16) as *const _)),
                );
            }
        } else {
            for r in 0..rows {
                let (a, o) = (acc.0[r].as_ptr(), out.add(r * ldc + c0) as *mut i8);
                _mm_mask_storeu_epi8(o, m0, rq0.apply(_mm512_load_si512(a as *const _)));
            }
        }
    }

    /// AVX-VNNI product with the requantization in registers (8 columns per vector; a column
    /// tail below 8 goes through the scalar epilogue).
    ///
    /// # Safety
    /// AVX2 and AVX-VNNI available; sizes checked by [`PackedQB::run`]; `epi.general` None.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn run_fused_avxvnni(
        &self,
        m: usize,
        a: &[u8],
        lda: usize,
        out: &mut [u8],
        ldc: usize,
        epi: &QEpilogue,
    ) {
        let mr = self.isa.mr();
        for &(c0, w, off) in &self.panels {
            let panel = &self.data[off..off + self.kp * w];
            let valid = w.min(self.n - c0);
            let mut i = 0;
            while i < m {
                let rows = mr.min(m - i);
                let t = micro_avxvnni_regs(rows, &a[i * lda..], lda, panel, w, self.kp);
                for (r, tr) in t.iter().enumerate().take(rows) {
                    let o = &mut out[(i + r) * ldc + c0..(i + r) * ldc + c0 + valid];
                    store_avx2(tr, o, c0, epi);
                }
                i += rows;
            }
        }
    }

    /// AVX2 product over the K-pair panels, in blocks of up to [`WIDE_ROWS`] rows of A
    /// ([`PackedQB::wide_block`] for each block's height).
    ///
    /// # Safety
    /// AVX2 available; sizes checked by [`PackedQB::run`]; packed for [`QIsa::Avx2`].
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn run_wide_avx2(
        &self,
        m: usize,
        a: &[u8],
        lda: usize,
        out: &mut [u8],
        ldc: usize,
        epi: &QEpilogue,
    ) {
        let mut buf = [0u32; WIDE_ROWS * WIDE_CHUNK];
        let mut i = 0;
        while i < m {
            let rows = WIDE_ROWS.min(m - i);
            let (ap, op) = (a.as_ptr().add(i * lda), out.as_mut_ptr().add(i * ldc));
            match rows {
                6 => self.wide_block::<6>(ap, lda, op, ldc, epi, &mut buf),
                5 => self.wide_block::<5>(ap, lda, op, ldc, epi, &mut buf),
                4 => self.wide_block::<4>(ap, lda, op, ldc, epi, &mut buf),
                3 => self.wide_block::<3>(ap, lda, op, ldc, epi, &mut buf),
                2 => self.wide_block::<2>(ap, lda, op, ldc, epi, &mut buf),
                _ => self.wide_block::<1>(ap, lda, op, ldc, epi, &mut buf),
            }
            i += rows;
        }
    }

    /// `R` rows of A against every panel: the rows widened to i16 pairs once (in chunks of
    /// [`WIDE_CHUNK`] pairs in `buf`, again per panel only when K is longer), an `R` x 16
    /// register tile per panel, requantized in registers with the panel's bias and
    /// multipliers loaded once (the scalar epilogue for a column tail or general activation).
    ///
    /// # Safety
    /// AVX2 available; `R` rows of `kp` bytes readable from `ap` (stride `lda`) and `R` rows
    /// of `n` bytes writable at `op` (stride `ldc`); packed for [`QIsa::Avx2`].
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    #[allow(clippy::needless_range_loop)] // register tiles index several arrays in step
    unsafe fn wide_block<const R: usize>(
        &self,
        ap: *const u8,
        lda: usize,
        op: *mut u8,
        ldc: usize,
        epi: &QEpilogue,
        buf: &mut [u32; WIDE_ROWS * WIDE_CHUNK],
    ) {
        let pairs = self.kp / 2;
        let once = pairs <= WIDE_CHUNK;
        if once {
            widen_rows(ap, lda, R, 0, pairs, buf);
        }
        for &(c0, _, off) in &self.panels {
            let bp = self.pairs.as_ptr().add(off);
            let mut acc = [[_mm256_setzero_si256(); 2]; R];
            let mut k0 = 0;
            while k0 < pairs {
                let kc = WIDE_CHUNK.min(pairs - k0);
                if !once {
                    widen_rows(ap, lda, R, k0, kc, buf);
                }
                tile_wide_avx2::<R>(&mut acc, buf, bp.add(k0 * 32), kc);
                k0 += kc;
            }
            let valid = 16.min(self.n - c0);
            if valid == 16 && epi.general.is_none() {
                let rq = Requant16::new(epi, c0);
                for r in 0..R {
                    let q = rq.apply(epi, acc[r][0], acc[r][1]);
                    _mm_storeu_si128(op.add(r * ldc + c0) as *mut __m128i, q);
                }
            } else {
                for r in 0..R {
                    let o = std::slice::from_raw_parts_mut(op.add(r * ldc + c0), valid);
                    store_avx2(&acc[r], o, c0, epi);
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run_avx2(
        &self,
        m: usize,
        a: &[u8],
        lda: usize,
        out: &mut [u8],
        ldc: usize,
        epi: &QEpilogue,
    ) {
        self.run_impl(m, a, lda, out, ldc, epi)
    }

    /// The panel/row loops (inlined into each ISA's compiled copy so the epilogue vectorises).
    #[inline(always)]
    fn run_impl(
        &self,
        m: usize,
        a: &[u8],
        lda: usize,
        out: &mut [u8],
        ldc: usize,
        epi: &QEpilogue,
    ) {
        let mr = self.isa.mr();
        let mut acc = [[0i32; NR]; 6];
        for &(c0, w, off) in &self.panels {
            let panel = &self.data[off..off + self.kp * w];
            let mut i = 0;
            while i < m {
                let rows = mr.min(m - i);
                let arow = &a[i * lda..];
                self.micro(rows, arow, lda, panel, w, &mut acc);
                let valid = w.min(self.n - c0);
                for (r, accr) in acc.iter().enumerate().take(rows) {
                    let o = &mut out[(i + r) * ldc + c0..(i + r) * ldc + c0 + valid];
                    epi.store(&accr[..valid], c0, o);
                }
                i += rows;
            }
        }
    }

    /// Accumulates `rows` (<= mr) rows of A against one panel into `acc`.
    #[inline(always)]
    fn micro(
        &self,
        rows: usize,
        a: &[u8],
        lda: usize,
        panel: &[i8],
        w: usize,
        acc: &mut [[i32; NR]; 6],
    ) {
        let kp = self.kp;
        debug_assert!(a.len() >= (rows - 1) * lda + kp && panel.len() >= kp * w);
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: the ISA was checked available when packing (QIsa::detect/available) and
            // `run` checked that `rows` rows of `kp` bytes of A and the panel are in bounds.
            unsafe {
                match self.isa {
                    QIsa::Avx512Vnni => return micro_vnni512(rows, a, lda, panel, w, kp, acc),
                    QIsa::AvxVnni => return micro_avxvnni(rows, a, lda, panel, w, kp, acc),
                    // AVX2 runs its own widened panels (`run_wide_avx2`).
                    QIsa::Avx2 => {}
                    QIsa::Portable => {}
                }
            }
        }
        micro_portable(rows, a, lda, panel, w, kp, acc);
    }
}

/// One VNNI register tile: `R` rows (fewer at the end: the last valid row repeats, its
/// results dropped) against `NV` 16-column vectors of a packed panel, requantized in registers
/// and stored (columns masked by `masks`) at `out` (row stride `ldc`, first column `c0` of the
/// epilogue). Returns the number of rows done.
///
/// # Safety
/// AVX-512 VNNI available; `min(left, R)` rows of `4 * groups` bytes readable from `ap` at
/// stride `lda`, `groups` groups of `NV * 64` bytes at `bp`, the masked outputs writable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)] // register tiles
unsafe fn tile_vnni512<const R: usize, const NV: usize>(
    left: usize,
    ap: *const u8,
    lda: usize,
    bp: *const i8,
    groups: usize,
    out: *mut u8,
    ldc: usize,
    epi: &QEpilogue,
    c0: usize,
    masks: [__mmask16; 2],
) -> usize {
    let rows = R.min(left);
    let mut rp = [ap; R];
    for (r, p) in rp.iter_mut().enumerate() {
        *p = ap.add(r.min(rows - 1) * lda);
    }
    let mut c = [[_mm512_setzero_si512(); NV]; R];
    for g in 0..groups {
        let mut b = [_mm512_setzero_si512(); NV];
        for v in 0..NV {
            b[v] = _mm512_loadu_si512(bp.add(g * 64 * NV + v * 64) as *const _);
        }
        for r in 0..R {
            let av = _mm512_set1_epi32((rp[r].add(g * 4) as *const i32).read_unaligned());
            for v in 0..NV {
                c[r][v] = _mm512_dpbusd_epi32(c[r][v], av, b[v]);
            }
        }
    }
    for r in 0..rows {
        for v in 0..NV {
            if masks[v] == 0 {
                continue;
            }
            let q = epi.requant16(c[r][v], c0 + v * 16, masks[v]);
            _mm_mask_storeu_epi8(out.add(r * ldc + v * 16) as *mut i8, masks[v], q);
        }
    }
    rows
}

fn micro_portable(
    rows: usize,
    a: &[u8],
    lda: usize,
    panel: &[i8],
    w: usize,
    kp: usize,
    acc: &mut [[i32; NR]; 6],
) {
    for (r, accr) in acc.iter_mut().enumerate().take(rows) {
        let ar = &a[r * lda..r * lda + kp];
        accr[..w].fill(0);
        for (g, a4) in ar.chunks_exact(4).enumerate() {
            let b = &panel[g * w * 4..(g + 1) * w * 4];
            for (j, bj) in b.chunks_exact(4).enumerate() {
                accr[j] += (0..4).map(|t| a4[t] as i32 * bj[t] as i32).sum::<i32>();
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[allow(clippy::needless_range_loop)] // register tiles index several arrays in step
unsafe fn micro_vnni512(
    rows: usize,
    a: &[u8],
    lda: usize,
    panel: &[i8],
    w: usize,
    kp: usize,
    acc: &mut [[i32; NR]; 6],
) {
    let ap = a.as_ptr();
    let bp = panel.as_ptr();
    let mut c = [[_mm512_setzero_si512(); 2]; 6];
    let nv = w / 16;
    let groups = kp / 4;
    // Row pointers (rows beyond `rows` repeat the last valid one; their results are dropped).
    let mut rp = [ap; 6];
    for (r, p) in rp.iter_mut().enumerate() {
        *p = ap.add(r.min(rows - 1) * lda);
    }
    if nv == 2 {
        for g in 0..groups {
            let b0 = _mm512_loadu_si512(bp.add(g * 128) as *const _);
            let b1 = _mm512_loadu_si512(bp.add(g * 128 + 64) as *const _);
            for r in 0..6 {
                let av = _mm512_set1_epi32((rp[r].add(g * 4) as *const i32).read_unaligned());
                c[r][0] = _mm512_dpbusd_epi32(c[r][0], av, b0);
                c[r][1] = _mm512_dpbusd_epi32(c[r][1], av, b1);
            }
        }
    } else {
        for g in 0..groups {
            let b0 = _mm512_loadu_si512(bp.add(g * 64) as *const _);
            for r in 0..6 {
                let av = _mm512_set1_epi32((rp[r].add(g * 4) as *const i32).read_unaligned());
                c[r][0] = _mm512_dpbusd_epi32(c[r][0], av, b0);
            }
        }
    }
    for r in 0..rows {
        for v in 0..nv {
            _mm512_storeu_si512(acc[r].as_mut_ptr().add(v * 16) as *mut _, c[r][v]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avxvnni")]
#[allow(clippy::needless_range_loop)] // register tiles index several arrays in step
unsafe fn micro_avxvnni(
    rows: usize,
    a: &[u8],
    lda: usize,
    panel: &[i8],
    w: usize,
    kp: usize,
    acc: &mut [[i32; NR]; 6],
) {
    let ap = a.as_ptr();
    let bp = panel.as_ptr();
    let mut c = [[_mm256_setzero_si256(); 4]; 2];
    let nv = w / 8;
    let r1 = ap.add((rows - 1).min(1) * lda);
    for g in 0..kp / 4 {
        let a0 = _mm256_set1_epi32((ap.add(g * 4) as *const i32).read_unaligned());
        let a1 = _mm256_set1_epi32((r1.add(g * 4) as *const i32).read_unaligned());
        for v in 0..nv {
            let b = _mm256_loadu_si256(bp.add(g * w * 4 + v * 32) as *const _);
            c[0][v] = _mm256_dpbusd_avx_epi32(c[0][v], a0, b);
            c[1][v] = _mm256_dpbusd_avx_epi32(c[1][v], a1, b);
        }
    }
    for r in 0..rows {
        for v in 0..nv {
            _mm256_storeu_si256(acc[r].as_mut_ptr().add(v * 8) as *mut _, c[r][v]);
        }
    }
}

/// [`micro_avxvnni`] returning the 2 x 32 accumulators in registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avxvnni")]
#[inline]
#[allow(clippy::needless_range_loop)] // register tiles index several arrays in step
unsafe fn micro_avxvnni_regs(
    rows: usize,
    a: &[u8],
    lda: usize,
    panel: &[i8],
    w: usize,
    kp: usize,
) -> [[__m256i; 4]; 2] {
    let ap = a.as_ptr();
    let bp = panel.as_ptr();
    let mut c = [[_mm256_setzero_si256(); 4]; 2];
    let r1 = ap.add((rows - 1).min(1) * lda);
    if w == NR {
        for g in 0..kp / 4 {
            let a0 = _mm256_set1_epi32((ap.add(g * 4) as *const i32).read_unaligned());
            let a1 = _mm256_set1_epi32((r1.add(g * 4) as *const i32).read_unaligned());
            for v in 0..4 {
                let b = _mm256_loadu_si256(bp.add(g * 128 + v * 32) as *const _);
                c[0][v] = _mm256_dpbusd_avx_epi32(c[0][v], a0, b);
                c[1][v] = _mm256_dpbusd_avx_epi32(c[1][v], a1, b);
            }
        }
    } else {
        for g in 0..kp / 4 {
            let a0 = _mm256_set1_epi32((ap.add(g * 4) as *const i32).read_unaligned());
            let a1 = _mm256_set1_epi32((r1.add(g * 4) as *const i32).read_unaligned());
            for v in 0..2 {
                let b = _mm256_loadu_si256(bp.add(g * 64 + v * 32) as *const _);
                c[0][v] = _mm256_dpbusd_avx_epi32(c[0][v], a0, b);
                c[1][v] = _mm256_dpbusd_avx_epi32(c[1][v], a1, b);
            }
        }
    }
    c
}

/// Rows of A per AVX2 register tile (6 x 16: twelve accumulators, two B vectors and a
/// broadcast in the sixteen ymm registers).
#[cfg(target_arch = "x86_64")]
const WIDE_ROWS: usize = 6;

/// K pairs of A widened at once (`WIDE_ROWS` rows of them: 24 KiB on the stack).
#[cfg(target_arch = "x86_64")]
const WIDE_CHUNK: usize = 1024;

/// Writes pairs `k0..k0 + kc` of `rows` rows of A (from `ap`, stride `lda`) zero-extended to
/// i16 into `buf` (row `r` at `r * WIDE_CHUNK`), one u32 lane per pair.
///
/// # Safety
/// AVX2 available; each row has `2 * (k0 + kc)` readable bytes, `rows <= WIDE_ROWS` and
/// `kc <= WIDE_CHUNK`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn widen_rows(
    ap: *const u8,
    lda: usize,
    rows: usize,
    k0: usize,
    kc: usize,
    buf: &mut [u32],
) {
    for r in 0..rows {
        let src = ap.add(r * lda + 2 * k0);
        let dst = buf.as_mut_ptr().add(r * WIDE_CHUNK);
        let mut j = 0;
        while j + 8 <= kc {
            let v = _mm_loadu_si128(src.add(2 * j) as *const __m128i);
            _mm256_storeu_si256(dst.add(j) as *mut __m256i, _mm256_cvtepu8_epi16(v));
            j += 8;
        }
        while j < kc {
            let (lo, hi) = (*src.add(2 * j) as u32, *src.add(2 * j + 1) as u32);
            *dst.add(j) = lo | hi << 16;
            j += 1;
        }
    }
}

/// Accumulates `kc` pairs of the `R` widened rows in `buf` against one 16-column K-pair panel
/// chunk at `bp` (`[kc][16][2]`, widened to i16 as loaded) into `acc`.
///
/// # Safety
/// AVX2 available; `bp` holds `kc * 32` bytes, `buf` `R * WIDE_CHUNK` lanes, `R <= 6`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
#[allow(clippy::needless_range_loop)] // register tiles index several arrays in step
unsafe fn tile_wide_avx2<const R: usize>(
    acc: &mut [[__m256i; 2]; R],
    buf: &[u32],
    bp: *const i8,
    kc: usize,
) {
    let mut c = *acc;
    let ap = buf.as_ptr();
    for g in 0..kc {
        let b0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(bp.add(g * 32) as *const __m128i));
        let b1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(bp.add(g * 32 + 16) as *const __m128i));
        for r in 0..R {
            let a = _mm256_set1_epi32(*ap.add(r * WIDE_CHUNK + g) as i32);
            c[r][0] = _mm256_add_epi32(c[r][0], _mm256_madd_epi16(a, b0));
            c[r][1] = _mm256_add_epi32(c[r][1], _mm256_madd_epi16(a, b1));
        }
    }
    *acc = c;
}

/// Stores one row's accumulators (8 columns per vector, columns `c0..c0 + o.len()`) through
/// the epilogue: in registers for whole vectors when it has no general activation, else (and
/// for a tail below 8) through [`QEpilogue::store`].
///
/// # Safety
/// AVX2 available; `tr` holds at least `ceil(o.len() / 8)` vectors and the epilogue covers
/// columns `c0..c0 + o.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn store_avx2(tr: &[__m256i], o: &mut [u8], c0: usize, epi: &QEpilogue) {
    let valid = o.len();
    let mut j = 0;
    if epi.general.is_none() {
        while j + 8 <= valid {
            let q = epi.requant8(tr[j / 8], c0 + j);
            _mm_storel_epi64(o.as_mut_ptr().add(j) as *mut __m128i, q);
            j += 8;
        }
    }
    while j < valid {
        let mut tmp = [0i32; 8];
        _mm256_storeu_si256(tmp.as_mut_ptr() as *mut __m256i, tr[j / 8]);
        let n = (valid - j).min(8);
        epi.store(&tmp[..n], c0 + j, &mut o[j..j + n]);
        j += n;
    }
}

/// [`QEpilogue::requant16`] with the columns' bias and multipliers and the clamp held in
/// registers: loaded once for a panel's 16 columns, applied to every row of a block.
#[cfg(target_arch = "x86_64")]
struct Requant512 {
    bias: __m512i,
    mult: __m512,
    lo: __m512,
    hi: __m512,
    zy: __m512i,
    /// LeakyRelu's negative slope, when it is not 1.
    slope: Option<__m512>,
    signed: bool,
}

#[cfg(target_arch = "x86_64")]
impl Requant512 {
    /// Loads columns `c0..` of `epi` in the lanes of `m` (the others are never read).
    ///
    /// # Safety
    /// AVX-512F available; lanes of `m` are columns below `epi.bias.len()`; `general` None.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    #[inline]
    unsafe fn new(epi: &QEpilogue, c0: usize, m: __mmask16) -> Self {
        Requant512 {
            bias: _mm512_maskz_loadu_epi32(m, epi.bias.as_ptr().add(c0)),
            mult: _mm512_maskz_loadu_ps(m, epi.mult.as_ptr().add(c0)),
            lo: _mm512_set1_ps(epi.lo - epi.zy),
            hi: _mm512_set1_ps(epi.hi - epi.zy),
            zy: _mm512_set1_epi32(epi.zy as i32),
            slope: (epi.slope != 1.0).then(|| _mm512_set1_ps(epi.slope)),
            signed: epi.signed,
        }
    }

    /// The 16 output bytes of `acc`: i32 -> f32 rounding, one multiply, clamp, round half to
    /// even (default MXCSR), so bit-identical to [`QEpilogue::store`].
    ///
    /// # Safety
    /// AVX-512F/BW/VL available.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    #[inline]
    unsafe fn apply(&self, acc: __m512i) -> __m128i {
        let mut f = _mm512_mul_ps(
            _mm512_cvtepi32_ps(_mm512_add_epi32(acc, self.bias)),
            self.mult,
        );
        if let Some(slope) = self.slope {
            let neg = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(f, _mm512_setzero_ps());
            f = _mm512_mask_mul_ps(f, neg, f, slope);
        }
        let f = _mm512_min_ps(_mm512_max_ps(f, self.lo), self.hi);
        let q = _mm512_add_epi32(_mm512_cvtps_epi32(f), self.zy);
        if self.signed {
            _mm512_cvtsepi32_epi8(q)
        } else {
            _mm512_cvtusepi32_epi8(q)
        }
    }
}

/// [`QEpilogue::requant8`] for 16 columns at once with their bias and multipliers held in
/// registers (loaded once per panel, used for every row of a tile).
#[cfg(target_arch = "x86_64")]
struct Requant16 {
    bias: [__m256i; 2],
    mult: [__m256; 2],
    lo: __m256,
    hi: __m256,
    zy: __m256i,
}

#[cfg(target_arch = "x86_64")]
impl Requant16 {
    /// Loads columns `c0..c0 + 16` of `epi`.
    ///
    /// # Safety
    /// AVX2 available and `c0 + 16 <= epi.bias.len()`.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn new(epi: &QEpilogue, c0: usize) -> Self {
        let (bp, mp) = (epi.bias.as_ptr().add(c0), epi.mult.as_ptr().add(c0));
        Requant16 {
            bias: [
                _mm256_loadu_si256(bp as *const __m256i),
                _mm256_loadu_si256(bp.add(8) as *const __m256i),
            ],
            mult: [_mm256_loadu_ps(mp), _mm256_loadu_ps(mp.add(8))],
            lo: _mm256_set1_ps(epi.lo - epi.zy),
            hi: _mm256_set1_ps(epi.hi - epi.zy),
            zy: _mm256_set1_epi32(epi.zy as i32),
        }
    }

    /// The 16 output bytes of accumulators `a0` (first 8 columns) and `a1`; bit-identical
    /// to [`QEpilogue::store`].
    ///
    /// # Safety
    /// AVX2 available; `epi` is the epilogue this was loaded from, `general` None.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn apply(&self, epi: &QEpilogue, a0: __m256i, a1: __m256i) -> __m128i {
        let q = |a: __m256i, v: usize| {
            let mut f = _mm256_mul_ps(
                _mm256_cvtepi32_ps(_mm256_add_epi32(a, self.bias[v])),
                self.mult[v],
            );
            if epi.slope != 1.0 {
                let neg = _mm256_cmp_ps::<_CMP_LT_OQ>(f, _mm256_setzero_ps());
                f = _mm256_blendv_ps(f, _mm256_mul_ps(f, _mm256_set1_ps(epi.slope)), neg);
            }
            let f = _mm256_min_ps(_mm256_max_ps(f, self.lo), self.hi);
            _mm256_add_epi32(_mm256_cvtps_epi32(f), self.zy)
        };
        // In range after the clamp, so the saturating packs only reorder: per 128-bit lane
        // [a0 0..4, a1 0..4 | a0 4..8, a1 4..8], put back in column order.
        let w = _mm256_packs_epi32(q(a0, 0), q(a1, 1));
        let w = _mm256_permute4x64_epi64::<0b11_01_10_00>(w);
        let (lo, hi) = (_mm256_castsi256_si128(w), _mm256_extracti128_si256::<1>(w));
        if epi.signed {
            _mm_packs_epi16(lo, hi)
        } else {
            _mm_packus_epi16(lo, hi)
        }
    }
}

/// Requantization of i32 accumulators into 8-bit outputs, per output column.
#[derive(Clone, Debug)]
pub struct QEpilogue {
    /// Added to the accumulator (bias minus the input zero-point correction).
    pub bias: Vec<i32>,
    /// `x_scale * w_scale[n] / y_scale`.
    pub mult: Vec<f32>,
    /// Output zero point.
    pub zy: f32,
    /// Clamp of the rounded value (after adding the zero point), in the output's range.
    pub lo: f32,
    /// Upper end of that clamp (`lo` is the lower end).
    pub hi: f32,
    /// Negative-side slope (LeakyRelu; 1 otherwise).
    pub slope: f32,
    /// An activation that is not a clamp or slope: applied to the real value `(acc+bias)*mult*y_scale`.
    pub general: Option<(Activation, f32)>,
    /// Output is i8 (else u8).
    pub signed: bool,
}

impl QEpilogue {
    /// The epilogue for input/weight/output quantization, bias (i32 at scale x*w) and activation.
    pub fn new(
        x: QParams,
        w_scales: &[f32],
        y: QParams,
        bias: &[i32],
        col_sums: &[i32],
        act: Option<Activation>,
    ) -> Self {
        let (qlo, qhi) = y.range();
        let zy = y.zero_point as f32;
        let q = |v: f32| (v / y.scale).round_ties_even() + zy;
        let (mut lo, mut hi, mut slope, mut general) = (qlo as f32, qhi as f32, 1.0, None);
        match act {
            None => {}
            Some(Activation::Relu) => lo = lo.max(zy),
            Some(Activation::Clip { min, max }) => {
                lo = lo.max(q(min));
                hi = hi.min(q(max));
            }
            Some(Activation::LeakyRelu { alpha }) => slope = alpha,
            Some(a) => general = Some((a, y.scale)),
        }
        let za = x.zero_point;
        QEpilogue {
            bias: bias
                .iter()
                .zip(col_sums)
                .map(|(&b, &s)| b.wrapping_sub(za.wrapping_mul(s)))
                .collect(),
            mult: w_scales.iter().map(|&ws| x.scale * ws / y.scale).collect(),
            zy,
            lo,
            hi: hi.max(lo),
            slope,
            general,
            signed: y.dtype == DataType::I8,
        }
    }

    /// Requantizes `acc` (columns `c0..`) into `out`.
    #[inline(always)]
    pub fn store(&self, acc: &[i32], c0: usize, out: &mut [u8]) {
        let n = acc.len().min(out.len());
        let bias = &self.bias[c0..c0 + n];
        let mult = &self.mult[c0..c0 + n];
        let (zy, lo, hi, slope, signed) = (self.zy, self.lo, self.hi, self.slope, self.signed);
        if let Some((act, ys)) = self.general {
            for j in 0..n {
                let real = (acc[j].wrapping_add(bias[j])) as f32 * mult[j] * ys;
                let q = ((act.apply(real) / ys).round_ties_even() + zy).clamp(lo, hi);
                out[j] = if signed {
                    q as i32 as i8 as u8
                } else {
                    q as i32 as u8
                };
            }
            return;
        }
        // Clamping before rounding is exact (the bounds are integers) and keeps |f| < 2^22, so
        // adding and subtracting 1.5 * 2^23 rounds half to even (default FP mode) without a
        // libm call, in a loop the compiler vectorises.
        const MAGIC: f32 = 12_582_912.0;
        let (flo, fhi) = (lo - zy, hi - zy);
        for j in 0..n {
            let f = (acc[j].wrapping_add(bias[j])) as f32 * mult[j];
            let f = if f < 0.0 { f * slope } else { f };
            let f = f.max(flo).min(fhi);
            // SAFETY: f is finite (finite factors) and clamped to the 8-bit range.
            let q = unsafe { ((f + MAGIC) - MAGIC + zy).to_int_unchecked::<i32>() };
            out[j] = if signed { q as i8 as u8 } else { q as u8 };
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl QEpilogue {
    /// Requantizes 16 accumulators of columns `c0..c0 + 16` (lanes outside `m` are ignored,
    /// their bias/multiplier not read) in registers, into 16 bytes. Same arithmetic as
    /// [`QEpilogue::store`] (i32 -> f32 rounding, one multiply, clamp, round half to even), so the
    /// results are bit-identical. Only for `general == None`.
    ///
    /// # Safety
    /// AVX-512F/BW/VL must be available and lanes of `m` must be columns below `bias.len()`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    #[inline]
    pub(super) unsafe fn requant16(&self, acc: __m512i, c0: usize, m: __mmask16) -> __m128i {
        Requant512::new(self, c0, m).apply(acc)
    }

    /// Requantizes 8 accumulators of columns `c0..c0 + 8` in registers into the low 8 bytes
    /// (AVX2; bit-identical to [`QEpilogue::store`]). Only for `general == None`.
    ///
    /// # Safety
    /// AVX2 must be available and `c0 + 8 <= bias.len()`.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(super) unsafe fn requant8(&self, acc: __m256i, c0: usize) -> __m128i {
        let b = _mm256_loadu_si256(self.bias.as_ptr().add(c0) as *const __m256i);
        let mu = _mm256_loadu_ps(self.mult.as_ptr().add(c0));
        let mut f = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(acc, b)), mu);
        if self.slope != 1.0 {
            let neg = _mm256_cmp_ps::<_CMP_LT_OQ>(f, _mm256_setzero_ps());
            f = _mm256_blendv_ps(f, _mm256_mul_ps(f, _mm256_set1_ps(self.slope)), neg);
        }
        let f = _mm256_min_ps(
            _mm256_max_ps(f, _mm256_set1_ps(self.lo - self.zy)),
            _mm256_set1_ps(self.hi - self.zy),
        );
        let q = _mm256_add_epi32(_mm256_cvtps_epi32(f), _mm256_set1_epi32(self.zy as i32));
        let w = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q));
        if self.signed {
            _mm_packs_epi16(w, w)
        } else {
            _mm_packus_epi16(w, w)
        }
    }
}

/// Quantization parameters of a node's scale/zero-point pair, read from its op.
fn qgemm_parts(node: &Node) -> Result<&crate::ir::QGemmAttrs> {
    match &node.op {
        Op::QGemm(q) => Ok(q),
        other => Err(Error::Unsupported(format!(
            "qgemm kernel does not handle {}",
            other.name()
        ))),
    }
}

/// The i32 bias constant of input `k` (zeros when absent), `n` values.
pub(crate) fn bias_i32(graph: &Graph, node: &Node, k: usize, n: usize) -> Result<Vec<i32>> {
    match node.input(k) {
        None => Ok(vec![0; n]),
        Some(v) => match graph.constant(v).map(|t| &t.data) {
            Some(TensorData::I32(b)) if b.len() == n => Ok(b.clone()),
            _ => Err(Error::Unsupported(format!(
                "{} '{}': bias must be a constant i32 tensor of {n} values",
                node.op.name(),
                node.name
            ))),
        },
    }
}

/// The i8 weight constant of input 1.
pub(crate) fn weights_i8<'g>(graph: &'g Graph, node: &Node) -> Result<&'g [i8]> {
    match graph.const_input(node, 1).map(|t| &t.data) {
        Some(TensorData::I8(w)) => Ok(w),
        _ => Err(Error::Unsupported(format!(
            "{} '{}': weights must be a constant int8 tensor",
            node.op.name(),
            node.name
        ))),
    }
}

/// Compiles a QGemm node.
pub fn build(graph: &Graph, node: &Node) -> Result<Box<dyn Kernel>> {
    let q = qgemm_parts(node)?;
    let a = graph.shape(
        node.input(0)
            .ok_or_else(|| Error::InvalidModel("QGemm lacks A".into()))?,
    )?;
    let bshape = graph.shape(
        node.input(1)
            .ok_or_else(|| Error::InvalidModel("QGemm lacks B".into()))?,
    )?;
    if a.len() != 2 || bshape.len() != 2 {
        return Err(Error::Shape(format!(
            "QGemm '{}': 2-D operands needed",
            node.name
        )));
    }
    let (m, k) = (a[0], a[1]);
    let (kb, n) = if q.trans_b {
        (bshape[1], bshape[0])
    } else {
        (bshape[0], bshape[1])
    };
    if kb != k || q.w_scales.len() != n {
        return Err(Error::Shape(format!(
            "QGemm '{}': operand shapes differ",
            node.name
        )));
    }
    let w = weights_i8(graph, node)?;
    let isa = QIsa::detect();
    let bias = bias_i32(graph, node, 2, n)?;
    // One row (a classifier head at batch 1) cannot be shared by rows: its columns are, in
    // one part per worker (whole 32-column panels), when there are enough of them.
    let threads = rayon::current_num_threads().max(1);
    let width = if m == 1 && threads > 1 && n >= 64 * threads {
        n.div_ceil(threads).next_multiple_of(32)
    } else {
        n.max(1)
    };
    let parts = (0..n)
        .step_by(width)
        .map(|c0| {
            let c1 = n.min(c0 + width);
            let packed = if q.trans_b {
                PackedQB::pack(k, c1 - c0, |kk, j| w[(c0 + j) * k + kk], isa)
            } else {
                PackedQB::pack(k, c1 - c0, |kk, j| w[kk * n + c0 + j], isa)
            };
            let epi = QEpilogue::new(
                u8_params(q.a),
                &q.w_scales[c0..c1],
                q.y,
                &bias[c0..c1],
                &packed.col_sums,
                q.activation,
            );
            (packed, epi)
        })
        .collect::<Vec<(PackedQB, QEpilogue)>>();
    Ok(Box::new(QGemmKernel {
        m,
        k,
        kp: parts.first().map_or(4, |p| p.0.kp),
        n,
        width,
        flip: q.a.dtype == DataType::I8,
        parts,
        name: node.name.clone(),
    }))
}

/// Int8 Gemm: A rows copied into scratch (K padded to a multiple of 4, i8 input flipped to u8).
struct QGemmKernel {
    m: usize,
    k: usize,
    /// K padded as every part's packing pads it (the row stride of the copied A).
    kp: usize,
    n: usize,
    /// Columns per part (`n` when there is one part).
    width: usize,
    /// Input is i8: `x ^ 0x80` gives the u8 value `x + 128` (the zero point is shifted to match).
    flip: bool,
    /// The packed weights and epilogue of each run of `width` columns: one part, or for a
    /// single row one per worker.
    parts: Vec<(PackedQB, QEpilogue)>,
    name: String,
}

impl Kernel for QGemmKernel {
    fn run(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        scratch: &mut [u8],
    ) -> Result<()> {
        let a = input(inputs, 0, &self.name)?;
        let out = output(outputs, 0, &self.name)?;
        let (m, k, kp, n) = (self.m, self.k, self.kp, self.n);
        if a.bytes.len() != m * k || out.bytes.len() != m * n || scratch.len() < m * kp {
            return Err(Error::Shape(format!("QGemm '{}': buffer sizes", self.name)));
        }
        let buf = &mut scratch[..m * kp];
        for (dst, src) in buf.chunks_exact_mut(kp).zip(a.bytes.chunks_exact(k)) {
            copy_row(dst, src, self.flip);
        }
        if let [(packed, epi)] = &self.parts[..] {
            let per = m.div_ceil(rayon::current_num_threads().max(1)).max(1);
            return out
                .bytes
                .par_chunks_mut(per * n)
                .zip(buf.par_chunks(per * kp))
                .try_for_each(|(o, ab)| packed.run(o.len() / n, ab, kp, o, n, epi));
        }
        // One row split by columns: each part's columns are one contiguous run of the output.
        let buf = &*buf;
        out.bytes
            .par_chunks_mut(self.width)
            .zip(self.parts.par_iter())
            .try_for_each(|(o, (packed, epi))| packed.run(1, buf, kp, o, o.len(), epi))
    }

    fn scratch_bytes(&self) -> usize {
        self.m * self.kp
    }
}

/// Copies one row of 8-bit activations into a K-padded buffer (zero padding), flipping i8 to u8.
#[inline]
pub(super) fn copy_row(dst: &mut [u8], src: &[u8], flip: bool) {
    let k = src.len().min(dst.len());
    if flip {
        for (d, s) in dst[..k].iter_mut().zip(src) {
            *d = s ^ 0x80;
        }
    } else {
        dst[..k].copy_from_slice(&src[..k]);
    }
    dst[k..].fill(0);
}

/// The input zero point as seen by the u8 kernels (shifted by 128 for i8 inputs).
pub(crate) fn u8_params(x: QParams) -> QParams {
    match x.dtype {
        DataType::I8 => QParams {
            zero_point: x.zero_point + 128,
            dtype: DataType::U8,
            ..x
        },
        _ => x,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Every micro-kernel this CPU runs: (ISA, AMX tiles).
    fn isas() -> Vec<(QIsa, bool)> {
        let all = [QIsa::Portable, QIsa::Avx2, QIsa::AvxVnni, QIsa::Avx512Vnni];
        let mut v: Vec<(QIsa, bool)> = all
            .into_iter()
            .filter(|i| i.available())
            .map(|i| (i, false))
            .collect();
        for i in all {
            if !i.available() {
                println!("SKIP: int8 gemm {i:?} path because this CPU lacks it");
            }
        }
        if QIsa::Avx512Vnni.available() && amx_available() {
            v.push((QIsa::Avx512Vnni, true));
        } else {
            println!("SKIP: int8 gemm AMX path because this CPU or OS lacks AMX-INT8");
        }
        v
    }

    /// Every ISA path against a naive i32 reference, odd sizes, extreme values included, with
    /// and without a fused LeakyRelu (the in-register epilogues' slope path).
    #[test]
    fn packed_gemm_matches_naive_reference_on_all_isas() {
        for alpha in [None, Some(0.1f32)] {
            gemm_case(alpha);
        }
    }

    fn gemm_case(alpha: Option<f32>) {
        let mut rng = Rng(7);
        for &(m, k, n) in &[
            (1, 1, 1),
            (7, 13, 5),
            (13, 64, 48),
            (6, 37, 33),
            (20, 300, 70),
            (9, 16, 100),
            (30, 16, 96),
            (14, 2500, 40),
            // AMX: blocks of 32 rows, 16-row tails, K past one step, tight buffers whose
            // last rows are staged, 16-wide column panels.
            (16, 64, 32),
            (47, 24, 40),
            (77, 200, 48),
            (100, 1152, 80),
            (33, 16, 16),
        ] {
            let a: Vec<u8> = (0..m * k)
                .map(|i| if i % 7 == 0 { 255 } else { rng.next() as u8 })
                .collect();
            let b: Vec<i8> = (0..k * n)
                .map(|i| if i % 5 == 0 { -128 } else { rng.next() as i8 })
                .collect();
            let x = QParams {
                scale: 0.02,
                zero_point: 3,
                dtype: DataType::U8,
            };
            let y = QParams {
                scale: 0.5,
                zero_point: -5,
                dtype: DataType::I8,
            };
            let ws: Vec<f32> = (0..n).map(|j| 0.001 + j as f32 * 1e-4).collect();
            let bias: Vec<i32> = (0..n).map(|j| j as i32 * 37 - 500).collect();
            let mut want = vec![0u8; m * n];
            for i in 0..m {
                for j in 0..n {
                    let acc: i32 = (0..k)
                        .map(|kk| (a[i * k + kk] as i32 - 3) * b[kk * n + j] as i32)
                        .sum::<i32>()
                        + bias[j];
                    let f = acc as f32 * (0.02 * ws[j] / 0.5);
                    let f = match alpha {
                        Some(a) if f < 0.0 => f * a,
                        _ => f,
                    };
                    let q = (f.round_ties_even() as i32 - 5).clamp(-128, 127);
                    want[i * n + j] = q as i8 as u8;
                }
            }
            for (isa, amx) in isas() {
                let p = PackedQB::pack_with(k, n, |kk, j| b[kk * n + j], isa, amx);
                let act = alpha.map(|alpha| Activation::LeakyRelu { alpha });
                let epi = QEpilogue::new(x, &ws, y, &bias, &p.col_sums, act);
                let kp = p.kp;
                let mut ap = vec![0u8; m * kp];
                for i in 0..m {
                    copy_row(&mut ap[i * kp..(i + 1) * kp], &a[i * k..(i + 1) * k], false);
                }
                let mut got = vec![0u8; m * n];
                p.run(m, &ap, kp, &mut got, n, &epi).unwrap();
                for (idx, (g, w)) in got.iter().zip(&want).enumerate() {
                    // f32 requantization may differ by one step from the reference's rounding
                    // only at exact ties; none occur with these scales.
                    assert_eq!(
                        *g as i8, *w as i8,
                        "{isa:?} (AMX {amx}) m{m} k{k} n{n} element {idx}"
                    );
                }
            }
        }
    }

    #[test]
    fn one_row_split_by_columns_matches_the_reference() {
        // A classifier head at batch 1 (m = 1, N = 300, both B layouts): built in a 3-worker
        // pool its columns run as three parts (128 + 128 + 44); built in a 1-worker pool, as
        // one. Both must give the naive integer reference's bytes.
        use crate::ir::{Graph, Node, QGemmAttrs, Tensor, TensorData};
        let mut rng = Rng(5);
        let (k, n) = (100, 300);
        let a = QParams {
            scale: 0.05,
            zero_point: 17,
            dtype: DataType::U8,
        };
        let y = QParams {
            scale: 0.3,
            zero_point: 4,
            dtype: DataType::U8,
        };
        let xs: Vec<u8> = (0..k).map(|_| rng.next() as u8).collect();
        let wt: Vec<i8> = (0..k * n).map(|_| rng.next() as i8).collect();
        let bias: Vec<i32> = (0..n).map(|_| (rng.next() % 4001) as i32 - 2000).collect();
        let ws: Vec<f32> = (0..n).map(|j| 0.001 + 0.00002 * j as f32).collect();
        for trans_b in [false, true] {
            let at = |kk: usize, j: usize| {
                if trans_b {
                    wt[j * k + kk]
                } else {
                    wt[kk * n + j]
                }
            };
            let want: Vec<u8> = (0..n)
                .map(|j| {
                    let acc = bias[j]
                        + (0..k)
                            .map(|kk| (xs[kk] as i32 - a.zero_point) * at(kk, j) as i32)
                            .sum::<i32>();
                    let f = acc as f32 * (a.scale * ws[j] / y.scale);
                    (f.round_ties_even() + 4.0).clamp(0.0, 255.0) as u8
                })
                .collect();
            let mut g = Graph {
                opset: 17,
                ..Default::default()
            };
            let xv = g.add_constant(
                "a",
                Tensor::new(vec![1, k], TensorData::U8(xs.clone())).unwrap(),
            );
            let bshape = if trans_b { vec![n, k] } else { vec![k, n] };
            let wv = g.add_constant(
                "w",
                Tensor::new(bshape, TensorData::I8(wt.clone())).unwrap(),
            );
            let bv = g.add_constant(
                "b",
                Tensor::new(vec![n], TensorData::I32(bias.clone())).unwrap(),
            );
            let out = g.add_value("y", DataType::U8);
            g.values[out].shape = Some(vec![1, n]);
            let node = Node {
                name: "fc".into(),
                op: Op::QGemm(QGemmAttrs {
                    trans_b,
                    a,
                    y,
                    w_scales: ws.clone(),
                    activation: None,
                }),
                inputs: vec![Some(xv), Some(wv), Some(bv)],
                outputs: vec![out],
            };
            for workers in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(workers)
                    .build()
                    .unwrap();
                let got = pool.install(|| {
                    let kern = build(&g, &node).unwrap();
                    let mut scratch = vec![0u8; kern.scratch_bytes()];
                    let ins = [
                        Some(TensorRef {
                            dtype: DataType::U8,
                            shape: &[1, k],
                            bytes: &xs,
                        }),
                        None,
                        None,
                    ];
                    let mut got = vec![0u8; n];
                    let mut outs = [TensorMut {
                        dtype: DataType::U8,
                        shape: &[1, n],
                        bytes: &mut got,
                    }];
                    kern.run(&ins, &mut outs, &mut scratch).unwrap();
                    got
                });
                assert_eq!(got, want, "trans_b {trans_b}, {workers} workers");
            }
        }
    }

    /// A general activation (sigmoid, requantized by the scalar epilogue) gives the same bytes
    /// on every micro-kernel, AMX included, as on the portable one.
    #[test]
    fn general_activation_is_the_same_on_every_path() {
        let mut rng = Rng(11);
        let (m, k, n) = (77, 200, 48);
        let a: Vec<u8> = (0..m * k).map(|_| rng.next() as u8).collect();
        let b: Vec<i8> = (0..k * n).map(|_| rng.next() as i8).collect();
        let x = QParams {
            scale: 0.02,
            zero_point: 3,
            dtype: DataType::U8,
        };
        let y = QParams {
            scale: 1.0 / 255.0,
            zero_point: 0,
            dtype: DataType::U8,
        };
        let ws: Vec<f32> = (0..n).map(|j| 0.0005 + j as f32 * 2e-5).collect();
        let bias: Vec<i32> = (0..n).map(|j| j as i32 * 91 - 2000).collect();
        let run = |isa: QIsa, amx: bool| {
            let p = PackedQB::pack_with(k, n, |kk, j| b[kk * n + j], isa, amx);
            let epi = QEpilogue::new(x, &ws, y, &bias, &p.col_sums, Some(Activation::Sigmoid));
            assert!(epi.general.is_some());
            let mut out = vec![0u8; m * n];
            p.run(m, &a, k, &mut out, n, &epi).unwrap();
            out
        };
        let want = run(QIsa::Portable, false);
        // Sigmoid outputs spread over the u8 range: the comparison is not of constants.
        assert!(want.iter().any(|&q| q < 64) && want.iter().any(|&q| q > 192));
        for (isa, amx) in isas() {
            assert_eq!(run(isa, amx), want, "{isa:?} (AMX {amx})");
        }
    }

    #[test]
    fn epilogue_clamps_relu_and_leaky() {
        let x = QParams {
            scale: 1.0,
            zero_point: 0,
            dtype: DataType::U8,
        };
        let y = QParams {
            scale: 1.0,
            zero_point: 10,
            dtype: DataType::U8,
        };
        let e = QEpilogue::new(x, &[1.0; 3], y, &[0; 3], &[0; 3], Some(Activation::Relu));
        let mut o = [0u8; 3];
        e.store(&[-20, 5, 300], 0, &mut o);
        assert_eq!(o, [10, 15, 255]);
        let e = QEpilogue::new(
            x,
            &[1.0; 3],
            y,
            &[0; 3],
            &[0; 3],
            Some(Activation::LeakyRelu { alpha: 0.25 }),
        );
        e.store(&[-20, 5, -2], 0, &mut o);
        assert_eq!(o, [5, 15, 10]);
    }
}
