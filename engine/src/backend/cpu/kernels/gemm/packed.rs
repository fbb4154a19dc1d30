//! Our own f32 GEMM for a constant right-hand side: `B` ([K, N]) is packed once at build time
//! into column panels (K contiguous, panel width NR), and `A` (row-major rows with any row
//! stride >= K, e.g. NHWC activations) is read in place by register-blocked micro-kernels
//! (AVX-512 8x32, AVX2 6x16, portable 4x16). Bias and a clamp/leaky activation are fused into
//! the store; nothing is allocated at run time.

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::ir::Activation;

/// Instruction set a packed product runs with (chosen at pack time; panels depend on it).
/// Only x86-64 selects the SIMD variants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub enum Isa {
    /// AVX-512F: 8 x 32 tiles (16-wide tail panels).
    Avx512,
    /// AVX2 + FMA: 6 x 16 tiles (8-wide tail panels).
    Avx2,
    /// Portable (auto-vectorised) 4 x 16 tiles.
    Portable,
}

impl Isa {
    /// The best instruction set this CPU supports.
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }

    /// True when this CPU can run `self`.
    pub fn available(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => std::is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// (rows per tile, full panel width, tail panel width).
    fn dims(self) -> (usize, usize, usize) {
        match self {
            Isa::Avx512 => (8, 32, 16),
            Isa::Avx2 => (6, 16, 8),
            Isa::Portable => (4, 16, 16),
        }
    }
}

/// Fused output transform `clamp(max(x,0) + slope*min(x,0), lo, hi)`, then `post` (scalar).
#[derive(Clone, Copy, Debug)]
pub struct Epilogue {
    slope: f32,
    lo: f32,
    hi: f32,
    post: Option<Activation>,
}

impl Epilogue {
    /// The epilogue for an optional activation (ReLU, Clip, LeakyReLU fused; others after).
    pub fn new(act: Option<Activation>) -> Self {
        let (inf, ninf) = (f32::INFINITY, f32::NEG_INFINITY);
        let lin = |slope, lo, hi| Epilogue {
            slope,
            lo,
            hi,
            post: None,
        };
        match act {
            None => lin(1.0, ninf, inf),
            Some(Activation::Relu) => lin(0.0, ninf, inf),
            Some(Activation::Clip { min, max }) => lin(1.0, min, max),
            Some(Activation::LeakyRelu { alpha }) => lin(alpha, ninf, inf),
            Some(a) => Epilogue {
                post: Some(a),
                ..lin(1.0, ninf, inf)
            },
        }
    }

    /// (negative slope, lower clamp, upper clamp) of the fused part (read by the x86 kernels).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub fn linear(&self) -> (f32, f32, f32) {
        (self.slope, self.lo, self.hi)
    }

    /// The activation applied after the fused part, if any (scalar, in place).
    pub fn post(&self) -> Option<Activation> {
        self.post
    }

    #[inline(always)]
    fn scalar(&self, x: f32) -> f32 {
        (x.max(0.0) + self.slope * x.min(0.0))
            .max(self.lo)
            .min(self.hi)
    }
}

/// `B` ([K, N]) packed into panels for one [`Isa`], with a per-column bias.
pub struct PackedB {
    isa: Isa,
    k: usize,
    n: usize,
    /// Full panel width; the last panel may be `tail` wide instead.
    nr: usize,
    /// Width of the last panel.
    last_w: usize,
    panels: usize,
    /// Offset of the 64-byte aligned start inside `buf`.
    off: usize,
    buf: Vec<f32>,
    /// Bias padded to the panel widths (zeros when absent).
    bias: Vec<f32>,
}

/// An output pointer shared by workers that write disjoint tiles.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: workers write disjoint (row, column) tiles of the output; see `PackedB::run`.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

/// Work (m*n*k multiply-adds) below which a product stays on the calling thread.
const PAR_WORK: usize = 1 << 20;

