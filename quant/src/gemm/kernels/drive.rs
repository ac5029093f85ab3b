//! Running a weight type's tile kernel ([`Kern`]) over a matrix: token tiles, row slices,
//! integer and float accumulators, and prefetching ahead of the stream.

// Accumulator arrays, token pointers and results are parallel arrays indexed by token.
#![allow(clippy::needless_range_loop)]

use super::Arch;
use super::super::{GROUP, PackedMatrix, QActs};

/// One weight type's tile kernel.
pub(in crate::gemm) trait Kern {
    /// Largest token tile (register budget of this kernel).
    const MAX_N: usize;
    /// Largest tile of two-level rows (pairs) on arch `A` where the pairs carry their merged
    /// activations, for a 16-bit form that holds a pair in one accumulator (0: as for
    /// single-level rows).
    #[inline(always)]
    fn max_n_pairs<A: Arch>() -> usize {
        0
    }
    /// Whether this kernel on arch `A` reads two-level pairs' merged activations (see
    /// [`QActs::add_merged`]): those with a 16-bit form, i.e. wide pair tiles.
    #[inline(always)]
    fn reads_merged<A: Arch>() -> bool {
        Self::max_n_pairs::<A>() > 0
    }
    /// Rows of group `g` × tokens `t0..t0+N` into `out[t·ld + r]`.
    unsafe fn tile<A: Arch, const N: usize>(w: &PackedMatrix, a: &QActs, g: usize, t0: usize, out: *mut f32, ld: usize);
}

/// All tokens of `a` for the groups in `groups`, in tiles of up to 8 tokens.
///
/// # Safety
/// Shapes checked by the caller ([`crate::gemm::GemmKernels`]); `out` valid as documented there;
/// the CPU has the features `A` uses.
#[inline(always)]
pub(in crate::gemm) unsafe fn drive<A: Arch, K: Kern>(
    w: &PackedMatrix,
    a: &QActs,
    groups: std::ops::Range<usize>,
    out: *mut f32,
    ld: usize,
) {
    let n = a.n_tok;
    // Wider pair tiles are for the 16-bit forms, which read the merged activations.
    let nmax = match K::max_n_pairs::<A>() {
        n_pairs if a.pairs && a.has_merged() && n_pairs > 0 => n_pairs,
        _ => A::NMAX.min(K::MAX_N),
    };
    debug_assert!(!a.pairs || n.is_multiple_of(2), "two-level activations come in pairs of rows");
    // SAFETY: forwarded from the caller.
    unsafe {
        for g in groups {
            let mut t = 0;
            if nmax >= 8 {
                while n - t >= 8 {
                    K::tile::<A, 8>(w, a, g, t, out, ld);
                    t += 8;
                }
            }
            if nmax >= 4 {
                while n - t >= 4 {
                    K::tile::<A, 4>(w, a, g, t, out, ld);
                    t += 4;
                }
            }
            while n - t >= 2 {
                // Two-level rows stay in pairs (tiles of 8, 4, 2): kernels may merge a pair.
                if n - t >= 3 && nmax >= 3 && !a.pairs {
                    K::tile::<A, 3>(w, a, g, t, out, ld);
                    t += 3;
                } else {
                    K::tile::<A, 2>(w, a, g, t, out, ld);
                    t += 2;
                }
            }
            if n - t == 1 {
                K::tile::<A, 1>(w, a, g, t, out, ld);
            }
        }
    }
}

