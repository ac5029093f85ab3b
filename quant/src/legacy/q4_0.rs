//! Q4_0: 32 values, one f16 scale, value = d·(q − 8).

use super::{imatrix_weights, row_sigma2, signed_absmax};
use crate::blocks::{BlockQ4_0, F16Bytes, QK};
use crate::rounding::c_f32_to_i8;
use crate::search::make_qx_quants;

/// Port of `quantize_row_q4_0_ref`. `x.len()` must be `32 · y.len()`.
pub fn quantize_row_q4_0(x: &[f32], y: &mut [BlockQ4_0]) {
    assert_eq!(x.len(), y.len() * QK);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked above).
        return unsafe { quantize_row_q4_0_avx2(x, y) };
    }
    quantize_row_q4_0_inline(x, y)
}

/// The same code compiled with AVX2 so that the finite blocks' loops run as vectors.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_row_q4_0_avx2(x: &[f32], y: &mut [BlockQ4_0]) {
    quantize_row_q4_0_inline(x, y)
}

/// A block of finite values without the reference's serial pieces: the signed extreme is the
/// first value whose |v| is the (order-free) maximum, as ggml's strict `amax < |v|` scan
/// picks, and x·id + 8.5 lies in 0.5..=16.5, where C's `(int8_t)` is plain truncation.
/// Returns false, writing nothing, for blocks with inf or NaN or an infinite 1/d.
#[inline(always)]
fn quantize_finite_block(xb: &[f32], yb: &mut BlockQ4_0) -> bool {
    let mut amax = 0.0f32;
    let mut finite = true;
    for &v in xb {
        amax = amax.max(v.abs());
        finite &= v.is_finite();
    }
    // All zeros: the scan keeps its initial +0 (a −0 in the block must not become the max).
    let max = if amax == 0.0 { 0.0 } else { xb.iter().copied().find(|v| v.abs() == amax).unwrap_or(0.0) };
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    if !finite || !id.is_finite() {
        return false;
    }
    yb.d = F16Bytes::from_f32(d);
    for j in 0..QK / 2 {
        let lo = ((xb[j] * id + 8.5) as i32).min(15) as u8;
        let hi = ((xb[j + QK / 2] * id + 8.5) as i32).min(15) as u8;
        yb.qs[j] = lo | (hi << 4);
    }
    true
}

#[inline(always)]
fn quantize_row_q4_0_inline(x: &[f32], y: &mut [BlockQ4_0]) {
    for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
        if quantize_finite_block(xb, yb) {
            continue;
        }
        let (max, _) = signed_absmax(xb);
        // The scale maps the signed extreme onto −8, so the full range −8..7 is used.
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = F16Bytes::from_f32(d);
        for j in 0..QK / 2 {
            let lo = (c_f32_to_i8(xb[j] * id + 8.5) as i32).min(15) as u8;
            let hi = (c_f32_to_i8(xb[j + QK / 2] * id + 8.5) as i32).min(15) as u8;
            yb.qs[j] = lo | (hi << 4);
        }
    }
}

/// Port of `quantize_row_q4_0_impl` with importance weights `qw` (one per element).
/// `x` must be one whole row: σ² is taken over all of it.
pub fn quantize_row_q4_0_imatrix(x: &[f32], y: &mut [BlockQ4_0], qw: &[f32]) {
    assert_eq!(x.len(), y.len() * QK);
    assert_eq!(qw.len(), x.len());
    let sigma2 = row_sigma2(x);
    let mut l = [0i8; QK];
    for ((xb, qb), yb) in x.chunks_exact(QK).zip(qw.chunks_exact(QK)).zip(y.iter_mut()) {
        let w: [f32; QK] = imatrix_weights(xb, qb, sigma2);
        let d = make_qx_quants(8, xb, &mut l, 1, Some(&w));
        yb.d = F16Bytes::from_f32(d);
        for j in 0..QK / 2 {
            yb.qs[j] = (l[j] as u8) | ((l[j + QK / 2] as u8) << 4);
        }
    }
}

