//! The second level of two-level activations: a block's rounding error after its Q8
//! quantization (ggml's Q8_0 / Q8_1 / Q8_K bytes, the first level), quantized again on a grid
//! exactly [`RATIO`] times finer than the first level's step.
//!
//! With the first level `x ≈ d·q`, the error `x − d·q` is at most about d/2 per element (a
//! little more where the stored f16 `d` differs from amax/127), so on the grid d/128 it takes
//! about ±64 levels of an i8: `q2 = round((x − d·q) · 128/d)`. What is left is at most d/256
//! per element, 1/128 of the single level's error.
//!
//! Why a fixed ratio rather than the residual's own absmax: the two steps being a power of two
//! apart lets a kernel add the levels' integer dot products before any float work,
//! `d·Σw·q + (d/128)·Σw·q2 = (d/128)·(128·Σw·q + Σw·q2)`: one conversion, one scale multiply
//! and one FMA per block for both levels (the packed Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 kernels
//! do so), and a per-row dot product can take the second level with the first level's scale
//! and divide the result by 128, exactly.

/// The first level's step over the second's.
pub const RATIO: f32 = 128.0;
/// log2 of [`RATIO`]: `is1 << SHIFT` is the first level's integer dot on the second's grid.
pub const SHIFT: u32 = 7;

/// Adding and subtracting 1.5·2²³ rounds an f32 below 2²² to the nearest integer (ties to
/// even), in a form the compiler vectorizes.
const ROUND: f32 = 12_582_912.0;

/// Second-level quants of one block: `x` its values, `d` the first level's step as it
/// dequantizes (the stored scale) and `q` the first level's quants. Writes `q2` and returns
/// Σq2. A zero or non-finite `d` gives zeros; a NaN value gives 0 and ±∞ clamps to ±127.
pub fn quantize_block(x: &[f32], d: f32, q: &[i8], q2: &mut [i8]) -> i32 {
    debug_assert!(x.len() == q.len() && q.len() == q2.len());
    let inv = if d != 0.0 && d.is_finite() { RATIO / d } else { 0.0 };
    let mut sum = 0;
    for ((o, &v), &q) in q2.iter_mut().zip(x).zip(q) {
        // clamp keeps NaN, which `as` turns into 0.
        let r = ((v - d * q as f32) * inv).clamp(-127.0, 127.0);
        *o = ((r + ROUND) - ROUND) as i8;
        sum += *o as i32;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What is left after both levels is at most half the second level's step, d/256.
    #[test]
    fn both_levels_leave_at_most_half_a_fine_step() {
        let x: Vec<f32> =
            (0..32).map(|i| ((i * 37 % 29) as f32 - 14.0) * 0.173 + if i == 5 { 9.0 } else { 0.0 }).collect();
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        // ggml's first level with an f16 scale, as Q8_0 stores it.
        let d = half::f16::from_f32(amax / 127.0).to_f32();
        let q: Vec<i8> = x.iter().map(|&v| (v / (amax / 127.0)).round() as i8).collect();
        let mut q2 = [0i8; 32];
        let sum = quantize_block(&x, d, &q, &mut q2);
        assert_eq!(sum, q2.iter().map(|&v| v as i32).sum::<i32>());
        assert!(q2.iter().any(|&v| v != 0), "the first level left no error to quantize");
        for i in 0..32 {
            let left = x[i] - d * q[i] as f32 - d / RATIO * q2[i] as f32;
            assert!(left.abs() <= d / (2.0 * RATIO) * 1.0001, "[{i}] {left} vs step {}", d / RATIO);
        }
    }

    #[test]
    fn degenerate_blocks_give_zeros() {
        let q = [3i8; 4];
        let mut q2 = [9i8; 4];
        assert_eq!(quantize_block(&[0.0; 4], 0.0, &[0; 4], &mut q2), 0);
        assert_eq!(q2, [0; 4]);
        for d in [f32::NAN, f32::INFINITY] {
            q2 = [9; 4];
            assert_eq!(quantize_block(&[1.0; 4], d, &q, &mut q2), 0);
            assert_eq!(q2, [0; 4]);
        }
        q2 = [9; 4];
        quantize_block(&[f32::NAN, 1.0, f32::INFINITY, 1.0], 0.5, &[0, 2, 0, 2], &mut q2);
        assert_eq!(q2, [0, 0, 127, 0]);
    }
}