/// Runs `f(r0)` for each LANES-row slice of group `g` that holds rows of the matrix and
/// stores the N result vectors (rows t0..t0+N of the activations). Two-level activations
/// (`pairs`; N and t0 even) store each pair's sum, as token t0/2 + p: the kernels keep a pair's
/// levels in two accumulators, and summing them here, in registers, spares the caller a pass
/// over twice the output (summed afterwards by the runtime, the pairs had left the cache).
///
/// A closure the compiler leaves out of line is compiled without the kernel set's target
/// features, every intrinsic in it a call: the Q6_K and Q4_K/Q5_K tiles mark their `f`
/// `#[inline(always)]` (Q6_K's pair tile of 8 ran 60 times slower without; Q4_K's, once it
/// had `q4k_q5k::q4k_scaled`, 100 times). Forced on Q4_K before that, it had made the AVX2 prompt
/// kernel slower (128 → 82 GMAC/s, `--ab`); on Q4_0 it changes nothing measurable, so the
/// 32-element formats and the float tiles are left to the compiler.
#[inline(always)]
pub(in crate::gemm) unsafe fn slices<A: Arch, const N: usize>(
    w: &PackedMatrix,
    pairs: bool,
    g: usize,
    t0: usize,
    out: *mut f32,
    ld: usize,
    mut f: impl FnMut(usize) -> [A::F; N],
) {
    let here = (w.rows - g * GROUP).min(GROUP);
    let mut r0 = 0;
    while r0 < here {
        let acc = f(r0);
        let valid = here - r0;
        let p = out.wrapping_add(g * GROUP + r0);
        if pairs {
            debug_assert!(N.is_multiple_of(2) && t0.is_multiple_of(2));
            for q in 0..N / 2 {
                // SAFETY: see store_slice.
                unsafe {
                    store_slice::<A>(A::add_f(acc[2 * q], acc[2 * q + 1]), p.wrapping_add((t0 / 2 + q) * ld), valid)
                };
            }
        } else {
            for (t, v) in acc.into_iter().enumerate() {
                // SAFETY: see store_slice.
                unsafe { store_slice::<A>(v, p.wrapping_add((t0 + t) * ld), valid) };
            }
        }
        r0 += A::LANES;
    }
}

/// Stores the first `valid` (all if ≥ LANES) of `v`'s lanes at `p`. The caller of [`drive`]
/// guarantees the output rows of the tile and the rows of the group.
#[inline(always)]
pub(in crate::gemm) unsafe fn store_slice<A: Arch>(v: A::F, p: *mut f32, valid: usize) {
    // SAFETY: `p..p + valid` is this slice's part of an output row (above).
    unsafe {
        if valid >= A::LANES {
            A::store(v, p);
        } else {
            let mut tmp = [0f32; 16];
            A::store(v, tmp.as_mut_ptr());
            std::ptr::copy_nonoverlapping(tmp.as_ptr(), p, valid);
        }
    }
}

#[inline(always)]
pub(in crate::gemm) fn toks<const N: usize>(a: &QActs, t0: usize) -> [*const u8; N] {
    std::array::from_fn(|t| a.tok(t0 + t))
}

/// Pair p's merged i16 activations (QActs, in its second row) for the first N/2 pairs of a
/// tile from row t0; later entries are never read (the first row's segment stands in).
#[inline(always)]
pub(in crate::gemm) fn merged_pairs<const N: usize>(a: &QActs, t0: usize) -> [*const u8; N] {
    std::array::from_fn(|p| if 2 * p + 1 < N { a.merged(t0 + 2 * p + 1) } else { a.tok(t0) })
}

/// `acc + Σ w·a` over merged activation elements 4g..4g+4 at `m`, which lie as 8 bytes at
/// 8g in the order (a0, a2), (a1, a3): `lo` holds each lane's weights (w0, w2), `hi` (w1, w3)
/// as i16.
#[inline(always)]
pub(in crate::gemm) unsafe fn dot16_quad<A: Arch>(acc: A::V, lo: A::V, hi: A::V, m: *const u8, g: usize) -> A::V {
    // SAFETY: the 8 bytes at m + 8g lie inside the merged segment (forwarded).
    unsafe { A::dot16(A::dot16(acc, lo, at(m, 8 * g)), hi, at(m, 8 * g + 4)) }
}

/// Pointer `p + off` (no dereference).
#[inline(always)]
pub(in crate::gemm) fn at(p: *const u8, off: usize) -> *const u8 {
    p.wrapping_add(off)
}

/// Independent accumulation chains per token: with few tokens in a tile, one chain of
/// `vpdpbusd` (latency 5) or FMA (latency 4) per token would leave the machine waiting.
/// `wide`: chains per token for tiles of 3 to 7 tokens. Tiles of 8 have 8 chains with one
/// each, and a second would cost registers: with one, Q4_0 gained tiles of 8 (it had stopped
/// at 4) and the 1.1B prompt speeds rose 1-13% (Q4_0 two-level), 2-4% (Q8_0), 3-7%
/// (SmolLM2 Q4_1 two-level) on AVX-512.
pub(in crate::gemm) const fn chains(n: usize, wide: usize) -> usize {
    match n {
        1 => 4,
        2 => 2,
        8 => 1,
        _ => wide,
    }
}

