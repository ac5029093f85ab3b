//! The Q4_K and Q5_K tiles. Each lane holds 4 bytes of one row's packed quants (low nibbles
//! one sub-block, high nibbles the next); the 6-bit scales and minimums of a super-block are
//! unpacked once per slice of rows and shared by the tile's tokens.
//!
//! On AVX2 without VNNI, Q4_K sums its products as 16-bit partials whose widening multiplies
//! in the sub-block scale ([`q4k_scaled`]): a super-block then reaches the floats once per row
//! (pairs: twice), not once per sub-block and row. Two-level prompt kernel (`cargo bench -p
//! duet-quant --bench gemm -- --ab Q4_K`, one thread): 62.5 → 72.5 GMAC/s.

// Accumulator arrays, token pointers and results are parallel arrays indexed by token.
#![allow(clippy::needless_range_loop)]

use super::kernels::{Arch, FAcc, IAcc, Kern, at, fold_block, fold_pair, prefetch_ahead, slices, toks};
use super::{PackedMatrix, QActs};
use crate::second_level;

/// Q4_K and Q5_K (`FIVE`). `PER`: dots per 16-bit partial (see [`IAcc`]).
#[inline(always)]
unsafe fn tile_q4k_q5k<A: Arch, const N: usize, const FIVE: bool, const PER: usize>(
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
    let qs_at = if FIVE { 512 } else { 0 };
    // SAFETY: pointers stay inside the group and the token segments.
    unsafe {
        slices::<A, N>(
            w,
            a.pairs,
            g,
            t0,
            out,
            ld,
            #[inline(always)]
            |r0| {
                let m0f = A::splat8(0x0f);
                let mut acc = [A::zero_f(); N];
                for sb in 0..nb {
                    prefetch_ahead::<A>(w, bulk, sb * (bb + mb), bb + mb, t0, r0);
                    let mt = at(meta, sb * 256);
                    let bk = at(bulk, sb * bb);
                    // get_scale_min_k4 for 8 sub-blocks of LANES rows: each lane holds the bytes
                    // sc[0..4] (p0 & 63), m[0..4] (p1 & 63), sc[4..8], m[4..8].
                    let m3f = A::splat8(0x3f);
                    let m30 = A::splat8(0x30);
                    let p0 = at(mt, 64 + 4 * r0);
                    let p1 = A::load(at(mt, 128 + 4 * r0));
                    let p2 = at(mt, 192 + 4 * r0);
                    // The minimum's part first: Σ_j m_j·(Σ of sub-block j's activations), with the
                    // i16 pairs (m0,m2), (m1,m3), (m4,m6), (m5,m7).
                    {
                        let m_lo = A::and(p1, m3f);
                        let m_hi = A::or(A::and(A::srli32::<4>(A::load(p2)), m0f), A::and(A::srli32::<2>(p1), m30));
                        let ff = A::splat32(0x00ff_00ff);
                        let mw = [
                            A::and(m_lo, ff),
                            A::and(A::srli32::<8>(m_lo), ff),
                            A::and(m_hi, ff),
                            A::and(A::srli32::<8>(m_hi), ff),
                        ];
                        let dmw = A::load_f16(at(mt, 32 + 2 * r0));
                        for t in 0..N {
                            let e = at(tk[t], x_off + 80 * sb);
                            let mut mi = A::zero();
                            for (i, m) in mw.iter().enumerate() {
                                mi = A::dot16(mi, *m, at(e, 4 * i));
                            }
                            let da = A::bcast_f32(at(tk[t], d_off + 4 * sb));
                            acc[t] = A::fnmadd(A::cvt(mi), A::mul(dmw, da), acc[t]);
                        }
                    }
                    if A::PARTIAL16 && !FIVE {
                        let dw = A::load_f16(at(mt, 2 * r0));
                        let scv = [scale_bytes::<A>(p0, p2, false), scale_bytes::<A>(p0, p2, true)];
                        let d_at = d_off + 4 * sb;
                        if a.pairs && N.is_multiple_of(2) {
                            q4k_scaled::<A, N, true>(&mut acc, at(bk, 4 * r0), scv, dw, &tk, sb, d_at);
                        } else {
                            q4k_scaled::<A, N, false>(&mut acc, at(bk, 4 * r0), scv, dw, &tk, sb, d_at);
                        }
                        continue;
                    }
                    let mut sacc = FAcc::<A, N>::new();
                    for c in 0..4 {
                        let scv = scale_bytes::<A>(p0, p2, c >= 2);
                        for h in 0..2 {
                            let j = (2 * c + h) as u32 % 4;
                            let scf = A::cvt(A::byte_lane(scv, j));
                            let mut is = IAcc::<A, N, true, PER>::new([A::zero(); N]);
                            for s in 0..8 {
                                let x = A::load(at(bk, qs_at + 64 * (8 * c + s) + 4 * r0));
                                let mut q = if h == 0 { A::and(x, m0f) } else { A::and(A::srli16::<4>(x), m0f) };
                                if FIVE {
                                    q = A::set_bit4(q, at(bk, 8 * (2 * (8 * c + s) + h) + r0 / 2));
                                }
                                for t in 0..N {
                                    is.dot(s, t, q, at(tk[t], 256 * sb + 64 * c + 32 * h + 4 * s));
                                }
                            }
                            let is = is.sum();
                            for t in 0..N {
                                sacc.fmadd(2 * c + h, t, A::cvt(is[t]), scf);
                            }
                        }
                    }
                    let sacc = sacc.sum();
                    let dw = A::load_f16(at(mt, 2 * r0));
                    for t in 0..N {
                        let da = A::bcast_f32(at(tk[t], d_off + 4 * sb));
                        acc[t] = A::fmadd(sacc[t], A::mul(dw, da), acc[t]);
                    }
                }
                acc
            },
        )
    }
}

