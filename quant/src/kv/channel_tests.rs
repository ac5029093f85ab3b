//! Tests of the per-channel group format (`super`): round trips within the bound, the
//! range search, the sink row, compact headers, and the eight-lane writer against the scalar
//! definition.

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

/// The unit of column c's block, with compact headers (0 otherwise).
fn unit_of(f: ChannelFormat, group: &[u8], c: usize) -> f32 {
    if !f.compact_header() {
        return 0.0;
    }
    let at = 2 * COLS + 4 * (c / N);
    f32::from_le_bytes(group[at..at + 4].try_into().unwrap())
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
            let unit = unit_of(f, &bytes, c);
            let bound = f.error_bound(lo, hi, unit);
            for r in 0..GROUP {
                let (a, b) = (col[r], back[r * COLS + c]);
                assert!((a - b).abs() <= bound, "{f:?} col {c} row {r}: {a} -> {b}, bound {bound}");
            }
            // The bottom of the range is the smallest value exactly, or at 3 and 2 bits
            // above it by at most two steps of the whole range where the search
            // narrowed it, and with compact headers within an eighth of its step more.
            let bottom = back.iter().skip(c).step_by(COLS).fold(f32::INFINITY, |m, &v| m.min(v));
            let step = (hi - lo) / f.top() as f32;
            if !f.narrows_range() {
                assert_eq!(bottom, lo, "{f:?} col {c}");
            } else {
                let moved = f.compact_step_bound(lo, hi, unit) / 8.0;
                assert!(bottom >= lo - moved && bottom - lo <= 2.0 * step * 1.001 + moved, "{f:?} col {c}: {bottom}");
            }
        }
        // A constant column is exact, or with compact headers within an eighth of the
        // step its bottom needs.
        let constant = |r: usize| back[r * COLS + 7];
        if f.compact_header() {
            let moved = f.compact_step_bound(-2.5, -2.5, unit_of(f, &bytes, 7)) / 8.0;
            assert!((0..GROUP).all(|r| constant(r) == constant(0)));
            assert!((constant(0) + 2.5).abs() <= moved, "{f:?}: {}", constant(0));
        } else {
            assert!((0..GROUP).all(|r| constant(r) == -2.5));
        }
    }
}

/// The narrowed range never leaves a column more error (the sum of squared errors, the
/// search's measure but for its f16 rounding of each residual) than the whole range, and
/// at 2 bits it takes a column with one high row from coarse steps to fine ones: 31
/// values spread over 0..1 and one at 1.6. With compact headers both ranges are taken
/// to the grid first (where the narrowed one would lose, the whole one is written).
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
            let (mut lo, mut step) = (a, f16_bits_to_f32(f16_bits_up((b - a) / top)));
            if f.compact_header() {
                let unit = unit_of(f, &bytes, c);
                (lo, step) = channel_header::decode(channel_header::encode(lo, step, unit), unit);
            }
            let whole: f32 = col.iter().map(|&v| (v - (lo + step * code(v, lo, step, top))).powi(2)).sum();
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
        assert!(step[11] * 20.0 < step0[11], "{f:?}: step {} with the sink left out, {} with it", step[11], step0[11]);
        let mut back = vec![0f32; x.len()];
        f.dequantize_group(&with, COLS, &mut back);
        for c in 0..COLS {
            let col: Vec<f32> = (SINK..GROUP).map(|r| x[r * COLS + c].to_f32()).collect();
            let lo = col.iter().fold(f32::INFINITY, |m, &v| m.min(v));
            let hi = col.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            for (r, &a) in col.iter().enumerate() {
                let b = back[(r + SINK) * COLS + c];
                assert!(
                    (a - b).abs() <= f.error_bound(lo, hi, unit_of(f, &with, c)),
                    "{f:?} col {c} row {}: {a} -> {b}",
                    r + SINK
                );
            }
        }
        let hi11 = (SINK..GROUP).map(|r| x[r * COLS + 11].to_f32()).fold(f32::NEG_INFINITY, f32::max);
        assert!(
            (back[11] - hi11).abs() <= f.error_bound(lo[11], hi11, unit_of(f, &with, 11)),
            "{f:?}: row 0 clamped to the top"
        );
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
    // Compact headers: a word per column, then the units. Column 2 spans 1..=16, the
    // block's largest step (15/7 up to f16, then to the unit's 8 bits); the constant 1.0 of
    // column 0 takes the finest step whose 255 quarter steps reach it.
    assert_eq!(ChannelFormat::Q3.group_bytes(64), 2 * 64 + 2 * 4 + 32 * 24);
    let mut b = vec![0u8; ChannelFormat::Q3.group_bytes(32)];
    ChannelFormat::Q3.quantize_group(&x, 32, 0, &mut b);
    let unit = f32::from_le_bytes(b[64..68].try_into().unwrap());
    assert_eq!(unit, channel_header::round_up_8_bits(f16_bits_to_f32(f16_bits_up(15.0 / 7.0))));
    let word = |c: usize| channel_header::decode(u16::from_le_bytes([b[2 * c], b[2 * c + 1]]), unit);
    let (lo, step) = word(2);
    assert!((lo - 1.0).abs() <= step / 8.0 && (1.9..=unit).contains(&step), "column 2: {lo} {step}");
    let (lo, step) = word(0);
    assert!((lo - 1.0).abs() <= step / 8.0 && (4.0 / 255.5..=4.0 / 255.5 * 1.054).contains(&step), "{lo} {step}");
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