/// Integer accumulators of N tokens in `chains(N, A::CHAINS)` chains (`A::CHAINS_K` for the
/// K-quants, `KQ`); step k goes to chain k % chains. All compile-time constants.
///
/// Where the arch sums 16-bit partials ([`Arch::PARTIAL16`]), steps `k` of one token are
/// instead summed in groups of `PER` consecutive steps (k = 0, 1, 2, … in order, a multiple of
/// `PER` in all) and each group is widened once. `PER` is what keeps every i16 lane exact:
/// a step adds at most 2·w_max·128 per lane (two u8 × i8 products; activations are Q8 in
/// −128..127), so PER ≤ 32767 / (256·w_max): 8 for 4-bit weights, 4 for 5-bit, 2 for 6-bit.
/// The partial's add chain has latency 1, so no extra chains are needed there. `PER` is a
/// type parameter, not a field, because tiles of 8 tokens do not get their step loops
/// unrolled: a run-time grouping there cost more (Q4_K prompts −15%) than it saved.
/// The widening `vpmaddwd` multiplies each i16 pair by token t's `scale[t]` (1 unless the
/// kernel puts a weight scale there, see [`IAcc::new_scaled`]).
pub(in crate::gemm) struct IAcc<A: Arch, const N: usize, const KQ: bool, const PER: usize> {
    acc: [[A::V; N]; 4],
    part: [A::V; N],
    scale: [A::V; N],
}

impl<A: Arch, const N: usize, const KQ: bool, const PER: usize> IAcc<A, N, KQ, PER> {
    const CHAINS: usize = chains(N, if KQ { A::CHAINS_K } else { A::CHAINS });
    const PARTIALS: bool = A::PARTIAL16 && PER > 1;

    #[inline(always)]
    pub(in crate::gemm) unsafe fn new(init: [A::V; N]) -> Self {
        // SAFETY: no memory access.
        unsafe { Self::new_scaled(init, [A::splat32(0x0001_0001); N]) }
    }
    /// Where the arch sums 16-bit partials: widened partials of token t are multiplied by
    /// `scale[t]`, an i16 in both halves of each lane, when they join the i32 sums (the
    /// caller bounds the products; elsewhere the scale is ignored).
    #[inline(always)]
    pub(in crate::gemm) unsafe fn new_scaled(init: [A::V; N], scale: [A::V; N]) -> Self {
        // SAFETY: no memory access.
        let z = unsafe { A::zero() };
        IAcc { acc: [init, [z; N], [z; N], [z; N]], part: [z; N], scale }
    }
    #[inline(always)]
    pub(in crate::gemm) unsafe fn dot(&mut self, k: usize, t: usize, w: A::V, a: *const u8) {
        // SAFETY: forwarded.
        unsafe {
            if Self::PARTIALS {
                let m = A::dot_part(w, a);
                let p = &mut self.part[t];
                *p = if k.is_multiple_of(PER) { m } else { A::add_part(*p, m) };
                if k % PER == PER - 1 {
                    self.acc[0][t] = A::madd16(self.acc[0][t], *p, self.scale[t]);
                }
            } else {
                let c = &mut self.acc[k % Self::CHAINS][t];
                *c = A::dot(*c, w, a);
            }
        }
    }
    #[inline(always)]
    pub(in crate::gemm) unsafe fn dot_q8(&mut self, k: usize, t: usize, w: A::W8, a: *const u8) {
        let c = &mut self.acc[k % Self::CHAINS][t];
        // SAFETY: forwarded.
        *c = unsafe { A::dot_q8(*c, w, a) };
    }
    #[inline(always)]
    pub(in crate::gemm) unsafe fn sum(self) -> [A::V; N] {
        let chains = if Self::PARTIALS { 1 } else { Self::CHAINS };
        std::array::from_fn(|t| {
            let mut s = self.acc[0][t];
            for c in 1..chains {
                // SAFETY: no memory access.
                s = unsafe { A::add32(s, self.acc[c][t]) };
            }
            s
        })
    }
}

/// Float accumulators of N tokens in `chains(N, 1)` chains.
pub(in crate::gemm) struct FAcc<A: Arch, const N: usize>([[A::F; N]; 4]);

