//! Per-column asymmetric quantization over groups of rows: the K cache format of KIVI (Liu et
//! al. 2024), for the `q8c`/`q6c`/`q4c`/`q3c`/`q2c` cache types.
//!
//! A key's large coordinates sit in fixed channels and barely change from one token to the
//! next, so quantizing each channel over a group of tokens, from its own minimum with its
//! own step, leaves every channel its full resolution — where blocks along a row spend
//! their levels on the one outlier channel. On SmolLM2-135M a 4-bit K cache stored this
//! way costs a tenth of what Hadamard-rotated Q4_0 rows cost (docs/kv-cache-formats.md).
//!
//! A group holds [`GROUP`] rows of `cols` values (`cols` a multiple of 32), quantized from
//! their f16 values (a cache keeps the rows of a group that is not yet full in f16, and
//! quantizing f16 values makes the bytes independent of how the rows were batched):
//!
//! * `lo[cols]`: f16, the bottom of each column's range;
//! * `step[cols]`: f16, `(hi − lo) / (2^bits − 1)` rounded up to f16, so `hi` is in range —
//!   the range `lo..=hi` being the column's smallest and largest value, or that range
//!   at 3 and 2 bits narrowed where values beyond it then cost less in all
//!   (`ChannelFormat::clipped_range`: each end moved in by up to one step, the least sum
//!   of squared errors);
//! * at 3 and 2 bits, in place of those two, the compact header ([`super::channel_header`]):
//!   a `u16` word per column, then an f32 unit per 32 columns — the f16 `lo` and `step`
//!   above taken to the nearest bottom and next step of its grid (or the whole range's,
//!   where that leaves less error);
//! * [`GROUP`] rows of codes `u ∈ [0, 2^bits − 1]`, each row `cols·bits/8` bytes, packed 32
//!   at a time ([`super::pack`]).
//!
//! A sequence's first [`SINK`] positions — the attention sink, whose keys are outliers in
//! several channels (SmolLM2: channel ranges of 13.6 with position 0, 2.5 without) — are
//! kept in f16 apart from the groups; the sequence's group 0 takes its ranges over its other
//! rows only (`sink_rows`), so one token no longer coarsens 31 others' steps. Their codes are
//! still written (clamped into range) but never read.
//!
//! `value = lo + step·u` with `u = clamp(round((x − lo) / step), 0, 2^bits − 1)`, round
//! halves away from zero (a step of 0 gives u = 0) — [`ChannelFormat::error_bound`]. Only
//! correctly rounded subtraction and division are involved, and products only where they
//! are exact (the range search's), so a GPU compiler that fuses a product into the next
//! addition changes nothing and the GPU writes the same bytes.

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::channel_header;
use super::pack::{N, pack32, packed_bytes, unpack32};
use crate::fp::{f16_bits_to_f32, f32_to_f16_bits};

/// Rows per group.
pub const GROUP: usize = 32;

/// Positions at the start of a sequence kept in f16 outside the groups (the attention sink).
pub const SINK: usize = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChannelFormat {
    Q8,
    Q6,
    Q4,
    Q3,
    Q2,
}

impl ChannelFormat {
    pub const ALL: [ChannelFormat; 5] =
        [ChannelFormat::Q8, ChannelFormat::Q6, ChannelFormat::Q4, ChannelFormat::Q3, ChannelFormat::Q2];

    pub fn bits(self) -> u32 {
        match self {
            ChannelFormat::Q8 => 8,
            ChannelFormat::Q6 => 6,
            ChannelFormat::Q4 => 4,
            ChannelFormat::Q3 => 3,
            ChannelFormat::Q2 => 2,
        }
    }

    /// The largest code, `2^bits − 1`.
    pub fn top(self) -> u32 {
        (1 << self.bits()) - 1
    }

    /// Bytes of `lo` and `step` for `cols` columns: f16 pairs, or at 3 and 2 bits a word a
    /// column and a unit per 32 ([`ChannelFormat::compact_header`]).
    pub fn header_bytes(self, cols: usize) -> usize {
        if self.compact_header() { 2 * cols + 4 * (cols / N) } else { 4 * cols }
    }

    /// Whether `lo` and `step` are stored in 16 bits a column ([`super::channel_header`])
    /// rather than as f16 pairs: at 3 and 2 bits, where the header's 32 bits a column over
    /// a group of 32 positions were a whole bit a value (a 3-bit K cache 4 bits, past issue
    /// 44's budget of 3.5). At 4 bits the coarser grid cost 18% more KL divergence.
    pub fn compact_header(self) -> bool {
        self.bits() <= 3
    }