impl PackedB {
    /// Packs `B` (element (p, j) at `b[p * rs + j * cs]`) scaled by `alpha`, with an optional
    /// per-column bias of length `n`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        isa: Isa,
        k: usize,
        n: usize,
        b: &[f32],
        rs: usize,
        cs: usize,
        alpha: f32,
        bias: Option<&[f32]>,
    ) -> Result<Self> {
        if k > 0 && n > 0 && (k - 1) * rs + (n - 1) * cs >= b.len() {
            return Err(Error::Shape(format!(
                "packed gemm: B of {k}x{n} exceeds its buffer"
            )));
        }
        if bias.is_some_and(|v| v.len() != n) {
            return Err(Error::Shape(
                "packed gemm: bias length differs from N".into(),
            ));
        }
        let (_, nr, tail) = isa.dims();
        let full = n / nr;
        let rem = n % nr;
        let (panels, last_w) = match rem {
            0 => (full, nr),
            r if r <= tail => (full + 1, tail),
            _ => (full + 1, nr),
        };
        let padded = if panels == 0 {
            0
        } else {
            (panels - 1) * nr + last_w
        };
        let mut buf = vec![0.0f32; padded * k + 16];
        let off = buf.as_ptr().align_offset(64).min(15);
        let mut bias_p = vec![0.0f32; padded.max(1)];
        for p in 0..panels {
            let w = if p + 1 == panels { last_w } else { nr };
            let base = off + p * nr * k;
            for kk in 0..k {
                for j in 0..w {
                    let col = p * nr + j;
                    if col < n {
                        buf[base + kk * w + j] = alpha * b[kk * rs + col * cs];
                    }
                }
            }
        }
        if let Some(bv) = bias {
            bias_p[..n].copy_from_slice(bv);
        }
        Ok(PackedB {
            isa,
            k,
            n,
            nr,
            last_w,
            panels,
            off,
            buf,
            bias: bias_p,
        })
    }

    /// `c[i*ldc + j] = epi(sum_p a[i*lda + p] * B[p, j] + bias[j] (+ c[i*ldc + j] when
    /// accumulate))` for `i < m`, `j < N`. Splits over threads when `parallel` and large enough.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        m: usize,
        a: &[f32],
        lda: usize,
        c: &mut [f32],
        ldc: usize,
        accumulate: bool,
        epi: Epilogue,
        parallel: bool,
    ) -> Result<()> {
        let (k, n) = (self.k, self.n);
        if m == 0 || n == 0 {
            return Ok(());
        }
        if (m - 1) * ldc + n > c.len()
            || (k > 0 && ((m - 1) * lda + k > a.len() || lda < k))
            || ldc < n
        {
            return Err(Error::Shape(format!(
                "packed gemm {m}x{k}x{n}: operands exceed their buffers"
            )));
        }
        if !self.isa.available() {
            return Err(Error::Unsupported(format!(
                "packed gemm: {:?} is not available on this CPU",
                self.isa
            )));
        }
        let (mr, _, _) = self.isa.dims();
        // Rows per block: an A block of up to ~256 KiB stays in L2 while every B panel
        // streams past it once.
        let mc = ((65536 / k.max(1)) / mr * mr).clamp(mr, 32 * mr);

        let mblocks = m.div_ceil(mc);
        let threads = rayon::current_num_threads();
        let cp = OutPtr(c.as_mut_ptr());
        let job = |mb: usize, p0: usize, p1: usize| {
            let r0 = mb * mc;
            let r1 = (r0 + mc).min(m);
            // SAFETY: rows r0..r1 and panels p0..p1 lie inside the checked operands; each job
            // covers a distinct (row block, panel range) so writes never overlap.
            unsafe { self.block(r0, r1, p0, p1, a.as_ptr(), lda, cp, ldc, accumulate, &epi) };
        };
        if parallel && threads > 1 && m.saturating_mul(n).saturating_mul(k) >= PAR_WORK {
            let want = threads * 3;
            let ngroups = if mblocks >= want {
                1
            } else {
                want.div_ceil(mblocks).min(self.panels)
            };
            let per = self.panels.div_ceil(ngroups);
            let ngroups = self.panels.div_ceil(per);
            (0..mblocks * ngroups).into_par_iter().for_each(|t| {
                let (mb, gi) = (t / ngroups, t % ngroups);
                job(mb, gi * per, ((gi + 1) * per).min(self.panels));
            });
        } else {
            for mb in 0..mblocks {
                job(mb, 0, self.panels);
            }
        }
        Ok(())
    }

    /// Rows `r0..r1` x panels `p0..p1`.
    ///
    /// # Safety
    /// The operands must cover the rows and panels (checked by `run`) and the ISA be available.
    #[allow(clippy::too_many_arguments)]
    unsafe fn block(
        &self,
        r0: usize,
        r1: usize,
        p0: usize,
        p1: usize,
        a: *const f32,
        lda: usize,
        c: OutPtr,
        ldc: usize,
        acc: bool,
        epi: &Epilogue,
    ) {
        let (mr, _, _) = self.isa.dims();
        for p in p0..p1 {
            let w = if p + 1 == self.panels {
                self.last_w
            } else {
                self.nr
            };
            let col0 = p * self.nr;
            let nv = (self.n - col0).min(w);
            let bp = self.buf.as_ptr().add(self.off + col0 * self.k);
            let bias = self.bias.as_ptr().add(col0);
            let mut r = r0;
            while r < r1 {
                let rows = (r1 - r).min(mr);
                let t = Tile {
                    k: self.k,
                    a: a.wrapping_add(r * lda),
                    lda,
                    b: bp,
                    c: c.0.add(r * ldc + col0),
                    ldc,
                    nv,
                    bias,
                    acc,
                    epi: *epi,
                };
                dispatch(self.isa, w == self.nr, rows, &t);
                if let Some(post) = epi.post {
                    for i in 0..rows {
                        let row = std::slice::from_raw_parts_mut(t.c.add(i * ldc), nv);
                        row.iter_mut().for_each(|x| *x = post.apply(*x));
                    }
                }
                r += rows;
            }
        }
    }
}

