//! Q8_K: the activation format for K-quant dot products (256 values, f32 scale, i8 quants,
//! and the sums of each 16 quants, which the dots use to apply sub-block minimums cheaply).

use crate::blocks::{BlockQ8K, QK_K};
use crate::legacy::signed_absmax;
use crate::rounding::nearest_int;

/// Port of `quantize_row_q8_K_ref`. The scale maps the signed extreme to −127 (not −128)
/// exactly as ggml does.
pub fn quantize_row_q8_k(x: &[f32], y: &mut [BlockQ8K]) {
    assert_eq!(x.len(), y.len() * QK_K);
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let (max, amax) = signed_absmax(xb);
        if amax == 0.0 {
            yb.d = 0.0;
            yb.qs = [0; QK_K];
            yb.bsums = [0; QK_K / 16];
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        yb.bsums = q8_k_bsums(&yb.qs);
        yb.d = 1.0 / iscale;
    }
}

/// Q8_K's `bsums`: the sum of each 16 quants (|sum| ≤ 16·127, an i16).
pub fn q8_k_bsums(qs: &[i8; QK_K]) -> [i16; QK_K / 16] {
    std::array::from_fn(|j| qs[16 * j..16 * j + 16].iter().map(|&q| q as i16).sum())
}

/// Port of `dequantize_row_q8_K`.
pub fn dequantize_row_q8_k(x: &[BlockQ8K], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK_K);
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        for (out, &q) in yb.iter_mut().zip(&xb.qs) {
            *out = xb.d * q as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bsums_and_scale() {
        let x: Vec<f32> = (0..QK_K).map(|i| (i as f32 - 100.0) * 0.01).collect();
        let mut q = [BlockQ8K::default()];
        quantize_row_q8_k(&x, &mut q);
        // The extreme is +1.55 at i = 255; ggml maps the signed extreme to −127, so the
        // scale comes out negative: d = −1.55/127.
        assert_eq!(q[0].qs[255], -127);
        assert!((q[0].d + 1.55 / 127.0).abs() < 1e-7);
        assert_eq!(q[0].qs[100], 0);
        for j in 0..16 {
            let s: i32 = q[0].qs[16 * j..16 * j + 16].iter().map(|&v| v as i32).sum();
            assert_eq!(q[0].bsums[j] as i32, s);
        }
    }
}
