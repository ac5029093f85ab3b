//! The Q6_K tile: single-level rows, and two-level rows (pairs) in two forms that give the
//! same bits.
//!
//! Two-level activations are a 15-bit activation in disguise: `a = 128·q1 + q2` on the grid
//! d/128 ([`crate::second_level`]). For a pair, both forms compute each sub-block's exact
//! integer `Σ (w − 32)·a` (|·| ≤ 16·32·16383 < 2²⁴, so its f32 is exact too) and fold it into
//! one f32 chain per token, `f = fma(f32(Σ), scale_j, f)`, in the same order of sub-blocks;
//! a super-block's `f` is scaled once, by `d_w · d/128`. So a token decoded alone gets the
//! bits it gets in a prompt's batch (test `a_token_is_multiplied_the_same_alone_and_in_a_batch`).
//!
//! * **Merged bytes** (activations without their merged form — fewer than
//!   `MERGED_FROM_TOKENS` tokens, i.e. decode, or quantized without it and not given it by
//!   `QActs::add_merged` — on every arch, and tiles of 1-2 tokens on VNNI):
//!   `vpdpbusd` (on plain AVX2 `vpmaddubsw`, two dots a 16-bit partial widened by one
//!   `vpmaddwd`: two-level decode from L2, `--ab Q6_K`, 31.5-31.9 → 33.8-33.9 GB/s) over the
//!   two levels' i8 quants, the first level's sum shifted onto the fine grid before the
//!   second's dots.
//! * **16-bit** (activations that carry their merged form, prompts: tiles of 4 tokens, and
//!   every tile on plain AVX2): `vpdpwssd` (`vpmaddwd` +
//!   add) over `a` as i16 (QActs' merged segment) and the weights' `w − 32` as i16, unpacked
//!   once per tile. As many dots as two i8 levels (a 16-bit dot does half the elements of an
//!   8-bit one), but no offsets, shifts or merges per token, and on plain AVX2 no u8×i8
//!   partials: one thread's two-level prompt kernel (`cargo bench -p duet-quant --bench gemm
//!   -- --ab Q6_K`) 145 → 184 GMAC/s on AVX-512, 63 → 86 on AVX2+AVX-VNNI, 53 → 69 on AVX2.

// Accumulator arrays, token pointers and results are parallel arrays indexed by token.
#![allow(clippy::needless_range_loop)]

use super::kernels::{Arch, FAcc, IAcc, Kern, at, dot16_quad, merged_pairs, prefetch_ahead, slices, toks};
use super::{PackedMatrix, QActs};
use crate::second_level;

pub(super) struct Q6K;
impl Kern for Q6K {
    /// Tiles of 4 tokens with two chains each (AVX-512) beat tiles of 8 with one: 270 against
    /// 242 GMAC/s in prompts (`cargo bench -p duet-quant --bench gemm -- --ab Q6_K`).
    const MAX_N: usize = 4;
    /// The 16-bit form's tiles: 4 tokens on every arch, whatever its NMAX (tiles of 8 tokens
    /// on AVX-512 were no faster: 174 against 178 GMAC/s in one `--ab Q6_K` run).
    #[inline(always)]
    fn max_n_pairs<A: Arch>() -> usize {
        WIDE_FROM_ROWS
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
        // Type parameters, so that every loop over the tile's rows stays unrolled with its
        // accumulators in registers.
        // SAFETY: forwarded.
        unsafe {
            // (Pair tiles have an even N: drive keeps pairs whole.)
            if !a.pairs || !N.is_multiple_of(2) {
                tile_q6k::<A, N, false, false>(w, a, g, t0, out, ld)
            } else if a.has_merged() && (N >= WIDE_FROM_ROWS || A::PARTIAL16) {
                tile_q6k::<A, N, true, true>(w, a, g, t0, out, ld)
            } else {
                tile_q6k::<A, N, true, false>(w, a, g, t0, out, ld)
            }
        }
    }
}

/// Pair tiles of this many rows and more take the 16-bit form (fewer: the merged bytes,
/// which unpack the weights with fewer operations when few tokens share them).
const WIDE_FROM_ROWS: usize = 8;

