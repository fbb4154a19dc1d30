//! AVX-512 NHWC depthwise convolution: 16 channels per vector (masked tail), the KH x KW
//! weight vectors of a channel block held in registers, four output pixels per step in the
//! branch-free interior, per-tap bounds checks only on border pixels and rows; bias and a
//! clamp/leaky activation fused into the store.

use super::super::gemm::packed::Epilogue;
use super::Geom;

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// True when the AVX-512 row kernel can run here for a `kh` x `kw` kernel.
pub(super) fn avx512_usable(kh: usize, kw: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        matches!((kh, kw), (3, 3) | (5, 5)) && std::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (kh, kw);
        false
    }
}

/// One output row (`row` = n*OH + oy) of a depthwise conv with packed weights `w[t*C + c]`,
/// bias and fused epilogue (the caller applies `epi`'s scalar post-activation, if any).
/// Returns false (writing nothing) when the AVX-512 kernel cannot handle this geometry.
pub(super) fn row_avx512(
    g: &Geom,
    x: &[f32],
    w: &[f32],
    bias: &[f32],
    row: usize,
    o: &mut [f32],
    epi: &Epilogue,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let c = g.cin;
        let ok = avx512_usable(g.kh, g.kw)
            && x.len() >= g.n * g.h * g.w * c
            && w.len() >= g.kh * g.kw * c
            && bias.len() >= c
            && o.len() >= g.ow * c
            && row < g.n * g.oh;
        if !ok {
            return false;
        }
        // SAFETY: AVX-512F detected above; every access below is bounds-checked against the
        // geometry (input rows/columns tested per tap or proven interior).
        unsafe {
            match g.kh {
                3 => row_impl::<3, 3>(g, x, w, bias, row, o, epi),
                _ => row_impl::<5, 5>(g, x, w, bias, row, o, epi),
            }
        }
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (g, x, w, bias, row, o, epi);
        false
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
#[allow(clippy::needless_range_loop)] // register tiles index several arrays in step
unsafe fn row_impl<const KH: usize, const KW: usize>(
    g: &Geom,
    x: &[f32],
    w: &[f32],
    bias: &[f32],
    row: usize,
    o: &mut [f32],
    epi: &Epilogue,
) {
    let c = g.cin;
    let ni = row / g.oh;
    let oy = row % g.oh;
    let xp = x.as_ptr();
    let mut rp = [xp; KH];
    let mut all_rows = true;
    let mut rv = [false; KH];
    for ky in 0..KH {
        let iy = (oy * g.sh + ky * g.dh).wrapping_sub(g.pt);
        if iy < g.h {
            rp[ky] = xp.add((ni * g.h + iy) * g.w * c);
            rv[ky] = true;
        } else {
            all_rows = false;
        }
    }
    // Interior: ox*sw - pl >= 0 and ox*sw - pl + (KW-1)*dw < w.
    let span = (KW - 1) * g.dw;
    let lo = g.pl.div_ceil(g.sw).min(g.ow);
    let hi = if g.w + g.pl > span {
        ((g.w - 1 + g.pl - span) / g.sw + 1).min(g.ow)
    } else {
        0
    };
    let (lo, hi) = if all_rows && hi > lo {
        (lo, hi)
    } else {
        (0, 0)
    };
    let (slope, elo, ehi) = epi.linear();
    let slope = _mm512_set1_ps(slope);
    let elo = _mm512_set1_ps(elo);
    let ehi = _mm512_set1_ps(ehi);
    let zero = _mm512_setzero_ps();
    let fin = |v: __m512| {
        let y = _mm512_fmadd_ps(slope, _mm512_min_ps(v, zero), _mm512_max_ps(v, zero));
        _mm512_min_ps(_mm512_max_ps(y, elo), ehi)
    };
    let op = o.as_mut_ptr();
    let mut cb = 0;
    while cb < c {
        let valid = (c - cb).min(16);
        let m: __mmask16 = if valid == 16 {
            0xffff
        } else {
            ((1u32 << valid) - 1) as u16
        };
        let mut wv = [[zero; KW]; KH];
        for (ky, wr) in wv.iter_mut().enumerate() {
            for (kx, wk) in wr.iter_mut().enumerate() {
                *wk = _mm512_maskz_loadu_ps(m, w.as_ptr().add((ky * KW + kx) * c + cb));
            }
        }
        let bv = _mm512_maskz_loadu_ps(m, bias.as_ptr().add(cb));
        // Checked pixel (border rows or columns).
        let checked = |ox: usize| {
            let mut acc = bv;
            for ky in 0..KH {
                if !rv[ky] {
                    continue;
                }
                for kx in 0..KW {
                    let ix = (ox * g.sw + kx * g.dw).wrapping_sub(g.pl);
                    if ix < g.w {
                        let xv = _mm512_maskz_loadu_ps(m, rp[ky].add(ix * c + cb));
                        acc = _mm512_fmadd_ps(xv, wv[ky][kx], acc);
                    }
                }
            }
            _mm512_mask_storeu_ps(op.add(ox * c + cb), m, fin(acc));
        };
        for ox in 0..lo {
            checked(ox);
        }
        let xs = g.sw * c;
        let xd = g.dw * c;
        let mut ox = lo;
        while ox + 4 <= hi {
            let mut acc = [bv; 4];
            let base = (ox * g.sw - g.pl) * c + cb;
            for ky in 0..KH {
                let r = rp[ky].add(base);
                for kx in 0..KW {
                    let p = r.add(kx * xd);
                    for (u, a) in acc.iter_mut().enumerate() {
                        let xv = _mm512_maskz_loadu_ps(m, p.add(u * xs));
                        *a = _mm512_fmadd_ps(xv, wv[ky][kx], *a);
                    }
                }
            }
            for (u, a) in acc.iter().enumerate() {
                _mm512_mask_storeu_ps(op.add((ox + u) * c + cb), m, fin(*a));
            }
            ox += 4;
        }
        while ox < hi {
            let mut acc = bv;
            let base = (ox * g.sw - g.pl) * c + cb;
            for ky in 0..KH {
                let r = rp[ky].add(base);
                for kx in 0..KW {
                    let xv = _mm512_maskz_loadu_ps(m, r.add(kx * xd));
                    acc = _mm512_fmadd_ps(xv, wv[ky][kx], acc);
                }
            }
            _mm512_mask_storeu_ps(op.add(ox * c + cb), m, fin(acc));
            ox += 1;
        }
        for ox in hi.max(lo)..g.ow {
            checked(ox);
        }
        cb += 16;
    }
}
