//! Activation quantization for [`super::QActs`]: bit for bit the reference
//! [`crate::legacy::quantize_row_q8_0`] / [`crate::legacy::quantize_row_q8_1`] /
//! [`crate::kquants::quantize_row_q8_k`], vectorised with AVX2 on x86-64.
//!
//! Each SIMD block does exactly the reference's float operations (the same divisions,
//! multiplications and roundings; only the max reduction is reordered, which is exact). A
//! block with a non-finite input, or whose scale is not finite, goes to the reference code, so
//! every input, NaN and infinity included, gives the reference bytes (tests.rs checks this).

use crate::blocks::{BlockQ8_0, BlockQ8_1, BlockQ8K, F16Bytes, QK, QK_K};

/// One quantized 32-block: the reference's bytes and scale, plus Σq.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Q8Block {
    pub qs: [i8; QK],
    /// The stored (f16) scale.
    pub d: F16Bytes,
    pub sum: i32,
    /// Q8_1's `s`: f16 of Σq · d, with d = amax/127 before its f16 rounding.
    pub s: F16Bytes,
}

/// Q8_0 (and Q8_1) of 32 values.
pub(super) fn q8_block(x: &[f32; QK]) -> Q8Block {
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: the CPU has AVX2 and FMA (checked).
        if let Some(b) = unsafe { x86::q8_block(x) } {
            return b;
        }
    }
    reference_q8(x)
}

pub(super) fn reference_q8(x: &[f32; QK]) -> Q8Block {
    let mut blk = [BlockQ8_1::default()];
    crate::legacy::quantize_row_q8_1(x, &mut blk);
    let mut blk0 = [BlockQ8_0::default()];
    crate::legacy::quantize_row_q8_0(x, &mut blk0);
    debug_assert_eq!(blk0[0].qs, blk[0].qs);
    let sum = blk[0].qs.iter().map(|&q| q as i32).sum();
    Q8Block { qs: blk[0].qs, d: blk[0].d, sum, s: blk[0].s }
}

/// Q8_K of 256 values.
pub(super) fn q8_k_block(x: &[f32; QK_K]) -> BlockQ8K {
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: the CPU has AVX2 and FMA (checked).
        if let Some(b) = unsafe { x86::q8_k_block(x) } {
            return b;
        }
    }
    reference_q8_k(x)
}

pub(super) fn reference_q8_k(x: &[f32; QK_K]) -> BlockQ8K {
    let mut blk = [BlockQ8K::default()];
    crate::kquants::quantize_row_q8_k(x, &mut blk);
    blk[0]
}

/// Q8_K's `bsums` of 256 quants (the second level's: the first level's come with
/// [`q8_k_block`]).
pub(super) fn q8_k_bsums(qs: &[i8; QK_K]) -> [i16; QK_K / 16] {
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: the CPU has AVX2 (checked).
        return unsafe { x86::q8_k_bsums(qs) };
    }
    crate::kquants::q8_k_bsums(qs)
}

/// A pair's merged activations `128·q1 + q2` (|·| ≤ 127·129 < 2¹⁵) as little-endian i16 into
/// `dst` (2 bytes per value), each 4 values in the order (a0, a2, a1, a3): a lane of packed
/// weights splits into the i16 pairs (w0, w2), (w1, w3) with one AND and one shift.
pub(super) fn merged(dst: &mut [u8], q1: &[i8], q2: &[i8]) {
    assert!(q1.len() == q2.len() && dst.len() == 2 * q1.len() && q1.len().is_multiple_of(16));
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: the CPU has AVX2 (checked); lengths checked above.
        return unsafe { x86::merged(dst, q1, q2) };
    }
    reference_merged(dst, q1, q2)
}

