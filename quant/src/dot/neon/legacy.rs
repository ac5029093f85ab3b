//! Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 weights against Q8_0/Q8_1 activations (32-element blocks).
//!
//! Each weight block becomes two vectors of signed levels, elements 0..16 and 16..32, dotted
//! with the activation block's two halves by [`idot`]. Every level fits a signed byte (Q4_0
//! q−8 ∈ [−8, 7], Q5_0 q−16 ∈ [−16, 15], Q4_1/Q5_1 q ∈ [0, 31], Q8_0 any i8) and `idot` is
//! exact for any i8, so a block's integer sum is exact: at most 32·128·128 = 2^19 in
//! magnitude, which also converts to f32 without rounding.
//!
//! Every intrinsic here works on registers only (loads go through the bounds-checked
//! [`ld_u8`]/[`ld_i8`]); the `unsafe` blocks exist because these `#[inline(always)]` functions
//! cannot carry `#[target_feature(enable = "neon")]` (see the module docs of `neon`).

use std::arch::aarch64::*;

use super::{as_i8, f16, idot, ld_i8, ld_u8};
use crate::blocks::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1};

/// One 32-element weight block against its activation block.
trait BlockDot {
    type Act;
    /// The block's integer dot product (spread over four lanes), the scale that turns it into
    /// a float, and a float term to add as is (Q4_1/Q5_1: min · d8·Σq8; otherwise 0).
    fn dot<const SDOT: bool>(&self, y: &Self::Act) -> (int32x4_t, f32, f32);
}

/// Σ over blocks, as [`super::super::scalar`] computes it up to float summation order.
#[inline(always)]
fn sum_blocks<const SDOT: bool, B: BlockDot>(w: &[B], a: &[B::Act]) -> f32 {
    assert_eq!(w.len(), a.len());
    // SAFETY (all blocks below): register-only baseline NEON.
    let zero = unsafe { vdupq_n_f32(0.0) };
    // Two accumulators, so the FMA of one block does not wait for the previous block's.
    let (mut acc0, mut acc1) = (zero, zero);
    let mut extra = 0.0f32;
    let (w2, w_rest) = w.as_chunks::<2>();
    let (a2, a_rest) = a.as_chunks::<2>();
    for ([x0, x1], [y0, y1]) in w2.iter().zip(a2) {
        let (s0, d0, e0) = x0.dot::<SDOT>(y0);
        let (s1, d1, e1) = x1.dot::<SDOT>(y1);
        unsafe {
            acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(s0), d0);
            acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(s1), d1);
        }
        extra += e0 + e1;
    }
    if let ([x], [y]) = (w_rest, a_rest) {
        let (s, d, e) = x.dot::<SDOT>(y);
        acc0 = unsafe { vfmaq_n_f32(acc0, vcvtq_f32_s32(s), d) };
        extra += e;
    }
    unsafe { vaddvq_f32(vaddq_f32(acc0, acc1)) + extra }
}

/// Σ x[i]·y[i] over one block, given its weight levels as elements 0..16 and 16..32.
#[inline(always)]
fn dot32<const SDOT: bool>(x0: int8x16_t, x1: int8x16_t, y: &[i8; 32]) -> int32x4_t {
    let zero = unsafe { vdupq_n_s32(0) };
    idot::<SDOT>(idot::<SDOT>(zero, x0, ld_i8(y, 0)), x1, ld_i8(y, 16))
}

/// The 32 nibbles of a block as levels 0..16: low nibbles are elements 0..16, high nibbles
/// elements 16..32 (ggml's order for the 32-element formats).
#[inline(always)]
fn nibbles(qs: &[u8; 16]) -> (uint8x16_t, uint8x16_t) {
    let v = ld_u8(qs, 0);
    unsafe { (vandq_u8(v, vdupq_n_u8(0x0f)), vshrq_n_u8::<4>(v)) }
}

/// Bit j of Q5's `qh` spread to byte j: 0xFF where set, 0 where clear (elements 0..16, 16..32).
#[inline(always)]
fn fifth_bit_masks(qh: [u8; 4]) -> (uint8x16_t, uint8x16_t) {
    // Byte j of the result looks at byte j/8 of qh and tests bit j%8 of it.
    const FROM_LO: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1];
    const FROM_HI: [u8; 16] = [2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3];
    const BIT: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    let (from_lo, from_hi, bit) = (ld_u8(&FROM_LO, 0), ld_u8(&FROM_HI, 0), ld_u8(&BIT, 0));
    unsafe {
        // Little-endian: byte k of the u32 lane is qh[k].
        let bytes = vreinterpretq_u8_u32(vdupq_n_u32(u32::from_le_bytes(qh)));
        (vtstq_u8(vqtbl1q_u8(bytes, from_lo), bit), vtstq_u8(vqtbl1q_u8(bytes, from_hi), bit))
    }
}

