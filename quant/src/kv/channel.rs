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

    /// Bytes of `lo` and `step` for `cols` columns.
    pub fn header_bytes(self, cols: usize) -> usize {
        4 * cols
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
    /// is an f16 value; the top by up to one), which also covers the values inside.
    pub fn error_bound(self, lo: f32, hi: f32) -> f32 {
        let step = (hi - lo) / self.top() as f32 * (1.0 + 1.0 / 1024.0) + 1.0 / (1u32 << 24) as f32;
        let steps = if self.narrows_range() { 2.0 } else { 0.5 };
        step * (steps + 1.0 / 16384.0) + (lo.abs().max(hi.abs())) * f32::EPSILON
    }

    /// Quantizes a group: `x` is [`GROUP`] rows of `cols` f16 values, row-major; `out` is
    /// [`ChannelFormat::group_bytes`] bytes. The first `sink_rows` rows (0, or [`SINK`] for
    /// a sequence's group 0, whose first rows are read from elsewhere) are left out of the
    /// columns' ranges; their codes are clamped like any other.
    pub fn quantize_group(self, x: &[f16], cols: usize, sink_rows: usize, out: &mut [u8]) {
        let (lo_bytes, step_bytes, codes) = self.group_parts(x, cols, sink_rows, out);
        let mut xf = vec![0f32; GROUP * cols];
        x.convert_to_f32_slice(&mut xf);
        let (mut lo, mut step, mut u) = (vec![0u16; cols], vec![0u16; cols], vec![0u8; GROUP * cols]);
        super::channel_lanes::quantize_columns(self, &xf, cols, sink_rows, &mut lo, &mut step, &mut u);
        for (c, (&l, &s)) in lo.iter().zip(&step).enumerate() {
            lo_bytes[2 * c..2 * c + 2].copy_from_slice(&l.to_le_bytes());
            step_bytes[2 * c..2 * c + 2].copy_from_slice(&s.to_le_bytes());
        }
        let pb = packed_bytes(self.bits());
        for (row_codes, row_u) in codes.chunks_exact_mut(self.row_bytes(cols)).zip(u.chunks_exact(cols)) {
            for (dst, blk) in row_codes.chunks_exact_mut(pb).zip(row_u.chunks_exact(N)) {
                pack32(self.bits(), blk.try_into().unwrap(), dst);
            }
        }
    }

    /// The checks of a group's quantization and its output split into the bottoms, the
    /// steps and the codes.
    fn group_parts<'a>(
        self,
        x: &[f16],
        cols: usize,
        sink_rows: usize,
        out: &'a mut [u8],
    ) -> (&'a mut [u8], &'a mut [u8], &'a mut [u8]) {
        assert!(cols.is_multiple_of(N), "channel groups are whole blocks of {N} columns, not {cols}");
        assert!(sink_rows < GROUP, "a group of {GROUP} rows cannot leave {sink_rows} out");
        assert_eq!(x.len(), GROUP * cols, "a group is {GROUP} rows");
        assert_eq!(out.len(), self.group_bytes(cols), "output is not the group's size");
        let (header, codes) = out.split_at_mut(self.header_bytes(cols));
        let (lo_bytes, step_bytes) = header.split_at_mut(2 * cols);
        (lo_bytes, step_bytes, codes)
    }

    /// [`ChannelFormat::quantize_group`] a column at a time: the definition, which
    /// `super::channel_lanes` runs eight columns at a time and the GPU's write kernel
    /// repeats, kept to test both against.
    #[cfg(test)]
    fn quantize_group_scalar(self, x: &[f16], cols: usize, sink_rows: usize, out: &mut [u8]) {
        let (lo_bytes, step_bytes, codes) = self.group_parts(x, cols, sink_rows, out);
        let top = self.top() as f32;
        let mut lo = vec![0f32; cols];
        let mut step = vec![0f32; cols];
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
            lo_bytes[2 * c..2 * c + 2].copy_from_slice(&lo_bits.to_le_bytes());
            step_bytes[2 * c..2 * c + 2].copy_from_slice(&step_bits.to_le_bytes());
            lo[c] = f16_bits_to_f32(lo_bits);
            step[c] = f16_bits_to_f32(step_bits);
        }
        let rb = self.row_bytes(cols);
        for (r, row_codes) in codes.chunks_exact_mut(rb).enumerate() {
            let row = &x[r * cols..(r + 1) * cols];
            for (blk, dst) in row_codes.chunks_exact_mut(packed_bytes(self.bits())).enumerate() {
                let u: [u8; N] = std::array::from_fn(|j| {
                    let c = blk * N + j;
                    code(row[c].to_f32(), lo[c], step[c], top) as u8
                });
                pack32(self.bits(), &u, dst);
            }
        }
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
        let f = |b: &[u8]| f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]));
        for (c, (l, s)) in lo.iter_mut().zip(step.iter_mut()).enumerate().take(cols) {
            *l = f(&group[2 * c..]);
            *s = f(&group[2 * cols + 2 * c..]);
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
#[cfg(test)]
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
mod tests {
    use super::*;
    use crate::legacy::test_util::normal;

    const COLS: usize = 64;

    /// Columns of different characters: an offset outlier channel with a small spread
    /// (what keys look like), a constant column, mixed signs, tiny values.
    fn group() -> Vec<f16> {
        let n = normal(GROUP * COLS, 11);
        (0..GROUP * COLS)
            .map(|i| {
                let (r, c) = (i / COLS, i % COLS);
                let v = match c {
                    3 => 40.0 + 0.05 * n[i],
                    7 => -2.5,
                    9 => 1e-5 * n[i],
                    11 => {
                        if r == 0 {
                            300.0
                        } else {
                            n[i]
                        }
                    }
                    _ => n[i] * (1.0 + c as f32 / 16.0),
                };
                f16::from_f32(v)
            })
            .collect()
    }

    #[test]
    fn round_trip_error_is_within_the_bound() {
        let x = group();
        for f in ChannelFormat::ALL {
            let mut bytes = vec![0u8; f.group_bytes(COLS)];
            f.quantize_group(&x, COLS, 0, &mut bytes);
            let mut back = vec![0f32; x.len()];
            f.dequantize_group(&bytes, COLS, &mut back);
            for c in 0..COLS {
                let col: Vec<f32> = (0..GROUP).map(|r| x[r * COLS + c].to_f32()).collect();
                let lo = col.iter().fold(f32::INFINITY, |m, &v| m.min(v));
                let hi = col.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                let bound = f.error_bound(lo, hi);
                for r in 0..GROUP {
                    let (a, b) = (col[r], back[r * COLS + c]);
                    assert!((a - b).abs() <= bound, "{f:?} col {c} row {r}: {a} -> {b}, bound {bound}");
                }
                // The bottom of the range is the smallest value exactly, or at 3 and 2 bits
                // above it by at most two steps of the whole range where the search
                // narrowed it.
                let bottom = back.iter().skip(c).step_by(COLS).fold(f32::INFINITY, |m, &v| m.min(v));
                let step = (hi - lo) / f.top() as f32;
                if !f.narrows_range() {
                    assert_eq!(bottom, lo, "{f:?} col {c}");
                } else {
                    assert!(bottom >= lo && bottom - lo <= 2.0 * step * 1.001, "{f:?} col {c}: {bottom}");
                }
            }
            // A constant column is exact.
            assert!((0..GROUP).all(|r| back[r * COLS + 7] == -2.5));
        }
    }

    /// The narrowed range never leaves a column more error (the sum of squared errors, the
    /// search's measure but for its f16 rounding of each residual) than the whole range, and
    /// at 2 bits it takes a column with one high row from coarse steps to fine ones: 31
    /// values spread over 0..1 and one at 1.6.
    #[test]
    fn clipping_never_costs_and_helps_a_lone_high_value() {
        let mut x = group();
        for r in 0..GROUP {
            x[r * COLS + 20] = f16::from_f32(if r == 13 { 1.6 } else { r as f32 / 31.0 });
        }
        for f in ChannelFormat::ALL {
            let mut bytes = vec![0u8; f.group_bytes(COLS)];
            f.quantize_group(&x, COLS, 0, &mut bytes);
            let mut back = vec![0f32; x.len()];
            f.dequantize_group(&bytes, COLS, &mut back);
            let top = f.top() as f32;
            for c in 0..COLS {
                let col: Vec<f32> = (0..GROUP).map(|r| x[r * COLS + c].to_f32()).collect();
                let (a, b) = col.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v)));
                let step = f16_bits_to_f32(f16_bits_up((b - a) / top));
                let whole: f32 = col.iter().map(|&v| (v - (a + step * code(v, a, step, top))).powi(2)).sum();
                let got: f32 = (0..GROUP).map(|r| (col[r] - back[r * COLS + c]).powi(2)).sum();
                assert!(got <= whole * (1.0 + 2e-3), "{f:?} col {c}: {got} > {whole} over the whole range");
                if !f.narrows_range() {
                    assert_eq!(got, whole, "{f:?} col {c}: searched though it does not narrow");
                }
                if c == 20 && f == ChannelFormat::Q2 {
                    assert!(got < whole * 0.8, "2 bits, one high row: {got} vs {whole}");
                }
            }
        }
    }

    /// With the sink row left out, column 11's outlier in row 0 (300) no longer sets the
    /// column's range: rows 1.. come back within the bound of their own range, which is
    /// far finer, and row 0's code is clamped to the top.
    #[test]
    fn the_sink_row_is_left_out_of_the_ranges() {
        let x = group();
        for f in ChannelFormat::ALL {
            let (mut with, mut without) = (vec![0u8; f.group_bytes(COLS)], vec![0u8; f.group_bytes(COLS)]);
            f.quantize_group(&x, COLS, SINK, &mut with);
            f.quantize_group(&x, COLS, 0, &mut without);
            let (mut lo, mut step) = (vec![0f32; COLS], vec![0f32; COLS]);
            f.header(&with, COLS, &mut lo, &mut step);
            let mut step0 = vec![0f32; COLS];
            f.header(&without, COLS, &mut lo.clone(), &mut step0);
            assert!(
                step[11] * 20.0 < step0[11],
                "{f:?}: step {} with the sink left out, {} with it",
                step[11],
                step0[11]
            );
            let mut back = vec![0f32; x.len()];
            f.dequantize_group(&with, COLS, &mut back);
            for c in 0..COLS {
                let col: Vec<f32> = (SINK..GROUP).map(|r| x[r * COLS + c].to_f32()).collect();
                let lo = col.iter().fold(f32::INFINITY, |m, &v| m.min(v));
                let hi = col.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                for (r, &a) in col.iter().enumerate() {
                    let b = back[(r + SINK) * COLS + c];
                    assert!((a - b).abs() <= f.error_bound(lo, hi), "{f:?} col {c} row {}: {a} -> {b}", r + SINK);
                }
            }
            let hi11 = (SINK..GROUP).map(|r| x[r * COLS + 11].to_f32()).fold(f32::NEG_INFINITY, f32::max);
            assert!((back[11] - hi11).abs() <= f.error_bound(lo[11], hi11), "{f:?}: row 0 clamped to the top");
        }
    }

    /// Two more bits divide the step by ~4 and the squared error by ~16 (at least 8 here),
    /// over the columns of normal values (the row outlier of column 11 leaves its others a
    /// step or two, where the error stops shrinking that way).
    #[test]
    fn more_bits_less_error() {
        let x = group();
        let err = |f: ChannelFormat| {
            let mut bytes = vec![0u8; f.group_bytes(COLS)];
            f.quantize_group(&x, COLS, 0, &mut bytes);
            let mut back = vec![0f32; x.len()];
            f.dequantize_group(&bytes, COLS, &mut back);
            let normal_column = |i: &usize| ![3, 7, 9, 11].contains(&(i % COLS));
            (0..x.len()).filter(normal_column).map(|i| ((x[i].to_f32() - back[i]) as f64).powi(2)).sum::<f64>()
        };
        let (e8, e6, e4) = (err(ChannelFormat::Q8), err(ChannelFormat::Q6), err(ChannelFormat::Q4));
        assert!(e8 * 8.0 < e6 && e6 * 8.0 < e4, "squared errors 8/6/4 bits: {e8} {e6} {e4}");
        // One bit fewer, about 4 times the squared error (at least 2.5 here).
        let (e3, e2) = (err(ChannelFormat::Q3), err(ChannelFormat::Q2));
        assert!(e4 * 2.5 < e3 && e3 * 2.5 < e2, "squared errors 4/3/2 bits: {e4} {e3} {e2}");
    }

    #[test]
    fn layout_and_sizes() {
        assert_eq!(ChannelFormat::Q4.group_bytes(64), 4 * 64 + 32 * 32);
        assert_eq!(ChannelFormat::Q6.row_bytes(64), 48);
        assert_eq!(ChannelFormat::Q8.group_bytes(32), 128 + 32 * 32);
        // Header first: lo then step, f16 little-endian; the codes of row r after it.
        let mut x = vec![f16::from_f32(1.0); GROUP * 32];
        x[5 * 32 + 2] = f16::from_f32(16.0);
        let mut b = vec![0u8; ChannelFormat::Q4.group_bytes(32)];
        ChannelFormat::Q4.quantize_group(&x, 32, 0, &mut b);
        assert_eq!(u16::from_le_bytes([b[4], b[5]]), f16::from_f32(1.0).to_bits(), "lo of column 2");
        assert_eq!(u16::from_le_bytes([b[64 + 4], b[64 + 5]]), f16::from_f32(1.0).to_bits(), "step 15/15");
        assert_eq!(b[128 + 5 * 16 + 2], 15, "row 5, column 2 is the top code (low nibble)");
        assert_eq!(b[128 + 4 * 16 + 2], 0);
    }

    #[test]
    fn rounding_up_to_f16() {
        assert_eq!(f16_bits_up(1.0), 0x3c00);
        assert_eq!(f16_bits_up(1.0 + 1e-6), 0x3c01);
        assert_eq!(f16_bits_up(0.0), 0);
        assert_eq!(f16_bits_up(1e-9), 1, "below the smallest subnormal rounds up to it");
        assert_eq!(f16_bits_up(70000.0), 0x7c00);
    }

    #[test]
    fn non_finite_inputs_do_not_panic() {
        let mut x = group();
        x[3] = f16::NAN;
        x[COLS + 4] = f16::INFINITY;
        let f = ChannelFormat::Q4;
        let mut bytes = vec![0u8; f.group_bytes(COLS)];
        f.quantize_group(&x, COLS, 0, &mut bytes);
        let mut back = vec![0f32; x.len()];
        f.dequantize_group(&bytes, COLS, &mut back);
        assert!(back[4].is_nan(), "a column holding inf decodes as NaN");
        assert!(back[5].is_finite());
    }

    /// The eight-lane write gives the scalar definition's bytes, header and codes, for every
    /// format, with and without the sink row, on columns of every character the lanes treat
    /// apart: normal, clipped outliers, constant, ±0, subnormal, near f16's top, NaN and ±inf
    /// (alone and mixed), the search's lanes beside lanes that skip it.
    #[test]
    fn lanes_write_the_scalar_bytes() {
        let base = group();
        let n = normal(GROUP * COLS, 5);
        let mut special = base.clone();
        for r in 0..GROUP {
            let at = |c: usize| r * COLS + c;
            special[at(16)] = f16::from_f32(if r % 2 == 0 { 0.0 } else { -0.0 });
            special[at(17)] = f16::from_bits(1 + (r as u16 % 5));
            special[at(18)] = f16::from_f32(60000.0 * n[at(18)].signum());
            special[at(19)] = if r == 9 { f16::NAN } else { f16::from_f32(n[at(19)]) };
            special[at(20)] = if r == 0 { f16::INFINITY } else { f16::from_f32(n[at(20)]) };
            special[at(21)] = if r == 31 { f16::NEG_INFINITY } else { f16::from_f32(n[at(21)]) };
            special[at(22)] = f16::NAN;
            special[at(23)] = if r == 4 { f16::from_f32(-0.0) } else { f16::from_f32(0.0) };
            special[at(40)] = f16::from_f32(if r == 1 { 50.0 } else { 0.01 * n[at(40)] });
            special[at(41)] = f16::from_f32(1.0 + f32::from(r as u8 % 3) * 1e-3);
        }
        for x in [&base, &special] {
            for f in ChannelFormat::ALL {
                for sink in [0, SINK] {
                    let (mut lanes, mut scalar) = (vec![0u8; f.group_bytes(COLS)], vec![1u8; f.group_bytes(COLS)]);
                    f.quantize_group(x, COLS, sink, &mut lanes);
                    f.quantize_group_scalar(x, COLS, sink, &mut scalar);
                    let first = lanes.iter().zip(&scalar).position(|(a, b)| a != b);
                    assert_eq!(first, None, "{f:?}, sink rows {sink}: first differing byte");
                }
            }
        }
    }
}
