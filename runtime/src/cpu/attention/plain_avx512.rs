//! The attention logits `scale · q · K[j]` of [`super`] in 16 lanes, for CPUs with AVX-512F.
//!
//! Decoding deep in a context spends most of its time in attention (SmolLM2 at 4,096
//! positions: two thirds of a token), and its logits are compute-bound, not memory-bound: a
//! KV head's rows are read by every query head of its group while they are still in cache.
//! Sixteen lanes halve the conversions and multiply-adds of the 8-lane form; rows go four at
//! a time, the query held in registers and the four dot products reduced together. Every row
//! is summed in the same order whether it falls in a group of four or not, so a logit does
//! not depend on where the cache's pages split a sequence. Only head sizes that are
//! multiples of 16 up to 128 come here (the callers fall back to the 8-lane form otherwise).
//! (The weighted sum of values stays 8-lane: its chains of multiply-adds run through every
//! row in order, which keeps it independent of the pages too, and on a CPU that splits a
//! 512-bit multiply-add in two, 16 lanes gain nothing there.)

// Registers, rows and chunks are parallel arrays indexed by chunk or row.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::esize;

static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Whether this CPU has the instructions below, the program did not keep attention to the
/// 8-lane forms ([`keep_to_avx2`]), and `hd` fits their register layout.
#[inline]
pub fn usable(hd: usize) -> bool {
    hd.is_multiple_of(16) && hd <= 128 && *ON.get_or_init(|| is_x86_feature_detected!("avx512f"))
}

/// Keeps attention to the 8-lane AVX2 forms for the rest of the process (to measure or test
/// them on an AVX-512 CPU). Refused once attention ran with the 16-lane forms.
pub fn keep_to_avx2() -> Result<(), &'static str> {
    ON.set(false)
        .or_else(|_| if *ON.get_or_init(|| false) { Err("attention's kernels were chosen before") } else { Ok(()) })
}

/// 16 values at element `i` of a row of f16 (`F16`) or f32.
///
/// # Safety
/// `p` + 16 elements at `i` must be readable.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn ld16<const F16: bool>(p: *const u8, i: usize) -> __m512 {
    // SAFETY: forwarded.
    unsafe {
        if F16 {
            _mm512_cvtph_ps(_mm256_loadu_si256(p.add(2 * i) as *const __m256i))
        } else {
            _mm512_loadu_ps((p as *const f32).add(i))
        }
    }
}

/// The sums of the lanes of a, b, c and d, in that order.
#[inline]
#[target_feature(enable = "avx512f")]
fn sum4(a: __m512, b: __m512, c: __m512, d: __m512) -> [f32; 4] {
    // 128-bit lanes: [a0+a2, a1+a3, b0+b2, b1+b3], then [a, b, c, d] one quarter each.
    let ab = _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(a, b), _mm512_shuffle_f32x4::<0xEE>(a, b));
    let cd = _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(c, d), _mm512_shuffle_f32x4::<0xEE>(c, d));
    let q = _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(ab, cd), _mm512_shuffle_f32x4::<0xDD>(ab, cd));
    // Within each quarter: pairs, then the two halves.
    let q = _mm512_add_ps(q, _mm512_permute_ps::<0x4E>(q));
    let q = _mm512_add_ps(q, _mm512_permute_ps::<0xB1>(q));
    let mut lanes = [0f32; 16];
    // SAFETY: 16 f32 into a 16-element array.
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), q) };
    [lanes[0], lanes[4], lanes[8], lanes[12]]
}

/// `out[j] = scale · q · K[j]`, rows `stride` elements apart.
///
/// # Safety
/// [`usable`]`(q.len())`, and every row j < out.len() has q.len() readable elements at
/// `j·stride`.
#[target_feature(enable = "avx512f")]
pub unsafe fn scores<const F16: bool>(q: &[f32], k: *const u8, stride: usize, scale: f32, out: &mut [f32]) {
    let hd = q.len();
    let nc = hd / 16;
    let row_bytes = stride * esize(F16);
    // SAFETY: nc ≤ 8 chunks of 16 inside q.
    let qv: [__m512; 8] = std::array::from_fn(|c| {
        if c < nc { unsafe { _mm512_loadu_ps(q.as_ptr().add(16 * c)) } } else { _mm512_setzero_ps() }
    });
    let n = out.len();
    let mut j = 0;
    // SAFETY: rows below n are readable (the caller's contract).
    unsafe {
        while j + 4 <= n {
            let row = |r: usize| k.wrapping_add((j + r) * row_bytes);
            let s = [
                row_sum::<F16>(row(0), &qv, nc),
                row_sum::<F16>(row(1), &qv, nc),
                row_sum::<F16>(row(2), &qv, nc),
                row_sum::<F16>(row(3), &qv, nc),
            ];
            let sums = sum4(s[0], s[1], s[2], s[3]);
            for r in 0..4 {
                out[j + r] = sums[r] * scale;
            }
            j += 4;
        }
        // The last rows alone, with the same chains and reduction as in a group of four, so
        // that a row's logit does not depend on where its group starts (the cache's pages
        // split a sequence into runs, and a shared prefix must give a cold run's logits).
        while j < n {
            let s = row_sum::<F16>(k.wrapping_add(j * row_bytes), &qv, nc);
            out[j] = sum4(s, s, s, s)[0] * scale;
            j += 1;
        }
    }
}

/// One row's products with the query (`nc` chunks of 16 in `qv`) in two chains, even and odd
/// chunks (the last odd one into the even chain), added lane by lane. The rows of a group of
/// four are independent chains that the CPU overlaps.
///
/// # Safety
/// `row` must have 16·nc readable elements.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn row_sum<const F16: bool>(row: *const u8, qv: &[__m512; 8], nc: usize) -> __m512 {
    let (mut even, mut odd) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut c = 0;
    // SAFETY: forwarded.
    unsafe {
        while c + 2 <= nc {
            even = _mm512_fmadd_ps(ld16::<F16>(row, 16 * c), qv[c], even);
            odd = _mm512_fmadd_ps(ld16::<F16>(row, 16 * c + 16), qv[c + 1], odd);
            c += 2;
        }
        if c < nc {
            even = _mm512_fmadd_ps(ld16::<F16>(row, 16 * c), qv[c], even);
        }
    }
    _mm512_add_ps(even, odd)
}
