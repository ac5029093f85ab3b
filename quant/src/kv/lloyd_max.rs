//! Lloyd–Max levels for the 3-bit rotated cache (`q3r`, [`super::signed_max`]'s blocks of 64).
//!
//! After each head's Hadamard rotation a row's values are near-Gaussian (SmolLM2's V rows:
//! kurtosis 2.96), and for a Gaussian the levels that least square the error are not evenly
//! spaced: the Lloyd–Max quantizer of a unit Gaussian at 3 bits has its levels at ±0.2451,
//! ±0.7560, ±1.3440 and ±2.1520, which ×16.26 are close to the integers [`LEVELS`] (±4, ±12,
//! ±22, ±35). Integers keep the readers' integer dot products (a level is an i8, looked up
//! from the 3-bit code in a 16-entry table: `pshufb` on x86, two packed words on the GPU).
//!
//! A block's scale `d` puts the outer level at [`OUTER`] (0.889) times the block's largest
//! magnitude `a`: `d = f16(a · SCALE)`, `SCALE` = OUTER/35 an exact f32 of few bits, so the
//! product is correctly rounded alike everywhere. Each value goes to the nearest level
//! of `t = x / d` (a correctly rounded division): the codes 0–7 are the levels in order,
//! ties between two levels go to the one farther from zero, `t` = ±0 and NaN (and `d` = 0,
//! where every value is zero) to code 4 (+4·d). Squared error over SmolLM2's rotated V rows
//! of a calibration text (normalised): 0.0364 with the signed-max rule, 0.0316 with these
//! levels (runtime/bench/results/kv-lowbit-trials-2026-11-28.md). OUTER was chosen by the
//! logits' KL divergence from an f16 cache's on another calibration text (V alone, SmolLM2):
//! 0.0234 signed-max; 0.0295, 0.0248, 0.0225, 0.0216, 0.0216, 0.0221, 0.0229 at 0.75, 0.80,
//! 0.85, 0.875, 0.90, 0.925, 0.95 (runtime/bench/results/kv-lowbit-trials-2026-11-29.md).

/// Each 3-bit code's level (code `u` stands for `LEVELS[u]·d`).
pub const LEVELS: [i8; 8] = [-35, -22, -12, -4, 4, 12, 22, 35];

/// Half-way points between neighbouring positive levels, in `t = x/d` units: from 0, 8,
/// 17 and 28.5 on `|t|` selects the level 4, 12, 22, 35.
const BOUNDS: [f32; 3] = [8.0, 17.0, 28.5];

/// `d = f16(a · SCALE)`: 0.025390625 = 13/512, exact in f32, the outer level at 35·SCALE =
/// 0.8887 of the block's largest magnitude.
pub const SCALE: f32 = 13.0 / 512.0;

/// The fraction of the block's largest magnitude where the outer level sits.
pub const OUTER: f32 = 35.0 * SCALE;

/// The code of value `x` in a block of scale `d`: [`code`] of `x / d`, but 4 (as for zero)
/// where `d` is 0 or `x` is subnormal.
pub fn code_of(x: f32, d: f32) -> u8 {
    if d == 0.0 || x.abs() < f32::MIN_POSITIVE { 4 } else { code(x / d) }
}

/// The code of `t = x / d`: its nearest level, ties away from zero; ±0, a subnormal `t` and
/// NaN give 4. (Subnormals count as zero because a GPU may flush them — its division falls
/// back to the hardware's there — and zero's code is the same everywhere.)
pub fn code(t: f32) -> u8 {
    let m = t.abs();
    if m < f32::MIN_POSITIVE {
        return 4;
    }
    let i = BOUNDS.iter().filter(|&&b| m >= b).count() as u8;
    if t < 0.0 { 3 - i } else { 4 + i }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_the_nearest_levels() {
        for k in -4000..=4000 {
            let t = k as f32 / 100.0;
            let u = code(t) as usize;
            let err = (t - LEVELS[u] as f32).abs();
            let best = LEVELS.iter().map(|&l| (t - l as f32).abs()).fold(f32::INFINITY, f32::min);
            assert_eq!(err, best, "t = {t}: code {u}");
        }
        // Ties go away from zero; zero, negative zero and NaN to +4.
        assert_eq!((code(8.0), code(-8.0), code(28.5), code(-17.0)), (5, 2, 7, 1));
        assert_eq!((code(0.0), code(-0.0), code(f32::NAN)), (4, 4, 4));
        assert_eq!((code(f32::INFINITY), code(f32::NEG_INFINITY)), (7, 0));
        // Subnormals as zero, whether the value or the quotient.
        assert_eq!((code(-1e-40), code(1e-40), code_of(-1e-40, 1e-3), code_of(-1e-30, 0.0)), (4, 4, 4, 4));
        assert_eq!((code_of(-1.0, 0.25), code_of(-1e-37, 1e4)), (3, 4));
    }

    #[test]
    fn the_scale_is_exact() {
        assert_eq!(SCALE as f64, 13.0 / 512.0);
        assert_eq!(OUTER * 512.0, 455.0, "35·13/512 is exact");
    }
}