/// Quarter `K`'s 6-bit levels of step `s` of half `h`: levels 0-2 are a byte's bits 0-5,
/// level 3 bits 6-7 of the three bytes (see the layout in mod.rs). 16-bit shifts carry the
/// next byte's bits in; the masks drop them.
#[inline(always)]
unsafe fn q6_levels<A: Arch, const K: usize>(bk: *const u8, h: usize, s: usize) -> A::V {
    // SAFETY: the three lines of (h, s) lie inside the block (forwarded from the tile).
    unsafe {
        let line = at(bk, 64 * 3 * (8 * h + s));
        if K < 3 {
            A::and(A::load(at(line, 64 * K)), A::splat8(0x3f))
        } else {
            let b0 = A::and(A::srli16::<6>(A::load(line)), A::splat8(0x03));
            let b1 = A::and(A::srli16::<4>(A::load(at(line, 64))), A::splat8(0x0c));
            let b2 = A::and(A::srli16::<2>(A::load(at(line, 128))), A::splat8(0x30));
            A::or(A::or(b0, b1), b2)
        }
    }
}

/// Sub-block (quarter `K` of half `h`, l-half `q`) of N single-level rows: `Σ (w − 32)·a`.
#[inline(always)]
unsafe fn q6_sub<A: Arch, const N: usize, const K: usize>(
    bk: *const u8,
    tk: &[*const u8; N],
    qoff: usize,
    off_at: usize,
    h: usize,
    q: usize,
) -> [A::V; N] {
    // SAFETY: forwarded from the tile.
    unsafe {
        let mut is = IAcc::<A, N, true, 2>::new(std::array::from_fn(|t| A::bcast_i32(at(tk[t], off_at))));
        // `i`, not `s`, picks the accumulation chain: a constant once the loop is unrolled.
        // (With `s`, whose parity the compiler could not see through the run-time `q`, the
        // two-chain tiles kept their accumulators in memory: two-level decode ran at a fifth
        // of single-level speed on AVX-512.)
        for i in 0..4 {
            let s = 4 * q + i;
            let wq = q6_levels::<A, K>(bk, h, s);
            for t in 0..N {
                is.dot(i, t, wq, at(tk[t], qoff + 128 * h + 32 * K + 4 * s));
            }
        }
        is.sum()
    }
}

/// [`q6_sub`] for N/2 pairs from the two levels' i8 quants (the merged-bytes form): each
/// token's two levels go into one accumulator, the first level's sum shifted onto the fine
/// grid before the second's dots. The pair's sum is in entry 2p; odd entries are zero.
#[inline(always)]
unsafe fn q6_sub_merged<A: Arch, const N: usize, const K: usize>(
    bk: *const u8,
    tk: &[*const u8; N],
    qoff: usize,
    off_at: usize,
    h: usize,
    q: usize,
) -> [A::V; N] {
    // SAFETY: forwarded from the tile.
    unsafe {
        let wq: [A::V; 4] = std::array::from_fn(|i| q6_levels::<A, K>(bk, h, 4 * q + i));
        let act = |t: usize, i: usize| at(tk[t], qoff + 128 * h + 32 * K + 4 * (4 * q + i));
        // IAcc keeps each pair's sum in entry 2p: its chains, or on plain AVX2 16-bit partials of
        // two dots (PER = 2 for 6-bit weights) widened once. Odd entries stay zero.
        let off = |t: usize| A::bcast_i32(at(tk[t], off_at));
        let mut is = IAcc::<A, N, true, 2>::new(std::array::from_fn(|t| if t % 2 == 0 { off(t) } else { A::zero() }));
        // Level 0 is row 2p, level 1 row 2p+1.
        for level in 0..2 {
            if level == 1 {
                let first = is.sum();
                is = IAcc::new(std::array::from_fn(|t| {
                    if t % 2 == 0 {
                        A::add32(A::slli32::<{ second_level::SHIFT }>(first[t]), off(t + 1))
                    } else {
                        A::zero()
                    }
                }));
            }
            for i in 0..4 {
                for p in 0..N / 2 {
                    is.dot(i, 2 * p, wq[i], act(2 * p + level, i));
                }
            }
        }
        is.sum()
    }
}

/// Step `s` of quarter `K` of half `h` as `w − 32` in two vectors of i16 pairs, each lane's
/// bytes (w0 w1 w2 w3) as (w0, w2) and (w1, w3): the order of QActs' merged activations.
#[inline(always)]
unsafe fn q6_words<A: Arch, const K: usize>(bk: *const u8, h: usize, s: usize) -> (A::V, A::V) {
    // SAFETY: forwarded from the tile.
    unsafe {
        let (lo, hi) = if K < 3 {
            let v = A::load(at(bk, 64 * (3 * (8 * h + s) + K)));
            let m = A::splat32(0x003f_003f);
            (A::and(v, m), A::and(A::srli16::<8>(v), m))
        } else {
            let v = q6_levels::<A, 3>(bk, h, s);
            (A::and(v, A::splat32(0x00ff_00ff)), A::srli16::<8>(v))
        };
        let c32 = A::splat32(0x0020_0020);
        (A::sub16(lo, c32), A::sub16(hi, c32))
    }
}

