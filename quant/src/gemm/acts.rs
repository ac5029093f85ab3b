//! Activations quantized for the packed kernels ([`QActs`]): the 8-bit formats each weight
//! type multiplies against, with the per-block sums the kernels subtract offsets through.

use super::*;
use crate::GgmlType;
use crate::blocks::{F16Bytes, QK, QK_K};
use crate::second_level;

/// The activation format a packed kernel reads (ggml's `vec_dot_type` of the weight type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActKind {
    /// For Q4_0, Q5_0, Q8_0.
    Q8_0,
    /// For Q4_1, Q5_1.
    Q8_1,
    /// For the K-quants.
    Q8K,
    /// Plain f32, for F16/BF16 weights.
    F32,
}

impl ActKind {
    pub fn for_weight(ty: GgmlType) -> Option<ActKind> {
        Some(match ty {
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => ActKind::Q8_0,
            GgmlType::Q4_1 | GgmlType::Q5_1 => ActKind::Q8_1,
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => ActKind::Q8K,
            GgmlType::F16 | GgmlType::BF16 => ActKind::F32,
            _ => return None,
        })
    }

    pub(super) fn block(self) -> usize {
        match self {
            ActKind::Q8_0 | ActKind::Q8_1 => QK,
            ActKind::Q8K => QK_K,
            ActKind::F32 => 16,
        }
    }
}

/// Activation rows quantized for the packed kernels: the reference quantization's bytes and
/// scales, plus cached per-block sums. Token t's data is one 64-byte aligned segment:
///
/// * Q8_0: `qs[cols]`, `d[nb]` (f32), `−8·Σq`, `−16·Σq`, `−128·Σq` (`[i32; nb]` each);
/// * Q8_1: `qs[cols]`, `d[nb]`, `s[nb]` (f32, Q8_1's f16 `d·Σq`);
/// * Q8K: `qs[cols]`, `d[nb]`, then per super-block 4 i32 of i16 pairs of sub-block sums
///   (Σ of 32: (b0,b2), (b1,b3), (b4,b6), (b5,b7)), then 16 i32 `−32·bsums[j]`;
/// * Q8_0 and Q8K, second row of a two-level pair of at least [`MERGED_FROM_TOKENS`]
///   tokens: then also (64-byte aligned) room for the pair's *merged* activations
///   `128·q1 + q2` as i16, each 4 elements in the order (a0, a2, a1, a3), for the kernels'
///   16-bit forms (Q6_K; Q8_0 on plain AVX2), written by [`QActs::quantize_two_level`] or
///   [`QActs::add_merged`];
/// * F32: the values.
#[derive(Clone)]
pub struct QActs {
    pub(super) kind: ActKind,
    /// Two-level: row 2t is token t's first level, row 2t+1 its second, whose step is
    /// exactly 1/[`second_level::RATIO`] of the first's (kernels may merge the pair).
    pub(super) pairs: bool,
    pub(super) n_tok: usize,
    pub(super) cols: usize,
    pub(super) nb: usize,
    pub(super) stride: usize,
    pub(super) d_off: usize,
    pub(super) x_off: usize,
    /// Offset of the room for the merged i16 activations in a pair's second row (Q8_0 and Q8K
    /// pairs of at least [`MERGED_FROM_TOKENS`] tokens; else 0).
    pub(super) merged_off: usize,
    /// Whether the merged activations are written (see [`QActs::add_merged`]).
    pub(super) merged_written: bool,
    pub(super) buf: AlignedBytes,
}

impl std::fmt::Debug for QActs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QActs({:?} {}×{})", self.kind, self.n_tok, self.cols)
    }
}

impl QActs {
    /// An empty set of activations of `kind`.
    pub fn new(kind: ActKind) -> QActs {
        QActs {
            kind,
            pairs: false,
            n_tok: 0,
            cols: 0,
            nb: 0,
            stride: 0,
            d_off: 0,
            x_off: 0,
            merged_off: 0,
            merged_written: false,
            buf: AlignedBytes::zeroed(0),
        }
    }

