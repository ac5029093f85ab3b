//! x86-64 AVX2 + FMA + F16C dot kernels.
//!
//! The integer work per block is exact (u8×i8 → i16 pair sums never overflow for these
//! ranges); only the order of float accumulation differs from [`super::scalar`].

use std::arch::x86_64::*;

use super::Kernels;
use crate::blocks::{
    BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K, BlockQ8_0, BlockQ8_1, BlockQ8K,
};

pub fn kernels() -> Option<Kernels> {
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
        Some(Kernels {
            name: "avx2",
            q4_0: |w, a| unsafe { dot_q4_0(w, a) },
            q4_1: |w, a| unsafe { dot_q4_1(w, a) },
            q5_0: |w, a| unsafe { dot_q5_0(w, a) },
            q5_1: |w, a| unsafe { dot_q5_1(w, a) },
            q8_0: |w, a| unsafe { dot_q8_0(w, a) },
            q4_k: |w, a| unsafe { dot_q4_k(w, a) },
            q5_k: |w, a| unsafe { dot_q5_k(w, a) },
            q6_k: |w, a| unsafe { dot_q6_k(w, a) },
            f32: |w, x| unsafe { dot_f32(w, x) },
            f16: |w, x| unsafe { dot_f16(w, x) },
            bf16: |w, x| unsafe { dot_bf16(w, x) },
        })
    } else {
        None
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum_ps(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load32(p: &[i8; 32]) -> __m256i {
    unsafe { _mm256_loadu_si256(p.as_ptr() as *const __m256i) }
}

/// 16 packed nibble bytes → 32 bytes: low nibbles in bytes 0..16, high nibbles in 16..32
/// (ggml's element order for the 32-element formats).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn unpack_nibbles_16(qs: &[u8; 16]) -> __m256i {
    unsafe {
        let v = _mm_loadu_si128(qs.as_ptr() as *const __m128i);
        let both = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
        _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
    }
}

/// Bit j of `bits` spread to byte j of the result: 0xFF where set, 0 where clear.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bytes_from_bits_32(bits: [u8; 4]) -> __m256i {
    let x = u32::from_le_bytes(bits) as i32;
    let v = _mm256_set1_epi32(x);
    // Byte j must look at source byte j/8.
    let shuf = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
    );
    let v = _mm256_shuffle_epi8(v, shuf);
    let mask = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let v = _mm256_and_si256(v, mask);
    _mm256_cmpeq_epi8(v, mask)
}

/// Σ of signed-byte products, as 8 i32 lanes. `x` and `y` are both signed.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn mul_sum_i8_pairs(x: __m256i, y: __m256i) -> __m256i {
    // maddubs wants its first operand unsigned: move x's sign onto y.
    let ax = _mm256_sign_epi8(x, x);
    let sy = _mm256_sign_epi8(y, x);
    mul_sum_u8_i8(ax, sy)
}