    /// Bytes of one row's codes.
    pub fn row_bytes(self, cols: usize) -> usize {
        cols / N * packed_bytes(self.bits())
    }

    /// Bytes of one whole group.
    pub fn group_bytes(self, cols: usize) -> usize {
        self.header_bytes(cols) + GROUP * self.row_bytes(cols)
    }

    /// Whether a group's columns may take a narrower range than their values span
    /// ([`ChannelFormat::quantize_group`]'s search): at 3 and 2 bits. Above, it gained within
    /// the noise (q4c alone: +0.57% → +0.49% perplexity on SmolLM2) for ~1 ms a group of 32
    /// positions and 192 channels on a 2-core Zen 4. The GPU's write kernel takes it from here.
    pub fn narrows_range(self) -> bool {
        self.bits() <= 3
    }

    /// Whether keys are stored as they were before RoPE (KVQuant, Hooper et al. 2024), RoPE
    /// applied to each key as it is read: at 4, 3 and 2 bits. RoPE turns each channel pair
    /// of a key into a sinusoid over positions, so within a group of 32 the fast-rotating
    /// pairs span their whole amplitude, where before RoPE a channel stays near its own
    /// offset: SmolLM2's 3-bit K alone +3.1% → +1.8% perplexity, 2-bit +26.5% → +17.1%
    /// (runtime/bench/results/kv-lowbit-trials-2026-11-28.md); 4-bit K alone +0.57% →
    /// +0.21%, `q4c`/`q4r` +0.94% → +0.59% at `-c 512` and +1.34% → +0.58% at `-c 4096`
    /// (`kv-accuracy-duet-f95b7c9.md`), once the turned keys were shared by the query
    /// heads that read them. At 6 and 8 bits post-RoPE keys lose nothing measurable and keep
    /// the integer reads.
    pub fn keys_before_rope(self) -> bool {
        self.bits() <= 4
    }

    /// Largest round-trip error of a value in a column whose group spans `lo..=hi` (f16
    /// values): half a step (the step rounded up to f16: at most 2⁻¹⁰ larger, or by f16's
    /// subnormal spacing 2⁻²⁴ for tiny ones), plus the f32 rounding of computing the code
    /// and the value. At 3 and 2 bits the search may narrow the range: a value beyond it is
    /// off by the clipped distance, at most two steps of the whole range (the bottom moves
    /// in by up to one step and its f16 rounding by no more than that, since the old bottom
    /// is an f16 value; the top by up to one), which also covers the values inside. With
    /// compact headers, half of [`ChannelFormat::compact_step_bound`] more (`unit`: the
    /// column's block's, [`super::channel_header`]; unused otherwise).
    pub fn error_bound(self, lo: f32, hi: f32, unit: f32) -> f32 {
        let step = (hi - lo) / self.top() as f32 * (1.0 + 1.0 / 1024.0) + 1.0 / (1u32 << 24) as f32;
        let steps = if self.narrows_range() { 2.0 } else { 0.5 };
        let bound = step * (steps + 1.0 / 16384.0) + (lo.abs().max(hi.abs())) * f32::EPSILON;
        if self.compact_header() { bound + self.compact_step_bound(lo, hi, unit) * 0.5 } else { bound }
    }

    /// With compact headers, the largest step a column spanning `lo..=hi` may be given
    /// (bounded with 5.4% where the grid's steps are at most 4.7% apart, 2^(1/16) with
    /// 8-bit mantissas): the next of the grid above its own, or above `4·|lo| / 255` where
    /// the bottom would not fit in 255 quarter steps otherwise, and no finer than the
    /// grid's finest, 134·2⁻¹⁵ of the block's unit. Its bottom moves by at most an eighth
    /// of it.
    pub fn compact_step_bound(self, lo: f32, hi: f32, unit: f32) -> f32 {
        let step = (hi - lo) / self.top() as f32 * (1.0 + 1.0 / 1024.0) + 1.0 / (1u32 << 24) as f32;
        let fit = 4.0 * lo.abs().max(hi.abs()) / 254.0;
        1.054 * step.max(fit).max(unit / 245.0)
    }

