//! The packed kernels, written once over [`Arch`], a small set of vector operations on
//! `LANES` rows at a time (16 for AVX-512, 8 for AVX2, 16 for the portable set). Each
//! instruction set implements [`Arch`] with `#[inline(always)]` methods and instantiates
//! [`drive`] inside a `#[target_feature]` entry point, so everything below compiles to straight
//! SIMD code for that set.
//!
//! A *tile* is one 16-row group × N tokens (N ≤ 8). The group is processed `LANES` rows (one
//! *slice*) at a time; for each block, the weight quants are unpacked once into registers and
//! multiplied against every token of the tile.

// Accumulator arrays, token pointers and results are parallel arrays indexed by token.
#![allow(clippy::needless_range_loop)]

use super::{GROUP, PackedMatrix, QActs};
use crate::second_level;

/// Vector operations on `LANES` rows. `V` holds one i32 lane (4 bytes) per row, `F` one f32.
///
/// # Safety
/// Pointer arguments must be valid for the bytes the method reads (documented per method);
/// no alignment is required.
pub(super) trait Arch {
    const LANES: usize;
    /// Largest token tile worth using (register budget).
    const NMAX: usize;
    /// Integer accumulation chains per token in tiles of 3 to 7 tokens (latency vs registers),
    /// for the 32-element formats and for the K-quants (which hold more accumulators).
    const CHAINS: usize;
    const CHAINS_K: usize;
    /// Whether [`Arch::dot_q8`] multiplies Q8_0's stored bytes (q + 128) as they are, so that
    /// the caller must subtract 128·Σa; otherwise it computes the signed product itself.
    const Q8_BIASED: bool;
    type V: Copy;
    type F: Copy;
    type W8: Copy;

