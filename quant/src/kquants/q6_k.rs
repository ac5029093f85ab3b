//! Q6_K: super-blocks of 256 = 16 sub-blocks of 16, value = d·sc·(q − 32), q 6 bits
//! (low 4 in `ql`, high 2 in `qh`), sc a signed 8-bit scale.

use crate::blocks::{BlockQ6K, F16Bytes, QK_K};
use crate::rounding::nearest_int;
use crate::search::{GROUP_MAX_EPS, make_qx_quants};

fn quantize_block(x: &[f32], qw: Option<&[f32]>, y: &mut BlockQ6K) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    let mut max_scale = 0.0f32;
    let mut max_abs_scale = 0.0f32;
    for ib in 0..QK_K / 16 {
        let w = qw.map(|q| &q[16 * ib..16 * ib + 16]);
        let scale = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16], 1, w);
        scales[ib] = scale;
        if scale.abs() > max_abs_scale {
            max_abs_scale = scale.abs();
            max_scale = scale;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        // All-zero block: ggml writes zeros everywhere (d = +0).
        *y = BlockQ6K::default();
        return;
    }
    let iscale = -128.0 / max_scale;
    y.d = F16Bytes::from_f32(1.0 / iscale);
    for (dst, &s) in y.scales.iter_mut().zip(&scales) {
        *dst = nearest_int(iscale * s).min(127) as i8;
    }
    let d_super = y.d.get();
    for j in 0..QK_K / 16 {
        let d = d_super * y.scales[j] as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let li = nearest_int(x[16 * j + ii] / d).clamp(-32, 31);
            l[16 * j + ii] = (li + 32) as i8;
        }
    }
    // Each 128 elements: ql gets 64 bytes (elements l and l+64 in one byte, l+32 and l+96
    // in the next 32), qh 32 bytes with the high two bits of l, l+32, l+64, l+96.
    for half in 0..QK_K / 128 {
        let lv = |k: usize| l[128 * half + k] as u8;
        let ql = &mut y.ql[64 * half..64 * half + 64];
        for i in 0..32 {
            ql[i] = (lv(i) & 0xf) | ((lv(i + 64) & 0xf) << 4);
            ql[i + 32] = (lv(i + 32) & 0xf) | ((lv(i + 96) & 0xf) << 4);
        }
        let qh = &mut y.qh[32 * half..32 * half + 32];
        for (i, q) in qh.iter_mut().enumerate() {
            *q = (lv(i) >> 4) | ((lv(i + 32) >> 4) << 2) | ((lv(i + 64) >> 4) << 4) | ((lv(i + 96) >> 4) << 6);
        }
    }
}

/// Port of `quantize_row_q6_K_ref`.
pub fn quantize_row_q6_k(x: &[f32], y: &mut [BlockQ6K]) {
    assert_eq!(x.len(), y.len() * QK_K);
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        quantize_block(xb, None, yb);
    }
}

/// Port of `quantize_row_q6_K_impl`: the importance weights replace x² in the search.
pub fn quantize_row_q6_k_imatrix(x: &[f32], y: &mut [BlockQ6K], qw: &[f32]) {
    assert_eq!(x.len(), y.len() * QK_K);
    assert_eq!(qw.len(), x.len());
    for ((xb, qb), yb) in x.chunks_exact(QK_K).zip(qw.chunks_exact(QK_K)).zip(y.iter_mut()) {
        quantize_block(xb, Some(qb), yb);
    }
}

/// Port of `dequantize_row_q6_K`.
pub fn dequantize_row_q6_k(x: &[BlockQ6K], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK_K);
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = xb.d.get();
        for half in 0..QK_K / 128 {
            let ql = &xb.ql[64 * half..];
            let qh = &xb.qh[32 * half..];
            let sc = &xb.scales[8 * half..];
            let out = &mut yb[128 * half..128 * half + 128];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                out[l] = d * sc[is] as f32 * q1 as f32;
                out[l + 32] = d * sc[is + 2] as f32 * q2 as f32;
                out[l + 64] = d * sc[is + 4] as f32 * q3 as f32;
                out[l + 96] = d * sc[is + 6] as f32 * q4 as f32;
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
        let x = normal(QK_K * 16, 7);
        let mut q = vec![BlockQ6K::default(); 16];
        quantize_row_q6_k(&x, &mut q);
        let mut y = vec![0.0; x.len()];
        dequantize_row_q6_k(&q, &mut y);
        assert!(rel_max_err(&x, &y) < 0.03, "{}", rel_max_err(&x, &y));
    }

    #[test]
    fn all_zero_block_is_all_zero_bytes() {
        let x = vec![0.0f32; QK_K];
        let mut q = [BlockQ6K::default()];
        q[0].ql[0] = 0xaa; // must be overwritten
        quantize_row_q6_k(&x, &mut q);
        assert!(bytemuck::bytes_of(&q[0]).iter().all(|&b| b == 0));
    }
}
