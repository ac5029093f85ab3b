//! Attention's inner loops over cache rows (row j of a head at `j·stride`): AVX2 + FMA + F16C
//! on x86-64 when the CPU has them (one dispatch per head and query row, 8 lanes, the output
//! kept in registers, a vectorised exp; the logits in 16 lanes with AVX-512, [`avx512`]),
//! plain loops otherwise. A row's logit is summed in the same order wherever it sits in a
//! run of rows, and the weighted sum runs through the rows in order, so the result does not
//! depend on how the cache's pages split a sequence. The SIMD forms round
//! differently (summation order; exp within 2 ulp); f32 → f16 rounds to nearest even either
//! way.

use half::f16;

#[cfg(target_arch = "x86_64")]
#[path = "plain_avx512.rs"]
mod avx512;

/// Keeps the logits to the 8-lane forms on an AVX-512 CPU for the rest of the process.
pub fn keep_to_avx2() -> Result<(), &'static str> {
    #[cfg(target_arch = "x86_64")]
    return avx512::keep_to_avx2();
    #[cfg(not(target_arch = "x86_64"))]
    Ok(())
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn simd() -> bool {
    // std caches the CPUID results; this is a couple of loads.
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

pub fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: the CPU has the features (checked above).
        return unsafe { x86::f32_to_f16(src, dst) };
    }
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f16::from_f32(s);
    }
}

/// Bytes per element of an f16 (`true`) or f32 row.
#[cfg(target_arch = "x86_64")]
const fn esize(f16: bool) -> usize {
    if f16 { 2 } else { 4 }
}

/// Rows `stride` apart of which the first `hd` values are read, `n` rows.
fn check(len: usize, n: usize, stride: usize, hd: usize) {
    assert!(n == 0 || (n - 1) * stride + hd <= len, "attention rows out of the cache");
}

