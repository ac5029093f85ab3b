//! x86-64 [`Arch`] implementations: AVX-512 with VNNI (16 rows per zmm), and AVX2 with or
//! without AVX-VNNI (8 rows per ymm, a group in two slices).
//!
//! Without VNNI, `dot` is `vpmaddubsw` + `vpmaddwd` (u8×i8 pairs into i16, then into i32);
//! the i16 pair sums cannot saturate because packed weight bytes are below 64 (Q8_0, whose
//! bytes are full range, goes through the signed `vpsignb` form instead).

use std::arch::x86_64::*;

use super::GemmKernels;
use super::kernels::{Arch, Tuned, kernel_set};

pub(super) fn available() -> Vec<GemmKernels> {
    let mut v = Vec::new();
    let base = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c");
    if base
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
    {
        v.push(avx512vnni::KERNELS);
    }
    if base && is_x86_feature_detected!("avxvnni") {
        v.push(avx2vnni::KERNELS);
    }
    if base {
        v.push(avx2::KERNELS);
    }
    v
}

#[inline(always)]
unsafe fn rd_i32(p: *const u8) -> i32 {
    // SAFETY: the caller passes 4 readable bytes.
    unsafe { (p as *const i32).read_unaligned() }
}

#[inline(always)]
unsafe fn rd_f32(p: *const u8) -> f32 {
    // SAFETY: the caller passes 4 readable bytes.
    unsafe { (p as *const f32).read_unaligned() }
}

