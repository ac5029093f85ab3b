//! [`ChannelFormat::quantize_group`] eight columns at a time: column `c0 + l` runs in lane l.
//!
//! The columns of a group are independent, and the 3- and 2-bit range search evaluates 25
//! candidate ranges over each column's 32 values — a division, a rounding and a square per
//! value and candidate, most of a decode step's cache writes (SmolLM2, 30 layers × 192 key
//! channels every 32 tokens) and a quarter of a long prompt's time when run a column at a
//! time. Every lane performs exactly the scalar operations in their order (the sums in row
//! order, no fused multiply-add, the branches as per-lane selects), so the bytes are the
//! ones the scalar definition ([`super::channel`]'s tests keep it) and the GPU's write
//! kernel produce, while the compiler runs the lanes as one vector (as [`crate::search_x8`]).

use super::channel::{CLIP_QUARTERS, ChannelFormat, GROUP, f16_bits_up, round_to_11_bits};
use crate::fp::{f16_bits_to_f32, f32_to_f16_bits};

/// Columns per step: the lanes.
const L: usize = 8;

type Lanes = [f32; L];

/// Each column's header (`lo_bits`, `step_bits`, `cols` each) and the codes of every value
/// (`codes`: [`GROUP`] rows of `cols`, one code a byte) of the group `x` ([`GROUP`] rows of
/// `cols` values, `cols` a multiple of 8), as [`ChannelFormat::quantize_group`] defines them.
pub(super) fn quantize_columns(
    fmt: ChannelFormat,
    x: &[f32],
    cols: usize,
    sink_rows: usize,
    lo_bits: &mut [u16],
    step_bits: &mut [u16],
    codes: &mut [u8],
) {
    assert!(cols.is_multiple_of(L) && x.len() == GROUP * cols && codes.len() == GROUP * cols);
    assert!(lo_bits.len() == cols && step_bits.len() == cols && sink_rows < GROUP);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked above).
        return unsafe { columns_avx2(fmt, x, cols, sink_rows, lo_bits, step_bits, codes) };
    }
    columns_inline(fmt, x, cols, sink_rows, lo_bits, step_bits, codes);
}

/// The same code compiled with AVX2. FMA stays off: Rust never contracts a·b + c.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn columns_avx2(
    fmt: ChannelFormat,
    x: &[f32],
    cols: usize,
    sink_rows: usize,
    lo_bits: &mut [u16],
    step_bits: &mut [u16],
    codes: &mut [u8],
) {
    columns_inline(fmt, x, cols, sink_rows, lo_bits, step_bits, codes);
}

#[inline(always)]
fn columns_inline(
    fmt: ChannelFormat,
    x: &[f32],
    cols: usize,
    sink_rows: usize,
    lo_bits: &mut [u16],
    step_bits: &mut [u16],
    codes: &mut [u8],
) {
    let top = fmt.top() as f32;
    for c0 in (0..cols).step_by(L) {
        let rows: [Lanes; GROUP] = std::array::from_fn(|r| x[r * cols + c0..r * cols + c0 + L].try_into().unwrap());
        let (lo, step) = header(fmt, &rows, sink_rows, top);
        lo_bits[c0..c0 + L].copy_from_slice(&lo);
        step_bits[c0..c0 + L].copy_from_slice(&step);
        let (lo, step) = (lo.map(f16_bits_to_f32), step.map(f16_bits_to_f32));
        for (r, row) in rows.iter().enumerate() {
            let u = &mut codes[r * cols + c0..r * cols + c0 + L];
            for l in 0..L {
                u[l] = code(row[l], lo[l], step[l], top) as u8;
            }
        }
    }
}

