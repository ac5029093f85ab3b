//! Q4_K, Q5_K and Q6_K weights against Q8_K activations (256-element super-blocks).
//!
//! Each 16-element vector of weight levels is dotted with its activations by [`idot`] and its
//! lanes multiplied by the sub-block's scale, all in i32. Exactness of that i32 sum: a
//! super-block's |Σ scale·level·q8| is at most 256·31·128·63 ≈ 2^26 for Q5_K (Q4_K: levels
//! ≤ 15) and 256·32·128·128 = 2^27 for Q6_K (|level − 32| ≤ 32, |scale| ≤ 128), and every lane
//! holds a part of that sum, so nothing can overflow, whatever the bytes of the blocks.
//!
//! As in `legacy`, the `unsafe` blocks are register-only baseline NEON; loads go through the
//! bounds-checked [`ld_u8`]/[`ld_i8`].

use std::arch::aarch64::*;

use super::{as_i8, f16, idot, ld_i8, ld_u8};
use crate::blocks::{BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use crate::kquants::get_scale_min_k4;

/// The eight 6-bit scales and mins of a Q4_K/Q5_K super-block.
#[inline(always)]
fn scales_mins(packed: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        (sc[j], m[j]) = get_scale_min_k4(j, packed);
    }
    (sc, m)
}

/// Σ_j m[j]·(bsums[2j] + bsums[2j+1]): what the mins take away from a Q4_K/Q5_K super-block.
/// The pair sums are widened to i32 before anything else (`SADDLP`), so this is exact for any
/// i16 `bsums`: |pair| ≤ 2^16, times m ≤ 63, eight terms: < 2^25.
#[inline(always)]
fn mins_dot_bsums(m: &[u8; 8], bsums: &[i16; 16]) -> i32 {
    // SAFETY: the loads read exactly the 8 bytes of `m` and 2×8 i16 of `bsums`; the rest is
    // register-only baseline NEON.
    unsafe {
        let pairs_lo = vpaddlq_s16(vld1q_s16(bsums.as_ptr()));
        let pairs_hi = vpaddlq_s16(vld1q_s16(bsums[8..].as_ptr()));
        let m16 = vmovl_u8(vld1_u8(m.as_ptr()));
        let m_lo = vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(m16)));
        let m_hi = vreinterpretq_s32_u32(vmovl_high_u16(m16));
        vaddvq_s32(vmlaq_s32(vmulq_s32(pairs_lo, m_lo), pairs_hi, m_hi))
    }
}

/// Σ over one 32-element sub-block of level·q8, given the levels as two 16-byte vectors.
#[inline(always)]
fn dot_sub32<const SDOT: bool>(x0: uint8x16_t, x1: uint8x16_t, q8: &[i8; 256], at: usize) -> int32x4_t {
    let zero = unsafe { vdupq_n_s32(0) };
    idot::<SDOT>(idot::<SDOT>(zero, as_i8(x0), ld_i8(q8, at)), as_i8(x1), ld_i8(q8, at + 16))
}

#[inline(always)]
pub(super) fn q4_k<const SDOT: bool>(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
    assert_eq!(w.len(), a.len());
    // SAFETY (all blocks below): register-only baseline NEON.
    let mut acc = unsafe { vdupq_n_f32(0.0) };
    let mut acc_min = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let (sc, m) = scales_mins(&x.scales);
        let mut sumi = unsafe { vdupq_n_s32(0) };
        // 32-byte chunk c: low nibbles are sub-block 2c (elements 64c..64c+32), high nibbles
        // sub-block 2c+1.
        for c in 0..4 {
            let (q0, q1) = (ld_u8(&x.qs, 32 * c), ld_u8(&x.qs, 32 * c + 16));
            unsafe {
                let low = vdupq_n_u8(0x0f);
                let p_lo = dot_sub32::<SDOT>(vandq_u8(q0, low), vandq_u8(q1, low), &y.qs, 64 * c);
                let p_hi = dot_sub32::<SDOT>(vshrq_n_u8::<4>(q0), vshrq_n_u8::<4>(q1), &y.qs, 64 * c + 32);
                sumi = vmlaq_n_s32(sumi, p_lo, sc[2 * c] as i32);
                sumi = vmlaq_n_s32(sumi, p_hi, sc[2 * c + 1] as i32);
            }
        }
        acc = unsafe { vfmaq_n_f32(acc, vcvtq_f32_s32(sumi), f16(x.d) * y.d) };
        acc_min += f16(x.dmin) * y.d * mins_dot_bsums(&m, &y.bsums) as f32;
    }
    unsafe { vaddvq_f32(acc) - acc_min }
}