/// `vpdpwssd` with the 4 bytes at `a` broadcast, in assembly: LLVM turns the intrinsic into
/// `acc + vpmaddwd(w, a)` and reassociates the sums of a chain of them, which in the Q6_K
/// pair tile became a zeroed register, a dot and an add per step, with the broadcasts hoisted
/// and spilled (two-level prompts at half speed). Opaque, it stays one instruction with the
/// broadcast in its memory operand. (`#[inline]`, not always: it carries target features; it
/// is inlined into the kernel set's entry points, which have them.)
#[target_feature(enable = "avx512f,avx512vnni")]
#[inline]
unsafe fn dpwssd_bcast(mut acc: __m512i, w: __m512i, a: *const u8) -> __m512i {
    // SAFETY: `a` is valid for 4 bytes (the trait's contract); the CPU has the features.
    unsafe {
        std::arch::asm!(
            "vpdpwssd {acc}, {w}, dword ptr [{a}]{{1to16}}",
            acc = inout(zmm_reg) acc,
            w = in(zmm_reg) w,
            a = in(reg) a,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    acc
}

/// AVX-VNNI's `vpdpwssd`, in assembly for the reason [`dpwssd_bcast`] is.
#[target_feature(enable = "avx2,avxvnni")]
#[inline]
unsafe fn dpwssd_avx(mut acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
    // SAFETY: register operands only; the CPU has the features.
    unsafe {
        std::arch::asm!(
            "{{vex}} vpdpwssd {acc}, {w}, {a}",
            acc = inout(ymm_reg) acc,
            w = in(ymm_reg) w,
            a = in(ymm_reg) a,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// AVX-512 F/BW/VL + VNNI, with F16C for the scales.
#[derive(Clone, Copy)]
pub(super) struct Avx512;

/// A `pshufb` mask (one 128-bit lane) that puts byte `j` (< 4) of each 32-bit lane into
/// bytes 0 and 2 of that lane and zeros bytes 1 and 3 (see `Arch::byte_lane_x2`).
#[inline(always)]
fn lane_x2_mask(j: u32) -> __m128i {
    debug_assert!(j < 4);
    // Per 32-bit lane L: bytes (4L + j, 0x80, 4L + j, 0x80); a set top bit zeroes the byte.
    let m = |lane: u32| (((4 * lane + j) * 0x1_0001) | 0x8000_8000) as i32;
    // SAFETY: plain integers to a vector (SSE2, baseline on x86-64).
    unsafe { _mm_setr_epi32(m(0), m(1), m(2), m(3)) }
}

// SAFETY (all methods): only called from `#[target_feature]` entry points of the set below,
// which `available()` hands out only when the CPU has those features; pointers are valid by the
// trait's contract.
impl Arch for Avx512 {
    const LANES: usize = 16;
    const NMAX: usize = 8;
    const CHAINS: usize = 2;
    const CHAINS_K: usize = 2;
    const Q8_BIASED: bool = true;
    type V = __m512i;
    type F = __m512;
    type W8 = __m512i;

    #[inline(always)]
    unsafe fn zero() -> __m512i {
        unsafe { _mm512_setzero_si512() }
    }
    #[inline(always)]
    unsafe fn splat8(x: u8) -> __m512i {
        unsafe { _mm512_set1_epi8(x as i8) }
    }
    #[inline(always)]
    unsafe fn splat32(x: u32) -> __m512i {
        unsafe { _mm512_set1_epi32(x as i32) }
    }
    #[inline(always)]
    unsafe fn load(p: *const u8) -> __m512i {
        unsafe { _mm512_loadu_si512(p as *const __m512i) }
    }
    #[inline(always)]
    unsafe fn and(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_and_si512(a, b) }
    }
    #[inline(always)]
    unsafe fn or(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_or_si512(a, b) }
    }
    #[inline(always)]
    unsafe fn srli16<const S: u32>(a: __m512i) -> __m512i {
        unsafe { _mm512_srli_epi16::<S>(a) }
    }
    #[inline(always)]
    unsafe fn srli32<const S: u32>(a: __m512i) -> __m512i {
        unsafe { _mm512_srli_epi32::<S>(a) }
    }
    #[inline(always)]
    unsafe fn slli32<const S: u32>(a: __m512i) -> __m512i {
        unsafe { _mm512_slli_epi32::<S>(a) }
    }
    #[inline(always)]
    unsafe fn add32(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_add_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn byte_lane(a: __m512i, j: u32) -> __m512i {
        unsafe { _mm512_and_si512(_mm512_srl_epi32(a, _mm_cvtsi32_si128(8 * j as i32)), _mm512_set1_epi32(0xff)) }
    }
    #[inline(always)]
    unsafe fn byte_lane_x2(a: __m512i, j: u32) -> __m512i {
        unsafe { _mm512_shuffle_epi8(a, _mm512_broadcast_i32x4(lane_x2_mask(j))) }
    }
    #[inline(always)]
    unsafe fn bcast_i32(p: *const u8) -> __m512i {
        unsafe { _mm512_set1_epi32(rd_i32(p)) }
    }
    #[inline(always)]
    unsafe fn dot(acc: __m512i, w: __m512i, a: *const u8) -> __m512i {
        unsafe { _mm512_dpbusd_epi32(acc, w, Self::bcast_i32(a)) }
    }
    #[inline(always)]
    unsafe fn prep_q8(w: __m512i) -> __m512i {
        w
    }
    #[inline(always)]
    unsafe fn dot_q8(acc: __m512i, w: __m512i, a: *const u8) -> __m512i {
        unsafe { Self::dot(acc, w, a) }
    }
    #[inline(always)]
    unsafe fn dot16(acc: __m512i, w: __m512i, a: *const u8) -> __m512i {
        unsafe { dpwssd_bcast(acc, w, a) }
    }
    #[inline(always)]
    unsafe fn madd16(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_add_epi32(acc, _mm512_madd_epi16(a, b)) }
    }
    #[inline(always)]
    unsafe fn sub16(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_sub_epi16(a, b) }
    }
    #[inline(always)]
    unsafe fn set_bit4(w: __m512i, bits: *const u8) -> __m512i {
        unsafe {
            let k = (bits as *const u64).read_unaligned();
            _mm512_mask_add_epi8(w, k, w, _mm512_set1_epi8(16))
        }
    }
    #[inline(always)]
    unsafe fn zero_f() -> __m512 {
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn cvt(a: __m512i) -> __m512 {
        unsafe { _mm512_cvtepi32_ps(a) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn fnmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        unsafe { _mm512_fnmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn add_f(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn bcast_f32(p: *const u8) -> __m512 {
        unsafe { _mm512_set1_ps(rd_f32(p)) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u8) -> __m512 {
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u8) -> __m512 {
        unsafe {
            let h = _mm256_loadu_si256(p as *const __m256i);
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
    }
    #[inline(always)]
    unsafe fn load_i8f(p: *const u8) -> __m512 {
        unsafe { _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i))) }
    }
    #[inline(always)]
    unsafe fn store(a: __m512, p: *mut f32) {
        unsafe { _mm512_storeu_ps(p, a) }
    }
    #[inline(always)]
    unsafe fn prefetch(p: *const u8) {
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p as *const i8) }
    }
}

/// AVX2 + FMA + F16C, with AVX-VNNI's `vpdpbusd`/`vpdpwssd` when `VNNI`.
#[derive(Clone, Copy)]
pub(super) struct Avx2<const VNNI: bool>;

// SAFETY: as for Avx512 (the VNNI = true instantiation is only used by the avxvnni set).
impl<const VNNI: bool> Arch for Avx2<VNNI> {
    const LANES: usize = 8;
    const NMAX: usize = 4;
    const CHAINS: usize = 2;
    const CHAINS_K: usize = 1;
    const Q8_BIASED: bool = VNNI;
    type V = __m256i;
    type F = __m256;
    /// (q + 128) with VNNI; (|q|, q) without.
    type W8 = (__m256i, __m256i);

    #[inline(always)]
    unsafe fn zero() -> __m256i {
        unsafe { _mm256_setzero_si256() }
    }
    #[inline(always)]
    unsafe fn splat8(x: u8) -> __m256i {
        unsafe { _mm256_set1_epi8(x as i8) }
    }
    #[inline(always)]
    unsafe fn splat32(x: u32) -> __m256i {
        unsafe { _mm256_set1_epi32(x as i32) }
    }
    #[inline(always)]
    unsafe fn load(p: *const u8) -> __m256i {
        unsafe { _mm256_loadu_si256(p as *const __m256i) }
    }
    #[inline(always)]
    unsafe fn and(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_and_si256(a, b) }
    }
    #[inline(always)]
    unsafe fn or(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_or_si256(a, b) }
    }
    #[inline(always)]
    unsafe fn srli16<const S: u32>(a: __m256i) -> __m256i {
        unsafe { _mm256_srl_epi16(a, _mm_cvtsi32_si128(S as i32)) }
    }
    #[inline(always)]
    unsafe fn srli32<const S: u32>(a: __m256i) -> __m256i {
        unsafe { _mm256_srl_epi32(a, _mm_cvtsi32_si128(S as i32)) }
    }
    #[inline(always)]
    unsafe fn slli32<const S: u32>(a: __m256i) -> __m256i {
        unsafe { _mm256_sll_epi32(a, _mm_cvtsi32_si128(S as i32)) }
    }
    #[inline(always)]
    unsafe fn add32(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_add_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn byte_lane(a: __m256i, j: u32) -> __m256i {
        unsafe { _mm256_and_si256(_mm256_srl_epi32(a, _mm_cvtsi32_si128(8 * j as i32)), _mm256_set1_epi32(0xff)) }
    }
    #[inline(always)]
    unsafe fn byte_lane_x2(a: __m256i, j: u32) -> __m256i {
        unsafe { _mm256_shuffle_epi8(a, _mm256_broadcastsi128_si256(lane_x2_mask(j))) }
    }
    #[inline(always)]
    unsafe fn bcast_i32(p: *const u8) -> __m256i {
        unsafe { _mm256_set1_epi32(rd_i32(p)) }
    }
    #[inline(always)]
    unsafe fn dot(acc: __m256i, w: __m256i, a: *const u8) -> __m256i {
        unsafe {
            if VNNI {
                _mm256_dpbusd_avx_epi32(acc, w, Self::bcast_i32(a))
            } else {
                let p16 = _mm256_maddubs_epi16(w, Self::bcast_i32(a));
                _mm256_add_epi32(acc, _mm256_madd_epi16(p16, _mm256_set1_epi16(1)))
            }
        }
    }
    #[inline(always)]
    unsafe fn prep_q8(w: __m256i) -> (__m256i, __m256i) {
        unsafe {
            if VNNI {
                (w, w)
            } else {
                let q = _mm256_xor_si256(w, _mm256_set1_epi8(-128));
                (_mm256_sign_epi8(q, q), q)
            }
        }
    }
    #[inline(always)]
    unsafe fn dot_q8(acc: __m256i, w: (__m256i, __m256i), a: *const u8) -> __m256i {
        unsafe {
            if VNNI {
                Self::dot(acc, w.0, a)
            } else {
                // |q| · (a with q's sign): u8 × i8 pairs, |sum| ≤ 2·128·127 < 2^15.
                let sa = _mm256_sign_epi8(Self::bcast_i32(a), w.1);
                let p16 = _mm256_maddubs_epi16(w.0, sa);
                _mm256_add_epi32(acc, _mm256_madd_epi16(p16, _mm256_set1_epi16(1)))
            }
        }
    }
    #[inline(always)]
    unsafe fn dot16(acc: __m256i, w: __m256i, a: *const u8) -> __m256i {
        unsafe {
            if VNNI {
                dpwssd_avx(acc, w, Self::bcast_i32(a))
            } else {
                _mm256_add_epi32(acc, _mm256_madd_epi16(w, Self::bcast_i32(a)))
            }
        }
    }
    #[inline(always)]
    unsafe fn madd16(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)) }
    }
    #[inline(always)]
    unsafe fn sub16(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_sub_epi16(a, b) }
    }
    const PARTIAL16: bool = !VNNI;
    #[inline(always)]
    unsafe fn dot_part(w: __m256i, a: *const u8) -> __m256i {
        unsafe {
            if VNNI {
                _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), w, Self::bcast_i32(a))
            } else {
                _mm256_maddubs_epi16(w, Self::bcast_i32(a))
            }
        }
    }
    #[inline(always)]
    unsafe fn add_part(p: __m256i, q: __m256i) -> __m256i {
        unsafe { if VNNI { _mm256_add_epi32(p, q) } else { _mm256_add_epi16(p, q) } }
    }
    #[inline(always)]
    unsafe fn set_bit4(w: __m256i, bits: *const u8) -> __m256i {
        unsafe {
            // Byte i takes bit i of the 32 bits: spread byte i/8 of the word to byte i, test
            // bit i%8.
            let v = _mm256_set1_epi32(rd_i32(bits));
            let shuf = _mm256_setr_epi8(
                0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
            );
            let bitmask = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
            let on = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, shuf), bitmask), bitmask);
            _mm256_or_si256(w, _mm256_and_si256(on, _mm256_set1_epi8(16)))
        }
    }
    #[inline(always)]
    unsafe fn zero_f() -> __m256 {
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn cvt(a: __m256i) -> __m256 {
        unsafe { _mm256_cvtepi32_ps(a) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn fnmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        unsafe { _mm256_fnmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn add_f(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn bcast_f32(p: *const u8) -> __m256 {
        unsafe { _mm256_set1_ps(rd_f32(p)) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u8) -> __m256 {
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u8) -> __m256 {
        unsafe {
            let h = _mm_loadu_si128(p as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
    }
    #[inline(always)]
    unsafe fn load_i8f(p: *const u8) -> __m256 {
        unsafe { _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i))) }
    }
    #[inline(always)]
    unsafe fn store(a: __m256, p: *mut f32) {
        unsafe { _mm256_storeu_ps(p, a) }
    }
    #[inline(always)]
    unsafe fn prefetch(p: *const u8) {
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p as *const i8) }
    }
}

kernel_set!(pub(super) avx512vnni, "avx512vnni", Avx512, true, [
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
]);
kernel_set!(pub(super) avx2vnni, "avx2+avxvnni", Avx2<true>, true, [#[target_feature(enable = "avx2,fma,f16c,avxvnni")]]);
kernel_set!(pub(super) avx2, "avx2", Avx2<false>, true, [#[target_feature(enable = "avx2,fma,f16c")]]);

// Alternative tunings, for benchmarks only (`variants()`): tile size, chains, chains (K).
kernel_set!(avx512_n8c11, "avx512vnni/n8c1,1", Tuned<Avx512, 8, 1, 1>, true, [#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]]);
kernel_set!(avx512_n4c22, "avx512vnni/n4c2,2", Tuned<Avx512, 4, 2, 2>, true, [#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]]);
kernel_set!(avx2vnni_n4c11, "avx2+avxvnni/n4c1,1", Tuned<Avx2<true>, 4, 1, 1>, true, [#[target_feature(enable = "avx2,fma,f16c,avxvnni")]]);
kernel_set!(avx2vnni_n3c22, "avx2+avxvnni/n3c2,2", Tuned<Avx2<true>, 3, 2, 2>, true, [#[target_feature(enable = "avx2,fma,f16c,avxvnni")]]);
kernel_set!(avx2_n4c11, "avx2/n4c1,1", Tuned<Avx2<false>, 4, 1, 1>, true, [#[target_feature(enable = "avx2,fma,f16c")]]);

/// Other tile sizes and chain counts of the sets above that this CPU can run.
pub(super) fn variants() -> Vec<GemmKernels> {
    let names: Vec<&str> = available().iter().map(|k| k.name).collect();
    let mut v = Vec::new();
    if names.contains(&"avx512vnni") {
        v.extend([avx512_n8c11::KERNELS, avx512_n4c22::KERNELS]);
    }
    if names.contains(&"avx2+avxvnni") {
        v.extend([avx2vnni_n4c11::KERNELS, avx2vnni_n3c22::KERNELS]);
    }
    if names.contains(&"avx2") {
        v.push(avx2_n4c11::KERNELS);
    }
    v
}