    pub fn kind(&self) -> ActKind {
        self.kind
    }
    /// Activation rows (two-level: two per token).
    pub fn n_tok(&self) -> usize {
        self.n_tok
    }
    /// Tokens, i.e. rows of a product's output.
    pub fn tokens(&self) -> usize {
        if self.pairs { self.n_tok / 2 } else { self.n_tok }
    }
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Quantizes `x` (`n_tok` rows of `cols`), reusing this allocation; tokens are spread
    /// over `par`. `cols` must be a multiple of the format's block (32, 256, or 16 for F32).
    pub fn quantize(&mut self, x: &[f32], n_tok: usize, cols: usize, par: ParFor) {
        self.fill(x, n_tok, cols, false, par);
    }

    /// Two-level quantization: 2·`n_tok` rows, row 2t holding token t exactly as
    /// [`QActs::quantize`] does and row 2t+1 that row's rounding error (`x − d·q` per block)
    /// on the grid d/128 ([`crate::second_level`]), with scale d/128. Summing a matmul's
    /// outputs for the two rows gives the product with the activations known to ~1/(2·127·128)
    /// of each block's absmax instead of ~1/254: the integer kernels stay, the activation error
    /// all but vanishes. A product's output has one row per token, the pair's sum.
    /// (F32: the second row is zeros.)
    ///
    /// Batches of at least [`MERGED_FROM_TOKENS`] tokens also get the pairs' merged i16
    /// activations, which some kernels read ([`GemmKernels::reads_merged`]).
    pub fn quantize_two_level(&mut self, x: &[f32], n_tok: usize, cols: usize, par: ParFor) {
        self.fill(x, n_tok, cols, true, par);
        self.add_merged(par);
    }

    /// [`QActs::quantize_two_level`] without the merged activations, which
    /// [`QActs::add_merged`] can add when a kernel that reads them comes: most kernels do not
    /// (writing them is a pass over 2 bytes an element), and the kernels that do fall back to
    /// their 8-bit forms without them, with the same results.
    pub fn quantize_two_level_unmerged(&mut self, x: &[f32], n_tok: usize, cols: usize, par: ParFor) {
        self.fill(x, n_tok, cols, true, par);
    }

    /// Writes the pairs' merged activations if this batch has room for them
    /// ([`MERGED_FROM_TOKENS`]) and they are not written yet.
    pub fn add_merged(&mut self, par: ParFor) {
        if self.merged_off == 0 || self.merged_written {
            return;
        }
        let (base, stride, cols, off) = (SendPtr(self.buf.as_mut_ptr()), self.stride, self.cols, self.merged_off);
        par(self.n_tok / 2, &|range| {
            for p in range {
                // SAFETY: pair p's rows lie inside `buf`; only this thread touches them, and
                // the merged bytes (after `off`) do not overlap the quants read (before `cols`).
                unsafe {
                    let q1 = std::slice::from_raw_parts(base.get().add(2 * p * stride) as *const i8, cols);
                    let lo = base.get().add((2 * p + 1) * stride);
                    let q2 = std::slice::from_raw_parts(lo as *const i8, cols);
                    quantize::merged(std::slice::from_raw_parts_mut(lo.add(off), 2 * cols), q1, q2);
                }
            }
        });
        self.merged_written = true;
    }