/// One micro-tile's operands.
struct Tile {
    k: usize,
    a: *const f32,
    lda: usize,
    /// Packed panel: `k` rows of the panel width.
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    /// Valid columns in this panel.
    nv: usize,
    bias: *const f32,
    acc: bool,
    epi: Epilogue,
}

/// Calls the micro-kernel for `rows` rows (<= MR) of a full (`wide`) or tail panel.
///
/// # Safety
/// `t` must describe valid memory and `isa` must be available.
unsafe fn dispatch(isa: Isa, wide: bool, rows: usize, t: &Tile) {
    macro_rules! rows_match {
        ($f:ident, $v:expr, $($r:literal),*) => {
            match rows {
                $($r => $f::<$r, $v>(t),)*
                _ => {}
            }
        };
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            if wide {
                rows_match!(mk_avx512, 2, 1, 2, 3, 4, 5, 6, 7, 8)
            } else {
                rows_match!(mk_avx512, 1, 1, 2, 3, 4, 5, 6, 7, 8)
            }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            if wide {
                rows_match!(mk_avx2, 2, 1, 2, 3, 4, 5, 6)
            } else {
                rows_match!(mk_avx2, 1, 1, 2, 3, 4, 5, 6)
            }
        }
        Isa::Portable => {
            // One panel width (tail == full), so `wide` does not change the kernel.
            let _ = wide;
            rows_match!(mk_portable, 16, 1, 2, 3, 4)
        }
        #[cfg(not(target_arch = "x86_64"))]
        _ => {}
    }
}

