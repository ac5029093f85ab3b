//! Q8_0 (value = d·q) and its activation twin Q8_1 (which also stores d·Σq).

use crate::blocks::{BlockQ8_0, BlockQ8_1, F16Bytes, QK};
use crate::rounding::{c_f32_to_i8, round_half_away_for_int};

/// ggml's `MAX(amax, fabsf(v))` fold (a NaN input propagates, as in C).
fn absmax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| if m > v.abs() { m } else { v.abs() })
}

/// Port of `quantize_row_q8_0_ref`: `roundf`, i.e. halves away from zero.
pub fn quantize_row_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    assert_eq!(x.len(), y.len() * QK);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked above).
        return unsafe { quantize_row_q8_0_avx2(x, y) };
    }
    quantize_row_q8_0_inline(x, y)
}

/// The same code compiled with AVX2 so that the finite blocks' loops run as vectors.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_row_q8_0_avx2(x: &[f32], y: &mut [BlockQ8_0]) {
    quantize_row_q8_0_inline(x, y)
}

#[inline(always)]
fn quantize_row_q8_0_inline(x: &[f32], y: &mut [BlockQ8_0]) {
    for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
        if !quantize_finite_block(xb, yb) {
            let d = absmax(xb) / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            yb.d = F16Bytes::from_f32(d);
            for (q, &v) in yb.qs.iter_mut().zip(xb) {
                *q = c_f32_to_i8(round_half_away_for_int(v * id));
            }
        }
    }
}

/// A block of finite values, the common case, without the reference's serial pieces: for
/// finite values ggml's NaN-propagating absmax fold is a plain maximum (any order), and
/// |v·id| ≤ 127 (plus rounding), so rounding halves away from zero needs no range check and
/// the narrowing no C emulation. Returns false, writing nothing, for blocks with inf or NaN.
#[inline(always)]
fn quantize_finite_block(xb: &[f32], yb: &mut BlockQ8_0) -> bool {
    let mut amax = 0.0f32;
    let mut finite = true;
    for &v in xb {
        amax = amax.max(v.abs());
        finite &= v.is_finite();
    }
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    // A subnormal d can make 1/d infinite; such blocks take the reference path too.
    if !finite || !id.is_finite() {
        return false;
    }
    yb.d = F16Bytes::from_f32(d);
    for (q, &v) in yb.qs.iter_mut().zip(xb) {
        let s = v * id;
        let t = s as i32; // truncation, exact: |s| < 2^23
        let frac = s - t as f32;
        *q = (t + (frac >= 0.5) as i32 - (frac <= -0.5) as i32) as i8;
    }
    true
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
            *q = c_f32_to_i8(round_half_away_for_int(v * id));
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

    /// The fast path gives the reference loop's bytes: exact halves, zeros, subnormal and
    /// huge blocks, inf and NaN, and random blocks.
    #[test]
    fn finite_block_path_matches_the_reference_loop() {
        let reference = |xb: &[f32]| {
            let d = absmax(xb) / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let qs: Vec<i8> = xb.iter().map(|&v| c_f32_to_i8((v * id).round())).collect();
            (F16Bytes::from_f32(d), qs)
        };
        let blocks = crate::legacy::test_util::edge_and_random_blocks(vec![
            (0..32).map(|i| i as f32 - 15.5).collect(),
            (0..32).map(|i| (i as f32 - 16.0) * 127.0 / 16.0 + 0.5).collect(),
        ]);
        for xb in &blocks {
            let mut y = [BlockQ8_0 { d: F16Bytes::from_f32(0.0), qs: [0; 32] }];
            quantize_row_q8_0(xb, &mut y);
            let (d, qs) = reference(xb);
            assert_eq!((y[0].d.get().to_bits(), y[0].qs.to_vec()), (d.get().to_bits(), qs), "{xb:?}");
        }
    }

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
