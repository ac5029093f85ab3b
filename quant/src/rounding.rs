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

    #[test]
    fn nearest_int_never_panics() {
        for v in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e30, -1e30] {
            let _ = nearest_int(v);
        }
    }
}
