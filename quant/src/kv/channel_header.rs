//! The compact header of a 3- or 2-bit per-channel group: each column's `lo` and `step` in
//! 16 bits where f16 pairs take 32, so that `q3c` keys cost 3.5 bits a value with their
//! headers (issue 44's budget) and `q2c` 2.5.
//!
//! Per block of 32 columns an f32 `unit` of 8 significant bits, then per column a `u16`
//! `(e << 9) | (m & 0x1ff)` with `e ∈ 0..=127` and `m ∈ −255..=255`:
//!
//! * `step = unit · K[e mod 16] · 2^−(8 + e / 16)` — a grid of steps 2^(1/16) apart, from
//!   the unit down to 2⁻⁸ of it ([`K`]: 2^(−i/16) to 8 bits);
//! * `lo = step · m / 4` — the bottom in quarter steps;
//! * `m = −256` marks a column that held ±inf or NaN: it decodes as NaN.
//!
//! The unit is the block's largest `max(step, |lo| / 32)` rounded up to 8 significant
//! bits, so `e = 0` holds every column's step and bottom. A column takes the finest step
//! of the grid at least its own (at most 4.7% coarser) whose bottom fits in `m`, then the
//! bottom rounded to the nearest quarter of that step. On SmolLM2-135M this costs a 3-bit K
//! cache 3% more KL divergence from the f16 cache than f16 pairs (0.0195 → 0.0201), a
//! 2-bit one 1.5% (0.0938 → 0.0952); at 4 bits 18%, so `q4c` keeps f16 pairs
//! (runtime/bench/results/kv-lowbit-trials-2026-11-28.md, "Compact headers").
//!
//! Every product here is exact in f32 (8 × 8 significant bits for the step, 16 × 8 for the
//! bottom, 16 × 3 for `step · code`) and the only division is correctly rounded, so a GPU
//! compiler that fuses products into additions changes nothing and the GPU's write kernel
//! encodes the same bits.

/// `round(256 · 2^(−i/16))`: the step grid's mantissas, 8 significant bits each.
pub const K: [u32; 16] = [256, 245, 235, 225, 215, 206, 197, 189, 181, 173, 166, 159, 152, 146, 140, 134];

/// [`K`] as f32, for readers that look the mantissa up in a register.
pub const K_F32: [f32; 16] = {
    let mut t = [0f32; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = K[i] as f32;
        i += 1;
    }
    t
};

/// Largest `e`.
pub const E_MAX: u32 = 127;

/// Largest `|m|`.
pub const M_MAX: i32 = 255;

/// The `m` of a column that is not finite.
pub const M_NOT_FINITE: i32 = -256;

/// The step of code `e` under `unit`.
#[inline]
pub fn step_at(unit: f32, e: u32) -> f32 {
    unit * K[(e & 15) as usize] as f32 * f32::from_bits((127 - 8 - (e >> 4)) << 23)
}

/// The unit of a block from its columns' `(lo, step)` (non-finite ones left out): their
/// largest `max(step, |lo| / 32)`, rounded up to 8 significant bits.
pub fn unit(columns: impl Iterator<Item = (f32, f32)>) -> f32 {
    let v = columns
        .filter(|(lo, step)| lo.is_finite() && step.is_finite())
        .fold(0f32, |v, (lo, step)| v.max(step).max(lo.abs() * (1.0 / 32.0)));
    round_up_8_bits(v)
}

/// `v ≥ 0` rounded up to 8 significant bits.
#[inline]
pub fn round_up_8_bits(v: f32) -> f32 {
    f32::from_bits((v.to_bits() + 0xffff) & 0xffff_0000)
}

/// The header word of a column whose range search chose `lo` and `step`.
pub fn encode(lo: f32, step: f32, unit: f32) -> u16 {
    if !(lo.is_finite() && step.is_finite() && unit.is_finite()) {
        return word(0, M_NOT_FINITE);
    }
    // The largest e whose step is at least the column's (step_at falls as e grows; e = 0,
    // the unit, is at least every step of the block).
    let mut e = 0;
    for bit in [64, 32, 16, 8, 4, 2, 1] {
        if step_at(unit, e + bit) >= step {
            e += bit;
        }
    }
    // Then the largest e' ≤ e whose bottom fits (|m| falls as e' falls; e' = 0 fits: the
    // unit is at least |lo| / 32).
    if quarters(lo, step_at(unit, e)).abs() > M_MAX {
        let mut fit = 0;
        for bit in [64, 32, 16, 8, 4, 2, 1] {
            if fit + bit < e && quarters(lo, step_at(unit, fit + bit)).abs() <= M_MAX {
                fit += bit;
            }
        }
        e = fit;
    }
    word(e, quarters(lo, step_at(unit, e)))
}

