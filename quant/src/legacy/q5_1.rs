//! Q5_1: 32 values, f16 scale and minimum, value = d·q + m, q 5 bits.

use super::{high_bit, imatrix_min_scale_blocks, min_max, pack_qh, row_sigma2};
use crate::blocks::{BlockQ5_1, F16Bytes, QK};
use crate::rounding::c_f32_to_u8;

/// Port of `quantize_row_q5_1_ref`.
pub fn quantize_row_q5_1(x: &[f32], y: &mut [BlockQ5_1]) {
    assert_eq!(x.len(), y.len() * QK);
    for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
        let (min, max) = min_max(xb);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = F16Bytes::from_f32(d);
        yb.m = F16Bytes::from_f32(min);
        let mut l = [0u8; QK];
        for (lj, &v) in l.iter_mut().zip(xb) {
            // No clamp here in ggml: (v − min)·id + 0.5 never exceeds 31.5.
            *lj = c_f32_to_u8((v - min) * id + 0.5);
        }
        store(yb, &l);
    }
}

/// Port of `quantize_row_q5_1_impl` (importance-weighted); `x` is one whole row.
pub fn quantize_row_q5_1_imatrix(x: &[f32], y: &mut [BlockQ5_1], qw: &[f32]) {
    assert_eq!(x.len(), y.len() * QK);
    assert_eq!(qw.len(), x.len());
    imatrix_min_scale_blocks(31, x, qw, row_sigma2(x), |b, d, min, l| {
        let yb = &mut y[b];
        yb.d = F16Bytes::from_f32(d);
        yb.m = F16Bytes::from_f32(-min);
        store(yb, l.try_into().expect("32 levels"));
    });
}

fn store(yb: &mut BlockQ5_1, l: &[u8; QK]) {
    for j in 0..QK / 2 {
        yb.qs[j] = (l[j] & 0x0f) | ((l[j + QK / 2] & 0x0f) << 4);
    }
    yb.qh = pack_qh(|j| l[j]);
}

/// Port of `dequantize_row_q5_1`.
pub fn dequantize_row_q5_1(x: &[BlockQ5_1], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK);
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let (d, m) = (xb.d.get(), xb.m.get());
        let qh = u32::from_le_bytes(xb.qh);
        for j in 0..QK / 2 {
            let lo = (xb.qs[j] & 0x0f) | high_bit(qh, j);
            let hi = (xb.qs[j] >> 4) | high_bit(qh, j + QK / 2);
            yb[j] = lo as f32 * d + m;
            yb[j + QK / 2] = hi as f32 * d + m;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legacy::test_util::normal;

    #[test]
    fn round_trip_error_is_within_half_a_step() {
        let x = normal(32 * 64, 4);
        let mut q = vec![BlockQ5_1::default(); 64];
        quantize_row_q5_1(&x, &mut q);
        let mut y = vec![0.0; x.len()];
        dequantize_row_q5_1(&q, &mut y);
        for (xb, (yb, qb)) in x.chunks(32).zip(y.chunks(32).zip(&q)) {
            let d = qb.d.get();
            let tol = 0.5 * d + 32.0 * d * 1e-3 + xb.iter().fold(0f32, |m, v| m.max(v.abs())) * 1e-3;
            for (a, b) in xb.iter().zip(yb) {
                assert!((a - b).abs() <= tol, "{a} vs {b}");
            }
        }
    }
}
