//! Portable reference dot kernels. Integer products are summed exactly per block and
//! scaled once per block, as ggml's generic kernels do; SIMD kernels must agree with these
//! up to float summation order.

use super::Kernels;
use crate::blocks::{
    BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K, BlockQ8_0, BlockQ8_1, BlockQ8K,
};
use crate::fp::{bf16_bits_to_f32, f16_bits_to_f32};
use crate::kquants::get_scale_min_k4;

pub const KERNELS: Kernels = Kernels {
    name: "scalar",
    q4_0: dot_q4_0,
    q4_1: dot_q4_1,
    q5_0: dot_q5_0,
    q5_1: dot_q5_1,
    q8_0: dot_q8_0,
    q4_k: dot_q4_k,
    q5_k: dot_q5_k,
    q6_k: dot_q6_k,
    f32: dot_f32,
    f16: dot_f16,
    bf16: dot_bf16,
};

/// Σ a[j]·b[j] over 32 pairs of small integers.
#[inline(always)]
fn isum32(a: impl Fn(usize) -> i32, b: &[i8; 32]) -> i32 {
    (0..32).map(|j| a(j) * b[j] as i32).sum()
}

pub fn dot_q4_0(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
    assert_eq!(w.len(), a.len());
    let mut sum = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let q = |j: usize| {
            if j < 16 { (x.qs[j] & 0xf) as i32 - 8 } else { (x.qs[j - 16] >> 4) as i32 - 8 }
        };
        sum += isum32(q, &y.qs) as f32 * (x.d.get() * y.d.get());
    }
    sum
}

pub fn dot_q4_1(w: &[BlockQ4_1], a: &[BlockQ8_1]) -> f32 {
    assert_eq!(w.len(), a.len());
    let mut sum = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let q = |j: usize| {
            if j < 16 { (x.qs[j] & 0xf) as i32 } else { (x.qs[j - 16] >> 4) as i32 }
        };
        // Σ (d·q + m)·(d8·q8) = d·d8·Σq·q8 + m·(d8·Σq8), and Q8_1 stores d8·Σq8 as `s`.
        sum += isum32(q, &y.qs) as f32 * (x.d.get() * y.d.get()) + x.m.get() * y.s.get();
    }
    sum
}

#[inline(always)]
fn q5_level(qs: &[u8; 16], qh: u32, j: usize) -> i32 {
    let low = if j < 16 { qs[j] & 0xf } else { qs[j - 16] >> 4 };
    (low | ((((qh >> j) & 1) as u8) << 4)) as i32
}

pub fn dot_q5_0(w: &[BlockQ5_0], a: &[BlockQ8_0]) -> f32 {
    assert_eq!(w.len(), a.len());
    let mut sum = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let qh = u32::from_le_bytes(x.qh);
        sum += isum32(|j| q5_level(&x.qs, qh, j) - 16, &y.qs) as f32 * (x.d.get() * y.d.get());
    }
    sum
}

pub fn dot_q5_1(w: &[BlockQ5_1], a: &[BlockQ8_1]) -> f32 {
    assert_eq!(w.len(), a.len());
    let mut sum = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let qh = u32::from_le_bytes(x.qh);
        sum += isum32(|j| q5_level(&x.qs, qh, j), &y.qs) as f32 * (x.d.get() * y.d.get()) + x.m.get() * y.s.get();
    }
    sum
}

pub fn dot_q8_0(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
    assert_eq!(w.len(), a.len());
    let mut sum = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        sum += isum32(|j| x.qs[j] as i32, &y.qs) as f32 * (x.d.get() * y.d.get());
    }
    sum
}

/// Shared by Q4_K and Q5_K: `level(i)` gives element i's level (0..16 or 0..32) within the
/// super-block; each 32-element sub-block j has a 6-bit scale and min.
#[inline(always)]
fn dot_kquant_scale_min(d: f32, dmin: f32, scales: &[u8; 12], level: impl Fn(usize) -> i32, y: &BlockQ8K) -> f32 {
    let mut sum_scaled = 0i32;
    let mut sum_mins = 0i32;
    for j in 0..8 {
        let (sc, m) = get_scale_min_k4(j, scales);
        let mut isum = 0i32;
        for i in 32 * j..32 * j + 32 {
            isum += level(i) * y.qs[i] as i32;
        }
        sum_scaled += sc as i32 * isum;
        sum_mins += m as i32 * (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32);
    }
    d * y.d * sum_scaled as f32 - dmin * y.d * sum_mins as f32
}

pub fn dot_q4_k(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
    assert_eq!(w.len(), a.len());
    let mut sum = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        // Element i lives in 32-byte chunk i/64; the low nibble for the first 32 of the 64.
        let level = |i: usize| {
            let byte = x.qs[32 * (i / 64) + i % 32];
            (if i % 64 < 32 { byte & 0xf } else { byte >> 4 }) as i32
        };
        sum += dot_kquant_scale_min(x.d.get(), x.dmin.get(), &x.scales, level, y);
    }
    sum
}

pub fn dot_q5_k(w: &[BlockQ5K], a: &[BlockQ8K]) -> f32 {
    assert_eq!(w.len(), a.len());
    let mut sum = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let level = |i: usize| {
            let group = i / 64;
            let byte = x.qs[32 * group + i % 32];
            let high_shift = 2 * group + usize::from(i % 64 >= 32);
            let low = if i % 64 < 32 { byte & 0xf } else { byte >> 4 };
            (low | (((x.qh[i % 32] >> high_shift) & 1) << 4)) as i32
        };
        sum += dot_kquant_scale_min(x.d.get(), x.dmin.get(), &x.scales, level, y);
    }
    sum
}

pub fn dot_q6_k(w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
    assert_eq!(w.len(), a.len());
    let mut sum = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let mut isum = 0i32;
        for sub in 0..16 {
            let mut s = 0i32;
            for i in 16 * sub..16 * sub + 16 {
                // Element i: half h = i/128, quarter k = (i%128)/32, lane l = i%32.
                let (h, k, l) = (i / 128, (i % 128) / 32, i % 32);
                let ql = x.ql[64 * h + 32 * (k & 1) + l];
                let low = if k < 2 { ql & 0xf } else { ql >> 4 };
                let high = (x.qh[32 * h + l] >> (2 * k)) & 3;
                s += ((low | (high << 4)) as i32 - 32) * y.qs[i] as i32;
            }
            isum += x.scales[sub] as i32 * s;
        }
        sum += x.d.get() * y.d * isum as f32;
    }
    sum
}

pub fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len());
    w.iter().zip(x).map(|(a, b)| a * b).sum()
}

pub fn dot_f16(w: &[u8], x: &[f32]) -> f32 {
    assert_eq!(w.len(), 2 * x.len());
    w.chunks_exact(2).zip(x).map(|(b, v)| f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]])) * v).sum()
}

pub fn dot_bf16(w: &[u8], x: &[f32]) -> f32 {
    assert_eq!(w.len(), 2 * x.len());
    w.chunks_exact(2).zip(x).map(|(b, v)| bf16_bits_to_f32(u16::from_le_bytes([b[0], b[1]])) * v).sum()
}
