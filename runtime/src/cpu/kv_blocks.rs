//! Attention's inner loops over K/V cache rows stored in absmax blocks (q8/q6/q4 caches,
//! [`duet_quant::absmax`]), reading the blocks in place: nothing is dequantized ahead.
//!
//! A head's columns `col0..col0 + n` of a row are walked block by block; within a block the
//! products use the integer values converted to f32 and the block scale is applied once per
//! block (`d·Σ q·x`), so the only rounding beyond the cache's own is f32 summation order.

use duet_quant::absmax::{AbsmaxFormat, BLOCK};

/// One block's values (q8: the bytes themselves) and scale.
#[inline(always)]
fn block<'a>(fmt: AbsmaxFormat, bytes: &'a [u8], tmp: &'a mut [i8; BLOCK]) -> (f32, &'a [i8; BLOCK]) {
    if fmt == AbsmaxFormat::Q8 {
        let d = duet_quant::fp::f16_bits_to_f32(u16::from_le_bytes([bytes[0], bytes[1]]));
        let q: &[i8] = bytemuck::cast_slice(&bytes[2..2 + BLOCK]);
        (d, q.try_into().expect("32 values"))
    } else {
        let d = fmt.unpack_block(bytes, tmp);
        (d, tmp)
    }
}

/// Calls `f(d, block values, first column in the block, x offset, count)` for the blocks
/// covering columns `col0..col0 + n` of one row.
#[inline(always)]
fn for_blocks(
    fmt: AbsmaxFormat,
    row: &[u8],
    col0: usize,
    n: usize,
    mut f: impl FnMut(f32, &[i8; BLOCK], usize, usize, usize),
) {
    let bb = fmt.block_bytes();
    let mut tmp = [0i8; BLOCK];
    let mut c = col0;
    while c < col0 + n {
        let (b, o) = (c / BLOCK, c % BLOCK);
        let len = (BLOCK - o).min(col0 + n - c);
        let (d, q) = block(fmt, &row[b * bb..(b + 1) * bb], &mut tmp);
        f(d, q, o, c - col0, len);
        c += len;
    }
}

/// `out[j] = scale · q · K_j[col0..col0 + q.len()]` for the first `out.len()` rows, row j at
/// byte `j·row_bytes` of `rows`.
pub fn scores(fmt: AbsmaxFormat, q: &[f32], rows: &[u8], row_bytes: usize, col0: usize, scale: f32, out: &mut [f32]) {
    let n = q.len();
    assert!(out.len() * row_bytes <= rows.len(), "attention rows out of the cache");
    for (j, o) in out.iter_mut().enumerate() {
        let row = &rows[j * row_bytes..(j + 1) * row_bytes];
        let mut s = 0f32;
        for_blocks(fmt, row, col0, n, |d, qs, o, x0, len| {
            s += d * dot(&q[x0..x0 + len], &qs[o..o + len]);
        });
        *o = s * scale;
    }
}

/// `out += Σ_j p[j] · V_j[col0..col0 + out.len()]`.
pub fn weighted_sum(fmt: AbsmaxFormat, p: &[f32], rows: &[u8], row_bytes: usize, col0: usize, out: &mut [f32]) {
    let n = out.len();
    assert!(p.len() * row_bytes <= rows.len(), "attention rows out of the cache");
    for (j, &w) in p.iter().enumerate() {
        let row = &rows[j * row_bytes..(j + 1) * row_bytes];
        for_blocks(fmt, row, col0, n, |d, qs, o, x0, len| {
            axpy(w * d, &qs[o..o + len], &mut out[x0..x0 + len]);
        });
    }
}