/// [`merged`] one value at a time.
pub(super) fn reference_merged(dst: &mut [u8], q1: &[i8], q2: &[i8]) {
    for (g, d) in dst.chunks_exact_mut(8).enumerate() {
        for (slot, j) in [0, 2, 1, 3].into_iter().enumerate() {
            let v = ((q1[4 * g + j] as i16) << crate::second_level::SHIFT) + q2[4 * g + j] as i16;
            d[2 * slot..2 * slot + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn simd() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::Q8Block;
    use crate::blocks::{BlockQ8K, F16Bytes, QK, QK_K};

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn abs(v: __m256) -> __m256 {
        _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff)))
    }

    /// Whether all 8 lanes are finite (NaN and ±inf are not).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn finite(v: __m256) -> __m256 {
        _mm256_cmp_ps::<_CMP_LT_OQ>(abs(v), _mm256_set1_ps(f32::INFINITY))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hmax(v: __m256) -> f32 {
        let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hsum_epi32(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
        _mm_cvtsi128_si32(s)
    }

    /// [`super::merged`], 16 values at a time (it was 2% of a 1.1B Q4_0 decode one value at a
    /// time, on the critical path: one thread quantizes a decoded token).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn merged(dst: &mut [u8], q1: &[i8], q2: &[i8]) {
        // Within each 128-bit lane, i16 slots 0..8 → 0, 2, 1, 3, 4, 6, 5, 7.
        let order = _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15));
        for i in (0..q1.len()).step_by(16) {
            // SAFETY: i + 16 ≤ len for q1 and q2, 2·(i + 16) ≤ dst.len() (checked by the caller).
            unsafe {
                let h = _mm256_cvtepi8_epi16(_mm_loadu_si128(q1.as_ptr().add(i) as *const __m128i));
                let l = _mm256_cvtepi8_epi16(_mm_loadu_si128(q2.as_ptr().add(i) as *const __m128i));
                let a = _mm256_add_epi16(_mm256_slli_epi16::<{ crate::second_level::SHIFT as i32 }>(h), l);
                _mm256_storeu_si256(dst.as_mut_ptr().add(2 * i) as *mut __m256i, _mm256_shuffle_epi8(a, order));
            }
        }
    }

    /// [`super::q8_k_bsums`], 32 quants at a time (one at a time it was 0.4% of a 1.1B
    /// Q4_K_M prompt): offset to unsigned, `vpsadbw` sums each 8, minus 16·128 a sum of 16.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn q8_k_bsums(qs: &[i8; QK_K]) -> [i16; QK_K / 16] {
        let mut out = [0i16; QK_K / 16];
        let bias = _mm256_set1_epi8(-128);
        for k in 0..QK_K / 32 {
            // SAFETY: 32 bytes at 32k inside the 256 quants.
            let v = unsafe { _mm256_loadu_si256(qs.as_ptr().add(32 * k) as *const __m256i) };
            // q + 128 as u8, summed per 8 bytes into the four 64-bit lanes.
            let s8 = _mm256_sad_epu8(_mm256_xor_si256(v, bias), _mm256_setzero_si256());
            let s16 = _mm256_add_epi64(s8, _mm256_shuffle_epi32::<0b01_00_11_10>(s8));
            out[2 * k] = (_mm256_extract_epi32::<0>(s16) - 16 * 128) as i16;
            out[2 * k + 1] = (_mm256_extract_epi32::<4>(s16) - 16 * 128) as i16;
        }
        out
    }

    /// 32 i32 in −128..=127 → 32 i8 in order.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn pack32(q: [__m256i; 4]) -> __m256i {
        // packs work per 128-bit lane: the result holds the dwords in order 0,4,1,5,2,6,3,7.
        let w = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }

    /// `quantize_row_q8_1_ref` (and q8_0's qs, d) for one block; None → use the reference.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn q8_block(x: &[f32; QK]) -> Option<Q8Block> {
        // SAFETY: 4 × 8 loads inside the 32 values.
        let v: [__m256; 4] = std::array::from_fn(|i| unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * i)) });
        let fin = _mm256_and_ps(_mm256_and_ps(finite(v[0]), finite(v[1])), _mm256_and_ps(finite(v[2]), finite(v[3])));
        if _mm256_movemask_ps(fin) != 0xff {
            return None;
        }
        let m = _mm256_max_ps(_mm256_max_ps(abs(v[0]), abs(v[1])), _mm256_max_ps(abs(v[2]), abs(v[3])));
        let amax = hmax(m);
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        if !id.is_finite() {
            return None;
        }
        let idv = _mm256_set1_ps(id);
        let half = _mm256_set1_ps(0.5);
        let one = _mm256_set1_ps(1.0);
        let sign = _mm256_set1_ps(-0.0);
        let q: [__m256i; 4] = std::array::from_fn(|i| {
            // roundf (halves away from zero), exactly: trunc, then ±1 if the dropped part
            // is at least one half (x − trunc(x) is exact).
            let p = _mm256_mul_ps(v[i], idv);
            let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(p);
            let up = _mm256_cmp_ps::<_CMP_GE_OQ>(abs(_mm256_sub_ps(p, t)), half);
            let step = _mm256_or_ps(_mm256_and_ps(p, sign), one);
            _mm256_cvttps_epi32(_mm256_add_ps(t, _mm256_and_ps(up, step)))
        });
        let sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
        let mut qs = [0i8; QK];
        // SAFETY: 32 bytes into a 32-byte array.
        unsafe { _mm256_storeu_si256(qs.as_mut_ptr() as *mut __m256i, pack32(q)) };
        Some(Q8Block { qs, d: F16Bytes::from_f32(d), sum, s: F16Bytes::from_f32(sum as f32 * d) })
    }

    /// `quantize_row_q8_K_ref` for one block; None → use the reference.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn q8_k_block(x: &[f32; QK_K]) -> Option<BlockQ8K> {
        // SAFETY: 32 × 8 loads inside the 256 values.
        let v: [__m256; 32] = std::array::from_fn(|i| unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * i)) });
        let mut fin = finite(v[0]);
        let mut m = abs(v[0]);
        for &vi in &v[1..] {
            fin = _mm256_and_ps(fin, finite(vi));
            m = _mm256_max_ps(m, abs(vi));
        }
        if _mm256_movemask_ps(fin) != 0xff {
            return None;
        }
        let amax = hmax(m);
        let mut blk: BlockQ8K = bytemuck::Zeroable::zeroed();
        if amax == 0.0 {
            return Some(blk);
        }
        // The first value of largest magnitude, with its sign (signed_absmax).
        let am = _mm256_set1_ps(amax);
        let first = v
            .iter()
            .enumerate()
            .find_map(|(i, &vi)| {
                let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(abs(vi), am));
                (hit != 0).then(|| 8 * i + hit.trailing_zeros() as usize)
            })
            .expect("amax is one of the values");
        let iscale = -127.0 / x[first];
        if !iscale.is_finite() {
            return None;
        }
        let sv = _mm256_set1_ps(iscale);
        let magic = _mm256_set1_ps(12_582_912.0);
        let q: [__m256i; 32] = std::array::from_fn(|i| {
            // nearest_int: the bits of (v + 1.5·2^23), then min(127).
            let b = _mm256_castps_si256(_mm256_add_ps(_mm256_mul_ps(v[i], sv), magic));
            let n =
                _mm256_sub_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x007f_ffff)), _mm256_set1_epi32(0x0040_0000));
            _mm256_min_epi32(n, _mm256_set1_epi32(127))
        });
        for j in 0..QK_K / 16 {
            blk.bsums[j] = hsum_epi32(_mm256_add_epi32(q[2 * j], q[2 * j + 1])) as i16;
        }
        for k in 0..QK_K / 32 {
            let packed = pack32([q[4 * k], q[4 * k + 1], q[4 * k + 2], q[4 * k + 3]]);
            // SAFETY: 32 bytes at 32k inside the 256 qs.
            unsafe { _mm256_storeu_si256(blk.qs.as_mut_ptr().add(32 * k) as *mut __m256i, packed) };
        }
        blk.d = 1.0 / iscale;
        Some(blk)
    }
}
