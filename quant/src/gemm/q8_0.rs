//! The Q8_0 tile, and its 16-bit form for two-level rows on plain AVX2.
//!
//! Without VNNI a product of Q8_0's full-range bytes is four instructions per level (sign
//! transfer, `vpmaddubsw`, `vpmaddwd`, add), so two levels cost eight for every 4 elements of
//! 8 rows and token. The 16-bit form multiplies the pair's merged activations `128·q1 + q2`
//! (QActs, as i16) with the weights sign-extended to i16 once per tile: two `vpmaddwd` and two
//! adds. The block's integer is the same as the merged bytes' `128·Σq·q1 + Σq·q2` (|·| ≤
//! 32·128·16383 < 2²⁷), folded the same way ([`fold_pair`]), so every tile size gives the
//! same bits. On VNNI the i8 levels stay: `vpdpbusd` does 4 elements a lane, `vpdpwssd` 2.
//! Activations without their merged form (decode, see `MERGED_FROM_TOKENS`, or quantized
//! without it and not given it by `QActs::add_merged`) keep them too.

// Accumulator arrays, token pointers and results are parallel arrays indexed by token.
#![allow(clippy::needless_range_loop)]

use super::kernels::{
    Arch, IAcc, Kern, at, dot16_quad, fold_block, fold_pair, merged_pairs, prefetch_ahead, slices, toks,
};
use super::{PackedMatrix, QActs};

pub(super) struct Q8_0;
impl Kern for Q8_0 {
    const MAX_N: usize = 8;
    /// The 16-bit form: tiles of 4 tokens (plain AVX2's NMAX of 4 rows would be 2).
    #[inline(always)]
    fn max_n_pairs<A: Arch>() -> usize {
        if A::PARTIAL16 { 8 } else { 0 }
    }
    #[inline(always)]
    unsafe fn tile<A: Arch, const N: usize>(
        w: &PackedMatrix,
        a: &QActs,
        g: usize,
        t0: usize,
        out: *mut f32,
        ld: usize,
    ) {
        // SAFETY: forwarded.
        unsafe {
            if a.pairs && N.is_multiple_of(2) && A::PARTIAL16 && a.has_merged() {
                tile_wide::<A, N>(w, a, g, t0, out, ld)
            } else {
                tile_bytes::<A, N>(w, a, g, t0, out, ld)
            }
        }
    }
}

/// Rows of i8 quants (one level each, or a pair's two levels merged in [`fold_block`]).
#[inline(always)]
unsafe fn tile_bytes<A: Arch, const N: usize>(
    w: &PackedMatrix,
    a: &QActs,
    g: usize,
    t0: usize,
    out: *mut f32,
    ld: usize,
) {
    let (bulk, meta) = w.group(g);
    let nb = w.nb;
    let tk = toks::<N>(a, t0);
    let (d_off, off_off) = (a.d_off, a.x_off + 8 * nb); // −128·Σq
    let per_block = w.layout.bulk + w.layout.meta;
    // SAFETY: pointers stay inside the group and the token segments.
    unsafe {
        slices::<A, N>(w, a.pairs, g, t0, out, ld, |r0| {
            let mut acc = [A::zero_f(); N];
            for b in 0..nb {
                prefetch_ahead::<A>(w, bulk, per_block * b, per_block, t0, r0);
                let wb = at(bulk, b * 512 + 4 * r0);
                let mut is = IAcc::<A, N, false, 1>::new(std::array::from_fn(|t| {
                    if A::Q8_BIASED { A::bcast_i32(at(tk[t], off_off + 4 * b)) } else { A::zero() }
                }));
                for s in 0..8 {
                    let x = A::prep_q8(A::load(at(wb, 64 * s)));
                    for t in 0..N {
                        is.dot_q8(s, t, x, at(tk[t], 32 * b + 4 * s));
                    }
                }
                let dw = A::load_f16(at(meta, b * 32 + 2 * r0));
                fold_block::<A, N>(&mut acc, is.sum(), dw, &tk, d_off + 4 * b, a.pairs);
            }
            acc
        })
    }
}

/// Pairs from their merged 16-bit activations (the module docs' 16-bit form).
#[inline(always)]
unsafe fn tile_wide<A: Arch, const N: usize>(
    w: &PackedMatrix,
    a: &QActs,
    g: usize,
    t0: usize,
    out: *mut f32,
    ld: usize,
) {
    let (bulk, meta) = w.group(g);
    let tk = toks::<N>(a, t0);
    let m = merged_pairs::<N>(a, t0);
    let per_block = w.layout.bulk + w.layout.meta;
    // SAFETY: pointers stay inside the group and the token segments.
    unsafe {
        slices::<A, N>(w, a.pairs, g, t0, out, ld, |r0| {
            let mut acc = [A::zero_f(); N];
            let (low, bias) = (A::splat32(0x00ff_00ff), A::splat32(0x0080_0080));
            for b in 0..w.nb {
                prefetch_ahead::<A>(w, bulk, per_block * b, per_block, t0, r0);
                let wb = at(bulk, b * 512 + 4 * r0);
                let mut is = [A::zero(); N];
                for s in 0..8 {
                    // Stored bytes are q + 128: (b0, b2) and (b1, b3) as i16, less 128.
                    let x = A::load(at(wb, 64 * s));
                    let lo = A::sub16(A::and(x, low), bias);
                    let hi = A::sub16(A::srli16::<8>(x), bias);
                    for p in 0..N / 2 {
                        is[2 * p] = dot16_quad::<A>(is[2 * p], lo, hi, m[p], 8 * b + s);
                    }
                }
                let dw = A::load_f16(at(meta, b * 32 + 2 * r0));
                for p in 0..N / 2 {
                    fold_pair::<A, N>(&mut acc, p, is[2 * p], dw, &tk, a.d_off + 4 * b);
                }
            }
            acc
        })
    }
}