/// `out[j] = scale · q · K[j]` for j < out.len().
pub fn scores_f32(q: &[f32], k: &[f32], stride: usize, scale: f32, out: &mut [f32]) {
    check(k.len(), out.len(), stride, q.len());
    #[cfg(target_arch = "x86_64")]
    if avx512::usable(q.len()) {
        // SAFETY: the CPU has AVX-512F and the head size fits (usable); rows checked.
        return unsafe { avx512::scores::<false>(q, k.as_ptr() as *const u8, stride, scale, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: features checked; rows checked in bounds.
        return unsafe { x86::scores::<false>(q, k.as_ptr() as *const u8, stride, scale, out) };
    }
    for (j, o) in out.iter_mut().enumerate() {
        *o = k[j * stride..j * stride + q.len()].iter().zip(q).map(|(a, b)| a * b).sum::<f32>() * scale;
    }
}

pub fn scores_f16(q: &[f32], k: &[f16], stride: usize, scale: f32, out: &mut [f32]) {
    check(k.len(), out.len(), stride, q.len());
    #[cfg(target_arch = "x86_64")]
    if avx512::usable(q.len()) {
        // SAFETY: the CPU has AVX-512F and the head size fits (usable); rows checked.
        return unsafe { avx512::scores::<true>(q, k.as_ptr() as *const u8, stride, scale, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: as above.
        return unsafe { x86::scores::<true>(q, k.as_ptr() as *const u8, stride, scale, out) };
    }
    for (j, o) in out.iter_mut().enumerate() {
        *o = k[j * stride..j * stride + q.len()].iter().zip(q).map(|(a, b)| a.to_f32() * b).sum::<f32>() * scale;
    }
}

/// `s = exp(s − max s) / Σ exp(s − max s)`, the normaliser summed in f64.
pub fn softmax(s: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: features checked.
        return unsafe { x86::softmax(s) };
    }
    let max = s.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut sum = 0f64;
    for v in s.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in s.iter_mut() {
        *v *= inv;
    }
}

/// `out += Σ_j p[j] · V[j][..out.len()]`.
pub fn weighted_sum_f32(p: &[f32], v: &[f32], stride: usize, out: &mut [f32]) {
    check(v.len(), p.len(), stride, out.len());
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: as above.
        return unsafe { x86::weighted_sum::<false>(p, v.as_ptr() as *const u8, stride, out) };
    }
    for (j, &w) in p.iter().enumerate() {
        for (o, &x) in out.iter_mut().zip(&v[j * stride..]) {
            *o += w * x;
        }
    }
}

pub fn weighted_sum_f16(p: &[f32], v: &[f16], stride: usize, out: &mut [f32]) {
    check(v.len(), p.len(), stride, out.len());
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: as above.
        return unsafe { x86::weighted_sum::<true>(p, v.as_ptr() as *const u8, stride, out) };
    }
    for (j, &w) in p.iter().enumerate() {
        for (o, x) in out.iter_mut().zip(&v[j * stride..]) {
            *o += w * x.to_f32();
        }
    }
}

#[cfg(target_arch = "x86_64")]
// Scalar tails index rows through raw pointers by column.
#[allow(clippy::needless_range_loop)]
mod x86 {
    use std::arch::x86_64::*;

    use half::f16;

    use super::esize;
    use crate::cpu::simd::{exp, hsum};

    /// 8 values at element `i` of a row of f16 (`F16`) or f32.
    ///
    /// # Safety
    /// `p` + 8 elements at `i` must be readable.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn ld8<const F16: bool>(p: *const u8, i: usize) -> __m256 {
        // SAFETY: forwarded.
        unsafe {
            if F16 {
                _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * i) as *const __m128i))
            } else {
                _mm256_loadu_ps((p as *const f32).add(i))
            }
        }
    }

    /// One element (scalar tail).
    ///
    /// # Safety
    /// Element `i` must be readable.
    #[inline]
    unsafe fn ld1<const F16: bool>(p: *const u8, i: usize) -> f32 {
        // SAFETY: forwarded.
        unsafe {
            if F16 {
                f16::from_bits((p as *const u16).add(i).read_unaligned()).to_f32()
            } else {
                *(p as *const f32).add(i)
            }
        }
    }

    // SAFETY (all below): the callers checked that every row j < n has `hd` readable
    // elements at `j·stride`; vector loads stay below hd (i + 8 <= hd), tails are scalar.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        unsafe {
            while i + 8 <= n {
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.as_ptr().add(i)));
                _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
                i += 8;
            }
        }
        for j in i..n {
            dst[j] = f16::from_f32(src[j]);
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scores<const F16: bool>(q: &[f32], k: *const u8, stride: usize, scale: f32, out: &mut [f32]) {
        let hd = q.len();
        let row_bytes = stride * esize(F16);
        if !hd.is_multiple_of(8) {
            // A scalar tail per row: rows one at a time.
            for (j, o) in out.iter_mut().enumerate() {
                let row = k.wrapping_add(j * row_bytes);
                let (s, i) = unsafe { chains::<F16>(q, row) };
                let mut s = hsum(s);
                for t in i..hd {
                    s += unsafe { ld1::<F16>(row, t) } * q[t];
                }
                *o = s * scale;
            }
            return;
        }
        // Four rows at a time, each chunk of the query loaded once for all four and the four
        // sums reduced together; the last rows alone with the same chains and reduction, so
        // that a row's logit does not depend on where its group starts (the cache's pages
        // split a sequence into runs, and a shared prefix must give a cold run's logits).
        let mut j = 0;
        while j + 4 <= out.len() {
            let mut even = [_mm256_setzero_ps(); 4];
            let mut odd = [_mm256_setzero_ps(); 4];
            let rows: [*const u8; 4] = std::array::from_fn(|r| k.wrapping_add((j + r) * row_bytes));
            let mut i = 0;
            unsafe {
                while i + 16 <= hd {
                    let (qa, qb) = (_mm256_loadu_ps(q.as_ptr().add(i)), _mm256_loadu_ps(q.as_ptr().add(i + 8)));
                    for r in 0..4 {
                        even[r] = _mm256_fmadd_ps(ld8::<F16>(rows[r], i), qa, even[r]);
                        odd[r] = _mm256_fmadd_ps(ld8::<F16>(rows[r], i + 8), qb, odd[r]);
                    }
                    i += 16;
                }
                if i < hd {
                    let qa = _mm256_loadu_ps(q.as_ptr().add(i));
                    for r in 0..4 {
                        even[r] = _mm256_fmadd_ps(ld8::<F16>(rows[r], i), qa, even[r]);
                    }
                }
            }
            let s: [__m256; 4] = std::array::from_fn(|r| _mm256_add_ps(even[r], odd[r]));
            let sums = _mm_mul_ps(sum4(s[0], s[1], s[2], s[3]), _mm_set1_ps(scale));
            // SAFETY: four logits at j ≤ out.len() − 4.
            unsafe { _mm_storeu_ps(out.as_mut_ptr().add(j), sums) };
            j += 4;
        }
        for (j, o) in out.iter_mut().enumerate().skip(j) {
            let (s, _) = unsafe { chains::<F16>(q, k.wrapping_add(j * row_bytes)) };
            *o = _mm_cvtss_f32(sum4(s, s, s, s)) * scale;
        }
    }

    /// One row's dot product with `q` over whole chunks of 8 in two chains (even and odd
    /// chunks, the last odd one into the even chain), summed lane by lane; and where the
    /// chunks end.
    ///
    /// # Safety
    /// `row` must have q.len() readable elements.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn chains<const F16: bool>(q: &[f32], row: *const u8) -> (__m256, usize) {
        let hd = q.len();
        let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        unsafe {
            while i + 16 <= hd {
                s0 = _mm256_fmadd_ps(ld8::<F16>(row, i), _mm256_loadu_ps(q.as_ptr().add(i)), s0);
                s1 = _mm256_fmadd_ps(ld8::<F16>(row, i + 8), _mm256_loadu_ps(q.as_ptr().add(i + 8)), s1);
                i += 16;
            }
            if i + 8 <= hd {
                s0 = _mm256_fmadd_ps(ld8::<F16>(row, i), _mm256_loadu_ps(q.as_ptr().add(i)), s0);
                i += 8;
            }
        }
        (_mm256_add_ps(s0, s1), i)
    }

    /// The sums of the lanes of a, b, c and d, in that order.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn sum4(a: __m256, b: __m256, c: __m256, d: __m256) -> __m128 {
        // [a b c d | a b c d], each the sum of two lane pairs of its half, then the halves.
        let h = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
        _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn weighted_sum<const F16: bool>(p: &[f32], v: *const u8, stride: usize, out: &mut [f32]) {
        let hd = out.len();
        let row_bytes = stride * esize(F16);
        let mut c = 0;
        // Columns in blocks of 64 held in 8 registers across all rows.
        unsafe {
            while c + 64 <= hd {
                let mut acc: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(out.as_ptr().add(c + 8 * i)));
                for (j, &w) in p.iter().enumerate() {
                    let row = v.wrapping_add(j * row_bytes);
                    let wv = _mm256_set1_ps(w);
                    for (i, a) in acc.iter_mut().enumerate() {
                        *a = _mm256_fmadd_ps(wv, ld8::<F16>(row, c + 8 * i), *a);
                    }
                }
                for (i, a) in acc.iter().enumerate() {
                    _mm256_storeu_ps(out.as_mut_ptr().add(c + 8 * i), *a);
                }
                c += 64;
            }
            while c + 8 <= hd {
                let mut a = _mm256_loadu_ps(out.as_ptr().add(c));
                for (j, &w) in p.iter().enumerate() {
                    a = _mm256_fmadd_ps(_mm256_set1_ps(w), ld8::<F16>(v.wrapping_add(j * row_bytes), c), a);
                }
                _mm256_storeu_ps(out.as_mut_ptr().add(c), a);
                c += 8;
            }
            for t in c..hd {
                for (j, &w) in p.iter().enumerate() {
                    out[t] += w * ld1::<F16>(v.wrapping_add(j * row_bytes), t);
                }
            }
        }
    }

    /// The softmax of the plain path, with the exponentials of `s − max` 8 at a time
    /// (Cephes' expf, within 2 ulp).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn softmax(s: &mut [f32]) {
        let n = s.len();
        let mut i = 0;
        let mut mv = _mm256_set1_ps(f32::NEG_INFINITY);
        unsafe {
            while i + 8 <= n {
                mv = _mm256_max_ps(mv, _mm256_loadu_ps(s.as_ptr().add(i)));
                i += 8;
            }
        }
        let m = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let mut max = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
        for &v in &s[i..] {
            max = max.max(v);
        }
        let maxv = _mm256_set1_ps(max);
        let mut sum = _mm256_setzero_pd();
        let mut tail = 0f64;
        i = 0;
        unsafe {
            while i + 8 <= n {
                let e = exp(_mm256_sub_ps(_mm256_loadu_ps(s.as_ptr().add(i)), maxv));
                _mm256_storeu_ps(s.as_mut_ptr().add(i), e);
                sum = _mm256_add_pd(sum, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
                sum = _mm256_add_pd(sum, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
                i += 8;
            }
        }
        for v in &mut s[i..] {
            *v = (*v - max).exp();
            tail += *v as f64;
        }
        let mut lanes = [0f64; 4];
        // SAFETY: 4 f64 into a 4-element array.
        unsafe { _mm256_storeu_pd(lanes.as_mut_ptr(), sum) };
        let inv = (1.0 / (lanes.iter().sum::<f64>() + tail)) as f32;
        let invv = _mm256_set1_ps(inv);
        i = 0;
        unsafe {
            while i + 8 <= n {
                let p = s.as_mut_ptr().add(i);
                _mm256_storeu_ps(p, _mm256_mul_ps(_mm256_loadu_ps(p), invv));
                i += 8;
            }
        }
        for v in &mut s[i..] {
            *v *= inv;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_paths_match_plain_loops() {
        let n = 37;
        let (hd, stride) = (72, 80);
        let q: Vec<f32> = (0..hd).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1).collect();
        let kf: Vec<f32> = (0..n * stride).map(|i| ((i * 11 % 17) as f32 - 8.0) * 0.05).collect();
        let kh: Vec<f16> = kf.iter().map(|&v| f16::from_f32(v)).collect();
        let mut got = vec![0f32; n];
        scores_f16(&q, &kh, stride, 0.125, &mut got);
        for j in 0..n {
            let want: f32 = (0..hd).map(|i| kh[j * stride + i].to_f32() * q[i]).sum::<f32>() * 0.125;
            assert!((got[j] - want).abs() < 1e-5, "score {j}: {} vs {want}", got[j]);
        }
        let mut p = got.clone();
        softmax(&mut p);
        let max = got.iter().fold(f32::MIN, |m, &v| m.max(v));
        let z: f64 = got.iter().map(|&v| ((v - max) as f64).exp()).sum();
        for j in 0..n {
            let want = (((got[j] - max) as f64).exp() / z) as f32;
            assert!((p[j] - want).abs() <= 4.0 * f32::EPSILON * want.max(1e-30), "p {j}: {} vs {want}", p[j]);
        }
        let mut out = vec![0.5f32; hd];
        weighted_sum_f32(&p, &kf, stride, &mut out);
        for t in 0..hd {
            let want = 0.5 + (0..n).map(|j| p[j] * kf[j * stride + t]).sum::<f32>();
            assert!((out[t] - want).abs() < 1e-5, "out {t}: {} vs {want}", out[t]);
        }
    }

    /// The 16-lane logits against plain loops: every head size they take (16 to 128), row
    /// counts around their groups of four (0 to 9, 37), f16 and f32 rows.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_logits_match_plain_loops() {
        if !avx512::usable(64) {
            duet_test_support::cpu_lacks("avx512_logits_match_plain_loops", &["avx512f"], "this CPU has no AVX-512F");
            return;
        }
        for hd in (16..=128).step_by(16) {
            let stride = hd + 8;
            for n in (0..10).chain([37]) {
                let q: Vec<f32> = (0..hd).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1).collect();
                let kf: Vec<f32> = (0..n * stride).map(|i| ((i * 11 % 17) as f32 - 8.0) * 0.05).collect();
                let kh: Vec<f16> = kf.iter().map(|&v| f16::from_f32(v)).collect();
                let (mut s16, mut s32) = (vec![f32::NAN; n], vec![f32::NAN; n]);
                // SAFETY: usable(hd) checked above for this CPU; all rows are in bounds.
                unsafe {
                    avx512::scores::<true>(&q, kh.as_ptr() as *const u8, stride, 0.125, &mut s16);
                    avx512::scores::<false>(&q, kf.as_ptr() as *const u8, stride, 0.125, &mut s32);
                }
                for j in 0..n {
                    let want16: f32 = (0..hd).map(|i| kh[j * stride + i].to_f32() * q[i]).sum::<f32>() * 0.125;
                    let want32: f32 = (0..hd).map(|i| kf[j * stride + i] * q[i]).sum::<f32>() * 0.125;
                    assert!((s16[j] - want16).abs() < 1e-5, "hd {hd} n {n} f16 score {j}: {} vs {want16}", s16[j]);
                    assert!((s32[j] - want32).abs() < 1e-5, "hd {hd} n {n} f32 score {j}: {} vs {want32}", s32[j]);
                }
            }
        }
    }

    /// A row's logit is the same bits whether the row is the first, a middle or the last of
    /// the rows handed over at once (the cache's pages cut a sequence into runs wherever
    /// its pages lie): all 37 rows at once against every split into two runs, for the AVX2
    /// form (head sizes with and without a scalar tail) and the AVX-512 form.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn logits_do_not_depend_on_where_a_run_starts() {
        if !simd() {
            duet_test_support::cpu_lacks(
                "logits_do_not_depend_on_where_a_run_starts",
                &["avx2", "fma", "f16c"],
                "this CPU has no AVX2/FMA/F16C",
            );
            return;
        }
        type Form = unsafe fn(&[f32], *const u8, usize, f32, &mut [f32]);
        let mut forms: Vec<(&str, Form, usize)> =
            vec![("avx2", x86::scores::<true>, 64), ("avx2", x86::scores::<true>, 72)];
        if avx512::usable(64) {
            forms.push(("avx512", avx512::scores::<true>, 64));
        }
        let n = 37;
        for (name, form, hd) in forms {
            let stride = hd + 8;
            let q: Vec<f32> = (0..hd).map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.13).collect();
            let k: Vec<f16> = (0..n * stride).map(|i| f16::from_f32(((i * 13 % 19) as f32 - 9.0) * 0.07)).collect();
            let base = k.as_ptr() as *const u8;
            let mut whole = vec![0f32; n];
            // SAFETY: the CPU has the form's features (checked above); rows in bounds.
            unsafe { form(&q, base, stride, 0.3, &mut whole) };
            for cut in 1..n {
                let mut split = vec![0f32; n];
                let (a, b) = split.split_at_mut(cut);
                // SAFETY: as above; the second run starts at row `cut`.
                unsafe {
                    form(&q, base, stride, 0.3, a);
                    form(&q, base.add(2 * cut * stride), stride, 0.3, b);
                }
                assert!(
                    whole.iter().zip(&split).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{name} hd {hd}: runs cut at row {cut} change a logit"
                );
            }
        }
    }
}
