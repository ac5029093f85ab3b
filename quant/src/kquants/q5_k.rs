//! Q5_K: as Q4_K with a fifth bit per element (q in 0..32) kept in `qh`.

use super::{
    ScaleMinSearch, get_scale_min_k4, pack_scale_mins, requantize_levels, search_scale_mins_imatrix,
    search_scale_mins_ref,
};
use crate::blocks::{BlockQ5K, F16Bytes, QK_K};

fn store(x: &[f32], s: ScaleMinSearch, y: &mut BlockQ5K) {
    let mut l = s.l;
    pack_scale_mins(&s.ls, &s.lm, &mut y.scales);
    y.d = F16Bytes::from_f32(s.d);
    y.dmin = F16Bytes::from_f32(s.dmin);
    requantize_levels(x, y.d.get(), y.dmin.get(), &y.scales, 31, &mut l);
    // Elements come in groups of 64: the low nibbles of 32 bytes of qs hold the first 32,
    // the high nibbles the next 32; their fifth bits go to bit 2g and 2g+1 of qh[0..32].
    y.qh = [0; QK_K / 8];
    for group in 0..QK_K / 64 {
        let (m1, m2) = (1u8 << (2 * group), 2u8 << (2 * group));
        for j in 0..32 {
            let mut l1 = l[64 * group + j];
            if l1 > 15 {
                l1 -= 16;
                y.qh[j] |= m1;
            }
            let mut l2 = l[64 * group + j + 32];
            if l2 > 15 {
                l2 -= 16;
                y.qh[j] |= m2;
            }
            y.qs[32 * group + j] = l1 | (l2 << 4);
        }
    }
}

/// Port of `quantize_row_q5_K_ref`.
pub fn quantize_row_q5_k(x: &[f32], y: &mut [BlockQ5K]) {
    assert_eq!(x.len(), y.len() * QK_K);
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        store(xb, search_scale_mins_ref(xb, 31, -0.5, 15), yb);
    }
}

/// Port of `quantize_row_q5_K_impl`: importance-weighted.
pub fn quantize_row_q5_k_imatrix(x: &[f32], y: &mut [BlockQ5K], qw: &[f32]) {
    assert_eq!(x.len(), y.len() * QK_K);
    assert_eq!(qw.len(), x.len());
    for ((xb, qb), yb) in x.chunks_exact(QK_K).zip(qw.chunks_exact(QK_K)).zip(y.iter_mut()) {
        let mut s = search_scale_mins_imatrix(xb, Some(qb), 31);
        // ggml's Q5_K (unlike Q4_K) clamps the 6-bit levels here.
        s.ls = s.ls.map(|v| v.min(63));
        s.lm = s.lm.map(|v| v.min(63));
        store(xb, s, yb);
    }
}

/// Port of `dequantize_row_q5_K`.
pub fn dequantize_row_q5_k(x: &[BlockQ5K], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK_K);
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = xb.d.get();
        let min = xb.dmin.get();
        for group in 0..QK_K / 64 {
            let (sc1, m1) = get_scale_min_k4(2 * group, &xb.scales);
            let (sc2, m2) = get_scale_min_k4(2 * group + 1, &xb.scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            let (u1, u2) = (1u8 << (2 * group), 2u8 << (2 * group));
            let ql = &xb.qs[32 * group..32 * group + 32];
            let out = &mut yb[64 * group..64 * group + 64];
            for l in 0..32 {
                let h1 = if xb.qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if xb.qh[l] & u2 != 0 { 16 } else { 0 };
                out[l] = d1 * ((ql[l] & 0xf) + h1) as f32 - m1;
                out[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
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
        let x = normal(QK_K * 16, 6);
        let mut q = vec![BlockQ5K::default(); 16];
        quantize_row_q5_k(&x, &mut q);
        let mut y = vec![0.0; x.len()];
        dequantize_row_q5_k(&q, &mut y);
        assert!(rel_max_err(&x, &y) < 0.06, "{}", rel_max_err(&x, &y));
    }
}
