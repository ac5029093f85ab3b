//! The second level of two-level activations: a block's rounding error after its Q8
//! quantization (ggml's Q8_0 / Q8_1 / Q8_K bytes, the first level), quantized again on a grid
//! exactly [`RATIO`] times finer than the first level's step.
//!
//! With the first level `x ≈ d·q`, the error `x − d·q` is at most about d/2 per element (a
//! little more where the stored f16 `d` differs from amax/127), so on the grid d/128 it takes
//! about ±64 levels of an i8: `q2 = round((x − d·q) · 128/d)`. What is left is at most d/256
//! per element, 1/128 of the single level's error.
//!
//! Why a fixed ratio rather than the residual's own absmax: the two steps being a power of two
//! apart lets a kernel add the levels' integer dot products before any float work,
//! `d·Σw·q + (d/128)·Σw·q2 = (d/128)·(128·Σw·q + Σw·q2)`: one conversion, one scale multiply
//! and one FMA per block for both levels (the packed Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 kernels
//! do so), and a per-row dot product can take the second level with the first level's scale
//! and divide the result by 128, exactly.

/// The first level's step over the second's.
pub const RATIO: f32 = 128.0;
/// log2 of [`RATIO`]: `is1 << SHIFT` is the first level's integer dot on the second's grid.
pub const SHIFT: u32 = 7;

/// Adding and subtracting 1.5·2²³ rounds an f32 below 2²² to the nearest integer (ties to
/// even), in a form the compiler vectorizes.
const ROUND: f32 = 12_582_912.0;

/// Second-level quants of one block: `x` its values, `d` the first level's step as it
/// dequantizes (the stored scale) and `q` the first level's quants. Writes `q2` and returns
/// Σq2. A zero or non-finite `d` gives zeros; a NaN value gives 0 and ±∞ clamps to ±127.
pub fn quantize_block(x: &[f32], d: f32, q: &[i8], q2: &mut [i8]) -> i32 {
    debug_assert!(x.len() == q.len() && q.len() == q2.len());
    let inv = if d != 0.0 && d.is_finite() { RATIO / d } else { 0.0 };
    #[cfg(target_arch = "x86_64")]
    if x.len().is_multiple_of(8) && is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked); the three slices have the same length.
        if let Some(sum) = unsafe { x86::quantize_block(x, d, inv, q, q2) } {
            return sum;
        }
    }
    scalar(x, d, inv, q, q2)
}

/// [`quantize_block`] one value at a time: the reference the SIMD path matches bit for bit.
fn scalar(x: &[f32], d: f32, inv: f32, q: &[i8], q2: &mut [i8]) -> i32 {
    let mut sum = 0;
    for ((o, &v), &q) in q2.iter_mut().zip(x).zip(q) {
        // clamp keeps NaN, which `as` turns into 0.
        let r = ((v - d * q as f32) * inv).clamp(-127.0, 127.0);
        *o = ((r + ROUND) - ROUND) as i8;
        sum += *o as i32;
    }
    sum
}

