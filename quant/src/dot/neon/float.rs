//! f32, f16 and bf16 weights against f32 activations.
//!
//! Sixteen elements per step into four independent FMA accumulators (an FMA's latency is
//! about four times its issue interval on current cores), then a vector of four, then a scalar
//! tail, which also makes any length work.

use std::arch::aarch64::*;
use std::arch::asm;

/// Four f32 from `s[at..at + 4]` (bounds-checked).
#[inline]
#[target_feature(enable = "neon")]
fn ld_f32(s: &[f32], at: usize) -> float32x4_t {
    let s = &s[at..at + 4];
    // SAFETY: `s` holds exactly 4 readable f32.
    unsafe { vld1q_f32(s.as_ptr()) }
}

/// Eight little-endian 16-bit values from bytes `w[2·at..2·at + 16]` (bounds-checked).
#[inline]
#[target_feature(enable = "neon")]
fn ld_u16x8(w: &[u8], at: usize) -> uint16x8_t {
    let s = &w[2 * at..2 * at + 16];
    // SAFETY: `s` holds exactly 16 readable bytes; a byte load has no alignment requirement,
    // and on little-endian aarch64 (the only kind `kernels()` accepts) byte 2i is the low byte
    // of lane i.
    unsafe { vreinterpretq_u16_u8(vld1q_u8(s.as_ptr())) }
}

/// Shared loop: `widen` turns eight 16-bit weights into two f32x4; `tail` is the scalar kernel
/// for the last `len % 8` elements.
#[inline]
#[target_feature(enable = "neon")]
fn dot_16bit(
    w: &[u8],
    x: &[f32],
    widen: impl Fn(uint16x8_t) -> (float32x4_t, float32x4_t),
    tail: fn(&[u8], &[f32]) -> f32,
) -> f32 {
    assert_eq!(w.len(), 2 * x.len());
    let n = x.len();
    let mut acc = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    while i + 16 <= n {
        let (a, b) = widen(ld_u16x8(w, i));
        let (c, d) = widen(ld_u16x8(w, i + 8));
        acc[0] = vfmaq_f32(acc[0], a, ld_f32(x, i));
        acc[1] = vfmaq_f32(acc[1], b, ld_f32(x, i + 4));
        acc[2] = vfmaq_f32(acc[2], c, ld_f32(x, i + 8));
        acc[3] = vfmaq_f32(acc[3], d, ld_f32(x, i + 12));
        i += 16;
    }
    if i + 8 <= n {
        let (a, b) = widen(ld_u16x8(w, i));
        acc[0] = vfmaq_f32(acc[0], a, ld_f32(x, i));
        acc[1] = vfmaq_f32(acc[1], b, ld_f32(x, i + 4));
        i += 8;
    }
    let sum = vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3]));
    vaddvq_f32(sum) + tail(&w[2 * i..], &x[i..])
}

#[target_feature(enable = "neon")]
pub(super) fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len());
    let n = w.len();
    let mut acc = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    while i + 16 <= n {
        for (k, a) in acc.iter_mut().enumerate() {
            *a = vfmaq_f32(*a, ld_f32(w, i + 4 * k), ld_f32(x, i + 4 * k));
        }
        i += 16;
    }
    while i + 4 <= n {
        acc[0] = vfmaq_f32(acc[0], ld_f32(w, i), ld_f32(x, i));
        i += 4;
    }
    let sum = vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3]));
    let mut s = vaddvq_f32(sum);
    for j in i..n {
        s += w[j] * x[j];
    }
    s
}

/// Eight f16 (as bits) to f32 with `FCVTL`/`FCVTL2`: exact, including subnormals, infinities
/// and NaNs. These are baseline AArch64 Advanced SIMD instructions (FEAT_FP16 is only needed
/// for f16 arithmetic); Rust's `vcvt_f32_f16` would do the same but needs the unstable `f16`
/// type.
#[inline]
#[target_feature(enable = "neon")]
fn f16x8_to_f32(h: uint16x8_t) -> (float32x4_t, float32x4_t) {
    let (lo, hi): (float32x4_t, float32x4_t);
    // SAFETY: register-only conversion. `lo` is an early-clobber `out`, not `lateout`: it is
    // written by the first instruction, before the second one reads `h`.
    unsafe {
        asm!(
            "fcvtl {lo:v}.4s, {h:v}.4h",
            "fcvtl2 {hi:v}.4s, {h:v}.8h",
            h = in(vreg) h,
            lo = out(vreg) lo,
            hi = lateout(vreg) hi,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    (lo, hi)
}

#[target_feature(enable = "neon")]
pub(super) fn dot_f16(w: &[u8], x: &[f32]) -> f32 {
    dot_16bit(w, x, |h| f16x8_to_f32(h), super::super::scalar::dot_f16)
}

#[target_feature(enable = "neon")]
pub(super) fn dot_bf16(w: &[u8], x: &[f32]) -> f32 {
    // bf16 is the top half of an f32: shifting each u16 left by 16 while widening is exact.
    let widen = |h| {
        let lo = vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(h)));
        let hi = vreinterpretq_f32_u32(vshll_high_n_u16::<16>(h));
        (lo, hi)
    };
    dot_16bit(w, x, widen, super::super::scalar::dot_bf16)
}