/// The 6-bit scales of sub-blocks 0-3 (`upper`: 4-7) of a super-block (get_scale_min_k4):
/// byte j of each lane is its row's scale of sub-block j (4 + j); `p0`, `p2` point at the
/// scale words of the slice's rows (see tile_q4k_q5k).
#[inline(always)]
unsafe fn scale_bytes<A: Arch>(p0: *const u8, p2: *const u8, upper: bool) -> A::V {
    // SAFETY: the caller's pointers (4·LANES bytes each).
    unsafe {
        let (m0f, m3f, m30) = (A::splat8(0x0f), A::splat8(0x3f), A::splat8(0x30));
        if upper {
            A::or(A::and(A::load(p2), m0f), A::and(A::srli32::<2>(A::load(p0)), m30))
        } else {
            A::and(A::load(p0), m3f)
        }
    }
}

/// Q4_K's sub-blocks on archs that sum 16-bit partials (AVX2 without VNNI): the `vpmaddwd`
/// that widens a sub-block's partials multiplies them by the sub-block's 6-bit scale instead
/// of by 1 ([`IAcc::new_scaled`]), so the sub-blocks add up in i32 and reach the floats once
/// per super-block (pairs: twice) instead of with a conversion and an FMA per sub-block and
/// row. A two-level pair widens its first level by 128·scale (≤ 8064, an i16) and its second
/// by the scale: their sum is the pair's integer on the second level's grid, one conversion
/// for both.
///
/// Exact in i32: a partial's i16 lane is at most 8·2·15·127 = 30 480 ([`IAcc`]), widened at
/// most 2·30 480·8064 ≈ 4.92·10⁸ for a first level, 2·30 480·63 ≈ 3.8·10⁶ otherwise; a pair is
/// flushed to the floats every four sub-blocks (≈ 1.98·10⁹ < 2³¹), single rows once (≈ 3.1·10⁷).
///
/// `bk`: the super-block's quants at this slice's lanes; `scv`: [`scale_bytes`] of sub-blocks
/// 0-3 and 4-7; row t's activation scale at byte `d_at` of its segment.
#[inline(always)]
unsafe fn q4k_scaled<A: Arch, const N: usize, const PAIRS: bool>(
    acc: &mut [A::F; N],
    bk: *const u8,
    scv: [A::V; 2],
    dw: A::F,
    tk: &[*const u8; N],
    sb: usize,
    d_at: usize,
) {
    debug_assert!(A::PARTIAL16, "IAcc ignores the scales where the arch has no 16-bit partials");
    // SAFETY: the bytes tile_q4k_q5k reads.
    unsafe {
        let m0f = A::splat8(0x0f);
        let mut run = [A::zero(); N];
        // Sub-block J (= 2c + h) with its constants known: unrolled by hand, as the compiler
        // kept the loop and built each scale from a run-time shift.
        macro_rules! sub_block {
            ($j:literal) => {{
                let (c, h) = ($j / 2, $j % 2);
                let s1 = A::byte_lane_x2(scv[c / 2], $j % 4);
                let s128 = A::slli32::<{ second_level::SHIFT }>(s1);
                let mut scale = [s1; N];
                if PAIRS {
                    for t in (0..N).step_by(2) {
                        scale[t] = s128;
                    }
                }
                // 8 dots a partial: the bounds above.
                let mut is = IAcc::<A, N, true, 8>::new_scaled(run, scale);
                for s in 0..8 {
                    let x = A::load(at(bk, 64 * (8 * c + s)));
                    let q = if h == 0 { A::and(x, m0f) } else { A::and(A::srli16::<4>(x), m0f) };
                    for t in 0..N {
                        is.dot(s, t, q, at(tk[t], 256 * sb + 64 * c + 32 * h + 4 * s));
                    }
                }
                run = is.sum();
                if PAIRS && $j % 4 == 3 {
                    for p in 0..N / 2 {
                        // The pair's integer, on the second level's grid.
                        fold_pair::<A, N>(acc, p, A::add32(run[2 * p], run[2 * p + 1]), dw, tk, d_at);
                        run[2 * p] = A::zero();
                        run[2 * p + 1] = A::zero();
                    }
                }
            }};
        }
        sub_block!(0);
        sub_block!(1);
        sub_block!(2);
        sub_block!(3);
        sub_block!(4);
        sub_block!(5);
        sub_block!(6);
        sub_block!(7);
        if !PAIRS {
            fold_block::<A, N>(acc, run, dw, tk, d_at, false);
        }
    }
}

pub(super) struct Q4K;
pub(super) struct Q5K;
impl Kern for Q4K {
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
        unsafe { tile_q4k_q5k::<A, N, false, 8>(w, a, g, t0, out, ld) }
    }
}
impl Kern for Q5K {
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
        unsafe { tile_q4k_q5k::<A, N, true, 4>(w, a, g, t0, out, ld) }
    }
}