/// Port of `dequantize_row_q4_0`.
pub fn dequantize_row_q4_0(x: &[BlockQ4_0], y: &mut [f32]) {
    assert_eq!(y.len(), x.len() * QK);
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let d = xb.d.get();
        for j in 0..QK / 2 {
            yb[j] = ((xb.qs[j] & 0x0f) as i32 - 8) as f32 * d;
            yb[j + QK / 2] = ((xb.qs[j] >> 4) as i32 - 8) as f32 * d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference loop of `quantize_row_q4_0_ref`, for the fast path's test.
    fn reference(xb: &[f32]) -> BlockQ4_0 {
        let (max, _) = signed_absmax(xb);
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut y = BlockQ4_0 { d: F16Bytes::from_f32(d), qs: [0; QK / 2] };
        for j in 0..QK / 2 {
            let lo = (c_f32_to_i8(xb[j] * id + 8.5) as i32).min(15) as u8;
            let hi = (c_f32_to_i8(xb[j + QK / 2] * id + 8.5) as i32).min(15) as u8;
            y.qs[j] = lo | (hi << 4);
        }
        y
    }

    /// The fast path gives the reference loop's bytes: ties for the extreme (±), zeros,
    /// subnormal and huge blocks, inf and NaN, and random blocks.
    #[test]
    fn finite_block_path_matches_the_reference_loop() {
        let blocks = crate::legacy::test_util::edge_and_random_blocks(vec![
            (0..32).map(|i| i as f32 - 15.5).collect(),
            (0..32)
                .map(|i| {
                    if i == 4 {
                        3.0
                    } else if i == 9 {
                        -3.0
                    } else {
                        0.25 * i as f32 / 32.0
                    }
                })
                .collect(),
            (0..32)
                .map(|i| {
                    if i == 4 {
                        -3.0
                    } else if i == 9 {
                        3.0
                    } else {
                        0.1
                    }
                })
                .collect(),
        ]);
        for xb in &blocks {
            let mut y = [BlockQ4_0 { d: F16Bytes::from_f32(0.0), qs: [0; QK / 2] }];
            quantize_row_q4_0(xb, &mut y);
            let want = reference(xb);
            assert_eq!((y[0].d.get().to_bits(), y[0].qs), (want.d.get().to_bits(), want.qs), "{xb:?}");
        }
    }
    use crate::legacy::test_util::{normal, rel_max_err};

    #[test]
    fn round_trip_error_is_within_half_a_step() {
        let x = normal(32 * 64, 1);
        let mut q = vec![BlockQ4_0::default(); 64];
        quantize_row_q4_0(&x, &mut q);
        let mut y = vec![0.0; x.len()];
        dequantize_row_q4_0(&q, &mut y);
        for (xb, (yb, qb)) in x.chunks(32).zip(y.chunks(32).zip(&q)) {
            let d = qb.d.get().abs();
            for (a, b) in xb.iter().zip(yb) {
                // The signed extreme maps to the most negative level, so values of the other
                // sign may clamp one level short: up to a full step, plus d's f16 rounding.
                assert!((a - b).abs() <= d + 8.0 * d * 1e-3 + 1e-6, "{a} vs {b} (d={d})");
            }
        }
        assert!(rel_max_err(&x, &y) < 0.1);
    }

    #[test]
    fn extreme_maps_to_minus_eight() {
        let mut x = [0.25f32; 32];
        x[5] = -3.0;
        let mut q = [BlockQ4_0::default()];
        quantize_row_q4_0(&x, &mut q);
        // d = max/−8 = 0.375; the extreme is stored as q = 0 (value −8·d).
        assert_eq!(q[0].d.get(), 0.375);
        assert_eq!(q[0].qs[5] & 0x0f, 0);
    }
}