    unsafe fn zero() -> Self::V;
    unsafe fn splat8(x: u8) -> Self::V;
    unsafe fn splat32(x: u32) -> Self::V;
    /// 4·LANES bytes.
    unsafe fn load(p: *const u8) -> Self::V;
    unsafe fn and(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn or(a: Self::V, b: Self::V) -> Self::V;
    /// Shifts of every 16-bit / 32-bit lane.
    unsafe fn srli16<const S: u32>(a: Self::V) -> Self::V;
    unsafe fn srli32<const S: u32>(a: Self::V) -> Self::V;
    unsafe fn slli32<const S: u32>(a: Self::V) -> Self::V;
    unsafe fn add32(a: Self::V, b: Self::V) -> Self::V;
    /// Byte `j` of every 32-bit lane, zero-extended.
    unsafe fn byte_lane(a: Self::V, j: u32) -> Self::V;
    /// Byte `j` of every 32-bit lane, zero-extended into both of its 16-bit halves (one
    /// shuffle: `x | x << 16` became a `vpmulld` by 0x10001).
    unsafe fn byte_lane_x2(a: Self::V, j: u32) -> Self::V;
    /// The i32 at `p` (4 bytes) in every lane.
    unsafe fn bcast_i32(p: *const u8) -> Self::V;
    /// `acc + Σ_{j<4} w.byte[j] (u8) · a[j] (i8)` per lane, `a` = 4 bytes broadcast. The
    /// caller guarantees that `w` bytes are below 64 (no i16 saturation on AVX2).
    unsafe fn dot(acc: Self::V, w: Self::V, a: *const u8) -> Self::V;
    /// Prepares Q8_0's stored bytes (q + 128) for [`Arch::dot_q8`].
    unsafe fn prep_q8(w: Self::V) -> Self::W8;
    /// `acc + Σ (q+128)·a` if `Q8_BIASED`, else `acc + Σ q·a`.
    unsafe fn dot_q8(acc: Self::V, w: Self::W8, a: *const u8) -> Self::V;
    /// `acc + w.lo16·a.lo16 + w.hi16·a.hi16` per lane (i16 × i16), `a` = 4 bytes broadcast.
    unsafe fn dot16(acc: Self::V, w: Self::V, a: *const u8) -> Self::V;
    /// `acc + a.lo16·b.lo16 + a.hi16·b.hi16` per lane (i16 × i16, both in registers).
    unsafe fn madd16(acc: Self::V, a: Self::V, b: Self::V) -> Self::V;
    /// a − b per 16-bit lane.
    unsafe fn sub16(a: Self::V, b: Self::V) -> Self::V;
    /// Adds 16 to byte i of `w` where bit i of the 4·LANES bits at `bits` is set (w's bytes
    /// are below 16).
    unsafe fn set_bit4(w: Self::V, bits: *const u8) -> Self::V;

    /// Whether [`Arch::dot`]'s products are better summed as 16-bit *partials* before they are
    /// widened: true where `dot` is two instructions (AVX2 without VNNI: `vpmaddubsw` into i16
    /// pairs, then `vpmaddwd` into i32), so that several dots share one widening. The caller
    /// bounds how many dots one partial holds so that no i16 lane overflows (see [`IAcc`]).
    const PARTIAL16: bool = false;
    /// A partial of one dot (`Σ w·a` in i16 pairs where `PARTIAL16`, else in i32 lanes).
    unsafe fn dot_part(w: Self::V, a: *const u8) -> Self::V {
        // SAFETY: forwarded.
        unsafe { Self::dot(Self::zero(), w, a) }
    }
    /// The sum of two partials.
    unsafe fn add_part(p: Self::V, q: Self::V) -> Self::V {
        // SAFETY: no memory access.
        unsafe { Self::add32(p, q) }
    }

    unsafe fn zero_f() -> Self::F;
    unsafe fn cvt(a: Self::V) -> Self::F;
    /// a·b + c.
    unsafe fn fmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// c − a·b.
    unsafe fn fnmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    unsafe fn mul(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn add_f(a: Self::F, b: Self::F) -> Self::F;
    /// The f32 at `p` in every lane.
    unsafe fn bcast_f32(p: *const u8) -> Self::F;
    /// LANES little-endian f16 / bf16 (2·LANES bytes) / i8 (LANES bytes) as f32.
    unsafe fn load_f16(p: *const u8) -> Self::F;
    unsafe fn load_bf16(p: *const u8) -> Self::F;
    unsafe fn load_i8f(p: *const u8) -> Self::F;
    /// Stores LANES f32.
    unsafe fn store(a: Self::F, p: *mut f32);
    /// Hints that the 64-byte line at `p` will be read soon. Any address: never faults.
    #[inline(always)]
    unsafe fn prefetch(_p: *const u8) {}
}

/// One weight type's tile kernel.
pub(super) trait Kern {
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
/// Shapes checked by the caller ([`super::GemmKernels`]); `out` valid as documented there;
/// the CPU has the features `A` uses.
#[inline(always)]
pub(super) unsafe fn drive<A: Arch, K: Kern>(
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
/// had `k45::q4k_scaled`, 100 times). Forced on Q4_K before that, it had made the AVX2 prompt
/// kernel slower (128 → 82 GMAC/s, `--ab`); on Q4_0 it changes nothing measurable, so the
/// 32-element formats and the float tiles are left to the compiler.
#[inline(always)]
pub(super) unsafe fn slices<A: Arch, const N: usize>(
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
unsafe fn store_slice<A: Arch>(v: A::F, p: *mut f32, valid: usize) {
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
pub(super) fn toks<const N: usize>(a: &QActs, t0: usize) -> [*const u8; N] {
    std::array::from_fn(|t| a.tok(t0 + t))
}

/// Pair p's merged i16 activations (QActs, in its second row) for the first N/2 pairs of a
/// tile from row t0; later entries are never read (the first row's segment stands in).
#[inline(always)]
pub(super) fn merged_pairs<const N: usize>(a: &QActs, t0: usize) -> [*const u8; N] {
    std::array::from_fn(|p| if 2 * p + 1 < N { a.merged(t0 + 2 * p + 1) } else { a.tok(t0) })
}

/// `acc + Σ w·a` over merged activation elements 4g..4g+4 at `m`, which lie as 8 bytes at
/// 8g in the order (a0, a2), (a1, a3): `lo` holds each lane's weights (w0, w2), `hi` (w1, w3)
/// as i16.
#[inline(always)]
pub(super) unsafe fn dot16_quad<A: Arch>(acc: A::V, lo: A::V, hi: A::V, m: *const u8, g: usize) -> A::V {
    // SAFETY: the 8 bytes at m + 8g lie inside the merged segment (forwarded).
    unsafe { A::dot16(A::dot16(acc, lo, at(m, 8 * g)), hi, at(m, 8 * g + 4)) }
}

/// Pointer `p + off` (no dereference).
#[inline(always)]
pub(super) fn at(p: *const u8, off: usize) -> *const u8 {
    p.wrapping_add(off)
}

/// Independent accumulation chains per token: with few tokens in a tile, one chain of
/// `vpdpbusd` (latency 5) or FMA (latency 4) per token would leave the machine waiting.
/// `wide`: chains per token for tiles of 3 to 7 tokens. Tiles of 8 have 8 chains with one
/// each, and a second would cost registers: with one, Q4_0 gained tiles of 8 (it had stopped
/// at 4) and the 1.1B prompt speeds rose 1-13% (Q4_0 two-level), 2-4% (Q8_0), 3-7%
/// (SmolLM2 Q4_1 two-level) on AVX-512.
const fn chains(n: usize, wide: usize) -> usize {
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
pub(super) struct IAcc<A: Arch, const N: usize, const KQ: bool, const PER: usize> {
    acc: [[A::V; N]; 4],
    part: [A::V; N],
    scale: [A::V; N],
}

impl<A: Arch, const N: usize, const KQ: bool, const PER: usize> IAcc<A, N, KQ, PER> {
    const CHAINS: usize = chains(N, if KQ { A::CHAINS_K } else { A::CHAINS });
    const PARTIALS: bool = A::PARTIAL16 && PER > 1;

    #[inline(always)]
    pub(super) unsafe fn new(init: [A::V; N]) -> Self {
        // SAFETY: no memory access.
        unsafe { Self::new_scaled(init, [A::splat32(0x0001_0001); N]) }
    }
    /// Where the arch sums 16-bit partials: widened partials of token t are multiplied by
    /// `scale[t]`, an i16 in both halves of each lane, when they join the i32 sums (the
    /// caller bounds the products; elsewhere the scale is ignored).
    #[inline(always)]
    pub(super) unsafe fn new_scaled(init: [A::V; N], scale: [A::V; N]) -> Self {
        // SAFETY: no memory access.
        let z = unsafe { A::zero() };
        IAcc { acc: [init, [z; N], [z; N], [z; N]], part: [z; N], scale }
    }
    #[inline(always)]
    pub(super) unsafe fn dot(&mut self, k: usize, t: usize, w: A::V, a: *const u8) {
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
    pub(super) unsafe fn dot_q8(&mut self, k: usize, t: usize, w: A::W8, a: *const u8) {
        let c = &mut self.acc[k % Self::CHAINS][t];
        // SAFETY: forwarded.
        *c = unsafe { A::dot_q8(*c, w, a) };
    }
    #[inline(always)]
    pub(super) unsafe fn sum(self) -> [A::V; N] {
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
pub(super) struct FAcc<A: Arch, const N: usize>([[A::F; N]; 4]);

impl<A: Arch, const N: usize> FAcc<A, N> {
    #[inline(always)]
    pub(super) unsafe fn new() -> Self {
        // SAFETY: no memory access.
        let z = unsafe { A::zero_f() };
        FAcc([[z; N]; 4])
    }
    /// chain(k % chains)[t] += a·b.
    #[inline(always)]
    pub(super) unsafe fn fmadd(&mut self, k: usize, t: usize, a: A::F, b: A::F) {
        let c = &mut self.0[k % chains(N, 1)][t];
        // SAFETY: no memory access.
        *c = unsafe { A::fmadd(a, b, *c) };
    }
    #[inline(always)]
    pub(super) unsafe fn sum(self) -> [A::F; N] {
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
/// random 1.1B Llama gained 13-20% (Q4_0, Q4_K_M, Q6_K). The distance is in bytes of the
/// packed matrix, whose groups lie one after another, so the hint runs on into the next
/// groups; past the matrix's end it is a harmless hint about other memory.
const PREFETCH_BYTES: usize = 32 << 10;

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
pub(super) unsafe fn prefetch_ahead<A: Arch>(
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
fn slice_hints(
    span: std::ops::Range<usize>,
    group_bytes: usize,
    n_slices: usize,
    slice: usize,
) -> std::ops::Range<usize> {
    let start = (slice * group_bytes + span.start) / n_slices;
    start..start + span.len().div_ceil(n_slices)
}

// --- 32-element formats -----------------------------------------------------------------------

/// Adds a block's integer sums to the float accumulators of a 32-element format: `acc[t] +=
/// is[t] · dw · d_t`, `d_t` the activation scale of row t at byte `d_at` of its segment. For
/// two-level activations (`pairs`) rows 2p and 2p+1 are one token's two levels, the second's
/// step exactly 1/128 of the first's ([`crate::second_level`]): `is[2p] · 128 + is[2p+1]` is
/// the pair's sum on the fine grid (at most 32·255·127·128 < 2³¹), so one conversion and one
/// scale serve both levels and the pair's result goes to row 2p (row 2p+1 keeps only what the
/// caller adds itself; [`slices`] stores the pair's sum). Per block and pair that is 3 float
/// operations instead of 6: +4-5% on the 1.1B Q4_0 prompt speed with two levels.
#[inline(always)]
pub(super) unsafe fn fold_block<A: Arch, const N: usize>(
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
pub(super) unsafe fn fold_pair<A: Arch, const N: usize>(
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
unsafe fn tile_legacy4<A: Arch, const N: usize, const FIVE: bool, const MIN: bool, const PER: usize>(
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

pub(super) struct Q4_0;
pub(super) struct Q4_1;
pub(super) struct Q5_0;
pub(super) struct Q5_1;
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

pub(super) use super::q8_0::Q8_0;

// --- K-quants --------------------------------------------------------------------------------

pub(super) use super::k45::{Q4K, Q5K};
pub(super) use super::q6k::Q6K;

// --- float weights ---------------------------------------------------------------------------

#[inline(always)]
unsafe fn tile_float<A: Arch, const N: usize, const BF: bool>(
    w: &PackedMatrix,
    a: &QActs,
    g: usize,
    t0: usize,
    out: *mut f32,
    ld: usize,
) {
    let (bulk, _) = w.group(g);
    let nb = w.nb;
    let tk = toks::<N>(a, t0);
    // SAFETY: pointers stay inside the group and the token segments.
    unsafe {
        slices::<A, N>(w, a.pairs, g, t0, out, ld, |r0| {
            let load = |p| if BF { A::load_bf16(p) } else { A::load_f16(p) };
            if N == 1 {
                // One token: four chains hide the FMA latency.
                let mut acc = [A::zero_f(); 4];
                for b in 0..nb {
                    for k in 0..16 {
                        let wv = load(at(bulk, 512 * b + 32 * k + 2 * r0));
                        acc[k % 4] = A::fmadd(wv, A::bcast_f32(at(tk[0], 4 * (16 * b + k))), acc[k % 4]);
                    }
                }
                let s = A::add_f(A::add_f(acc[0], acc[1]), A::add_f(acc[2], acc[3]));
                std::array::from_fn(|_| s)
            } else {
                let mut acc = [A::zero_f(); N];
                for b in 0..nb {
                    for k in 0..16 {
                        let wv = load(at(bulk, 512 * b + 32 * k + 2 * r0));
                        for t in 0..N {
                            acc[t] = A::fmadd(wv, A::bcast_f32(at(tk[t], 4 * (16 * b + k))), acc[t]);
                        }
                    }
                }
                acc
            }
        })
    }
}

pub(super) struct F16;
pub(super) struct BF16;
impl Kern for F16 {
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
        unsafe { tile_float::<A, N, false>(w, a, g, t0, out, ld) }
    }
}
impl Kern for BF16 {
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
        unsafe { tile_float::<A, N, true>(w, a, g, t0, out, ld) }
    }
}

/// `A` with another tile size and chain count, for comparing tunings in one binary
/// ([`super::variants`]).
pub(super) struct Tuned<A, const NMAX: usize, const CHAINS: usize, const CHAINS_K: usize>(std::marker::PhantomData<A>);

macro_rules! delegate {
    ($( fn $name:ident $(<const $c:ident: u32>)? ($($arg:ident: $ty:ty),*) -> $ret:ty; )*) => {
        $(
            #[inline(always)]
            unsafe fn $name $(<const $c: u32>)? ($($arg: $ty),*) -> $ret {
                // SAFETY: forwarded.
                unsafe { A::$name $(::<$c>)? ($($arg),*) }
            }
        )*
    };
}

impl<A: Arch, const NMAX: usize, const CHAINS: usize, const CHAINS_K: usize> Arch for Tuned<A, NMAX, CHAINS, CHAINS_K> {
    const LANES: usize = A::LANES;
    const NMAX: usize = NMAX;
    const CHAINS: usize = CHAINS;
    const CHAINS_K: usize = CHAINS_K;
    const Q8_BIASED: bool = A::Q8_BIASED;
    const PARTIAL16: bool = A::PARTIAL16;
    type V = A::V;
    type F = A::F;
    type W8 = A::W8;
    delegate! {
        fn zero() -> A::V;
        fn splat8(x: u8) -> A::V;
        fn splat32(x: u32) -> A::V;
        fn load(p: *const u8) -> A::V;
        fn and(a: A::V, b: A::V) -> A::V;
        fn or(a: A::V, b: A::V) -> A::V;
        fn srli16<const S: u32>(a: A::V) -> A::V;
        fn srli32<const S: u32>(a: A::V) -> A::V;
        fn slli32<const S: u32>(a: A::V) -> A::V;
        fn add32(a: A::V, b: A::V) -> A::V;
        fn byte_lane(a: A::V, j: u32) -> A::V;
        fn byte_lane_x2(a: A::V, j: u32) -> A::V;
        fn bcast_i32(p: *const u8) -> A::V;
        fn dot(acc: A::V, w: A::V, a: *const u8) -> A::V;
        fn prep_q8(w: A::V) -> A::W8;
        fn dot_q8(acc: A::V, w: A::W8, a: *const u8) -> A::V;
        fn dot16(acc: A::V, w: A::V, a: *const u8) -> A::V;
        fn madd16(acc: A::V, a: A::V, b: A::V) -> A::V;
        fn sub16(a: A::V, b: A::V) -> A::V;
        fn set_bit4(w: A::V, bits: *const u8) -> A::V;
        fn dot_part(w: A::V, a: *const u8) -> A::V;
        fn add_part(p: A::V, q: A::V) -> A::V;
        fn zero_f() -> A::F;
        fn cvt(a: A::V) -> A::F;
        fn fmadd(a: A::F, b: A::F, c: A::F) -> A::F;
        fn fnmadd(a: A::F, b: A::F, c: A::F) -> A::F;
        fn mul(a: A::F, b: A::F) -> A::F;
        fn add_f(a: A::F, b: A::F) -> A::F;
        fn bcast_f32(p: *const u8) -> A::F;
        fn load_f16(p: *const u8) -> A::F;
        fn load_bf16(p: *const u8) -> A::F;
        fn load_i8f(p: *const u8) -> A::F;
        fn store(a: A::F, p: *mut f32) -> ();
        fn prefetch(p: *const u8) -> ();
    }
}

/// Builds a [`super::GemmKernels`] whose entries run [`drive`] for each type inside entry
/// points carrying `attrs` (the `#[target_feature]` of the instruction set).
macro_rules! kernel_set {
    ($vis:vis $name:ident, $label:literal, $arch:ty, $fast:expr, [$(#[$attr:meta])*]) => {
        $vis mod $name {
            use super::*;
            $crate::gemm::kernels::kernel_set!(@entry [$(#[$attr])*] $arch, q4_0, Q4_0);
            $crate::gemm::kernels::kernel_set!(@entry [$(#[$attr])*] $arch, q4_1, Q4_1);
            $crate::gemm::kernels::kernel_set!(@entry [$(#[$attr])*] $arch, q5_0, Q5_0);
            $crate::gemm::kernels::kernel_set!(@entry [$(#[$attr])*] $arch, q5_1, Q5_1);
            $crate::gemm::kernels::kernel_set!(@entry [$(#[$attr])*] $arch, q8_0, Q8_0);
            $crate::gemm::kernels::kernel_set!(@entry [$(#[$attr])*] $arch, q4_k, Q4K);
            $crate::gemm::kernels::kernel_set!(@entry [$(#[$attr])*] $arch, q5_k, Q5K);
            $crate::gemm::kernels::kernel_set!(@entry [$(#[$attr])*] $arch, q6_k, Q6K);
            $crate::gemm::kernels::kernel_set!(@entry [$(#[$attr])*] $arch, f16, F16);
            $crate::gemm::kernels::kernel_set!(@entry [$(#[$attr])*] $arch, bf16, BF16);
            /// `Kern::reads_merged` of each type's kernel on this arch.
            fn reads_merged(ty: $crate::GgmlType) -> bool {
                use $crate::gemm::kernels::{Kern, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4K, Q5K, Q6K, F16, BF16};
                use $crate::GgmlType as T;
                match ty {
                    T::Q4_0 => Q4_0::reads_merged::<$arch>(),
                    T::Q4_1 => Q4_1::reads_merged::<$arch>(),
                    T::Q5_0 => Q5_0::reads_merged::<$arch>(),
                    T::Q5_1 => Q5_1::reads_merged::<$arch>(),
                    T::Q8_0 => Q8_0::reads_merged::<$arch>(),
                    T::Q4_K => Q4K::reads_merged::<$arch>(),
                    T::Q5_K => Q5K::reads_merged::<$arch>(),
                    T::Q6_K => Q6K::reads_merged::<$arch>(),
                    T::F16 => F16::reads_merged::<$arch>(),
                    T::BF16 => BF16::reads_merged::<$arch>(),
                    _ => false,
                }
            }
            pub(crate) const KERNELS: $crate::gemm::GemmKernels = $crate::gemm::GemmKernels {
                name: $label,
                reads_merged,
                q4_0,
                q4_1,
                q5_0,
                q5_1,
                q8_0,
                q4_k,
                q5_k,
                q6_k,
                f16,
                bf16,
                fast: $fast,
            };
        }
    };
    (@entry [$(#[$attr:meta])*] $arch:ty, $fn_name:ident, $kern:ident) => {
        /// # Safety
        /// See `GemmKernels::gemm_groups`; the CPU must have this set's features.
        $(#[$attr])*
        pub(crate) unsafe fn $fn_name(
            w: &$crate::gemm::PackedMatrix,
            a: &$crate::gemm::QActs,
            groups: std::ops::Range<usize>,
            out: *mut f32,
            ld: usize,
        ) {
            // SAFETY: forwarded.
            unsafe { $crate::gemm::kernels::drive::<$arch, $crate::gemm::kernels::$kern>(w, a, groups, out, ld) }
        }
    };
}
pub(super) use kernel_set;

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