impl BlockDot for BlockQ4_0 {
    type Act = BlockQ8_0;
    #[inline(always)]
    fn dot<const SDOT: bool>(&self, y: &BlockQ8_0) -> (int32x4_t, f32, f32) {
        let (lo, hi) = nibbles(&self.qs);
        let (x0, x1) = unsafe {
            let eight = vdupq_n_s8(8);
            (vsubq_s8(as_i8(lo), eight), vsubq_s8(as_i8(hi), eight))
        };
        (dot32::<SDOT>(x0, x1, &y.qs), f16(self.d) * f16(y.d), 0.0)
    }
}

impl BlockDot for BlockQ4_1 {
    type Act = BlockQ8_1;
    #[inline(always)]
    fn dot<const SDOT: bool>(&self, y: &BlockQ8_1) -> (int32x4_t, f32, f32) {
        let (lo, hi) = nibbles(&self.qs);
        // Σ (d·q + m)·(d8·q8) = d·d8·Σ q·q8 + m·(d8·Σ q8), and Q8_1 caches d8·Σ q8 as `s`.
        (dot32::<SDOT>(as_i8(lo), as_i8(hi), &y.qs), f16(self.d) * f16(y.d), f16(self.m) * f16(y.s))
    }
}

impl BlockDot for BlockQ5_0 {
    type Act = BlockQ8_0;
    #[inline(always)]
    fn dot<const SDOT: bool>(&self, y: &BlockQ8_0) -> (int32x4_t, f32, f32) {
        let (lo, hi) = nibbles(&self.qs);
        let (h0, h1) = fifth_bit_masks(self.qh);
        // Level − 16 as a signed byte: with the fifth bit set that is the nibble itself;
        // without it, nibble − 16, which in two's complement is the nibble with 0xF0 set.
        let (x0, x1) = unsafe {
            let f0 = vdupq_n_u8(0xf0);
            (vorrq_u8(lo, vbicq_u8(f0, h0)), vorrq_u8(hi, vbicq_u8(f0, h1)))
        };
        (dot32::<SDOT>(as_i8(x0), as_i8(x1), &y.qs), f16(self.d) * f16(y.d), 0.0)
    }
}

impl BlockDot for BlockQ5_1 {
    type Act = BlockQ8_1;
    #[inline(always)]
    fn dot<const SDOT: bool>(&self, y: &BlockQ8_1) -> (int32x4_t, f32, f32) {
        let (lo, hi) = nibbles(&self.qs);
        let (h0, h1) = fifth_bit_masks(self.qh);
        // Level = nibble + 16·bit, at most 31.
        let (x0, x1) = unsafe {
            let sixteen = vdupq_n_u8(0x10);
            (vorrq_u8(lo, vandq_u8(h0, sixteen)), vorrq_u8(hi, vandq_u8(h1, sixteen)))
        };
        (dot32::<SDOT>(as_i8(x0), as_i8(x1), &y.qs), f16(self.d) * f16(y.d), f16(self.m) * f16(y.s))
    }
}

impl BlockDot for BlockQ8_0 {
    type Act = BlockQ8_0;
    #[inline(always)]
    fn dot<const SDOT: bool>(&self, y: &BlockQ8_0) -> (int32x4_t, f32, f32) {
        (dot32::<SDOT>(ld_i8(&self.qs, 0), ld_i8(&self.qs, 16), &y.qs), f16(self.d) * f16(y.d), 0.0)
    }
}

#[inline(always)]
pub(super) fn q4_0<const SDOT: bool>(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
    sum_blocks::<SDOT, _>(w, a)
}

#[inline(always)]
pub(super) fn q4_1<const SDOT: bool>(w: &[BlockQ4_1], a: &[BlockQ8_1]) -> f32 {
    sum_blocks::<SDOT, _>(w, a)
}

#[inline(always)]
pub(super) fn q5_0<const SDOT: bool>(w: &[BlockQ5_0], a: &[BlockQ8_0]) -> f32 {
    sum_blocks::<SDOT, _>(w, a)
}

#[inline(always)]
pub(super) fn q5_1<const SDOT: bool>(w: &[BlockQ5_1], a: &[BlockQ8_1]) -> f32 {
    sum_blocks::<SDOT, _>(w, a)
}

#[inline(always)]
pub(super) fn q8_0<const SDOT: bool>(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
    sum_blocks::<SDOT, _>(w, a)
}
