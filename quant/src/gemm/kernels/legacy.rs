//! The 32-element formats' tiles: Q4_0, Q4_1, Q5_0, Q5_1 (Q8_0's is in `q8_0.rs`).

// Accumulator arrays, token pointers and results are parallel arrays indexed by token.
#![allow(clippy::needless_range_loop)]

use super::{Arch, IAcc, Kern, at, prefetch_ahead, slices, toks};
use super::super::{PackedMatrix, QActs};
use crate::second_level;

/// Adds a block's integer sums to the float accumulators of a 32-element format: `acc[t] +=
/// is[t] · dw · d_t`, `d_t` the activation scale of row t at byte `d_at` of its segment. For
/// two-level activations (`pairs`) rows 2p and 2p+1 are one token's two levels, the second's
/// step exactly 1/128 of the first's ([`crate::second_level`]): `is[2p] · 128 + is[2p+1]` is
/// the pair's sum on the fine grid (at most 32·255·127·128 < 2³¹), so one conversion and one
/// scale serve both levels and the pair's result goes to row 2p (row 2p+1 keeps only what the
/// caller adds itself; [`slices`] stores the pair's sum). Per block and pair that is 3 float
/// operations instead of 6: +4-5% on the 1.1B Q4_0 prompt speed with two levels.
#[inline(always)]
pub(in crate::gemm) unsafe fn fold_block<A: Arch, const N: usize>(
    acc: &mut [A::F; N],
    is: [A::V; N],
    dw: A::F,
    tk: &[*const u8; N],
    d_at: usize,
    pairs: bool,
) {
    // SAFETY: `d_at` lies inside every token's segment (the caller's block index).
    unsafe {
        if pairs && N.is_multiple_of(2) {
            for p in 0..N / 2 {
                let fine = A::add32(A::slli32::<{ second_level::SHIFT }>(is[2 * p]), is[2 * p + 1]);
                fold_pair::<A, N>(acc, p, fine, dw, tk, d_at);
            }
        } else {
            for t in 0..N {
                let da = A::bcast_f32(at(tk[t], d_at));
                acc[t] = A::fmadd(A::cvt(is[t]), A::mul(dw, da), acc[t]);
            }
        }
    }
}

/// Pair p's part of [`fold_block`]: `acc[2p] += fine · dw · d2`, `fine` the block's integer
/// on the second level's grid and d2 that level's scale (row 2p+1's, at byte `d_at`).
#[inline(always)]
pub(in crate::gemm) unsafe fn fold_pair<A: Arch, const N: usize>(
    acc: &mut [A::F; N],
    p: usize,
    fine: A::V,
    dw: A::F,
    tk: &[*const u8; N],
    d_at: usize,
) {
    // SAFETY: `d_at` lies inside the token's segment (forwarded).
    unsafe {
        let d2 = A::bcast_f32(at(tk[2 * p + 1], d_at));
        acc[2 * p] = A::fmadd(A::cvt(fine), A::mul(dw, d2), acc[2 * p]);
    }
}