/// The second level was 2/3 of a prompt's activation quantization one value at a time
/// (0.35 against 0.12 ms for 128×2048 Q8_0 activations, `cargo bench -p duet-quant --bench
/// gemm`); eight at a time with the same operations in the same order (no FMA: `x − d·q` is
/// a product then a difference, as in [`scalar`]), so the quants are identical.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// None when a value, `d` or `inv` is not finite: [`super::scalar`] handles those (and rewrites
    /// all of `q2`). The values are checked as they are loaded: checked first, one at a time,
    /// they cost as much as the rest (0.9% of a 1.1B Q4_K_M prompt).
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_block(x: &[f32], d: f32, inv: f32, q: &[i8], q2: &mut [i8]) -> Option<i32> {
        // An infinite `inv` (a subnormal `d`) makes 0·∞ = NaN, which the scalar clamp keeps
        // (→ 0) and `max_ps`/`min_ps` would not.
        if !d.is_finite() || !inv.is_finite() {
            return None;
        }
        let (vd, vinv) = (_mm256_set1_ps(d), _mm256_set1_ps(inv));
        let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
        let (abs_mask, inf) = (_mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff)), _mm256_set1_ps(f32::INFINITY));
        let mut finite = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
        let mut sums = _mm256_setzero_si256();
        for i in (0..x.len()).step_by(8) {
            // SAFETY: i + 8 ≤ len for all three slices (len a multiple of 8, equal lengths).
            unsafe {
                let xv = _mm256_loadu_ps(x.as_ptr().add(i));
                // |x| < ∞ is false for ±∞ and NaN.
                finite = _mm256_and_ps(finite, _mm256_cmp_ps::<_CMP_LT_OQ>(_mm256_and_ps(xv, abs_mask), inf));
                let qv = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(q.as_ptr().add(i) as *const __m128i)));
                let r = _mm256_mul_ps(_mm256_sub_ps(xv, _mm256_mul_ps(vd, qv)), vinv);
                let r = _mm256_max_ps(_mm256_min_ps(r, hi), lo);
                let n = _mm256_cvtps_epi32(_mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(r));
                sums = _mm256_add_epi32(sums, n);
                // 8 i32 in −127..=127 → 8 i8 (the packs work per 128-bit lane).
                let w = _mm_packs_epi32(_mm256_castsi256_si128(n), _mm256_extracti128_si256::<1>(n));
                _mm_storel_epi64(q2.as_mut_ptr().add(i) as *mut __m128i, _mm_packs_epi16(w, w));
            }
        }
        if _mm256_movemask_ps(finite) != 0xff {
            return None;
        }
        let s = _mm_add_epi32(_mm256_castsi256_si128(sums), _mm256_extracti128_si256::<1>(sums));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        Some(_mm_cvtsi128_si32(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What is left after both levels is at most half the second level's step, d/256.
    #[test]
    fn both_levels_leave_at_most_half_a_fine_step() {
        let x: Vec<f32> =
            (0..32).map(|i| ((i * 37 % 29) as f32 - 14.0) * 0.173 + if i == 5 { 9.0 } else { 0.0 }).collect();
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        // ggml's first level with an f16 scale, as Q8_0 stores it.
        let d = half::f16::from_f32(amax / 127.0).to_f32();
        let q: Vec<i8> = x.iter().map(|&v| (v / (amax / 127.0)).round() as i8).collect();
        let mut q2 = [0i8; 32];
        let sum = quantize_block(&x, d, &q, &mut q2);
        assert_eq!(sum, q2.iter().map(|&v| v as i32).sum::<i32>());
        assert!(q2.iter().any(|&v| v != 0), "the first level left no error to quantize");
        for i in 0..32 {
            let left = x[i] - d * q[i] as f32 - d / RATIO * q2[i] as f32;
            assert!(left.abs() <= d / (2.0 * RATIO) * 1.0001, "[{i}] {left} vs step {}", d / RATIO);
        }
    }

    /// The dispatched (SIMD where the CPU has it) and the one-at-a-time quants agree bit for
    /// bit, on ordinary values, ties, huge and tiny ones.
    #[test]
    fn simd_matches_scalar() {
        let mut seed = 7u32;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        };
        for round in 0..2000 {
            let scale = [1e-30f32, 1e-3, 1.0, 7.5, 3e4][round % 5];
            let x: Vec<f32> = (0..256).map(|_| (next() as f32 / u32::MAX as f32 - 0.5) * scale).collect();
            for block in x.chunks_exact(32) {
                let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = half::f16::from_f32(amax / 127.0).to_f32();
                let q: Vec<i8> =
                    block.iter().map(|&v| if amax > 0.0 { (v * 127.0 / amax).round() as i8 } else { 0 }).collect();
                // Also a step off by a little, so that some residuals land on ties and clamps.
                for d in [d, d * 0.51, d * 1.5] {
                    let inv = if d != 0.0 && d.is_finite() { RATIO / d } else { 0.0 };
                    let (mut a, mut b) = ([0i8; 32], [0i8; 32]);
                    let sa = quantize_block(block, d, &q, &mut a);
                    let sb = scalar(block, d, inv, &q, &mut b);
                    assert_eq!((sa, a), (sb, b), "round {round}, d {d}");
                }
            }
        }
    }

    #[test]
    fn degenerate_blocks_give_zeros() {
        let q = [3i8; 4];
        let mut q2 = [9i8; 4];
        assert_eq!(quantize_block(&[0.0; 4], 0.0, &[0; 4], &mut q2), 0);
        assert_eq!(q2, [0; 4]);
        for d in [f32::NAN, f32::INFINITY] {
            q2 = [9; 4];
            assert_eq!(quantize_block(&[1.0; 4], d, &q, &mut q2), 0);
            assert_eq!(q2, [0; 4]);
        }
        q2 = [9; 4];
        quantize_block(&[f32::NAN, 1.0, f32::INFINITY, 1.0], 0.5, &[0, 2, 0, 2], &mut q2);
        assert_eq!(q2, [0, 0, 127, 0]);
        // A subnormal step: 128/d overflows, and values on the first level's grid give 0·∞.
        let d = 1e-40f32;
        let mut q2 = [9i8; 8];
        let x = [0.0, d, -d, 0.0, 3.0 * d, 0.0, 0.0, 0.0];
        let q = [0i8, 1, -1, 0, 3, 0, 0, 0];
        assert_eq!(quantize_block(&x, d, &q, &mut q2), 0);
        assert_eq!(q2, [0; 8]);
        // The same in blocks the SIMD path takes (multiples of 8), a bad value in any lane.
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for at in [0, 5, 13, 31] {
                let mut x = [1.25f32; 32];
                x[at] = bad;
                let mut q2 = [9i8; 32];
                let sum = quantize_block(&x, 0.5, &[2; 32], &mut q2);
                let mut want = [(0.25f32 * RATIO / 0.5) as i8; 32];
                want[at] = if bad.is_nan() { 0 } else { 127 * bad.signum() as i8 };
                assert_eq!((sum, q2), (want.iter().map(|&v| v as i32).sum(), want), "{bad} at {at}");
            }
        }
    }
}