    /// Quantizes a group: `x` is [`GROUP`] rows of `cols` f16 values, row-major; `out` is
    /// [`ChannelFormat::group_bytes`] bytes. The first `sink_rows` rows (0, or [`SINK`] for
    /// a sequence's group 0, whose first rows are read from elsewhere) are left out of the
    /// columns' ranges; their codes are clamped like any other.
    pub fn quantize_group(self, x: &[f16], cols: usize, sink_rows: usize, out: &mut [u8]) {
        self.check_group(x, cols, sink_rows, out);
        let mut xf = vec![0f32; GROUP * cols];
        x.convert_to_f32_slice(&mut xf);
        let (mut lo, mut step, mut u) = (vec![0u16; cols], vec![0u16; cols], vec![0u8; GROUP * cols]);
        super::channel_lanes::quantize_columns(self, &xf, cols, sink_rows, &mut lo, &mut step, &mut u);
        self.write_group(&xf, cols, sink_rows, &lo, &step, &mut u, out);
    }

    /// The checks of a group's quantization.
    fn check_group(self, x: &[f16], cols: usize, sink_rows: usize, out: &[u8]) {
        assert!(cols.is_multiple_of(N), "channel groups are whole blocks of {N} columns, not {cols}");
        assert!(sink_rows < GROUP, "a group of {GROUP} rows cannot leave {sink_rows} out");
        assert_eq!(x.len(), GROUP * cols, "a group is {GROUP} rows");
        assert_eq!(out.len(), self.group_bytes(cols), "output is not the group's size");
    }

    /// Writes a group whose columns' ranges were searched (f16 `lo` and `step`, codes `u`
    /// against them): f16 pairs as they are, or compact headers — each block's unit, each
    /// column's word, and the codes again against the bottom and step the word decodes to.
    /// A narrowed range can land badly on the compact grid (its bottom moved by up to an
    /// eighth of a step, its step up to 4.7% coarser, and the top with them), so a column
    /// takes the whole range's word instead where that leaves less error, measured as the
    /// search measures it.
    #[allow(clippy::too_many_arguments)]
    fn write_group(
        self,
        x: &[f32],
        cols: usize,
        sink_rows: usize,
        lo: &[u16],
        step: &[u16],
        u: &mut [u8],
        out: &mut [u8],
    ) {
        let (header, codes) = out.split_at_mut(self.header_bytes(cols));
        if self.compact_header() {
            let (words, units) = header.split_at_mut(2 * cols);
            let top = self.top() as f32;
            for b in 0..cols / N {
                let cs = b * N..(b + 1) * N;
                let searched = |c: usize| (f16_bits_to_f32(lo[c]), f16_bits_to_f32(step[c]));
                let whole = |c: usize| {
                    let col = (sink_rows..GROUP).map(|r| x[r * cols + c]);
                    let (a, b) = col.fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
                    (f16_bits_to_f32(f32_to_f16_bits(a)), f16_bits_to_f32(f16_bits_up((b - a) / top)))
                };
                let wholes: [(f32, f32); N] = std::array::from_fn(|i| whole(b * N + i));
                let unit = channel_header::unit(cs.clone().map(searched).chain(wholes));
                units[4 * b..4 * b + 4].copy_from_slice(&unit.to_le_bytes());
                for (c, ww) in cs.zip(wholes) {
                    let err = |w: u16| {
                        let (l, s) = channel_header::decode(w, unit);
                        (sink_rows..GROUP).fold(0f32, |e, r| {
                            let v = x[r * cols + c];
                            let d = round_to_11_bits(v - (l + s * code(v, l, s, top)));
                            e + d * d
                        })
                    };
                    let ws = searched(c);
                    let (ws, ww) = (channel_header::encode(ws.0, ws.1, unit), channel_header::encode(ww.0, ww.1, unit));
                    // NaN errors (a column that is not finite) keep the searched word; where
                    // both ranges land on the same word there is nothing to measure.
                    let w = if ww != ws && err(ww) < err(ws) { ww } else { ws };
                    words[2 * c..2 * c + 2].copy_from_slice(&w.to_le_bytes());
                    let (l, s) = channel_header::decode(w, unit);
                    for r in 0..GROUP {
                        u[r * cols + c] = code(x[r * cols + c], l, s, top) as u8;
                    }
                }
            }
        } else {
            let (lo_bytes, step_bytes) = header.split_at_mut(2 * cols);
            for (c, (&l, &s)) in lo.iter().zip(step).enumerate() {
                lo_bytes[2 * c..2 * c + 2].copy_from_slice(&l.to_le_bytes());
                step_bytes[2 * c..2 * c + 2].copy_from_slice(&s.to_le_bytes());
            }
        }
        let pb = packed_bytes(self.bits());
        for (row_codes, row_u) in codes.chunks_exact_mut(self.row_bytes(cols)).zip(u.chunks_exact(cols)) {
            for (dst, blk) in row_codes.chunks_exact_mut(pb).zip(row_u.chunks_exact(N)) {
                pack32(self.bits(), blk.try_into().unwrap(), dst);
            }
        }
    }