/// The f16 bits of each lane's `lo` and `step`: the whole range of rows `sink_rows..`
/// (f32::min/max skip NaN; a column of NaN or ±inf decodes as NaN, step NaN), narrowed
/// where [`ChannelFormat::narrows_range`] by the search of [`ChannelFormat::clipped_range`].
#[inline(always)]
fn header(fmt: ChannelFormat, rows: &[Lanes; GROUP], sink_rows: usize, top: f32) -> ([u16; L], [u16; L]) {
    let (mut a, mut b) = ([f32::INFINITY; L], [f32::NEG_INFINITY; L]);
    for row in &rows[sink_rows..] {
        for l in 0..L {
            a[l] = a[l].min(row[l]);
            b[l] = b[l].max(row[l]);
        }
    }
    let (mut lo, mut step, mut s, mut search) = ([0u16; L], [0u16; L], [0f32; L], [false; L]);
    for l in 0..L {
        if a[l].is_finite() && b[l].is_finite() {
            lo[l] = f32_to_f16_bits(a[l]);
            step[l] = f16_bits_up((b[l] - a[l]) / top);
            s[l] = f16_bits_to_f32(step[l]) / 4.0;
            search[l] = fmt.narrows_range() && b[l] != a[l] && s[l].is_finite();
        } else {
            lo[l] = f32_to_f16_bits(if a[l].is_finite() { a[l] } else { 0.0 });
            step[l] = 0x7e00;
        }
    }
    if search.contains(&true) {
        narrowed(rows, sink_rows, top, &a, &b, &s, &search, &mut lo, &mut step);
    }
    (lo, step)
}

/// [`ChannelFormat::clipped_range`] in the lanes where `search` is set: `lo`/`step` hold
/// the whole range on entry and the chosen one on return.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn narrowed(
    rows: &[Lanes; GROUP],
    sink_rows: usize,
    top: f32,
    a: &Lanes,
    b: &Lanes,
    s: &Lanes,
    search: &[bool; L],
    lo_bits: &mut [u16; L],
    step_bits: &mut [u16; L],
) {
    let whole_lo = *lo_bits;
    let mut best = [f32::INFINITY; L];
    for i in 0..=CLIP_QUARTERS {
        for j in 0..=CLIP_QUARTERS {
            let (mut lb, mut sb, mut lo, mut step, mut valid) =
                ([0u16; L], [0u16; L], [0f32; L], [0f32; L], [false; L]);
            for l in 0..L {
                // a itself for i = 0 (a −0 minimum stays −0), as the scalar search.
                lb[l] = if i == 0 { whole_lo[l] } else { f32_to_f16_bits(a[l] + i as f32 * s[l]) };
                lo[l] = f16_bits_to_f32(lb[l]);
                let hi = b[l] - j as f32 * s[l];
                valid[l] = search[l] && hi > lo[l];
                if valid[l] {
                    sb[l] = f16_bits_up((hi - lo[l]) / top);
                    step[l] = f16_bits_to_f32(sb[l]);
                }
            }
            if !valid.contains(&true) {
                continue;
            }
            let mut err = [0f32; L];
            for row in &rows[sink_rows..] {
                for l in 0..L {
                    let d = round_to_11_bits(row[l] - (lo[l] + step[l] * code(row[l], lo[l], step[l], top)));
                    err[l] += d * d;
                }
            }
            for l in 0..L {
                if valid[l] && err[l] < best[l] {
                    best[l] = err[l];
                    lo_bits[l] = lb[l];
                    step_bits[l] = sb[l];
                }
            }
        }
    }
}

/// `super::channel::code` with its branches as selects: `clamp(round((x − lo) / step), 0,
/// top)`, halves away from zero; 0 for a step of 0 and for NaN. For 0 < t < top the
/// truncation and `t − r` are exact, as there; elsewhere the rounded value is discarded.
#[inline(always)]
fn code(x: f32, lo: f32, step: f32, top: f32) -> f32 {
    let t = (x - lo) / step;
    let r = t as i32 as f32;
    let rounded = if t - r >= 0.5 { r + 1.0 } else { r };
    let clamped = if t >= top { top } else { rounded };
    let v = if t > 0.0 { clamped } else { 0.0 };
    if step == 0.0 { 0.0 } else { v }
}