/// `Σ x[i]·q[i]`.
#[inline(always)]
fn dot(x: &[f32], q: &[i8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if x.len() == BLOCK && simd() {
        // SAFETY: the CPU has AVX2 and FMA; both slices hold 32 values.
        return unsafe { x86::dot32(x.as_ptr(), q.as_ptr()) };
    }
    x.iter().zip(q).map(|(&a, &b)| a * b as f32).sum()
}

/// `out[i] += w·q[i]`.
#[inline(always)]
fn axpy(w: f32, q: &[i8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if out.len() == BLOCK && simd() {
        // SAFETY: as above.
        return unsafe { x86::axpy32(w, q.as_ptr(), out.as_mut_ptr()) };
    }
    for (o, &v) in out.iter_mut().zip(q) {
        *o += w * v as f32;
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn simd() -> bool {
    // std caches the CPUID answers: a couple of loads.
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// 8 i8 at `q` as f32 lanes.
    ///
    /// # Safety
    /// 8 bytes readable at `q`; AVX2.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn ld8(q: *const i8) -> __m256 {
        unsafe { _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(q as *const __m128i))) }
    }

    /// # Safety
    /// 32 values readable at `x` and `q`; AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot32(x: *const f32, q: *const i8) -> f32 {
        unsafe {
            let mut a = _mm256_mul_ps(_mm256_loadu_ps(x), ld8(q));
            let mut b = _mm256_mul_ps(_mm256_loadu_ps(x.add(8)), ld8(q.add(8)));
            a = _mm256_fmadd_ps(_mm256_loadu_ps(x.add(16)), ld8(q.add(16)), a);
            b = _mm256_fmadd_ps(_mm256_loadu_ps(x.add(24)), ld8(q.add(24)), b);
            let s = _mm256_add_ps(a, b);
            let s = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
        }
    }

    /// # Safety
    /// 32 values readable at `q` and writable at `out`; AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy32(w: f32, q: *const i8, out: *mut f32) {
        unsafe {
            let wv = _mm256_set1_ps(w);
            for k in 0..4 {
                let o = out.add(8 * k);
                _mm256_storeu_ps(o, _mm256_fmadd_ps(wv, ld8(q.add(8 * k)), _mm256_loadu_ps(o)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both loops against dequantize-then-f32 for every format, head offsets inside and
    /// across blocks (head_dim 16 shares blocks; 64 spans two).
    #[test]
    fn block_loops_match_dequantized_rows() {
        let (n_rows, kv_dim) = (9, 128);
        let vals: Vec<f32> = (0..n_rows * kv_dim).map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 3.0).collect();
        for fmt in [AbsmaxFormat::Q8, AbsmaxFormat::Q6, AbsmaxFormat::Q4] {
            let rb = fmt.bytes(kv_dim);
            let mut bytes = vec![0u8; n_rows * rb];
            for (x, b) in vals.chunks(kv_dim).zip(bytes.chunks_mut(rb)) {
                fmt.quantize_row(x, b);
            }
            let mut deq = vec![0f32; n_rows * kv_dim];
            for (b, x) in bytes.chunks(rb).zip(deq.chunks_mut(kv_dim)) {
                fmt.dequantize_row(b, x);
            }
            for (col0, hd) in [(0, 64), (64, 64), (16, 16), (48, 32), (8, 40)] {
                let q: Vec<f32> = (0..hd).map(|i| (i as f32 * 0.37).sin()).collect();
                let mut got = vec![0f32; n_rows];
                scores(fmt, &q, &bytes, rb, col0, 0.5, &mut got);
                for (j, g) in got.iter().enumerate() {
                    let want: f32 = (0..hd).map(|i| q[i] * deq[j * kv_dim + col0 + i]).sum::<f32>() * 0.5;
                    assert!((g - want).abs() <= 1e-5 * (1.0 + want.abs()), "{fmt:?} {col0}+{hd} row {j}: {g} vs {want}");
                }
                let p: Vec<f32> = (0..n_rows).map(|j| 1.0 / (j + 2) as f32).collect();
                let mut out = vec![0.25f32; hd];
                weighted_sum(fmt, &p, &bytes, rb, col0, &mut out);
                for (i, o) in out.iter().enumerate() {
                    let want: f32 = 0.25 + (0..n_rows).map(|j| p[j] * deq[j * kv_dim + col0 + i]).sum::<f32>();
                    assert!((o - want).abs() <= 1e-5 * (1.0 + want.abs()), "{fmt:?} {col0}+{hd} col {i}: {o} vs {want}");
                }
            }
        }
    }
}