/// `lo` in quarter steps, rounded to nearest (halves away from zero); 0 for a step of 0
/// (the unit is then 0, and so is every bottom).
#[inline]
fn quarters(lo: f32, step: f32) -> i32 {
    if step == 0.0 {
        return 0;
    }
    let t = 4.0 * lo / step;
    if t.abs() > 1024.0 { t.signum() as i32 * 1024 } else { t.round() as i32 }
}

#[inline]
fn word(e: u32, m: i32) -> u16 {
    ((e << 9) | (m as u32 & 0x1ff)) as u16
}

/// `(lo, step)` of a header word.
#[inline]
pub fn decode(w: u16, unit: f32) -> (f32, f32) {
    let m = ((w as i32) << 23) >> 23;
    if m == M_NOT_FINITE {
        return (f32::NAN, f32::NAN);
    }
    let step = step_at(unit, w as u32 >> 9);
    (step * m as f32 * 0.25, step)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grid_is_two_to_the_sixteenth_apart_and_exact() {
        for (i, &k) in K.iter().enumerate() {
            let t = k as f64 / 256.0;
            assert!((t / 2f64.powf(-(i as f64) / 16.0) - 1.0).abs() < 2.0 / 256.0, "K[{i}]");
        }
        let unit = round_up_8_bits(0.7321);
        for e in 0..=E_MAX {
            let s = step_at(unit, e);
            assert_eq!(s as f64, unit as f64 * K[(e & 15) as usize] as f64 / 2f64.powi(8 + (e >> 4) as i32));
            if e > 0 {
                let r = step_at(unit, e - 1) / s;
                assert!(r > 1.041 && r <= 1.046875, "e {e}: {r}");
            }
        }
    }

    #[test]
    fn a_column_gets_the_finest_step_at_least_its_own_and_its_bottom_to_a_quarter_step() {
        let unit = unit([(-3.0, 0.5), (0.5, 0.01), (0.25, 0.2)].into_iter());
        assert_eq!(unit, 0.5);
        for (lo, step) in [(-3.0f32, 0.5f32), (0.5, 0.01), (0.25, 0.2), (-0.0123, 0.0031), (0.0, 0.0)] {
            let (l, s) = decode(encode(lo, step, unit), unit);
            assert!(s >= step && s <= step.max(unit / 256.0) * 1.054, "{lo} {step}: step {s}");
            assert!((l - lo).abs() <= s / 8.0, "{lo} {step}: bottom {l}");
            assert_eq!(l, s * (4.0 * l / s).round() / 4.0, "a whole number of quarter steps");
        }
    }

    #[test]
    fn a_bottom_too_far_for_the_step_takes_a_coarser_step() {
        // 40 below zero in steps of 0.01: 16,000 quarter steps, far past 255.
        let unit = unit([(-40.0f32, 0.01f32)].into_iter());
        let (l, s) = decode(encode(-40.0, 0.01, unit), unit);
        assert!(s > 0.01 && (l + 40.0).abs() <= s / 8.0, "{l} {s}");
        // Nothing coarser than needed: the next finer step no longer fits.
        let w = encode(-40.0, 0.01, unit);
        let finer = step_at(unit, (w >> 9) as u32 + 1);
        assert!((4.0 * -40.0 / finer).round().abs() > M_MAX as f32);
    }

    #[test]
    fn constant_and_non_finite_columns() {
        assert_eq!(decode(encode(0.0, 0.0, 0.0), 0.0), (0.0, 0.0));
        let unit = unit([(5.0f32, 0.0f32), (f32::NAN, f32::NAN)].into_iter());
        let (l, s) = decode(encode(5.0, 0.0, unit), unit);
        assert!((l - 5.0).abs() <= s / 8.0 && s <= 5.0 / 60.0, "{l} {s}");
        let (l, s) = decode(encode(1.0, f32::NAN, unit), unit);
        assert!(l.is_nan() && s.is_nan());
        let (l, s) = decode(encode(1.0, f32::INFINITY, unit), unit);
        assert!(l.is_nan() && s.is_nan());
    }
}