impl<A: Arch, const N: usize> FAcc<A, N> {
    #[inline(always)]
    pub(in crate::gemm) unsafe fn new() -> Self {
        // SAFETY: no memory access.
        let z = unsafe { A::zero_f() };
        FAcc([[z; N]; 4])
    }
    /// chain(k % chains)[t] += a·b.
    #[inline(always)]
    pub(in crate::gemm) unsafe fn fmadd(&mut self, k: usize, t: usize, a: A::F, b: A::F) {
        let c = &mut self.0[k % chains(N, 1)][t];
        // SAFETY: no memory access.
        *c = unsafe { A::fmadd(a, b, *c) };
    }
    #[inline(always)]
    pub(in crate::gemm) unsafe fn sum(self) -> [A::F; N] {
        std::array::from_fn(|t| {
            let mut s = self.0[0][t];
            for c in 1..chains(N, 1) {
                // SAFETY: no memory access.
                s = unsafe { A::add_f(s, self.0[c][t]) };
            }
            s
        })
    }
}

/// How far ahead of the block being multiplied the weights are prefetched. Decoding streams
/// every weight from DRAM once per token, and the hardware prefetchers alone left each core
/// stalling on its misses: one thread decoding 1 GiB of Q4_0 / Q4_K ran at 22 / 18 GB/s,
/// 28 / 28 with 16-64 KiB of software prefetch (`cargo bench -p duet-quant --bench gemm --
/// --stream`, AVX-512 EPYC; plain AVX2 19 / 15 -> 27 / 26), and whole-model decode of the
/// random 1.1B Llama gained 13-20% (Q4_0, Q4_K_M, Q6_K).
///
/// The hints ask for L2 (x86 `prefetcht1`), not L1 (`prefetcht0`, until 2026-11-28): 32 KiB
/// ahead is all of Zen 4's L1D, and its L1 fills there were the limit. On a Zen 4 EPYC (CPU
/// family 25 model 17, half-width AVX-512), one thread streaming 1 GiB (`--stream`, two
/// alternating runs, GB/s, single / two-level): Q4_K 13.4 / 8.8-8.9 → 18.0-18.3 / 17.3-18.1,
/// Q6_K 15.1-15.9 / 12.5-12.8 → 18.0-18.7 / 18.0-19.5, Q4_0 15.0-15.9 / 14.4-15.5 → 18.4-18.5 /
/// 17.7-18.5, Q8_0 17.2-18.3 / 19.2-19.7 → 20.4-21.2 / 20.9-21.2, and the AVX2 set's two-level
/// Q4_K 9.8-10.2 → 15.8-16.3; 1.1B decode on 2 threads, three alternating rounds (tg32 t/s):
/// Q4_K_M 31.7-32.7 → 47.6-48.8, Q6_K 31.0-31.3 → 35.7-36.6 (runtime/bench/results/
/// cpu-speed-zen4-prefetch-l2.md). From L2 the line reaches L1 through the hardware's own
/// prefetcher in time. Distances of 16-128 KiB with L2 hints: within noise of 32 KiB (16 KiB
/// the slowest for Q6_K). Zen 5 (48 KiB L1D), where the L1 hints had been measured, is not
/// re-measured. The distance is in bytes of the
/// packed matrix, whose groups lie one after another, so the hint runs on into the next
/// groups; past the matrix's end it is a harmless hint about other memory.
pub(in crate::gemm) const PREFETCH_BYTES: usize = 32 << 10;

