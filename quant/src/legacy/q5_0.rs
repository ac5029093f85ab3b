//! Q5_0: 32 values, one f16 scale, value = d·(q − 16), the fifth bits packed in `qh`.

use super::{high_bit, imatrix_weights, pack_qh, row_sigma2, signed_absmax};
use crate::blocks::{BlockQ5_0, F16Bytes, QK};
use crate::rounding::c_f32_to_i8;
use crate::search::make_qx_quants;

/// Port of `quantize_row_q5_0_ref`.
pub fn quantize_row_q5_0(x: &[f32], y: &mut [BlockQ5_0]) {
    assert_eq!(x.len(), y.len() * QK);
    for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
        let (max, _) = signed_absmax(xb);
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = F16Bytes::from_f32(d);
        let mut l = [0u8; QK];
        for (lj, &v) in l.iter_mut().zip(xb) {
            *lj = (c_f32_to_i8(v * id + 16.5) as i32).min(31) as u8;
        }
        store(yb, &l);
    }
}

/// Port of `quantize_row_q5_0_impl` (importance-weighted); `x` is one whole row.
pub fn quantize_row_q5_0_imatrix(x: &[f32], y: &mut [BlockQ5_0], qw: &[f32]) {
    assert_eq!(x.len(), y.len() * QK);
    assert_eq!(qw.len(), x.len());
    let sigma2 = row_sigma2(x);
    let mut l = [0i8; QK];
    for ((xb, qb), yb) in x.chunks_exact(QK).zip(qw.chunks_exact(QK)).zip(y.iter_mut()) {
        let w: [f32; QK] = imatrix_weights(xb, qb, sigma2);
        let d = make_qx_quants(16, xb, &mut l, 1, Some(&w));
        yb.d = F16Bytes::from_f32(d);
        store(yb, &l.map(|v| v as u8));
    }
}

fn store(yb: &mut BlockQ5_0, l: &[u8; QK]) {
    for j in 0..QK / 2 {
        yb.qs[j] = (l[j] & 0x0f) | ((l[j + QK / 2] & 0x0f) << 4);
    }
    yb.qh = pack_qh(|j| l[j]);
}

/// Port of `dequantize_row_q5_0`.
pub fn dequantize_row_q5_0(x: &[BlockQ5_0], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK);
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let d = xb.d.get();
        let qh = u32::from_le_bytes(xb.qh);
        for j in 0..QK / 2 {
            let lo = ((xb.qs[j] & 0x0f) | high_bit(qh, j)) as i32 - 16;
            let hi = ((xb.qs[j] >> 4) | high_bit(qh, j + QK / 2)) as i32 - 16;
            yb[j] = lo as f32 * d;
            yb[j + QK / 2] = hi as f32 * d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legacy::test_util::normal;

    #[test]
    fn round_trip_error_is_within_half_a_step() {
        let x = normal(32 * 64, 3);
        let mut q = vec![BlockQ5_0::default(); 64];
        quantize_row_q5_0(&x, &mut q);
        let mut y = vec![0.0; x.len()];
        dequantize_row_q5_0(&q, &mut y);
        for (xb, (yb, qb)) in x.chunks(32).zip(y.chunks(32).zip(&q)) {
            let d = qb.d.get().abs();
            for (a, b) in xb.iter().zip(yb) {
                // The signed extreme maps to the most negative level, so values of the other
                // sign may clamp one level short: up to a full step, plus d's f16 rounding.
                assert!((a - b).abs() <= d + 16.0 * d * 1e-3 + 1e-6, "{a} vs {b}");
            }
        }
    }
}
