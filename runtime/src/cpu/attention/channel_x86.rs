//! The per-channel readers' x86 kernels (AVX2, FMA, F16C): scores, code sums and the
//! header decodes of `super::ChannelRows`.

use std::arch::x86_64::*;

use crate::cpu::simd::{by_head_groups, codes_u8, hsum, query_i16x2};

/// Scores of the rows of one group, the head NG·32 channels wide, from its decoded lo and
/// step: `c0 = Σ q·lo`, the scaled query q' = q·step rounded to i16
/// per 32 channels at two levels, then per row `(c0 + Σ q'·u)·scale` with the codes
/// widened to i16 (vpmaddwd: at most 2·255·32767 < 2^31 per lane).
///
/// # Safety
/// AVX2, FMA; `lo` and `step` NG·32 long; row t < out.len() has its NG packed groups at
/// `codes + t·row_bytes`; q.len() = NG·32.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_ng<const NG: usize>(
    bits: u32,
    q: &[f32],
    lo: &[f32],
    step: &[f32],
    codes: *const u8,
    row_bytes: usize,
    scale: f32,
    out: &mut [f32],
) {
    let pb = 4 * bits as usize;
    unsafe {
        let mut c0 = _mm256_setzero_ps();
        let mut qs = [0f32; 128];
        for i in (0..NG * 32).step_by(8) {
            let qv = _mm256_loadu_ps(q.as_ptr().add(i));
            let (l, st) = (_mm256_loadu_ps(lo[i..i + 8].as_ptr()), _mm256_loadu_ps(step[i..i + 8].as_ptr()));
            c0 = _mm256_fmadd_ps(qv, l, c0);
            _mm256_storeu_ps(qs.as_mut_ptr().add(i), _mm256_mul_ps(qv, st));
        }
        let c0 = hsum(c0);
        let Some(levels) = query_i16x2::<NG>(&qs[..NG * 32]) else {
            out.fill(f32::NAN);
            return;
        };
        for (t, o) in out.iter_mut().enumerate() {
            let row = codes.add(t * row_bytes);
            let mut acc = _mm256_setzero_ps();
            for g in 0..NG {
                let u = codes_u8(bits, row.add(g * pb));
                let (u0, u1) = (
                    _mm256_cvtepu8_epi16(_mm256_castsi256_si128(u)),
                    _mm256_cvtepu8_epi16(_mm256_extracti128_si256::<1>(u)),
                );
                for (qv, dq) in &levels {
                    let s = _mm256_add_epi32(_mm256_madd_epi16(u0, qv[g][0]), _mm256_madd_epi16(u1, qv[g][1]));
                    acc = _mm256_fmadd_ps(_mm256_set1_ps(dq[g]), _mm256_cvtepi32_ps(s), acc);
                }
            }
            *o = (c0 + hsum(acc)) * scale;
        }
    }
}

/// # Safety
/// As [`scores_ng`] with NG = q.len()/32 in 1..=4.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn scores(
    bits: u32,
    q: &[f32],
    lo: &[f32],
    step: &[f32],
    codes: *const u8,
    row_bytes: usize,
    scale: f32,
    out: &mut [f32],
) {
    unsafe { by_head_groups!(q.len() / 32, scores_ng(bits, q, lo, step, codes, row_bytes, scale, out)) }
}

/// `acc[c] += Σ_t p[t]·u_t[c]`, acc kept in registers over the rows.
///
/// # Safety
/// AVX2, FMA; row t < p.len() has acc.len()/32 packed groups at `codes + t·row_bytes`;
/// acc.len() is 32 to 128 and a multiple of 32.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn code_sums_ng<const NG: usize>(bits: u32, p: &[f32], codes: *const u8, row_bytes: usize, acc: &mut [f32]) {
    let pb = 4 * bits as usize;
    unsafe {
        let mut a: [[__m256; 4]; NG] =
            std::array::from_fn(|g| std::array::from_fn(|k| _mm256_loadu_ps(acc.as_ptr().add(32 * g + 8 * k))));
        for (t, &w) in p.iter().enumerate() {
            let row = codes.add(t * row_bytes);
            let wv = _mm256_set1_ps(w);
            for (g, ag) in a.iter_mut().enumerate() {
                let u = codes_u8(bits, row.add(g * pb));
                let halves = [_mm256_castsi256_si128(u), _mm256_extracti128_si256::<1>(u)];
                for (k, x) in ag.iter_mut().enumerate() {
                    let h = halves[k / 2];
                    let eight = if k % 2 == 0 { h } else { _mm_unpackhi_epi64(h, h) };
                    *x = _mm256_fmadd_ps(wv, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(eight)), *x);
                }
            }
        }
        for (g, ag) in a.iter().enumerate() {
            for (k, x) in ag.iter().enumerate() {
                _mm256_storeu_ps(acc.as_mut_ptr().add(32 * g + 8 * k), *x);
            }
        }
    }
}