    /// [`ChannelFormat::quantize_group`] a column at a time: the definition, which
    /// `super::channel_lanes` runs eight columns at a time and the GPU's write kernel
    /// repeats, kept to test both against.
    #[cfg(test)]
    fn quantize_group_scalar(self, x: &[f16], cols: usize, sink_rows: usize, out: &mut [u8]) {
        self.check_group(x, cols, sink_rows, out);
        let top = self.top() as f32;
        let (mut lo_all, mut step_all) = (vec![0u16; cols], vec![0u16; cols]);
        let mut u = vec![0u8; GROUP * cols];
        for c in 0..cols {
            let col: [f32; GROUP] = std::array::from_fn(|r| x[r * cols + c].to_f32());
            // f32::min/max skip NaN; a column of NaN or ±inf decodes as NaN (step NaN).
            let (a, b) =
                col[sink_rows..].iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v)));
            let (lo_bits, step_bits) = if a.is_finite() && b.is_finite() {
                self.clipped_range(&col, sink_rows, a, b)
            } else {
                (f32_to_f16_bits(if a.is_finite() { a } else { 0.0 }), 0x7e00)
            };
            (lo_all[c], step_all[c]) = (lo_bits, step_bits);
            let (lo, step) = (f16_bits_to_f32(lo_bits), f16_bits_to_f32(step_bits));
            for (r, &v) in col.iter().enumerate() {
                u[r * cols + c] = code(v, lo, step, top) as u8;
            }
        }
        let mut xf = vec![0f32; GROUP * cols];
        x.convert_to_f32_slice(&mut xf);
        self.write_group(&xf, cols, sink_rows, &lo_all, &step_all, &mut u, out);
    }

    /// The f16 bits of `lo` and `step` of a column whose rows `sink_rows..GROUP` (values
    /// `v(r)`, finite) span `a..=b`: among `lo = a + i·s`, `hi = b − j·s` for `i, j` in
    /// `0..=`[`CLIP_QUARTERS`] (`s` a quarter of the step of the whole range), the pair whose
    /// codes leave the least sum of squared errors over those rows, the first in `(i, j)`
    /// order — `(0, 0)`, the whole range, unless another is better. An outlier row no longer
    /// sets the steps of all the others (docs/kv-cache-formats.md, "3 and 2 bits", has what
    /// it gains). Only where [`ChannelFormat::narrows_range`]; elsewhere the whole range.
    ///
    /// The GPU repeats this bit for bit: `i·s`, `j·s` and `step·code` are exact (an f16 value
    /// times a small integer, or a power of two) and so is the square of a residual rounded
    /// to 11 bits, so a compiler that fuses a product into the next addition changes nothing;
    /// divisions and roundings are correctly rounded on both; the sums run in row order.
    #[cfg(test)]
    fn clipped_range(self, col: &[f32; GROUP], sink_rows: usize, a: f32, b: f32) -> (u16, u16) {
        let top = self.top() as f32;
        let whole = (f32_to_f16_bits(a), f16_bits_up((b - a) / top));
        let s = f16_bits_to_f32(whole.1) / 4.0;
        if !self.narrows_range() || b == a || !s.is_finite() {
            return whole;
        }
        let mut best = (f32::INFINITY, whole);
        for i in 0..=CLIP_QUARTERS {
            for j in 0..=CLIP_QUARTERS {
                // a itself for i = 0 (a −0 minimum stays −0, whatever a compiler makes of −0 + 0).
                let lo_bits = if i == 0 { whole.0 } else { f32_to_f16_bits(a + i as f32 * s) };
                let lo = f16_bits_to_f32(lo_bits);
                let hi = b - j as f32 * s;
                if hi <= lo {
                    continue;
                }
                let step_bits = f16_bits_up((hi - lo) / top);
                let step = f16_bits_to_f32(step_bits);
                let mut err = 0f32;
                for &x in &col[sink_rows..] {
                    let d = round_to_11_bits(x - (lo + step * code(x, lo, step, top)));
                    err += d * d;
                }
                if err < best.0 {
                    best = (err, (lo_bits, step_bits));
                }
            }
        }
        best.1
    }

    /// Each column's `lo` and `step` of a group.
    pub fn header(self, group: &[u8], cols: usize, lo: &mut [f32], step: &mut [f32]) {
        self.head_header(group, cols, 0, &mut lo[..cols], &mut step[..cols]);
    }

    /// `lo` and `step` of columns `col0..col0 + lo.len()` of a group of `cols` columns (a
    /// reader's head).
    pub fn head_header(self, group: &[u8], cols: usize, col0: usize, lo: &mut [f32], step: &mut [f32]) {
        let half = |at: usize| u16::from_le_bytes([group[at], group[at + 1]]);
        if self.compact_header() {
            for (i, (l, s)) in lo.iter_mut().zip(step.iter_mut()).enumerate() {
                let c = col0 + i;
                let at = 2 * cols + 4 * (c / N);
                let unit = f32::from_le_bytes(group[at..at + 4].try_into().unwrap());
                (*l, *s) = channel_header::decode(half(2 * c), unit);
            }
        } else {
            for (i, (l, s)) in lo.iter_mut().zip(step.iter_mut()).enumerate() {
                *l = f16_bits_to_f32(half(2 * (col0 + i)));
                *s = f16_bits_to_f32(half(2 * (cols + col0 + i)));
            }
        }
    }

    /// Dequantizes a group into `out` ([`GROUP`] rows of `cols`).
    pub fn dequantize_group(self, group: &[u8], cols: usize, out: &mut [f32]) {
        assert_eq!(group.len(), self.group_bytes(cols), "input is not the group's size");
        assert_eq!(out.len(), GROUP * cols, "a group is {GROUP} rows");
        let (mut lo, mut step) = (vec![0f32; cols], vec![0f32; cols]);
        self.header(group, cols, &mut lo, &mut step);
        let rb = self.row_bytes(cols);
        let codes = &group[self.header_bytes(cols)..];
        let mut u = [0u8; N];
        for (r, row) in out.chunks_exact_mut(cols).enumerate() {
            for (blk, o) in row.chunks_exact_mut(N).enumerate() {
                let pb = packed_bytes(self.bits());
                unpack32(self.bits(), &codes[r * rb + blk * pb..r * rb + (blk + 1) * pb], &mut u);
                for (j, (v, &c)) in o.iter_mut().zip(&u).enumerate() {
                    let col = blk * N + j;
                    *v = lo[col] + step[col] * c as f32;
                }
            }
        }
    }
}

