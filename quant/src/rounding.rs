//! The rounding primitives ggml's quantizers use. Ports get these wrong most often, so each
//! is written out once here and used everywhere.

/// ggml's `nearest_int`: adds 1.5·2^23 so the FPU rounds to an integer (ties to even), then
/// reads the integer back out of the mantissa bits. Exact for |v| ≤ 4194303; like ggml it
/// returns garbage (not a panic) outside that range.
#[inline(always)]
pub fn nearest_int(v: f32) -> i32 {
    let biased = v + 12_582_912.0f32;
    (biased.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// C's `roundf` (halves away from zero) for a value that is then narrowed to an integer: the
/// sign of a zero result may differ from roundf's, nothing else. Inlined and branch-light
/// where `f32::round` is a libm call on baseline x86-64 (16 % of a Q8_0 conversion).
#[inline(always)]
pub fn round_half_away_for_int(v: f32) -> f32 {
    // |v| < 2^23: truncation is exact, and so is v − t; NaN and larger values take roundf.
    // Branch-free: the halves go either way about half of the time.
    if v.abs() < 8_388_608.0 {
        let t = v as i32;
        let frac = v - t as f32;
        (t + (frac >= 0.5) as i32 - (frac <= -0.5) as i32) as f32
    } else {
        v.round()
    }
}

/// C's `(int8_t)f` / `(uint8_t)f` as gcc compiles it on x86-64: `cvttss2si` (truncate toward
/// zero; NaN and out-of-range give `i32::MIN`) followed by keeping the low 8 bits. For the
/// in-range values the quantizers normally produce this is plain truncation; emulating the
/// instruction keeps us bit-exact with ggml even for inf/NaN inputs.
#[inline(always)]
pub fn c_f32_to_i8(v: f32) -> i8 {
    c_f32_to_i32(v) as i8
}

/// See [`c_f32_to_i8`].
#[inline(always)]
pub fn c_f32_to_u8(v: f32) -> u8 {
    c_f32_to_i32(v) as u8
}

#[inline(always)]
fn c_f32_to_i32(v: f32) -> i32 {
    // 2^31 is exactly representable; anything at or beyond it (or NaN) is "indefinite".
    if v.is_nan() || !(-2_147_483_648.0..2_147_483_648.0).contains(&v) { i32::MIN } else { v as i32 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_half_away_matches_roundf_for_integers() {
        let mut v = vec![0.5f32, -0.5, 1.5, -1.5, 2.5, 0.49999997, -0.49999997, 126.5, -127.5, 8_388_607.5, 1e9, -0.0];
        v.extend([f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MIN_POSITIVE, 0.99999994, 1.0000001]);
        let mut x = 0x1234_5678u32;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            v.push(f32::from_bits(x) % 300.0);
        }
        for &f in &v {
            assert_eq!(c_f32_to_i32(round_half_away_for_int(f)), c_f32_to_i32(f.round()), "{f:e}");
        }
    }

    #[test]
    fn nearest_int_ties_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-0.5), 0);
        assert_eq!(nearest_int(-1.5), -2);
        assert_eq!(nearest_int(-2.5), -2);
        assert_eq!(nearest_int(3.49999), 3);
        assert_eq!(nearest_int(-7.6), -8);
        for i in -1000..1000 {
            let v = i as f32 * 0.37;
            assert_eq!(nearest_int(v), v.round_ties_even() as i32, "{v}");
        }
    }

    #[test]
    fn c_casts_truncate_like_x86() {
        assert_eq!(c_f32_to_i8(16.9), 16);
        assert_eq!(c_f32_to_i8(-0.9), 0);
        assert_eq!(c_f32_to_i8(f32::NAN), 0);
        assert_eq!(c_f32_to_i8(f32::INFINITY), 0);
        assert_eq!(c_f32_to_i8(300.0), 44); // low byte of 300
        assert_eq!(c_f32_to_u8(31.5), 31);
    }

    /// ggml's nearest_int: halves to even within |v| ≤ 2^22 (every value the quantizers
    /// give it, which they scale into a few hundred at most); outside, the bit trick's own
    /// values, pinned so that a change to them shows (ggml returns the same).
    #[test]
    fn nearest_int_rounds_halves_to_even_and_keeps_ggml_values_outside_its_range() {
        let mut checked = 0;
        for i in -20_000i32..=20_000 {
            for v in [i as f32 * 0.25, i as f32 * 0.5 + 0.001, i as f32 * 209.7 + 0.5] {
                if v.abs() <= 4_194_303.0 {
                    assert_eq!(nearest_int(v), v.round_ties_even() as i32, "{v}");
                    checked += 1;
                }
            }
        }
        assert!(checked > 100_000);
        for (v, want) in [(0.5f32, 0), (1.5, 2), (2.5, 2), (-0.5, 0), (-1.5, -2), (-2.5, -2), (4_194_303.0, 4_194_303)]
        {
            assert_eq!(nearest_int(v), want, "{v}");
        }
        // 12582912 + v leaves the binade that the mantissa trick reads.
        assert_eq!(nearest_int(f32::INFINITY), -4_194_304);
        assert_eq!(nearest_int(f32::NEG_INFINITY), -4_194_304);
        assert_eq!(nearest_int(f32::NAN), 0);
        assert_eq!(nearest_int(4_194_304.0), -4_194_304, "2^22 wraps");
    }
}