/// Portable micro-kernel: `R` rows x `W` columns, auto-vectorised.
///
/// # Safety
/// `t` must describe valid memory.
#[inline(never)]
unsafe fn mk_portable<const R: usize, const W: usize>(t: &Tile) {
    let mut acc = [[0.0f32; W]; R];
    for p in 0..t.k {
        let b = std::slice::from_raw_parts(t.b.add(p * W), W);
        for (i, row) in acc.iter_mut().enumerate() {
            let av = *t.a.add(i * t.lda + p);
            for (x, &bv) in row.iter_mut().zip(b) {
                *x += av * bv;
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        let c = std::slice::from_raw_parts_mut(t.c.add(i * t.ldc), t.nv);
        for (j, o) in c.iter_mut().enumerate() {
            let mut v = row[j] + *t.bias.add(j);
            if t.acc {
                v += *o;
            }
            *o = t.epi.scalar(v);
        }
    }
}

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// AVX-512 micro-kernel: `R` rows x `V` 16-lane vectors.
///
/// # Safety
/// `t` must describe valid memory (B panel and bias padded to `16 * V`) and AVX-512F present.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::needless_range_loop)] // register tiles index several arrays in step
unsafe fn mk_avx512<const R: usize, const V: usize>(t: &Tile) {
    let mut acc = [[_mm512_setzero_ps(); V]; R];
    let w = 16 * V;
    let mut rows = [t.a; R];
    for (i, r) in rows.iter_mut().enumerate() {
        *r = t.a.wrapping_add(i * t.lda);
    }
    let mut b = t.b;
    for p in 0..t.k {
        let mut bv = [_mm512_setzero_ps(); V];
        for (v, x) in bv.iter_mut().enumerate() {
            *x = _mm512_loadu_ps(b.add(16 * v));
        }
        for i in 0..R {
            let av = _mm512_set1_ps(*rows[i].add(p));
            for v in 0..V {
                acc[i][v] = _mm512_fmadd_ps(av, bv[v], acc[i][v]);
            }
        }
        b = b.add(w);
    }
    let slope = _mm512_set1_ps(t.epi.slope);
    let lo = _mm512_set1_ps(t.epi.lo);
    let hi = _mm512_set1_ps(t.epi.hi);
    let zero = _mm512_setzero_ps();
    let mut masks = [0u16; V];
    let mut bias = [zero; V];
    for v in 0..V {
        let valid = t.nv.saturating_sub(16 * v).min(16);
        masks[v] = if valid == 16 {
            0xffff
        } else {
            ((1u32 << valid) - 1) as u16
        };
        bias[v] = _mm512_loadu_ps(t.bias.add(16 * v));
    }
    for i in 0..R {
        for v in 0..V {
            let dst = t.c.add(i * t.ldc + 16 * v);
            let mut x = _mm512_add_ps(acc[i][v], bias[v]);
            if t.acc {
                x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(masks[v], dst));
            }
            let y = _mm512_fmadd_ps(slope, _mm512_min_ps(x, zero), _mm512_max_ps(x, zero));
            let y = _mm512_min_ps(_mm512_max_ps(y, lo), hi);
            _mm512_mask_storeu_ps(dst, masks[v], y);
        }
    }
}

/// AVX2 micro-kernel: `R` rows x `V` 8-lane vectors.
///
/// # Safety
/// `t` must describe valid memory (B panel and bias padded to `8 * V`) and AVX2 + FMA present.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::needless_range_loop)] // register tiles index several arrays in step
unsafe fn mk_avx2<const R: usize, const V: usize>(t: &Tile) {
    let mut acc = [[_mm256_setzero_ps(); V]; R];
    let w = 8 * V;
    let mut rows = [t.a; R];
    for (i, r) in rows.iter_mut().enumerate() {
        *r = t.a.wrapping_add(i * t.lda);
    }
    let mut b = t.b;
    for p in 0..t.k {
        let mut bv = [_mm256_setzero_ps(); V];
        for (v, x) in bv.iter_mut().enumerate() {
            *x = _mm256_loadu_ps(b.add(8 * v));
        }
        for i in 0..R {
            let av = _mm256_broadcast_ss(&*rows[i].add(p));
            for v in 0..V {
                acc[i][v] = _mm256_fmadd_ps(av, bv[v], acc[i][v]);
            }
        }
        b = b.add(w);
    }
    let slope = _mm256_set1_ps(t.epi.slope);
    let lo = _mm256_set1_ps(t.epi.lo);
    let hi = _mm256_set1_ps(t.epi.hi);
    let zero = _mm256_setzero_ps();
    for i in 0..R {
        for v in 0..V {
            let valid = t.nv.saturating_sub(8 * v).min(8);
            if valid == 0 {
                continue;
            }
            let dst = t.c.add(i * t.ldc + 8 * v);
            let mut tmp = [0.0f32; 8];
            if t.acc {
                std::ptr::copy_nonoverlapping(dst, tmp.as_mut_ptr(), valid);
            }
            let mut x = _mm256_add_ps(acc[i][v], _mm256_loadu_ps(t.bias.add(8 * v)));
            if t.acc {
                x = _mm256_add_ps(x, _mm256_loadu_ps(tmp.as_ptr()));
            }
            let y = _mm256_fmadd_ps(slope, _mm256_min_ps(x, zero), _mm256_max_ps(x, zero));
            let y = _mm256_min_ps(_mm256_max_ps(y, lo), hi);
            if valid == 8 {
                _mm256_storeu_ps(dst, y);
            } else {
                _mm256_storeu_ps(tmp.as_mut_ptr(), y);
                std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst, valid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{assert_close, Rng};
    use super::*;

    fn naive(
        m: usize,
        k: usize,
        n: usize,
        a: &[f32],
        lda: usize,
        b: &[f32],
        bias: &[f32],
    ) -> Vec<f32> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                let s: f32 = (0..k).map(|p| a[i * lda + p] * b[p * n + j]).sum();
                c[i * n + j] = s + bias[j];
            }
        }
        c
    }

    fn isas() -> Vec<Isa> {
        [Isa::Avx512, Isa::Avx2, Isa::Portable]
            .into_iter()
            .filter(|i| i.available())
            .collect()
    }

    #[test]
    fn packed_matches_naive_odd_sizes() {
        let mut rng = Rng(7);
        let sizes = [
            1usize, 2, 3, 5, 7, 8, 9, 15, 16, 17, 24, 31, 33, 40, 47, 64, 70,
        ];
        for isa in isas() {
            for (t, &m) in sizes.iter().enumerate() {
                for (u, &n) in sizes.iter().enumerate() {
                    let k = sizes[(t * 7 + u * 3) % sizes.len()];
                    let lda = k + (t % 3) * 5;
                    let ldc = n + (u % 2) * 3;
                    let a = rng.vec(m * lda);
                    let b = rng.vec(k * n);
                    let bias = rng.vec(n);
                    let want = naive(m, k, n, &a, lda, &b, &bias);
                    let pb = PackedB::new(isa, k, n, &b, n, 1, 1.0, Some(&bias)).unwrap();
                    let mut c = vec![f32::NAN; (m - 1) * ldc + n];
                    pb.run(m, &a, lda, &mut c, ldc, false, Epilogue::new(None), false)
                        .unwrap();
                    let got: Vec<f32> = (0..m)
                        .flat_map(|i| c[i * ldc..i * ldc + n].to_vec())
                        .collect();
                    assert_close(&got, &want, 1e-4);
                }
            }
        }
    }

    #[test]
    fn packed_epilogues_accumulate_transposed_threads() {
        let mut rng = Rng(8);
        let (m, k, n) = (150, 67, 130);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        for isa in isas() {
            for act in [
                None,
                Some(Activation::Relu),
                Some(Activation::Clip {
                    min: -0.5,
                    max: 0.7,
                }),
                Some(Activation::LeakyRelu { alpha: 0.1 }),
                Some(Activation::Sigmoid),
            ] {
                let a = rng.vec(m * k);
                // B given transposed ([N, K]) and scaled by alpha at pack time.
                let bt = rng.vec(n * k);
                let mut b = vec![0.0; k * n];
                for j in 0..n {
                    for p in 0..k {
                        b[p * n + j] = 0.5 * bt[j * k + p];
                    }
                }
                let c0 = rng.vec(m * n);
                let zero = vec![0.0; n];
                let mut want = naive(m, k, n, &a, k, &b, &zero);
                for (w, c) in want.iter_mut().zip(&c0) {
                    let x = *w + c;
                    *w = act.map_or(x, |f| f.apply(x));
                }
                let pb = PackedB::new(isa, k, n, &bt, 1, k, 0.5, None).unwrap();
                let mut c = c0.clone();
                pool.install(|| pb.run(m, &a, k, &mut c, n, true, Epilogue::new(act), true))
                    .unwrap();
                assert_close(&c, &want, 1e-4);
            }
        }
    }

    #[test]
    fn packed_rejects_short_buffers() {
        let pb = PackedB::new(Isa::Portable, 4, 3, &[0.0; 12], 3, 1, 1.0, None).unwrap();
        let mut c = vec![0.0; 5];
        let r = pb.run(
            2,
            &[0.0; 8],
            4,
            &mut c,
            3,
            false,
            Epilogue::new(None),
            false,
        );
        assert!(matches!(r, Err(Error::Shape(_))));
        assert!(PackedB::new(Isa::Portable, 4, 3, &[0.0; 11], 3, 1, 1.0, None).is_err());
    }
}