/// `v` (finite) rounded to 11 significant bits, to nearest even — f16's precision, with no
/// subnormal range — by integer arithmetic that a shader repeats exactly, so that the square
/// of a residual is exact in f32 (a residual is a multiple of 2⁻²⁶ here, so the square
/// is at least 2⁻⁵², a normal f32).
#[inline]
pub(super) fn round_to_11_bits(v: f32) -> f32 {
    let b = v.to_bits();
    f32::from_bits((b + 0xfff + ((b >> 13) & 1)) & !0x1fff)
}

/// How far in, in quarters of the whole range's step, the clipping search may move each end
/// of a column's range ([`ChannelFormat::quantize_group`]).
pub const CLIP_QUARTERS: usize = 4;

/// The code of `x` in a column from `lo` with `step`: `clamp(round((x − lo) / step), 0,
/// top)`, halves away from zero; 0 for a step of 0 and for NaN.
#[inline]
fn code(x: f32, lo: f32, step: f32, top: f32) -> f32 {
    if step == 0.0 {
        return 0.0;
    }
    let t = (x - lo) / step;
    // Below 0 or NaN (a NaN input or step) → 0; from top on → top.
    if t.is_nan() || t <= 0.0 {
        return 0.0;
    }
    if t >= top {
        return top;
    }
    // 0 < t < top ≤ 255: the truncation and t − r are exact, so this is f32::round (halves
    // away from zero) without a libm call — the range search runs it 25 times a value.
    let r = t as u32 as f32;
    if t - r >= 0.5 { r + 1.0 } else { r }
}

/// The f16 bits of `v ≥ 0` rounded up (toward +∞); above f16's range, +∞.
pub fn f16_bits_up(v: f32) -> u16 {
    let h = f32_to_f16_bits(v);
    if f16_bits_to_f32(h) >= v || v.is_nan() { h } else { h + 1 }
}

#[cfg(test)]
#[path = "channel_tests.rs"]
mod tests;
