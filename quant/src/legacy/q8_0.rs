//! Q8_0 (value = d·q) and its activation twin Q8_1 (which also stores d·Σq).

use crate::blocks::{BlockQ8_0, BlockQ8_1, F16Bytes, QK};
use crate::rounding::c_f32_to_i8;

/// ggml's `MAX(amax, fabsf(v))` fold (a NaN input propagates, as in C).
fn absmax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| if m > v.abs() { m } else { v.abs() })
}

/// Port of `quantize_row_q8_0_ref`: `roundf`, i.e. halves away from zero.
pub fn quantize_row_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    assert_eq!(x.len(), y.len() * QK);
    for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
        let d = absmax(xb) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = F16Bytes::from_f32(d);
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = c_f32_to_i8((v * id).round());
        }
    }
}

/// Port of `quantize_row_q8_1_ref`.
pub fn quantize_row_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    assert_eq!(x.len(), y.len() * QK);
    for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
        let d = absmax(xb) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = F16Bytes::from_f32(d);
        let mut sum = 0i32;
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = c_f32_to_i8((v * id).round());
            sum += *q as i32;
        }
        yb.s = F16Bytes::from_f32(sum as f32 * d);
    }
}

/// Port of `dequantize_row_q8_0`.
pub fn dequantize_row_q8_0(x: &[BlockQ8_0], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK);
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let d = xb.d.get();
        for (out, &q) in yb.iter_mut().zip(&xb.qs) {
            *out = q as f32 * d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_round_away_from_zero() {
        // With absmax 127 the scale is exactly 1, so x·id is x itself.
        let mut x = [0.0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        x[3] = 0.5;
        let mut q = [BlockQ8_0::default()];
        quantize_row_q8_0(&x, &mut q);
        assert_eq!(q[0].d.get(), 1.0);
        assert_eq!(&q[0].qs[..4], &[127, 3, -3, 1]);
    }

    #[test]
    fn q8_1_sum_matches_quants() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 * 0.7).sin()).collect();
        let mut q = [BlockQ8_1::default(); 2];
        quantize_row_q8_1(&x, &mut q);
        for (b, xb) in q.iter().zip(x.chunks(32)) {
            let d = absmax(xb) / 127.0;
            let sum: i32 = b.qs.iter().map(|&v| v as i32).sum();
            assert_eq!(b.s, F16Bytes::from_f32(sum as f32 * d));
        }
    }
}