/// [`code_sums`] of two probability vectors, 32 columns at a time (two sets of four
/// accumulators), each row's codes widened once for both; per lane the same sums in
/// the same order as `code_sums`.
///
/// # Safety
/// As [`code_sums_ng`] for both (p[0] and p[1] the same length, both accs as long).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn code_sums_pair(bits: u32, p: [&[f32]; 2], codes: *const u8, row_bytes: usize, acc: [&mut [f32]; 2]) {
    let (pb, [acc0, acc1]) = (4 * bits as usize, acc);
    assert!(acc0.len() == acc1.len() && acc0.len().is_multiple_of(32) && p[0].len() == p[1].len());
    unsafe {
        for g in 0..acc0.len() / 32 {
            let load =
                |a: &[f32]| -> [__m256; 4] { std::array::from_fn(|k| _mm256_loadu_ps(a.as_ptr().add(32 * g + 8 * k))) };
            let (mut a0, mut a1) = (load(acc0), load(acc1));
            for (t, (&w0, &w1)) in p[0].iter().zip(p[1]).enumerate() {
                let u = codes_u8(bits, codes.add(t * row_bytes + g * pb));
                let (wv0, wv1) = (_mm256_set1_ps(w0), _mm256_set1_ps(w1));
                let halves = [_mm256_castsi256_si128(u), _mm256_extracti128_si256::<1>(u)];
                for k in 0..4 {
                    let h = halves[k / 2];
                    let eight = if k % 2 == 0 { h } else { _mm_unpackhi_epi64(h, h) };
                    let x = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(eight));
                    a0[k] = _mm256_fmadd_ps(wv0, x, a0[k]);
                    a1[k] = _mm256_fmadd_ps(wv1, x, a1[k]);
                }
            }
            for k in 0..4 {
                _mm256_storeu_ps(acc0.as_mut_ptr().add(32 * g + 8 * k), a0[k]);
                _mm256_storeu_ps(acc1.as_mut_ptr().add(32 * g + 8 * k), a1[k]);
            }
        }
    }
}

/// `out[c] += lo[c]·sum_p + step[c]·acc[c]` (a group's values weighed, from its code
/// sums), eight at a time: the products and the sum the portable loop computes,
/// unfused, so both give the same bits.
///
/// # Safety
/// AVX2; lo, step and acc as long as out, a multiple of 8.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn add_group_values(lo: &[f32], step: &[f32], sum_p: f32, acc: &[f32], out: &mut [f32]) {
    assert!(acc.len() == out.len() && lo.len() == out.len() && step.len() == out.len());
    assert!(out.len().is_multiple_of(8));
    unsafe {
        let sp = _mm256_set1_ps(sum_p);
        for i in (0..out.len()).step_by(8) {
            let l = _mm256_loadu_ps(lo.as_ptr().add(i));
            let s = _mm256_loadu_ps(step.as_ptr().add(i));
            let v = _mm256_add_ps(_mm256_mul_ps(l, sp), _mm256_mul_ps(s, _mm256_loadu_ps(acc.as_ptr().add(i))));
            _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_add_ps(_mm256_loadu_ps(out.as_ptr().add(i)), v));
        }
    }
}

/// The compact header ([`duet_quant::kv::channel_header`]) of columns `col0..` of a
/// group of `cols`, eight at a time: the grid's mantissa by two table permutes, the
/// power of two from the exponent bits, the products in the definition's order (all
/// exact), NaN where m = −256 — the bits of `ChannelFormat::head_header`.
///
/// # Safety
/// AVX2; the header (2·cols bytes of words, then an f32 a block of 32) readable at
/// `group`; col0 and lo.len() = step.len() multiples of 8, col0 + lo.len() ≤ cols.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn compact_header(group: *const u8, cols: usize, col0: usize, lo: &mut [f32], step: &mut [f32]) {
    use duet_quant::kv::channel_header::{K_F32 as k, M_NOT_FINITE};
    unsafe {
        let (k_lo, k_hi) = (_mm256_loadu_ps(k.as_ptr()), _mm256_loadu_ps(k.as_ptr().add(8)));
        for i in (0..lo.len()).step_by(8) {
            let c = col0 + i;
            let unit = _mm256_set1_ps(f32::from_le_bytes(*group.add(2 * cols + 4 * (c / 32)).cast::<[u8; 4]>()));
            let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(group.add(2 * c).cast()));
            let e = _mm256_srli_epi32::<9>(w);
            let m = _mm256_srai_epi32::<23>(_mm256_slli_epi32::<23>(w));
            // K[e mod 16]: bit 3 of e, shifted to the sign, picks the table's half.
            let idx = _mm256_and_si256(e, _mm256_set1_epi32(7));
            let half = _mm256_castsi256_ps(_mm256_slli_epi32::<28>(e));
            let kv = _mm256_blendv_ps(_mm256_permutevar8x32_ps(k_lo, idx), _mm256_permutevar8x32_ps(k_hi, idx), half);
            let pow = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_sub_epi32(
                _mm256_set1_epi32(119),
                _mm256_srli_epi32::<4>(e),
            )));
            let s = _mm256_mul_ps(_mm256_mul_ps(unit, kv), pow);
            let l = _mm256_mul_ps(_mm256_mul_ps(s, _mm256_cvtepi32_ps(m)), _mm256_set1_ps(0.25));
            let bad = _mm256_castsi256_ps(_mm256_cmpeq_epi32(m, _mm256_set1_epi32(M_NOT_FINITE)));
            let nan = _mm256_set1_ps(f32::NAN);
            _mm256_storeu_ps(lo.as_mut_ptr().add(i), _mm256_blendv_ps(l, nan, bad));
            _mm256_storeu_ps(step.as_mut_ptr().add(i), _mm256_blendv_ps(s, nan, bad));
        }
    }
}

/// `out.len()` f16 values at `src` (little-endian, any alignment) as f32.
///
/// # Safety
/// F16C; 2·out.len() bytes readable at `src`; out.len() a multiple of 8.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16_to_f32(src: *const u8, out: &mut [f32]) {
    for i in (0..out.len()).step_by(8) {
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_cvtph_ps(_mm_loadu_si128(src.add(2 * i).cast()))) };
    }
}

/// # Safety
/// As [`code_sums_ng`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn code_sums(bits: u32, p: &[f32], codes: *const u8, row_bytes: usize, acc: &mut [f32]) {
    unsafe { by_head_groups!(acc.len() / 32, code_sums_ng(bits, p, codes, row_bytes, acc)) }
}
