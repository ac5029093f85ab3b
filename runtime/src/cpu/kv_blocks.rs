//! Attention's inner loops over K/V cache rows stored in absmax blocks (q8/q6/q4 caches,
//! [`duet_quant::absmax`]), reading the blocks in place: nothing is dequantized ahead.
//!
//! A head's columns `col0..col0 + n` of a row are walked block by block; within a block the
//! block scale is applied once per block (`d·Σ q·x`). The value sums convert the integers to
//! f32; the AVX2 scores multiply in integers against the query rounded to i16 per block (a
//! relative error of 2^-16, far below the cache's own), and are otherwise exact but for
//! f32 summation order.

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

/// Whether the whole-head AVX2 loops apply: block-aligned heads of 32 to 128 values.
#[cfg(target_arch = "x86_64")]
fn whole_blocks(col0: usize, n: usize) -> bool {
    col0.is_multiple_of(BLOCK) && n.is_multiple_of(BLOCK) && (BLOCK..=4 * BLOCK).contains(&n) && simd()
}

/// `out[j] = scale · q · K_j[col0..col0 + q.len()]` for the first `out.len()` rows, row j at
/// byte `j·row_bytes` of `rows`.
pub fn scores(fmt: AbsmaxFormat, q: &[f32], rows: &[u8], row_bytes: usize, col0: usize, scale: f32, out: &mut [f32]) {
    let n = q.len();
    assert!(out.len() * row_bytes <= rows.len(), "attention rows out of the cache");
    #[cfg(target_arch = "x86_64")]
    if whole_blocks(col0, n) {
        let bb = fmt.block_bytes();
        // SAFETY: AVX2/FMA/F16C checked; every row j < out.len() holds the head's n/32 blocks
        // at byte j·row_bytes + (col0/32)·bb (asserted above: rows are whole).
        return unsafe { x86::scores(fmt, q, rows.as_ptr().add(col0 / BLOCK * bb), row_bytes, scale, out) };
    }
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
    #[cfg(target_arch = "x86_64")]
    if whole_blocks(col0, n) {
        let bb = fmt.block_bytes();
        // SAFETY: as in `scores`.
        return unsafe { x86::weighted_sum(fmt, p, rows.as_ptr().add(col0 / BLOCK * bb), row_bytes, out) };
    }
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
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use duet_quant::absmax::{AbsmaxFormat, BLOCK};

    use crate::cpu::simd::hsum;

    /// The f16 scale at the start of a block.
    ///
    /// # Safety
    /// Two bytes readable at `block`; F16C.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block_scale(block: *const u8) -> f32 {
        unsafe {
            let bits = (block as *const u16).read_unaligned();
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
        }
    }

    /// A block's scale and its 32 values as i8 lanes.
    ///
    /// # Safety
    /// `block` points at a whole block of `fmt`; AVX2, F16C.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block_i8(fmt: AbsmaxFormat, block: *const u8) -> (f32, __m256i) {
        unsafe {
            let d = block_scale(block);
            let data = block.add(2);
            let nibbles = |bytes: __m128i| {
                let m = _mm_set1_epi8(0x0F);
                _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(bytes, 4), m), _mm_and_si128(bytes, m))
            };
            let q = match fmt {
                AbsmaxFormat::Q8 => _mm256_loadu_si256(data as *const __m256i),
                // u = q + 8: low nibbles are values 0..16, high nibbles 16..32.
                AbsmaxFormat::Q4 => {
                    _mm256_sub_epi8(nibbles(_mm_loadu_si128(data as *const __m128i)), _mm256_set1_epi8(8))
                }
                // u = q + 32: low 4 bits as Q4's nibbles; the top 2 bits of values j, j+8,
                // j+16, j+24 in bits 0-1, 2-3, 4-5, 6-7 of byte 16 + j (j < 8).
                AbsmaxFormat::Q6 => {
                    let lo = nibbles(_mm_loadu_si128(data as *const __m128i));
                    let hb = _mm256_set1_epi64x((data.add(16) as *const i64).read_unaligned());
                    let hi =
                        _mm256_and_si256(_mm256_srlv_epi64(hb, _mm256_set_epi64x(6, 4, 2, 0)), _mm256_set1_epi8(3));
                    let u = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
                    _mm256_sub_epi8(u, _mm256_set1_epi8(32))
                }
            };
            (d, q)
        }
    }

    /// A block's scale and a pointer to its 32 i8 values (q8: in place; q6/q4: unpacked
    /// into `tmp`).
    ///
    /// # Safety
    /// As [`block_i8`].
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block(fmt: AbsmaxFormat, block: *const u8, tmp: &mut [i8; BLOCK]) -> (f32, *const i8) {
        unsafe {
            if fmt == AbsmaxFormat::Q8 {
                return (block_scale(block), block.add(2) as *const i8);
            }
            let (d, q) = block_i8(fmt, block);
            _mm256_storeu_si256(tmp.as_mut_ptr() as *mut __m256i, q);
            (d, tmp.as_ptr())
        }
    }

    /// Whole-head scores, the head `NB` blocks wide, as integer dot products: the query is
    /// rounded to i16 per block of 32 (scale absmax/32767: a relative error of 2^-16 of the
    /// block's largest value, far below any cache format's own), each K block's i8 values
    /// are widened to i16 and multiplied pairwise into i32 lanes (vpmaddwd; at most 4·127·
    /// 32767 < 2^31 per lane), and each block's sum is scaled by d_K·d_q with one FMA. Per
    /// 32 values that is 7 vector operations where converting K to f32 takes 17, and fewer
    /// than the f16 cache's 12.
    ///
    /// # Safety
    /// AVX2, FMA, F16C; `head` + j·row_bytes holds the head's blocks for j < out.len();
    /// q.len() = NB·32.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scores_nb<const NB: usize>(
        fmt: AbsmaxFormat,
        q: &[f32],
        head: *const u8,
        row_bytes: usize,
        scale: f32,
        out: &mut [f32],
    ) {
        let bb = fmt.block_bytes();
        let mut qi = [[0i16; BLOCK]; NB];
        let mut dq = [0f32; NB];
        for ((x, qb), d) in q.chunks_exact(BLOCK).zip(&mut qi).zip(&mut dq) {
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            if !amax.is_finite() {
                out.fill(f32::NAN);
                return;
            }
            *d = amax / 32767.0;
            let inv = if amax > 0.0 { 32767.0 / amax } else { 0.0 };
            for (o, v) in qb.iter_mut().zip(x) {
                *o = (v * inv).round() as i16;
            }
        }
        unsafe {
            let qv: [[__m256i; 2]; NB] = std::array::from_fn(|b| {
                std::array::from_fn(|h| _mm256_loadu_si256(qi[b].as_ptr().add(16 * h) as *const __m256i))
            });
            for (j, o) in out.iter_mut().enumerate() {
                let row = head.add(j * row_bytes);
                let mut acc = _mm256_setzero_ps();
                for (b, qb) in qv.iter().enumerate() {
                    let (d, k) = block_i8(fmt, row.add(b * bb));
                    let lo = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(k)), qb[0]);
                    let hi = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(k)), qb[1]);
                    let sum = _mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi));
                    acc = _mm256_fmadd_ps(_mm256_set1_ps(d * dq[b]), sum, acc);
                }
                *o = hsum(acc) * scale;
            }
        }
    }

    /// # Safety
    /// As [`scores_nb`] with NB = q.len()/32 in 1..=4.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scores(fmt: AbsmaxFormat, q: &[f32], head: *const u8, row_bytes: usize, scale: f32, out: &mut [f32]) {
        unsafe {
            match q.len() / BLOCK {
                1 => scores_nb::<1>(fmt, q, head, row_bytes, scale, out),
                2 => scores_nb::<2>(fmt, q, head, row_bytes, scale, out),
                3 => scores_nb::<3>(fmt, q, head, row_bytes, scale, out),
                _ => scores_nb::<4>(fmt, q, head, row_bytes, scale, out),
            }
        }
    }

    /// Whole-head weighted sum with the output kept in registers across all rows.
    ///
    /// # Safety
    /// As [`scores_nb`], with out.len() = NB·32 and p.len() rows.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn weighted_sum_nb<const NB: usize>(
        fmt: AbsmaxFormat,
        p: &[f32],
        head: *const u8,
        row_bytes: usize,
        out: &mut [f32],
    ) {
        let bb = fmt.block_bytes();
        let mut tmp = [0i8; BLOCK];
        unsafe {
            let mut acc: [[__m256; 4]; NB] =
                std::array::from_fn(|b| std::array::from_fn(|k| _mm256_loadu_ps(out.as_ptr().add(32 * b + 8 * k))));
            for (j, &w) in p.iter().enumerate() {
                let row = head.add(j * row_bytes);
                for (b, ab) in acc.iter_mut().enumerate() {
                    let (d, qs) = block(fmt, row.add(b * bb), &mut tmp);
                    let wd = _mm256_set1_ps(w * d);
                    for (k, a) in ab.iter_mut().enumerate() {
                        *a = _mm256_fmadd_ps(wd, ld8(qs.add(8 * k)), *a);
                    }
                }
            }
            for (b, ab) in acc.iter().enumerate() {
                for (k, a) in ab.iter().enumerate() {
                    _mm256_storeu_ps(out.as_mut_ptr().add(32 * b + 8 * k), *a);
                }
            }
        }
    }

    /// # Safety
    /// As [`weighted_sum_nb`] with NB = out.len()/32 in 1..=4.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn weighted_sum(fmt: AbsmaxFormat, p: &[f32], head: *const u8, row_bytes: usize, out: &mut [f32]) {
        unsafe {
            match out.len() / BLOCK {
                1 => weighted_sum_nb::<1>(fmt, p, head, row_bytes, out),
                2 => weighted_sum_nb::<2>(fmt, p, head, row_bytes, out),
                3 => weighted_sum_nb::<3>(fmt, p, head, row_bytes, out),
                _ => weighted_sum_nb::<4>(fmt, p, head, row_bytes, out),
            }
        }
    }

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
            hsum(_mm256_add_ps(a, b))
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
    /// across blocks (head_dim 16 shares blocks; 64 spans two). Scores may differ by the
    /// query's i16 rounding (half a step of absmax/32767 per block, times |K|) beyond f32
    /// summation order.
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
            // Whole-block heads of 1 to 4 blocks (the AVX2 loops) and unaligned ones.
            for (col0, hd) in [(0, 64), (64, 64), (0, 128), (32, 96), (96, 32), (16, 16), (48, 32), (8, 40)] {
                let q: Vec<f32> = (0..hd).map(|i| (i as f32 * 0.37).sin()).collect();
                let mut got = vec![0f32; n_rows];
                scores(fmt, &q, &bytes, rb, col0, 0.5, &mut got);
                let q_step: Vec<f32> = q
                    .chunks(BLOCK)
                    .flat_map(|b| {
                        let step = b.iter().fold(0f32, |m, v| m.max(v.abs())) / 32767.0;
                        std::iter::repeat_n(step, b.len())
                    })
                    .collect();
                for (j, g) in got.iter().enumerate() {
                    let k = &deq[j * kv_dim + col0..j * kv_dim + col0 + hd];
                    let want: f32 = q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * 0.5;
                    let q_rounding: f32 = k.iter().zip(&q_step).map(|(b, st)| b.abs() * st / 2.0).sum::<f32>() * 0.5;
                    assert!(
                        (g - want).abs() <= 1e-5 * (1.0 + want.abs()) + q_rounding,
                        "{fmt:?} {col0}+{hd} row {j}: {g} vs {want} (query rounding bound {q_rounding})"
                    );
                }
                let p: Vec<f32> = (0..n_rows).map(|j| 1.0 / (j + 2) as f32).collect();
                let mut out = vec![0.25f32; hd];
                weighted_sum(fmt, &p, &bytes, rb, col0, &mut out);
                for (i, o) in out.iter().enumerate() {
                    let want: f32 = 0.25 + (0..n_rows).map(|j| p[j] * deq[j * kv_dim + col0 + i]).sum::<f32>();
                    assert!(
                        (o - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "{fmt:?} {col0}+{hd} col {i}: {o} vs {want}"
                    );
                }
            }
        }
    }
}