    pub(super) fn fill(&mut self, x: &[f32], n_tok: usize, cols: usize, two_level: bool, par: ParFor) {
        let bs = self.kind.block();
        assert!(cols.is_multiple_of(bs), "{:?} activations need a multiple of {bs} columns, got {cols}", self.kind);
        assert_eq!(x.len(), n_tok * cols, "activation buffer is not n_tok × cols");
        let nb = cols / bs;
        let (d_off, x_off, end) = match self.kind {
            ActKind::Q8_0 => (cols, cols + 4 * nb, cols + 16 * nb),
            ActKind::Q8_1 => (cols, cols + 4 * nb, cols + 8 * nb),
            ActKind::Q8K => (cols, cols + 4 * nb, cols + 4 * nb + 80 * nb),
            ActKind::F32 => (0, 0, 4 * cols),
        };
        let (merged_off, end) =
            if two_level && n_tok >= MERGED_FROM_TOKENS && matches!(self.kind, ActKind::Q8_0 | ActKind::Q8K) {
                let at = end.next_multiple_of(LINE);
                (at, at + 2 * cols)
            } else {
                (0, end)
            };
        let stride = end.next_multiple_of(LINE);
        let rows = if two_level { 2 * n_tok } else { n_tok };
        if self.buf.len < rows * stride {
            self.buf = AlignedBytes::zeroed(rows * stride);
        }
        (self.n_tok, self.cols, self.nb, self.stride, self.d_off, self.x_off) = (rows, cols, nb, stride, d_off, x_off);
        self.merged_off = merged_off;
        self.merged_written = false;
        self.pairs = two_level;
        let base = SendPtr(self.buf.as_mut_ptr());
        let this = &*self;
        // SAFETY: row segments are disjoint (each token's rows are written by one thread)
        // and lie inside `buf`.
        let seg = |row: usize| unsafe { std::slice::from_raw_parts_mut(base.get().add(row * stride), stride) };
        par(n_tok, &|range| {
            for t in range {
                let xt = &x[t * cols..(t + 1) * cols];
                if two_level {
                    let hi = seg(2 * t);
                    this.quantize_token(xt, hi);
                    this.second_level(xt, hi, seg(2 * t + 1));
                } else {
                    this.quantize_token(xt, seg(t));
                }
            }
        });
    }

    /// Quantizes one token into `seg`.
    pub(super) fn quantize_token(&self, x: &[f32], seg: &mut [u8]) {
        let (cols, nb) = (self.cols, self.nb);
        let (qs, rest) = seg.split_at_mut(cols);
        let (d, extra) = rest.split_at_mut(self.x_off - self.d_off);
        match self.kind {
            ActKind::Q8_0 | ActKind::Q8_1 => {
                for b in 0..nb {
                    let xb: &[f32; QK] = x[QK * b..QK * (b + 1)].try_into().expect("32 values");
                    let y = quantize::q8_block(xb);
                    qs[QK * b..QK * (b + 1)].copy_from_slice(bytemuck::cast_slice(&y.qs));
                    put_f32(d, b, y.d.get());
                    if self.kind == ActKind::Q8_0 {
                        put_q8_0_sums(extra, nb, b, y.sum);
                    } else {
                        put_f32(extra, b, y.s.get());
                    }
                }
            }
            ActKind::Q8K => {
                for b in 0..nb {
                    let xb: &[f32; QK_K] = x[QK_K * b..QK_K * (b + 1)].try_into().expect("256 values");
                    let y = quantize::q8_k_block(xb);
                    qs[QK_K * b..QK_K * (b + 1)].copy_from_slice(bytemuck::cast_slice(&y.qs));
                    put_f32(d, b, y.d);
                    put_q8k_sums(&mut extra[80 * b..80 * (b + 1)], &y.bsums);
                }
            }
            ActKind::F32 => {
                for (i, &v) in x.iter().enumerate() {
                    put_f32(seg, i, v);
                }
            }
        }
    }

