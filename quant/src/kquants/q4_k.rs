//! Q4_K: super-blocks of 256 = 8 sub-blocks of 32, value = d·sc·q − dmin·m, q in 0..16.

use super::{
    ScaleMinSearch, get_scale_min_k4, pack_scale_mins, requantize_levels, search_scale_mins_imatrix,
    search_scale_mins_ref,
};
use crate::blocks::{BlockQ4K, F16Bytes, QK_K};

fn store(x: &[f32], s: ScaleMinSearch, y: &mut BlockQ4K) {
    let mut l = s.l;
    pack_scale_mins(&s.ls, &s.lm, &mut y.scales);
    y.d = F16Bytes::from_f32(s.d);
    y.dmin = F16Bytes::from_f32(s.dmin);
    requantize_levels(x, y.d.get(), y.dmin.get(), &y.scales, 15, &mut l);
    // Each 32 bytes of qs hold 64 elements: the low nibbles the first 32, the high the next.
    for (chunk, q) in y.qs.chunks_exact_mut(32).enumerate() {
        let base = 64 * chunk;
        for i in 0..32 {
            q[i] = l[base + i] | (l[base + i + 32] << 4);
        }
    }
}

/// Port of `quantize_row_q4_K_ref`.
pub fn quantize_row_q4_k(x: &[f32], y: &mut [BlockQ4K]) {
    assert_eq!(x.len(), y.len() * QK_K);
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        store(xb, search_scale_mins_ref(xb, 15, -1.0, 20), yb);
    }
}

/// Port of `quantize_row_q4_K_impl`: importance-weighted (`qw` one weight per element).
pub fn quantize_row_q4_k_imatrix(x: &[f32], y: &mut [BlockQ4K], qw: &[f32]) {
    assert_eq!(x.len(), y.len() * QK_K);
    assert_eq!(qw.len(), x.len());
    for ((xb, qb), yb) in x.chunks_exact(QK_K).zip(qw.chunks_exact(QK_K)).zip(y.iter_mut()) {
        store(xb, search_scale_mins_imatrix(xb, Some(qb), 15), yb);
    }
}

/// Port of `dequantize_row_q4_K`.
pub fn dequantize_row_q4_k(x: &[BlockQ4K], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK_K);
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = xb.d.get();
        let min = xb.dmin.get();
        for (chunk, (q, out)) in xb.qs.chunks_exact(32).zip(yb.chunks_exact_mut(64)).enumerate() {
            let (sc1, m1) = get_scale_min_k4(2 * chunk, &xb.scales);
            let (sc2, m2) = get_scale_min_k4(2 * chunk + 1, &xb.scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            for l in 0..32 {
                out[l] = d1 * (q[l] & 0xf) as f32 - m1;
                out[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legacy::test_util::{normal, rel_max_err};

    #[test]
    fn round_trip_is_close() {
        let x = normal(QK_K * 16, 5);
        let mut q = vec![BlockQ4K::default(); 16];
        quantize_row_q4_k(&x, &mut q);
        let mut y = vec![0.0; x.len()];
        dequantize_row_q4_k(&q, &mut y);
        // 4 bits over a ±4σ range with a fitted min: about 1/15 of the sub-block range.
        assert!(rel_max_err(&x, &y) < 0.12, "{}", rel_max_err(&x, &y));
        let mut yi = vec![0.0; x.len()];
        let mut qi = vec![BlockQ4K::default(); 16];
        quantize_row_q4_k_imatrix(&x, &mut qi, &vec![1.0; x.len()]);
        dequantize_row_q4_k(&qi, &mut yi);
        assert!(rel_max_err(&x, &yi) < 0.12);
    }
}
