//! AVX2 building blocks shared by the CPU backend's vector kernels (attention, SwiGLU, the
//! quantized-cache loops).

use std::arch::x86_64::*;

/// The sum of the 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// e^x, Cephes' expf (within 2 ulp over [−87.3, 88.7]; clamped outside, NaN → e^−87.3).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn exp(x: __m256) -> __m256 {
    let x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3)), _mm256_set1_ps(88.7));
    let fx = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693_359_4), x);
    let r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut y = _mm256_set1_ps(1.987_569_1e-4);
    for c in [1.398_2e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5] {
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
    }
    let y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0)));
    let pow2 = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)));
    _mm256_mul_ps(y, _mm256_castsi256_ps(pow2))
}