/// Q4_0, Q4_1, Q5_0, Q5_1: `FIVE` adds the fifth bit; `MIN` uses d·q + m (Q8_1 activations)
/// instead of d·(q − offset). `PER`: dots per 16-bit partial (see [`IAcc`]).
#[inline(always)]
pub(in crate::gemm) unsafe fn tile_legacy4<A: Arch, const N: usize, const FIVE: bool, const MIN: bool, const PER: usize>(
    w: &PackedMatrix,
    a: &QActs,
    g: usize,
    t0: usize,
    out: *mut f32,
    ld: usize,
) {
    let (bulk, meta) = w.group(g);
    let (nb, bb, mb) = (w.nb, w.layout.bulk, w.layout.meta);
    let tk = toks::<N>(a, t0);
    let (d_off, x_off) = (a.d_off, a.x_off);
    // −8·Σq for Q4_0, −16·Σq for Q5_0 (see QActs).
    let off_off = x_off + if FIVE { 4 * nb } else { 0 };
    let qs_at = if FIVE { 64 } else { 0 };
    // SAFETY: all pointers stay inside the group (nb blocks) and the token segments.
    unsafe {
        slices::<A, N>(w, a.pairs, g, t0, out, ld, |r0| {
            let mask = A::splat8(0x0f);
            let mut acc = [A::zero_f(); N];
            for b in 0..nb {
                prefetch_ahead::<A>(w, bulk, b * (bb + mb), bb + mb, t0, r0);
                let wb = at(bulk, b * bb);
                let mut is = IAcc::<A, N, false, PER>::new(std::array::from_fn(|t| {
                    if MIN { A::zero() } else { A::bcast_i32(at(tk[t], off_off + 4 * b)) }
                }));
                for s in 0..4 {
                    let x = A::load(at(wb, qs_at + 64 * s + 4 * r0));
                    let mut lo = A::and(x, mask);
                    let mut hi = A::and(A::srli16::<4>(x), mask);
                    if FIVE {
                        lo = A::set_bit4(lo, at(wb, 8 * (2 * s) + r0 / 2));
                        hi = A::set_bit4(hi, at(wb, 8 * (2 * s + 1) + r0 / 2));
                    }
                    for t in 0..N {
                        let q = at(tk[t], 32 * b + 4 * s);
                        is.dot(2 * s, t, lo, q);
                        is.dot(2 * s + 1, t, hi, at(q, 16));
                    }
                }
                let dw = A::load_f16(at(meta, b * mb + 2 * r0));
                fold_block::<A, N>(&mut acc, is.sum(), dw, &tk, d_off + 4 * b, a.pairs);
                if MIN {
                    // Q8_1's s = d·Σq of each row (either level).
                    let mw = A::load_f16(at(meta, b * mb + 32 + 2 * r0));
                    for t in 0..N {
                        acc[t] = A::fmadd(mw, A::bcast_f32(at(tk[t], x_off + 4 * b)), acc[t]);
                    }
                }
            }
            acc
        })
    }
}

pub(in crate::gemm) struct Q4_0;
pub(in crate::gemm) struct Q4_1;
pub(in crate::gemm) struct Q5_0;
pub(in crate::gemm) struct Q5_1;
impl Kern for Q4_0 {
    const MAX_N: usize = 8;
    #[inline(always)]
    unsafe fn tile<A: Arch, const N: usize>(
        w: &PackedMatrix,
        a: &QActs,
        g: usize,
        t0: usize,
        out: *mut f32,
        ld: usize,
    ) {
        unsafe { tile_legacy4::<A, N, false, false, 8>(w, a, g, t0, out, ld) }
    }
}
impl Kern for Q4_1 {
    const MAX_N: usize = 8;
    #[inline(always)]
    unsafe fn tile<A: Arch, const N: usize>(
        w: &PackedMatrix,
        a: &QActs,
        g: usize,
        t0: usize,
        out: *mut f32,
        ld: usize,
    ) {
        unsafe { tile_legacy4::<A, N, false, true, 8>(w, a, g, t0, out, ld) }
    }
}
impl Kern for Q5_0 {
    const MAX_N: usize = 8;
    #[inline(always)]
    unsafe fn tile<A: Arch, const N: usize>(
        w: &PackedMatrix,
        a: &QActs,
        g: usize,
        t0: usize,
        out: *mut f32,
        ld: usize,
    ) {
        unsafe { tile_legacy4::<A, N, true, false, 4>(w, a, g, t0, out, ld) }
    }
}
impl Kern for Q5_1 {
    const MAX_N: usize = 8;
    #[inline(always)]
    unsafe fn tile<A: Arch, const N: usize>(
        w: &PackedMatrix,
        a: &QActs,
        g: usize,
        t0: usize,
        out: *mut f32,
        ld: usize,
    ) {
        unsafe { tile_legacy4::<A, N, true, true, 4>(w, a, g, t0, out, ld) }
    }
}
