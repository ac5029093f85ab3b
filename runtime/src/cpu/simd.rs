//! AVX2 building blocks shared by the CPU backend's vector kernels (attention, SwiGLU, the
//! quantized-cache loops).

use std::arch::x86_64::*;

/// `$kernel::<NG>(args…)` for a head of `$groups` groups of 32 values, NG = 1..=4 (4 for
/// anything larger; each caller's kernel asserts or is given at most 128 values): the
/// attention loops keep a head's lanes in registers, so its width is a constant.
macro_rules! by_head_groups {
    ($groups:expr, $kernel:ident($($arg:expr),* $(,)?)) => {
        match $groups {
            1 => $kernel::<1>($($arg),*),
            2 => $kernel::<2>($($arg),*),
            3 => $kernel::<3>($($arg),*),
            _ => $kernel::<4>($($arg),*),
        }
    };
}
pub(crate) use by_head_groups;

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

/// Whether this CPU runs the AVX2 + FMA + F16C kernels (std caches the CPUID answers: a
/// couple of loads).
#[inline]
pub(crate) fn avx2() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

/// The f16 at `p` (little-endian, any alignment) as f32.
///
/// # Safety
/// Two bytes readable at `p`; F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn f16_at(p: *const u8) -> f32 {
    unsafe {
        let bits = (p as *const u16).read_unaligned();
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    }
}

/// The 32 unsigned codes of one packed group (`duet_quant::kv::pack`) as u8 lanes 0..32.
///
/// # Safety
/// `packed_bytes(bits)` bytes readable at `p`; AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn codes_u8(bits: u32, p: *const u8) -> __m256i {
    unsafe {
        // Low nibbles are codes 0..16, high nibbles 16..32.
        let nibbles = |bytes: __m128i| {
            let m = _mm_set1_epi8(0x0F);
            _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(bytes, 4), m), _mm_and_si128(bytes, m))
        };
        // The 2-bit layout (also the top bits at 6): a 64-bit word shifted by 0, 2, 4, 6 holds
        // codes 0-7, 8-15, 16-23, 24-31 in its bytes' low 2 bits.
        let pairs = |p: *const u8| {
            let w = _mm256_set1_epi64x((p as *const i64).read_unaligned());
            _mm256_and_si256(_mm256_srlv_epi64(w, _mm256_set_epi64x(6, 4, 2, 0)), _mm256_set1_epi8(3))
        };
        match bits {
            8 => _mm256_loadu_si256(p as *const __m256i),
            4 => nibbles(_mm_loadu_si128(p as *const __m128i)),
            2 => pairs(p),
            // Bit 2 of code j is bit j of the u32 after the pairs: byte j / 8 of it copied to
            // lane j, then lane j's bit j % 8 tested.
            3 => {
                let w = _mm256_set1_epi32((p.add(8) as *const i32).read_unaligned());
                let spread = _mm256_shuffle_epi8(
                    w,
                    _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0),
                );
                let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
                let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
                _mm256_or_si256(pairs(p), _mm256_and_si256(set, _mm256_set1_epi8(4)))
            }
            // The low 4 bits as at 4 bits; the top 2 bits of codes j, j+8, j+16, j+24 in bits
            // 0-1, 2-3, 4-5, 6-7 of byte 16 + j (j < 8).
            _ => {
                let lo = nibbles(_mm_loadu_si128(p as *const __m128i));
                _mm256_or_si256(lo, _mm256_slli_epi16(pairs(p.add(16)), 4))
            }
        }
    }
}

/// A query rounded to i16: per group of 32, its lanes (two registers of 16) and its scale.
pub(crate) type QueryI16<const NG: usize> = ([[__m256i; 2]; NG], [f32; NG]);

/// A query of `NG`·32 values rounded to i16 per group of 32 for the integer score loops:
/// each group's i16 lanes (two registers of 16) and its scale absmax/32767 (a relative error
/// of 2^-16 of the group's largest value; ties round to even). `None` when the query is not
/// finite.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn query_i16<const NG: usize>(q: &[f32]) -> Option<QueryI16<NG>> {
    query_i16_rounded::<NG>(q, None)
}

/// [`query_i16`] at two levels: the query rounded to i16, then its rounding error rounded to
/// i16 again (relative error 2^-31 of each group's largest value), for queries whose values
/// span many orders of magnitude within a group (a per-channel cache's q·step).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn query_i16x2<const NG: usize>(q: &[f32]) -> Option<[QueryI16<NG>; 2]> {
    let mut rest = [0f32; 128];
    let hi = query_i16_rounded::<NG>(q, Some(&mut rest[..NG * 32]))?;
    let lo = query_i16::<NG>(&rest[..NG * 32])?;
    Some([hi, lo])
}

/// [`query_i16`], writing `q − rounded` into `rest` when given.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn query_i16_rounded<const NG: usize>(
    q: &[f32],
    mut rest: Option<&mut [f32]>,
) -> Option<([[__m256i; 2]; NG], [f32; NG])> {
    let mut qv = [[_mm256_setzero_si256(); 2]; NG];
    let mut dq = [0f32; NG];
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    for (g, (qg, d)) in qv.iter_mut().zip(&mut dq).enumerate() {
        // SAFETY: q holds NG·32 values (the callers' contract), 8 read at a time.
        let x: [__m256; 4] = std::array::from_fn(|k| unsafe { _mm256_loadu_ps(q.as_ptr().add(32 * g + 8 * k)) });
        let m = x.iter().fold(_mm256_setzero_ps(), |m, v| _mm256_max_ps(m, _mm256_and_ps(*v, abs_mask)));
        let amax = hmax(m);
        // NaN lanes are skipped by max: look for them (and ±inf) directly.
        if !amax.is_finite() || x.iter().any(|v| _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(*v, *v)) != 0) {
            return None;
        }
        *d = amax / 32767.0;
        let inv = _mm256_set1_ps(if amax > 0.0 { 32767.0 / amax } else { 0.0 });
        let i: [__m256i; 4] = std::array::from_fn(|k| _mm256_cvtps_epi32(_mm256_mul_ps(x[k], inv)));
        if let Some(rest) = rest.as_deref_mut() {
            let dv = _mm256_set1_ps(*d);
            for k in 0..4 {
                let r = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(i[k]), dv, x[k]);
                // SAFETY: rest holds NG·32 values like q.
                unsafe { _mm256_storeu_ps(rest.as_mut_ptr().add(32 * g + 8 * k), r) };
            }
        }
        // packs interleaves 128-bit lanes: (0,1) packs to lanes [0a 1a 0b 1b]; permute back.
        qg[0] = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(i[0], i[1]));
        qg[1] = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(i[2], i[3]));
    }
    Some((qv, dq))
}

/// The largest of the 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn hmax(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
}
