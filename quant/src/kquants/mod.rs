//! The K-quants: 256-element super-blocks with quantized sub-block scales.
//!
//! `quantize_row_*` port ggml's `quantize_row_*_ref` (llama-quantize without an importance
//! matrix); `quantize_row_*_imatrix` port `quantize_row_*_impl` (with one). Q8_K is the
//! activation format the K-quant dot products multiply against.

mod q4_k;
mod q5_k;
mod q6_k;
mod q8_k;

pub use q4_k::{dequantize_row_q4_k, quantize_row_q4_k, quantize_row_q4_k_imatrix};
pub use q5_k::{dequantize_row_q5_k, quantize_row_q5_k, quantize_row_q5_k_imatrix};
pub use q6_k::{dequantize_row_q6_k, quantize_row_q6_k, quantize_row_q6_k_imatrix};
pub use q8_k::{dequantize_row_q8_k, q8_k_bsums, quantize_row_q8_k};

use crate::blocks::{K_SCALE_SIZE, QK_K};
use crate::search::make_qp_quants;
use crate::search_x8::make_qkx_quants_x8;

/// Scale and min of sub-block `j` (0..8) from the 12-byte packed form (`get_scale_min_k4`):
/// sub-blocks 0–3 keep 6 bits in bytes 0–7; 4–7 split into a low nibble in bytes 8–11 and
/// two high bits borrowed from the top of bytes 0–7.
#[inline(always)]
pub fn get_scale_min_k4(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// Inverse of [`get_scale_min_k4`] for all eight sub-blocks. `scales` must start zeroed.
fn pack_scale_mins(ls: &[u8; 8], lm: &[u8; 8], scales: &mut [u8; K_SCALE_SIZE]) {
    *scales = [0; K_SCALE_SIZE];
    for j in 0..QK_K / 32 {
        let (s, m) = (ls[j], lm[j]);
        if j < 4 {
            scales[j] = s;
            scales[j + 4] = m;
        } else {
            scales[j + 4] = (s & 0xf) | ((m & 0xf) << 4);
            scales[j - 4] |= (s >> 4) << 6;
            scales[j] |= (m >> 4) << 6;
        }
    }
}

/// Sub-block scales/mins and element levels of one Q4_K/Q5_K super-block, before packing.
struct ScaleMinSearch {
    /// Element levels 0..=nmax.
    l: [u8; QK_K],
    /// 6-bit sub-block scales and mins.
    ls: [u8; 8],
    lm: [u8; 8],
    /// Super-block scale and min (before f16 rounding).
    d: f32,
    dmin: f32,
}

/// The first pass of `quantize_row_q{4,5}_K_ref`: per-sub-block weighted search with
/// weights av_x + |x| (`make_qkx2_quants`), then the sub-block scales and mins quantized to
/// 6 bits against their maxima.
fn search_scale_mins_ref(x: &[f32], nmax: i32, rmin: f32, nstep: i32) -> ScaleMinSearch {
    let mut out = ScaleMinSearch { l: [0; QK_K], ls: [0; 8], lm: [0; 8], d: 0.0, dmin: 0.0 };
    let mut weights = [0f32; QK_K];
    for (xs, ws) in x[..QK_K].chunks_exact(32).zip(weights.chunks_exact_mut(32)) {
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in ws.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
    }
    let (scales, mins) = make_qkx_quants_x8(nmax, &x[..QK_K], &weights, &mut out.l, rmin, 0.1, nstep);
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..QK_K / 32 {
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    for j in 0..QK_K / 32 {
        // C narrows the int to uint8_t before clamping; keep that.
        out.ls[j] = (crate::rounding::nearest_int(inv_scale * scales[j]) as u8).min(63);
        out.lm[j] = (crate::rounding::nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    out.d = max_scale / 63.0;
    out.dmin = max_min / 63.0;
    out
}

/// The first pass of `quantize_row_q{4,5}_K_impl`: weights from the importance matrix (or
/// σ-based defaults), `make_qkx3_quants` per sub-block, then the scales and mins quantized
/// by the weighted `make_qp_quants`.
fn search_scale_mins_imatrix(x: &[f32], qw: Option<&[f32]>, nmax: i32) -> ScaleMinSearch {
    let mut out = ScaleMinSearch { l: [0; QK_K], ls: [0; 8], lm: [0; 8], d: 0.0, dmin: 0.0 };
    let mut sw = [0f32; 8];
    let mut sum_x2 = 0.0f32;
    for &v in &x[..QK_K] {
        sum_x2 += v * v;
    }
    let sigma2 = 2.0 * sum_x2 / QK_K as f32;
    let av_x = sigma2.sqrt();
    let mut all_weights = [0f32; QK_K];
    for j in 0..QK_K / 32 {
        let xs = &x[32 * j..32 * j + 32];
        let weights = &mut all_weights[32 * j..32 * j + 32];
        match qw {
            Some(qw) => {
                for l in 0..32 {
                    weights[l] = qw[32 * j + l] * (sigma2 + xs[l] * xs[l]).sqrt();
                }
            }
            None => {
                for l in 0..32 {
                    weights[l] = av_x + xs[l].abs();
                }
            }
        }
        let mut sumw = 0.0f32;
        for &w in weights.iter() {
            sumw += w;
        }
        sw[j] = sumw;
    }
    let (scales, mins) = make_qkx_quants_x8(nmax, &x[..QK_K], &all_weights, &mut out.l, -0.9, 0.05, 36);
    out.d = make_qp_quants(63, &scales, &mut out.ls, &sw);
    out.dmin = make_qp_quants(63, &mins, &mut out.lm, &sw);
    out
}

/// The second pass shared by Q4_K and Q5_K: with the packed (f16-rounded) scales fixed,
/// re-quantize every element to 0..=nmax. Sub-blocks whose scale is zero keep the levels
/// of the first pass, as in ggml.
fn requantize_levels(x: &[f32], d: f32, dmin: f32, scales: &[u8; K_SCALE_SIZE], nmax: i32, l: &mut [u8; QK_K]) {
    for j in 0..QK_K / 32 {
        let (sc, m) = get_scale_min_k4(j, scales);
        let dj = d * sc as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin * m as f32;
        for ii in 0..32 {
            let li = crate::rounding::nearest_int((x[32 * j + ii] + dm) / dj);
            l[32 * j + ii] = li.clamp(0, nmax) as u8;
        }
    }
}