/// Σ of unsigned×signed byte products, as 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn mul_sum_u8_i8(ux: __m256i, sy: __m256i) -> __m256i {
    let dot16 = _mm256_maddubs_epi16(ux, sy);
    _mm256_madd_epi16(dot16, _mm256_set1_epi16(1))
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q4_0(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
    assert_eq!(w.len(), a.len());
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = _mm256_set1_ps(x.d.get() * y.d.get());
        let qx = _mm256_sub_epi8(unpack_nibbles_16(&x.qs), _mm256_set1_epi8(8));
        let qy = load32(&y.qs);
        let s = _mm256_cvtepi32_ps(mul_sum_i8_pairs(qx, qy));
        acc = _mm256_fmadd_ps(d, s, acc);
    }
    hsum_ps(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q4_1(w: &[BlockQ4_1], a: &[BlockQ8_1]) -> f32 {
    assert_eq!(w.len(), a.len());
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let d = _mm256_set1_ps(x.d.get() * y.d.get());
        let qx = unpack_nibbles_16(&x.qs);
        let qy = load32(&y.qs);
        let s = _mm256_cvtepi32_ps(mul_sum_u8_i8(qx, qy));
        acc = _mm256_fmadd_ps(d, s, acc);
        mins += x.m.get() * y.s.get();
    }
    hsum_ps(acc) + mins
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q5_0(w: &[BlockQ5_0], a: &[BlockQ8_0]) -> f32 {
    assert_eq!(w.len(), a.len());
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = _mm256_set1_ps(x.d.get() * y.d.get());
        let low = unpack_nibbles_16(&x.qs);
        // Level − 16 as a signed byte: with the fifth bit set it is the nibble itself,
        // without it the nibble − 16 = nibble | 0xF0.
        let high = _mm256_andnot_si256(bytes_from_bits_32(x.qh), _mm256_set1_epi8(0xf0u8 as i8));
        let qx = _mm256_or_si256(low, high);
        let qy = load32(&y.qs);
        let s = _mm256_cvtepi32_ps(mul_sum_i8_pairs(qx, qy));
        acc = _mm256_fmadd_ps(d, s, acc);
    }
    hsum_ps(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q5_1(w: &[BlockQ5_1], a: &[BlockQ8_1]) -> f32 {
    assert_eq!(w.len(), a.len());
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let d = _mm256_set1_ps(x.d.get() * y.d.get());
        let low = unpack_nibbles_16(&x.qs);
        let high = _mm256_and_si256(bytes_from_bits_32(x.qh), _mm256_set1_epi8(0x10));
        let qx = _mm256_or_si256(low, high);
        let qy = load32(&y.qs);
        let s = _mm256_cvtepi32_ps(mul_sum_u8_i8(qx, qy));
        acc = _mm256_fmadd_ps(d, s, acc);
        mins += x.m.get() * y.s.get();
    }
    hsum_ps(acc) + mins
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q8_0(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
    assert_eq!(w.len(), a.len());
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = _mm256_set1_ps(x.d.get() * y.d.get());
        let s = _mm256_cvtepi32_ps(mul_sum_i8_pairs(load32(&x.qs), load32(&y.qs)));
        acc = _mm256_fmadd_ps(d, s, acc);
    }
    hsum_ps(acc)
}

/// The eight 6-bit scales and mins of a Q4_K/Q5_K block, unpacked (`get_scale_min_k4`).
#[inline(always)]
fn unpack_scales_mins(scales: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..8 {
        (sc[j], m[j]) = crate::kquants::get_scale_min_k4(j, scales);
    }
    (sc, m)
}

/// Σ_j m[j]·(bsums[2j] + bsums[2j+1]): the minimum's contribution of a Q4_K/Q5_K block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn mins_dot_bsums(m: &[u8; 8], bsums: &[i16; 16]) -> i32 {
    unsafe {
        let b = _mm256_loadu_si256(bsums.as_ptr() as *const __m256i);
        // Pairwise sums of adjacent i16 via madd with 1, then multiply by the mins.
        let pairs = _mm256_madd_epi16(b, _mm256_set1_epi16(1)); // 8 × i32
        let mins = _mm256_cvtepu8_epi32(_mm_loadl_epi64(m.as_ptr() as *const __m128i));
        hsum_epi32(_mm256_mullo_epi32(pairs, mins))
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q4_k(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
    assert_eq!(w.len(), a.len());
    let mut acc = _mm256_setzero_ps();
    let mut acc_min = 0.0f32;
    let low_mask = _mm256_set1_epi8(0x0f);
    for (x, y) in w.iter().zip(a) {
        let (sc, m) = unpack_scales_mins(&x.scales);
        let mut sumi = _mm256_setzero_si256();
        for chunk in 0..4 {
            let q4 = unsafe { _mm256_loadu_si256(x.qs.as_ptr().add(32 * chunk) as *const __m256i) };
            let q4l = _mm256_and_si256(q4, low_mask);
            let q4h = _mm256_and_si256(_mm256_srli_epi16(q4, 4), low_mask);
            let q8l = unsafe { _mm256_loadu_si256(y.qs.as_ptr().add(64 * chunk) as *const __m256i) };
            let q8h = unsafe { _mm256_loadu_si256(y.qs.as_ptr().add(64 * chunk + 32) as *const __m256i) };
            let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(q4l, q8l), _mm256_set1_epi16(sc[2 * chunk] as i16));
            let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(q4h, q8h), _mm256_set1_epi16(sc[2 * chunk + 1] as i16));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        let d = x.d.get() * y.d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        acc_min += x.dmin.get() * y.d * mins_dot_bsums(&m, &y.bsums) as f32;
    }
    hsum_ps(acc) - acc_min
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q5_k(w: &[BlockQ5K], a: &[BlockQ8K]) -> f32 {
    assert_eq!(w.len(), a.len());
    let mut acc = _mm256_setzero_ps();
    let mut acc_min = 0.0f32;
    let low_mask = _mm256_set1_epi8(0x0f);
    let sixteen = _mm256_set1_epi8(16);
    for (x, y) in w.iter().zip(a) {
        let (sc, m) = unpack_scales_mins(&x.scales);
        let qh = unsafe { _mm256_loadu_si256(x.qh.as_ptr() as *const __m256i) };
        let mut sumi = _mm256_setzero_si256();
        for group in 0..4 {
            let q5 = unsafe { _mm256_loadu_si256(x.qs.as_ptr().add(32 * group) as *const __m256i) };
            // Bits 2g and 2g+1 of each qh byte are the fifth bits of the two halves.
            let hl = _mm256_and_si256(
                _mm256_cmpeq_epi8(
                    _mm256_and_si256(qh, _mm256_set1_epi8((1u8 << (2 * group)) as i8)),
                    _mm256_set1_epi8((1u8 << (2 * group)) as i8),
                ),
                sixteen,
            );
            let hh = _mm256_and_si256(
                _mm256_cmpeq_epi8(
                    _mm256_and_si256(qh, _mm256_set1_epi8((2u8 << (2 * group)) as i8)),
                    _mm256_set1_epi8((2u8 << (2 * group)) as i8),
                ),
                sixteen,
            );
            let q5l = _mm256_or_si256(_mm256_and_si256(q5, low_mask), hl);
            let q5h = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q5, 4), low_mask), hh);
            let q8l = unsafe { _mm256_loadu_si256(y.qs.as_ptr().add(64 * group) as *const __m256i) };
            let q8h = unsafe { _mm256_loadu_si256(y.qs.as_ptr().add(64 * group + 32) as *const __m256i) };
            let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(q5l, q8l), _mm256_set1_epi16(sc[2 * group] as i16));
            let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(q5h, q8h), _mm256_set1_epi16(sc[2 * group + 1] as i16));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        let d = x.d.get() * y.d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        acc_min += x.dmin.get() * y.d * mins_dot_bsums(&m, &y.bsums) as f32;
    }
    hsum_ps(acc) - acc_min
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q6_k(w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
    assert_eq!(w.len(), a.len());
    let mut acc = _mm256_setzero_ps();
    let low_mask = _mm256_set1_epi8(0x0f);
    let two_bits = _mm256_set1_epi8(3);
    for (x, y) in w.iter().zip(a) {
        let mut sumi = _mm256_setzero_si256();
        for half in 0..2 {
            let ql0 = unsafe { _mm256_loadu_si256(x.ql.as_ptr().add(64 * half) as *const __m256i) };
            let ql1 = unsafe { _mm256_loadu_si256(x.ql.as_ptr().add(64 * half + 32) as *const __m256i) };
            let qh = unsafe { _mm256_loadu_si256(x.qh.as_ptr().add(32 * half) as *const __m256i) };
            // The four quarters of 32 elements (see dequantize_row_q6_k), levels 0..64.
            let quarters = [
                _mm256_or_si256(_mm256_and_si256(ql0, low_mask), _mm256_slli_epi16(_mm256_and_si256(qh, two_bits), 4)),
                _mm256_or_si256(
                    _mm256_and_si256(ql1, low_mask),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), two_bits), 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low_mask),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), two_bits), 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low_mask),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), two_bits), 4),
                ),
            ];
            for (k, q6) in quarters.into_iter().enumerate() {
                let base = 128 * half + 32 * k;
                let q8 = unsafe { _mm256_loadu_si256(y.qs.as_ptr().add(base) as *const __m256i) };
                // Σ (q − 32)·q8 = Σ q·q8 − 32·Σ q8, both as i16 pair sums.
                let p = _mm256_maddubs_epi16(q6, q8);
                let s8 = _mm256_maddubs_epi16(_mm256_set1_epi8(32), q8);
                let p = _mm256_sub_epi16(p, s8);
                // Each 16 elements share one scale: lanes 0..8 (i16) are the first 16.
                let s0 = x.scales[base / 16] as i16;
                let s1 = x.scales[base / 16 + 1] as i16;
                let scales = _mm256_setr_epi16(s0, s0, s0, s0, s0, s0, s0, s0, s1, s1, s1, s1, s1, s1, s1, s1);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, scales));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x.d.get() * y.d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len());
    let n = w.len();
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    unsafe {
        while i + 32 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                let wv = _mm256_loadu_ps(w.as_ptr().add(i + 8 * k));
                let xv = _mm256_loadu_ps(x.as_ptr().add(i + 8 * k));
                *a = _mm256_fmadd_ps(wv, xv, *a);
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(w.as_ptr().add(i)), _mm256_loadu_ps(x.as_ptr().add(i)), acc[0]);
            i += 8;
        }
        let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut s = hsum_ps(sum);
        for j in i..n {
            s += w[j] * x[j];
        }
        s
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_f16(w: &[u8], x: &[f32]) -> f32 {
    assert_eq!(w.len(), 2 * x.len());
    let n = x.len();
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    unsafe {
        let wp = w.as_ptr();
        while i + 32 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                let h = _mm_loadu_si128(wp.add(2 * (i + 8 * k)) as *const __m128i);
                *a = _mm256_fmadd_ps(_mm256_cvtph_ps(h), _mm256_loadu_ps(x.as_ptr().add(i + 8 * k)), *a);
            }
            i += 32;
        }
        while i + 8 <= n {
            let h = _mm_loadu_si128(wp.add(2 * i) as *const __m128i);
            acc[0] = _mm256_fmadd_ps(_mm256_cvtph_ps(h), _mm256_loadu_ps(x.as_ptr().add(i)), acc[0]);
            i += 8;
        }
        let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        hsum_ps(sum) + super::scalar::dot_f16(&w[2 * i..], &x[i..])
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_bf16(w: &[u8], x: &[f32]) -> f32 {
    assert_eq!(w.len(), 2 * x.len());
    let n = x.len();
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut i = 0;
    unsafe {
        let wp = w.as_ptr();
        while i + 16 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                let h = _mm_loadu_si128(wp.add(2 * (i + 8 * k)) as *const __m128i);
                let f = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
                *a = _mm256_fmadd_ps(f, _mm256_loadu_ps(x.as_ptr().add(i + 8 * k)), *a);
            }
            i += 16;
        }
        hsum_ps(_mm256_add_ps(acc[0], acc[1])) + super::scalar::dot_bf16(&w[2 * i..], &x[i..])
    }
}
