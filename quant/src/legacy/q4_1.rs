//! Q4_1: 32 values, f16 scale and minimum, value = d·q + m.

use super::{imatrix_min_scale_blocks, min_max, row_sigma2};
use crate::blocks::{BlockQ4_1, F16Bytes, QK};
use crate::rounding::c_f32_to_i8;

/// Port of `quantize_row_q4_1_ref`.
pub fn quantize_row_q4_1(x: &[f32], y: &mut [BlockQ4_1]) {
    assert_eq!(x.len(), y.len() * QK);
    for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
        let (min, max) = min_max(xb);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = F16Bytes::from_f32(d);
        yb.m = F16Bytes::from_f32(min);
        for j in 0..QK / 2 {
            let lo = (c_f32_to_i8((xb[j] - min) * id + 0.5) as i32).min(15) as u8;
            let hi = (c_f32_to_i8((xb[j + QK / 2] - min) * id + 0.5) as i32).min(15) as u8;
            yb.qs[j] = lo | (hi << 4);
        }
    }
}

/// Port of `quantize_row_q4_1_impl` (importance-weighted); `x` is one whole row.
pub fn quantize_row_q4_1_imatrix(x: &[f32], y: &mut [BlockQ4_1], qw: &[f32]) {
    assert_eq!(x.len(), y.len() * QK);
    assert_eq!(qw.len(), x.len());
    imatrix_min_scale_blocks(15, x, qw, row_sigma2(x), |b, d, min, l| {
        let yb = &mut y[b];
        yb.d = F16Bytes::from_f32(d);
        yb.m = F16Bytes::from_f32(-min);
        for j in 0..QK / 2 {
            yb.qs[j] = l[j] | (l[j + QK / 2] << 4);
        }
    });
}

/// Port of `dequantize_row_q4_1`.
pub fn dequantize_row_q4_1(x: &[BlockQ4_1], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK);
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let (d, m) = (xb.d.get(), xb.m.get());
        for j in 0..QK / 2 {
            yb[j] = (xb.qs[j] & 0x0f) as f32 * d + m;
            yb[j + QK / 2] = (xb.qs[j] >> 4) as f32 * d + m;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legacy::test_util::normal;

    #[test]
    fn round_trip_error_is_within_half_a_step() {
        let x = normal(32 * 64, 2);
        let mut q = vec![BlockQ4_1::default(); 64];
        quantize_row_q4_1(&x, &mut q);
        let mut y = vec![0.0; x.len()];
        dequantize_row_q4_1(&q, &mut y);
        for (xb, (yb, qb)) in x.chunks(32).zip(y.chunks(32).zip(&q)) {
            let d = qb.d.get();
            let tol = 0.5 * d + 16.0 * d * 1e-3 + xb.iter().fold(0f32, |m, v| m.max(v.abs())) * 1e-3;
            for (a, b) in xb.iter().zip(yb) {
                assert!((a - b).abs() <= tol, "{a} vs {b}");
            }
        }
    }
}
