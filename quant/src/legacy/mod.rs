//! The legacy 32-element formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (and Q8_1 for activations).
//!
//! `quantize_row_*` are ports of ggml's `quantize_row_*_ref` (what llama-quantize writes
//! without an importance matrix); `quantize_row_*_imatrix` are ports of the weighted
//! `quantize_row_*_impl` it uses when given one.

mod q4_0;
mod q4_1;
mod q5_0;
mod q5_1;
mod q8_0;

pub use q4_0::{dequantize_row_q4_0, quantize_row_q4_0, quantize_row_q4_0_imatrix};
pub use q4_1::{dequantize_row_q4_1, quantize_row_q4_1, quantize_row_q4_1_imatrix};
pub use q5_0::{dequantize_row_q5_0, quantize_row_q5_0, quantize_row_q5_0_imatrix};
pub use q5_1::{dequantize_row_q5_1, quantize_row_q5_1, quantize_row_q5_1_imatrix};
pub use q8_0::{dequantize_row_q8_0, quantize_row_q8_0, quantize_row_q8_1};

use crate::blocks::QK;

/// The value of largest magnitude in `x` with its sign (the first one found on ties), and
/// that magnitude. ggml's legacy and Q6_K quantizers all start from this.
#[inline]
pub(crate) fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    (max, amax)
}

/// Smallest and largest value (ggml starts from ±FLT_MAX).
#[inline]
pub(crate) fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// Mean of squares of a whole row: the σ² the imatrix quantizers mix into their weights.
#[inline]
pub(crate) fn row_sigma2(x: &[f32]) -> f32 {
    let mut sum_x2 = 0.0f32;
    for &v in x {
        sum_x2 += v * v;
    }
    sum_x2 / x.len() as f32
}

/// Per-element weights for the imatrix searches: `qw[j] · sqrt(σ² + x[j]²)`.
#[inline]
pub(crate) fn imatrix_weights<const N: usize>(x: &[f32], qw: &[f32], sigma2: f32) -> [f32; N] {
    let mut w = [0.0f32; N];
    for j in 0..N {
        w[j] = qw[j] * (sigma2 + x[j] * x[j]).sqrt();
    }
    w
}

/// The importance-weighted asymmetric search of `quantize_row_q{4,5}_1_impl` on every block
/// of a row (`make_qkx3_quants(nmax, …, −0.9, 0.05, 36)`, weights from `qw`): eight blocks at a
/// time as vector lanes ([`crate::search_x8`], bit-identical), the rest one by one. Calls
/// `store(block, scale, the_min, levels)` for each block in order.
pub(crate) fn imatrix_min_scale_blocks(
    nmax: i32,
    x: &[f32],
    qw: &[f32],
    sigma2: f32,
    mut store: impl FnMut(usize, f32, f32, &[u8]),
) {
    const LANES: usize = 8;
    let n_blocks = x.len() / QK;
    let lanes_end = n_blocks / LANES * LANES;
    let mut w = [0f32; LANES * QK];
    let mut l = [0u8; LANES * QK];
    for b0 in (0..lanes_end).step_by(LANES) {
        let xs = &x[QK * b0..QK * (b0 + LANES)];
        for (j, wj) in w.chunks_exact_mut(QK).enumerate() {
            let (xb, qb) = (&xs[QK * j..QK * (j + 1)], &qw[QK * (b0 + j)..QK * (b0 + j + 1)]);
            wj.copy_from_slice(&imatrix_weights::<QK>(xb, qb, sigma2));
        }
        let (d, min) = crate::search_x8::make_qkx_quants_x8(nmax, xs, &w, &mut l, -0.9, 0.05, 36);
        for j in 0..LANES {
            store(b0 + j, d[j], min[j], &l[QK * j..QK * (j + 1)]);
        }
    }
    let (mut lb, mut laux) = ([0u8; QK], [0u8; QK]);
    for b in lanes_end..n_blocks {
        let (xb, qb) = (&x[QK * b..QK * (b + 1)], &qw[QK * b..QK * (b + 1)]);
        let wb: [f32; QK] = imatrix_weights(xb, qb, sigma2);
        let (d, min) = crate::search::make_qkx3_quants(nmax, xb, Some(&wb), &mut lb, &mut laux, -0.9, 0.05, 36);
        store(b, d, min, &lb);
    }
}

/// Packs the fifth bits of 32 5-bit values as ggml's Q5 `qh`: bit j = bit 4 of `l[j]`.
#[inline]
pub(crate) fn pack_qh(l: impl Fn(usize) -> u8) -> [u8; 4] {
    let mut qh = 0u32;
    for j in 0..32 {
        qh |= (((l(j) & 0x10) >> 4) as u32) << j;
    }
    qh.to_le_bytes()
}

/// Bit 4 of element j from a Q5 `qh` (0 or 16).
#[inline(always)]
pub(crate) fn high_bit(qh: u32, j: usize) -> u8 {
    (((qh >> j) & 1) << 4) as u8
}

#[cfg(test)]
pub(crate) mod test_util {
    /// Deterministic pseudo-normal values (xorshift + Box–Muller).
    pub fn normal(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        (0..n)
            .map(|_| {
                let (u1, u2) = (next(), next());
                ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
            })
            .collect()
    }

    /// Blocks of 32 that stress a quantizer's fast path, after the caller's own `special`
    /// ones: zeros, −0, subnormals, huge values, an infinity, a NaN, then 2000 uniform random
    /// blocks in ±4.
    pub fn edge_and_random_blocks(special: Vec<Vec<f32>>) -> Vec<Vec<f32>> {
        let mut blocks = special;
        blocks.extend([
            vec![0.0; 32],
            vec![-0.0; 32],
            (0..32).map(|i| i as f32 * 1e-45).collect(),
            (0..32).map(|i| (i as f32 - 16.0) * 1e37).collect(),
            (0..32).map(|i| if i == 3 { f32::INFINITY } else { i as f32 }).collect(),
            (0..32).map(|i| if i == 7 { f32::NAN } else { -(i as f32) }).collect(),
        ]);
        let mut x = 0x9e37_79b9u32;
        for _ in 0..2000 {
            blocks.push(
                (0..32)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 17;
                        x ^= x << 5;
                        (x as f32 / u32::MAX as f32 - 0.5) * 8.0
                    })
                    .collect(),
            );
        }
        blocks
    }

    /// Max |a-b| relative to max |a|.
    pub fn rel_max_err(a: &[f32], b: &[f32]) -> f32 {
        let scale = a.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-30);
        a.iter().zip(b).fold(0.0f32, |m, (x, y)| m.max((x - y).abs())) / scale
    }
}