/// Prefetches the bytes `from..from + len` of a group, [`PREFETCH_BYTES`] ahead: every line
/// they touch. A group is its blocks' quants and then their scales, so block b of B bytes of
/// quants and M of scales asks for `b·(B + M)..(b + 1)·(B + M)`: the hints advance at the rate
/// the group is consumed and, over the group, cover all of it, scales included (hints that
/// advanced by B per block left M/(B + M) of every matrix, 6-20%, to the hardware: Q4_0 and
/// Q4_K, 11%, were the slowest to stream from DRAM). Only the first token tile of a group
/// reads its weights from memory; later tiles find them in cache and skip the hints. A Q6_K
/// block asks for its lines a quarter at a time, as it uses them: all 48 hints at once
/// streamed Q6_K from DRAM at 21.6 GB/s on one thread against Q4_K's 29, a quarter per quarter
/// block at 27.6-27.9 (`--stream`), and decode of the 1.1B Q6_K file went from 35 to 47
/// tokens/s. (Q4_K's 32 hints split the same way decoded Q4_K_M 8% slower;
/// eighths for Q6_K, no faster than quarters.)
///
/// Where a slice is half a group (AVX2: 8 lanes), the first slice reads every line of the
/// group (each line holds 4 bytes of all 16 rows) and the second finds them in cache. Hints
/// issued by the first slice alone asked for the group's bytes in half its time and left the
/// memory idle in the other half, so slice s of S now asks for part s of S of the group's
/// hints, block by block: they advance evenly over all slices. One thread streaming from DRAM
/// with the AVX2 kernels (`--stream`, 2 alternating runs): two-level decode Q4_K 24 → 28
/// GB/s, Q6_K 23-24 → 28, Q4_0 25-26 → 29-30, single level Q4_K 27-28 → 34-35, Q6_K 26 → 34;
/// 1.1B decode with the AVX2 kernels on 2 threads: Q4_K_M +6-9%, Q4_0 +12%, Q6_K +13-16%,
/// Q8_0 +6-9%; prompts unchanged. (AVX-512's slice is the whole group: nothing changes.)
#[inline(always)]
pub(in crate::gemm) unsafe fn prefetch_ahead<A: Arch>(
    w: &PackedMatrix,
    group: *const u8,
    from: usize,
    len: usize,
    t0: usize,
    r0: usize,
) {
    if t0 != 0 {
        return;
    }
    let group_bytes = w.nb * (w.layout.bulk + w.layout.meta);
    let hints = slice_hints(from..from + len, group_bytes, GROUP.div_ceil(A::LANES), r0 / A::LANES);
    let start = group.wrapping_add(hints.start + PREFETCH_BYTES);
    let end = group.wrapping_add(hints.end + PREFETCH_BYTES);
    let mut line = start.wrapping_sub(start as usize % 64);
    while line < end {
        // SAFETY: a prefetch never faults, whatever the address.
        unsafe { A::prefetch(line) };
        line = line.wrapping_add(64);
    }
}

/// Slice `slice` of `n_slices`'s part of the hints for the bytes `span` of a group of
/// `group_bytes` (see [`prefetch_ahead`]): the group's bytes taken in order over all slices,
/// so that each slice's blocks ask for the next 1/n_slices of what the whole group asks for.
#[inline(always)]
pub(in crate::gemm) fn slice_hints(
    span: std::ops::Range<usize>,
    group_bytes: usize,
    n_slices: usize,
    slice: usize,
) -> std::ops::Range<usize> {
    let start = (slice * group_bytes + span.start) / n_slices;
    start..start + span.len().div_ceil(n_slices)
}

#[cfg(test)]
mod hint_tests {
    use super::slice_hints;

    /// Over all slices, in the order they run, the blocks' hints walk the group's bytes from
    /// start to end without a gap (and overlap by less than a byte per block where the block's
    /// bytes do not divide by the slices), for one and two slices and uneven block sizes.
    #[test]
    fn every_byte_of_a_group_is_hinted_in_order() {
        // (bytes per block, blocks): Q4_K (144 per 256 elements), Q6_K quarters, odd ones.
        for (per_block, nb) in [(144 * 16, 8), (210 * 4, 16), (34 * 16, 64), (37, 5), (1, 3)] {
            let group = per_block * nb;
            for n_slices in 1..=3 {
                let mut covered = 0;
                let mut hinted = 0;
                for slice in 0..n_slices {
                    for b in 0..nb {
                        let h = slice_hints(b * per_block..(b + 1) * per_block, group, n_slices, slice);
                        assert!(
                            h.start <= covered,
                            "gap before {h:?}: covered to {covered} ({per_block}×{nb}, {n_slices} slices)"
                        );
                        assert!(h.end >= covered, "hints went back: {h:?} after {covered}");
                        covered = h.end;
                        hinted += h.len();
                    }
                }
                assert!(covered >= group && covered <= group + n_slices, "covered {covered} of {group}");
                assert!(hinted < group + n_slices * nb, "hinted {hinted} bytes for a group of {group}");
            }
        }
    }
}