#[inline(always)]
pub(super) fn q5_k<const SDOT: bool>(w: &[BlockQ5K], a: &[BlockQ8K]) -> f32 {
    assert_eq!(w.len(), a.len());
    // SAFETY (all blocks below): register-only baseline NEON.
    let mut acc = unsafe { vdupq_n_f32(0.0) };
    let mut acc_min = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let (sc, m) = scales_mins(&x.scales);
        let mut sumi = unsafe { vdupq_n_s32(0) };
        // Element 64g + l (l < 32) takes its fifth bit from bit 2g of qh[l], element
        // 64g + 32 + l from bit 2g+1. Shifting qh right by 2 per group keeps them at bits 0, 1.
        let (mut qh0, mut qh1) = (ld_u8(&x.qh, 0), ld_u8(&x.qh, 16));
        for g in 0..4 {
            let (q0, q1) = (ld_u8(&x.qs, 32 * g), ld_u8(&x.qs, 32 * g + 16));
            unsafe {
                let (low, one, two) = (vdupq_n_u8(0x0f), vdupq_n_u8(1), vdupq_n_u8(2));
                // Bit 0 → 0x10 (shift 4), bit 1 → 0x10 (shift 3).
                let l0 = vorrq_u8(vandq_u8(q0, low), vshlq_n_u8::<4>(vandq_u8(qh0, one)));
                let l1 = vorrq_u8(vandq_u8(q1, low), vshlq_n_u8::<4>(vandq_u8(qh1, one)));
                let h0 = vorrq_u8(vshrq_n_u8::<4>(q0), vshlq_n_u8::<3>(vandq_u8(qh0, two)));
                let h1 = vorrq_u8(vshrq_n_u8::<4>(q1), vshlq_n_u8::<3>(vandq_u8(qh1, two)));
                let p_lo = dot_sub32::<SDOT>(l0, l1, &y.qs, 64 * g);
                let p_hi = dot_sub32::<SDOT>(h0, h1, &y.qs, 64 * g + 32);
                sumi = vmlaq_n_s32(sumi, p_lo, sc[2 * g] as i32);
                sumi = vmlaq_n_s32(sumi, p_hi, sc[2 * g + 1] as i32);
                qh0 = vshrq_n_u8::<2>(qh0);
                qh1 = vshrq_n_u8::<2>(qh1);
            }
        }
        acc = unsafe { vfmaq_n_f32(acc, vcvtq_f32_s32(sumi), f16(x.d) * y.d) };
        acc_min += f16(x.dmin) * y.d * mins_dot_bsums(&m, &y.bsums) as f32;
    }
    unsafe { vaddvq_f32(acc) - acc_min }
}

#[inline(always)]
pub(super) fn q6_k<const SDOT: bool>(w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
    assert_eq!(w.len(), a.len());
    // SAFETY (all blocks below): register-only baseline NEON.
    let mut acc = unsafe { vdupq_n_f32(0.0) };
    for (x, y) in w.iter().zip(a) {
        let mut sumi = unsafe { vdupq_n_s32(0) };
        // Element 128h + 32k + l (half h, quarter k, lane l < 32): low four bits from
        // ql[64h + 32(k&1) + l] (low nibble for k < 2, high for k ≥ 2), top two bits from
        // bits 2k, 2k+1 of qh[32h + l]. `part` picks lanes 0..16 or 16..32 of every quarter.
        for h in 0..2 {
            for part in 0..2 {
                let l = 16 * part;
                let ql0 = ld_u8(&x.ql, 64 * h + l);
                let ql1 = ld_u8(&x.ql, 64 * h + 32 + l);
                let qh = ld_u8(&x.qh, 32 * h + l);
                unsafe {
                    let (low, top) = (vdupq_n_u8(0x0f), vdupq_n_u8(0x30));
                    // Bits 2k, 2k+1 of qh moved to bits 4, 5 (0x30) for quarter k.
                    let levels = [
                        vorrq_u8(vandq_u8(ql0, low), vandq_u8(vshlq_n_u8::<4>(qh), top)),
                        vorrq_u8(vandq_u8(ql1, low), vandq_u8(vshlq_n_u8::<2>(qh), top)),
                        vorrq_u8(vshrq_n_u8::<4>(ql0), vandq_u8(qh, top)),
                        vorrq_u8(vshrq_n_u8::<4>(ql1), vandq_u8(vshrq_n_u8::<2>(qh), top)),
                    ];
                    for (k, level) in levels.into_iter().enumerate() {
                        let at = 128 * h + 32 * k + l;
                        // Levels are 0..64, so level − 32 fits a signed byte.
                        let q = vsubq_s8(as_i8(level), vdupq_n_s8(32));
                        let p = idot::<SDOT>(vdupq_n_s32(0), q, ld_i8(&y.qs, at));
                        // These 16 elements are exactly sub-block at/16 (one scale).
                        sumi = vmlaq_n_s32(sumi, p, x.scales[at / 16] as i32);
                    }
                }
            }
        }
        acc = unsafe { vfmaq_n_f32(acc, vcvtq_f32_s32(sumi), f16(x.d) * y.d) };
    }
    unsafe { vaddvq_f32(acc) }
}