    /// Writes into `lo` the second level of `x`, whose first level is `hi` (a segment written
    /// by [`QActs::quantize_token`]): the quants of [`crate::second_level`], scale d/128 (exact
    /// in f32), and the same cached sums as a first level's.
    pub(super) fn second_level(&self, x: &[f32], hi: &[u8], lo: &mut [u8]) {
        let (cols, nb) = (self.cols, self.nb);
        if self.kind == ActKind::F32 {
            lo[..4 * cols].fill(0);
            return;
        }
        let (q1, hi_rest) = hi.split_at(cols);
        let q1: &[i8] = bytemuck::cast_slice(q1);
        let (qs, rest) = lo.split_at_mut(cols);
        let qs: &mut [i8] = bytemuck::cast_slice_mut(qs);
        let (d, extra) = rest.split_at_mut(self.x_off - self.d_off);
        let bs = self.kind.block();
        for b in 0..nb {
            let e = b * bs..(b + 1) * bs;
            let d1 = f32::from_le_bytes(hi_rest[4 * b..4 * b + 4].try_into().expect("4 bytes"));
            let sum = second_level::quantize_block(&x[e.clone()], d1, &q1[e.clone()], &mut qs[e.clone()]);
            let d2 = d1 / second_level::RATIO;
            put_f32(d, b, d2);
            match self.kind {
                ActKind::Q8_0 => put_q8_0_sums(extra, nb, b, sum),
                // As the per-row path has it: Q8_1's f16 s = d1·Σq2 on the first level's
                // scale, divided by 128 (ActRow::second_level_into).
                ActKind::Q8_1 => put_f32(extra, b, F16Bytes::from_f32(d1 * sum as f32).get() / second_level::RATIO),
                _ => {
                    let bsums = quantize::q8_k_bsums(qs[e.clone()].try_into().expect("256 quants"));
                    put_q8k_sums(&mut extra[80 * b..80 * (b + 1)], &bsums);
                }
            }
        }
    }

    /// Whether the pairs' merged i16 activations are written (see [`MERGED_FROM_TOKENS`],
    /// [`QActs::add_merged`]).
    #[inline(always)]
    pub(super) fn has_merged(&self) -> bool {
        self.merged_written
    }

    /// Pair row `t` (a second level)'s merged i16 activations (Q8_0 and Q8K pairs).
    #[inline(always)]
    pub(super) fn merged(&self, t: usize) -> *const u8 {
        debug_assert!(self.pairs && self.merged_written && t % 2 == 1);
        self.tok(t).wrapping_add(self.merged_off)
    }

    /// Start of token t's segment.
    #[inline(always)]
    pub(super) fn tok(&self, t: usize) -> *const u8 {
        debug_assert!(t < self.n_tok);
        // SAFETY (pointer arithmetic only): t < n_tok, inside `buf`.
        unsafe { self.buf.as_ptr().add(t * self.stride) }
    }
}

/// Two-level activations of this many tokens and more have room for the pairs' merged i16
/// values, for the kernels' 16-bit forms, written by [`QActs::quantize_two_level`] or
/// [`QActs::add_merged`]. Fewer (decoding) do without: writing them was 1-1.5% of a 1.1B
/// decode (cold lines, on the one thread that quantizes a token), and the kernels take their
/// 8-bit forms instead, which give the same bits.
pub(super) const MERGED_FROM_TOKENS: usize = 4;

/// Stores `v` as the i-th little-endian 4-byte value of `dst`.
pub(super) fn put_i32(dst: &mut [u8], i: usize, v: i32) {
    dst[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
}

pub(super) fn put_f32(dst: &mut [u8], i: usize, v: f32) {
    dst[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
}

/// A Q8_0 block's cached offsets (see [`QActs`]): −8·Σq, −16·Σq, −128·Σq of block b, in the
/// three arrays of nb values after the scales.
pub(super) fn put_q8_0_sums(extra: &mut [u8], nb: usize, b: usize, sum: i32) {
    put_i32(extra, b, -8 * sum);
    put_i32(extra, nb + b, -16 * sum);
    put_i32(extra, 2 * nb + b, -128 * sum);
}

/// A Q8_K block's cached sums (see [`QActs`]): the four i16 pairs of 32-sub-block sums, then
/// `−32·bsums[j]` for its 16 sub-blocks of 16.
pub(super) fn put_q8k_sums(e: &mut [u8], bsums: &[i16; QK_K / 16]) {
    let bs = |j: usize| bsums[2 * j] as i32 + bsums[2 * j + 1] as i32;
    for (i, (lo, hi)) in [(0, 2), (1, 3), (4, 6), (5, 7)].into_iter().enumerate() {
        let pair = (bs(lo) as u16 as u32) | ((bs(hi) as u16 as u32) << 16);
        put_i32(e, i, pair as i32);
    }
    for (j, &b) in bsums.iter().enumerate() {
        put_i32(e, 4 + j, -32 * b as i32);
    }
}