/// [`q6_sub`] of super-block `sb` for N/2 pairs from 16-bit activations (the 16-bit form):
/// `m[p]`, pair p's merged activations. The pair's sum is in entry 2p.
#[inline(always)]
unsafe fn q6_sub_wide<A: Arch, const N: usize, const K: usize>(
    bk: *const u8,
    m: &[*const u8; N],
    sb: usize,
    h: usize,
    q: usize,
) -> [A::V; N] {
    // SAFETY: forwarded from the tile.
    unsafe {
        let mut is = [A::zero(); N];
        for i in 0..4 {
            let s = 4 * q + i;
            let (lo, hi) = q6_words::<A, K>(bk, h, s);
            // Elements 256sb + 128h + 32K + 4s.. of the row.
            let g = 64 * sb + 32 * h + 8 * K + s;
            for p in 0..N / 2 {
                is[2 * p] = dot16_quad::<A>(is[2 * p], lo, hi, m[p], g);
            }
        }
        is
    }
}

/// The Q6_K tile. `PAIRS`: rows 2p, 2p+1 are one token's two levels, merged; `WIDE`: from
/// their 16-bit merged activations.
#[inline(always)]
unsafe fn tile_q6k<A: Arch, const N: usize, const PAIRS: bool, const WIDE: bool>(
    w: &PackedMatrix,
    a: &QActs,
    g: usize,
    t0: usize,
    out: *mut f32,
    ld: usize,
) {
    let (bulk, meta) = w.group(g);
    let tk = toks::<N>(a, t0);
    let m = if WIDE { merged_pairs::<N>(a, t0) } else { tk };
    let (d_off, x_off) = (a.d_off, a.x_off);
    let per_block = w.layout.bulk + w.layout.meta;
    let quarter = per_block / 4;
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
                let mut acc = [A::zero_f(); N];
                for sb in 0..w.nb {
                    let mt = at(meta, sb * 288);
                    let bk = at(bulk, sb * 3072 + 4 * r0);
                    let qoff = 256 * sb;
                    let mut sacc = FAcc::<A, N>::new();
                    for h in 0..2 {
                        for q in 0..2 {
                            prefetch_ahead::<A>(w, bulk, sb * per_block + quarter * (2 * h + q), quarter, t0, r0);
                            // −32·bsums[j] of sub-block j = 8h + 2k + q.
                            let off = |k: usize| x_off + 80 * sb + 16 + 4 * (8 * h + 2 * k + q);
                            let scf = |k: usize| A::load_i8f(at(mt, 16 * (8 * h + 2 * k + q) + r0));
                            let mut fold = |is: [A::V; N], k: usize| {
                                let f = scf(k);
                                for t in 0..N {
                                    // Merged pair sums reach ~2³⁰ once scaled: their f32
                                    // sum rounds, so it runs in one order whatever the
                                    // tile (one chain), or a prompt's logits would differ
                                    // from the same tokens decoded one by one. (A single
                                    // row's terms are integers below 2²⁴: exact in any order.)
                                    if !PAIRS {
                                        sacc.fmadd(k, t, A::cvt(is[t]), f);
                                    } else if t % 2 == 0 {
                                        sacc.fmadd(0, t, A::cvt(is[t]), f);
                                    }
                                }
                            };
                            macro_rules! sub {
                                ($k:literal) => {
                                    fold(
                                        if WIDE {
                                            q6_sub_wide::<A, N, $k>(bk, &m, sb, h, q)
                                        } else if PAIRS {
                                            q6_sub_merged::<A, N, $k>(bk, &tk, qoff, off($k), h, q)
                                        } else {
                                            q6_sub::<A, N, $k>(bk, &tk, qoff, off($k), h, q)
                                        },
                                        $k,
                                    )
                                };
                            }
                            sub!(0);
                            sub!(1);
                            sub!(2);
                            sub!(3);
                        }
                    }
                    let sacc = sacc.sum();
                    let dw = A::load_f16(at(mt, 256 + 2 * r0));
                    for t in 0..N {
                        if PAIRS && t % 2 == 1 {
                            continue;
                        }
                        // A pair's merged sum is on the second level's grid: its scale.
                        let da = A::bcast_f32(at(tk[if PAIRS { t + 1 } else { t }], d_off + 4 * sb));
                        acc[t] = A::fmadd(sacc[t], A::mul(dw, da), acc[t]);
                    }
                }
                acc
            },
        )
    }
}
