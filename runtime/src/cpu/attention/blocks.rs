//! Attention's inner loops over cache rows stored in blocks along the row — an f16 scale
//! per 32 (`q8`/`q6`/`q4`, [`duet_quant::kv::absmax`]) or per 64 values (`q8r` … `q2r`,
//! [`duet_quant::kv::signed_max`]) — reading the blocks in place: nothing is dequantized
//! ahead. Both formats store levels with the same codes, so one decoder serves them — but
//! for `q3r`, whose codes stand for uneven levels (looked up in a table, the same integer
//! arithmetic after).
//!
//! A head's columns `col0..col0 + n` of a row are walked 32 values at a time; each group
//! of 32 has one scale, applied once (`d·Σ q·x`). The value sums convert the integers to
//! f32; the AVX2 scores multiply in integers against the query rounded to i16 per 32 values
//! at two levels (a relative error of 2^-31), and are otherwise exact but for f32 summation
//! order.

use duet_quant::kv::pack::{self, N};

/// The layout of one block-quantized row: blocks of `per_scale` values (32 or 64), each an
/// f16 scale followed by `per_scale/32` packed groups of codes, code `u` standing for level
/// `levels[u]` where a table is given (`q3r`), else `u − 2^(bits−1)` (two's complement at 8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowBlocks {
    pub bits: u32,
    pub per_scale: usize,
    pub levels: Option<&'static [i8; 8]>,
}

impl RowBlocks {
    pub fn block_bytes(self) -> usize {
        2 + self.per_scale / N * pack::packed_bytes(self.bits)
    }

    /// Byte offsets of the scale and of the codes of the group of 32 holding column `c`
    /// (a multiple of 32).
    #[inline(always)]
    fn group(self, c: usize) -> (usize, usize) {
        let start = c / self.per_scale * self.block_bytes();
        (start, start + 2 + (c % self.per_scale) / N * pack::packed_bytes(self.bits))
    }

    /// The levels of the 32 codes at `codes`.
    #[inline(always)]
    fn levels(self, codes: &[u8], q: &mut [i8; N]) {
        let mut u = [0u8; N];
        pack::unpack32(self.bits, codes, &mut u);
        let offset = 1i32 << (self.bits - 1);
        for (o, &c) in q.iter_mut().zip(&u) {
            *o = match self.levels {
                Some(l) => l[c as usize],
                None if self.bits == 8 => c as i8,
                None => (c as i32 - offset) as i8,
            };
        }
    }

    /// Calls `f(d, levels, first column in the group, x offset, count)` for the groups of
    /// 32 covering columns `col0..col0 + n` of one row.
    #[inline(always)]
    fn for_groups(self, row: &[u8], col0: usize, n: usize, mut f: impl FnMut(f32, &[i8; N], usize, usize, usize)) {
        let mut q = [0i8; N];
        let mut c = col0;
        while c < col0 + n {
            let (g, o) = (c / N * N, c % N);
            let len = (N - o).min(col0 + n - c);
            let (s, codes) = self.group(g);
            let d = duet_quant::fp::f16_bits_to_f32(u16::from_le_bytes([row[s], row[s + 1]]));
            self.levels(&row[codes..], &mut q);
            f(d, &q, o, c - col0, len);
            c += len;
        }
    }
}

/// Whether the whole-head AVX2 loops apply: heads of 32 to 128 values starting on a group.
#[cfg(target_arch = "x86_64")]
fn whole_groups(col0: usize, n: usize) -> bool {
    col0.is_multiple_of(N) && n.is_multiple_of(N) && (N..=4 * N).contains(&n) && crate::cpu::simd::avx2()
}

/// `out[j] = scale · q · K_j[col0..col0 + q.len()]` for the first `out.len()` rows, row j at
/// byte `j·row_bytes` of `rows`.
pub fn scores(fmt: RowBlocks, q: &[f32], rows: &[u8], row_bytes: usize, col0: usize, scale: f32, out: &mut [f32]) {
    let n = q.len();
    assert!(out.len() * row_bytes <= rows.len(), "attention rows out of the cache");
    #[cfg(target_arch = "x86_64")]
    if whole_groups(col0, n) {
        let groups: Vec<(usize, usize)> = (0..n / N).map(|g| fmt.group(col0 + g * N)).collect();
        // SAFETY: AVX2/FMA/F16C checked; every row j < out.len() is whole (asserted above)
        // and holds the head's groups at the offsets `group` computed.
        return unsafe { x86::scores(fmt, q, rows.as_ptr(), row_bytes, &groups, scale, out) };
    }
    for (j, o) in out.iter_mut().enumerate() {
        let row = &rows[j * row_bytes..(j + 1) * row_bytes];
        let mut s = 0f32;
        fmt.for_groups(row, col0, n, |d, qs, o, x0, len| {
            s += d * q[x0..x0 + len].iter().zip(&qs[o..o + len]).map(|(&a, &b)| a * b as f32).sum::<f32>();
        });
        *o = s * scale;
    }
}

/// `out += Σ_j p[j] · V_j[col0..col0 + out.len()]`.
pub fn weighted_sum(fmt: RowBlocks, p: &[f32], rows: &[u8], row_bytes: usize, col0: usize, out: &mut [f32]) {
    let n = out.len();
    assert!(p.len() * row_bytes <= rows.len(), "attention rows out of the cache");
    #[cfg(target_arch = "x86_64")]
    if whole_groups(col0, n) {
        let groups: Vec<(usize, usize)> = (0..n / N).map(|g| fmt.group(col0 + g * N)).collect();
        // SAFETY: as in `scores`.
        return unsafe { x86::weighted_sum(fmt, p, rows.as_ptr(), row_bytes, &groups, out) };
    }
    for (j, &w) in p.iter().enumerate() {
        let row = &rows[j * row_bytes..(j + 1) * row_bytes];
        fmt.for_groups(row, col0, n, |d, qs, o, x0, len| {
            for (o, &v) in out[x0..x0 + len].iter_mut().zip(&qs[o..o + len]) {
                *o += w * d * v as f32;
            }
        });
    }
}

/// [`weighted_sum`] of two probability vectors over the same rows at once (`out[i] +=
/// Σ_j p[i][j] · V_j`): DIFF's two softmaxes weigh the same values, and each value is
/// decoded once for both.
pub fn weighted_sum_pair(
    fmt: RowBlocks,
    p: [&[f32]; 2],
    rows: &[u8],
    row_bytes: usize,
    col0: usize,
    out: [&mut [f32]; 2],
) {
    let n = out[0].len();
    assert!(p[0].len() == p[1].len() && out[1].len() == n, "a pair of sums over the same rows");
    #[cfg(target_arch = "x86_64")]
    if whole_groups(col0, n) {
        assert!(p[0].len() * row_bytes <= rows.len(), "attention rows out of the cache");
        let groups: Vec<(usize, usize)> = (0..n / N).map(|g| fmt.group(col0 + g * N)).collect();
        // SAFETY: as in `scores`.
        return unsafe { x86::weighted_sum_pair(fmt, p, rows.as_ptr(), row_bytes, &groups, out) };
    }
    let [o0, o1] = out;
    weighted_sum(fmt, p[0], rows, row_bytes, col0, o0);
    weighted_sum(fmt, p[1], rows, row_bytes, col0, o1);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::RowBlocks;
    use crate::cpu::simd::{by_head_groups, codes_u8, f16_at, hsum, query_i16x2};

    /// How a row's codes become levels: a table to shuffle them through (`q3r`), or the
    /// offset 2^(bits−1) to subtract (none at 8 bits: the bytes are two's complement).
    #[derive(Clone, Copy)]
    struct Decode {
        bits: u32,
        table: Option<__m256i>,
    }

    impl Decode {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        fn new(fmt: RowBlocks) -> Decode {
            let table = fmt.levels.map(|l| {
                let t: [i8; 16] = std::array::from_fn(|u| if u < 8 { l[u] } else { 0 });
                // SAFETY: 16 readable bytes.
                let t = unsafe { _mm_loadu_si128(t.as_ptr() as *const __m128i) };
                _mm256_set_m128i(t, t)
            });
            Decode { bits: fmt.bits, table }
        }

        /// The 32 levels at `codes` as i8 lanes.
        ///
        /// # Safety
        /// The packed group readable at `codes`; AVX2.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn levels(self, codes: *const u8) -> __m256i {
            unsafe {
                let u = codes_u8(self.bits, codes);
                match self.table {
                    Some(t) => _mm256_shuffle_epi8(t, u),
                    None if self.bits == 8 => u,
                    None => _mm256_sub_epi8(u, _mm256_set1_epi8(1 << (self.bits - 1))),
                }
            }
        }
    }

    /// Whole-head scores, the head `NG` groups of 32 wide, as integer dot products: the
    /// query rounded to i16 per group at two levels ([`query_i16x2`]: the rounding error is
    /// rounded again, 2^-31 of the group's largest value), each K group's i8 levels widened
    /// to i16 and multiplied pairwise into i32 lanes (vpmaddwd; at most 2·128·32767 < 2^31
    /// per lane and group), each level's sum scaled by d_K·d_q with one FMA.
    ///
    /// # Safety
    /// AVX2, FMA, F16C; row j < out.len() at `rows + j·row_bytes` holds the groups at
    /// `groups` (scale offset, codes offset); q.len() = NG·32.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scores_ng<const NG: usize>(
        fmt: RowBlocks,
        q: &[f32],
        rows: *const u8,
        row_bytes: usize,
        groups: &[(usize, usize)],
        scale: f32,
        out: &mut [f32],
    ) {
        let Some([(qh, dh), (ql, dl)]) = query_i16x2::<NG>(q) else {
            out.fill(f32::NAN);
            return;
        };
        unsafe {
            let dec = Decode::new(fmt);
            for (j, o) in out.iter_mut().enumerate() {
                let row = rows.add(j * row_bytes);
                let mut acc = _mm256_setzero_ps();
                for g in 0..NG {
                    let (s, c) = groups[g];
                    let k = dec.levels(row.add(c));
                    let (k0, k1) = (
                        _mm256_cvtepi8_epi16(_mm256_castsi256_si128(k)),
                        _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(k)),
                    );
                    let hi = _mm256_add_epi32(_mm256_madd_epi16(k0, qh[g][0]), _mm256_madd_epi16(k1, qh[g][1]));
                    let lo = _mm256_add_epi32(_mm256_madd_epi16(k0, ql[g][0]), _mm256_madd_epi16(k1, ql[g][1]));
                    let d = f16_at(row.add(s));
                    acc = _mm256_fmadd_ps(_mm256_set1_ps(d * dh[g]), _mm256_cvtepi32_ps(hi), acc);
                    acc = _mm256_fmadd_ps(_mm256_set1_ps(d * dl[g]), _mm256_cvtepi32_ps(lo), acc);
                }
                *o = hsum(acc) * scale;
            }
        }
    }

    /// # Safety
    /// As [`scores_ng`] with NG = q.len()/32 in 1..=4.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scores(
        fmt: RowBlocks,
        q: &[f32],
        rows: *const u8,
        row_bytes: usize,
        groups: &[(usize, usize)],
        scale: f32,
        out: &mut [f32],
    ) {
        unsafe { by_head_groups!(groups.len(), scores_ng(fmt, q, rows, row_bytes, groups, scale, out)) }
    }

    /// Whole-head weighted sum with the output kept in registers across all rows.
    ///
    /// # Safety
    /// As [`scores_ng`], with out.len() = NG·32 and p.len() rows.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn weighted_sum_ng<const NG: usize>(
        fmt: RowBlocks,
        p: &[f32],
        rows: *const u8,
        row_bytes: usize,
        groups: &[(usize, usize)],
        out: &mut [f32],
    ) {
        unsafe {
            let dec = Decode::new(fmt);
            let mut acc: [[__m256; 4]; NG] =
                std::array::from_fn(|g| std::array::from_fn(|k| _mm256_loadu_ps(out.as_ptr().add(32 * g + 8 * k))));
            for (j, &w) in p.iter().enumerate() {
                let row = rows.add(j * row_bytes);
                for (g, ag) in acc.iter_mut().enumerate() {
                    let (s, c) = groups[g];
                    let q = dec.levels(row.add(c));
                    let wd = _mm256_set1_ps(w * f16_at(row.add(s)));
                    let halves = [_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q)];
                    for (k, a) in ag.iter_mut().enumerate() {
                        let h = halves[k / 2];
                        let eight = if k % 2 == 0 { h } else { _mm_unpackhi_epi64(h, h) };
                        let x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight));
                        *a = _mm256_fmadd_ps(wd, x, *a);
                    }
                }
            }
            for (g, ag) in acc.iter().enumerate() {
                for (k, a) in ag.iter().enumerate() {
                    _mm256_storeu_ps(out.as_mut_ptr().add(32 * g + 8 * k), *a);
                }
            }
        }
    }

    /// # Safety
    /// As [`weighted_sum_ng`] with NG = out.len()/32 in 1..=4.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn weighted_sum(
        fmt: RowBlocks,
        p: &[f32],
        rows: *const u8,
        row_bytes: usize,
        groups: &[(usize, usize)],
        out: &mut [f32],
    ) {
        unsafe { by_head_groups!(groups.len(), weighted_sum_ng(fmt, p, rows, row_bytes, groups, out)) }
    }

    /// [`weighted_sum`] of two probability vectors, a group of 32 columns at a time (two
    /// sets of four accumulators), each value decoded once for both.
    ///
    /// # Safety
    /// As [`weighted_sum_ng`] for both outputs (each groups.len()·32 long, p[0] and p[1]
    /// the same length).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn weighted_sum_pair(
        fmt: RowBlocks,
        p: [&[f32]; 2],
        rows: *const u8,
        row_bytes: usize,
        groups: &[(usize, usize)],
        out: [&mut [f32]; 2],
    ) {
        let [o0, o1] = out;
        unsafe {
            let dec = Decode::new(fmt);
            for (g, &(s, c)) in groups.iter().enumerate() {
                let load = |o: &[f32]| -> [__m256; 4] {
                    std::array::from_fn(|k| _mm256_loadu_ps(o.as_ptr().add(32 * g + 8 * k)))
                };
                let (mut a0, mut a1) = (load(o0), load(o1));
                for (j, (&w0, &w1)) in p[0].iter().zip(p[1]).enumerate() {
                    let row = rows.add(j * row_bytes);
                    let q = dec.levels(row.add(c));
                    let d = f16_at(row.add(s));
                    let (wd0, wd1) = (_mm256_set1_ps(w0 * d), _mm256_set1_ps(w1 * d));
                    let halves = [_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q)];
                    for k in 0..4 {
                        let h = halves[k / 2];
                        let eight = if k % 2 == 0 { h } else { _mm_unpackhi_epi64(h, h) };
                        let x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight));
                        a0[k] = _mm256_fmadd_ps(wd0, x, a0[k]);
                        a1[k] = _mm256_fmadd_ps(wd1, x, a1[k]);
                    }
                }
                for k in 0..4 {
                    _mm256_storeu_ps(o0.as_mut_ptr().add(32 * g + 8 * k), a0[k]);
                    _mm256_storeu_ps(o1.as_mut_ptr().add(32 * g + 8 * k), a1[k]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use duet_quant::kv::absmax::AbsmaxFormat;
    use duet_quant::kv::signed_max::SignedMaxFormat;

    use super::*;

    /// Both loops against dequantize-then-f32 for every format, head offsets inside and
    /// across blocks (head_dim 16 shares a group; 64 spans two). Scores may differ by the
    /// query's i16 rounding (half a step of absmax/32767 per group, times |K|) beyond f32
    /// summation order.
    #[test]
    fn block_loops_match_dequantized_rows() {
        let (n_rows, kv_dim) = (9, 128);
        let vals: Vec<f32> = (0..n_rows * kv_dim).map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 3.0).collect();
        type Codec = (RowBlocks, Box<dyn Fn(&[f32], &mut [u8])>, Box<dyn Fn(&[u8], &mut [f32])>, usize);
        let mut formats: Vec<Codec> = Vec::new();
        for f in [AbsmaxFormat::Q8, AbsmaxFormat::Q6, AbsmaxFormat::Q4] {
            let rb = RowBlocks { bits: f.bits(), per_scale: 32, levels: None };
            formats.push((
                rb,
                Box::new(move |x, b| f.quantize_row(x, b)),
                Box::new(move |b, x| f.dequantize_row(b, x)),
                f.bytes(kv_dim),
            ));
        }
        for f in SignedMaxFormat::ALL {
            let rb = RowBlocks { bits: f.bits(), per_scale: 64, levels: f.levels() };
            formats.push((
                rb,
                Box::new(move |x, b| f.quantize_row(x, b)),
                Box::new(move |b, x| f.dequantize_row(b, x)),
                f.bytes(kv_dim),
            ));
        }
        for (fmt, quantize, dequantize, rb) in &formats {
            assert_eq!(*rb, kv_dim / fmt.per_scale * fmt.block_bytes());
            let mut bytes = vec![0u8; n_rows * rb];
            for (x, b) in vals.chunks(kv_dim).zip(bytes.chunks_mut(*rb)) {
                quantize(x, b);
            }
            let mut deq = vec![0f32; n_rows * kv_dim];
            for (b, x) in bytes.chunks(*rb).zip(deq.chunks_mut(kv_dim)) {
                dequantize(b, x);
            }
            // Whole-group heads of 1 to 4 groups (the AVX2 loops) and unaligned ones.
            for (col0, hd) in [(0, 64), (64, 64), (0, 128), (32, 96), (96, 32), (16, 16), (48, 32), (8, 40)] {
                let q: Vec<f32> = (0..hd).map(|i| (i as f32 * 0.37).sin()).collect();
                let mut got = vec![0f32; n_rows];
                scores(*fmt, &q, &bytes, *rb, col0, 0.5, &mut got);
                let q_step: Vec<f32> = q
                    .chunks(N)
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
                weighted_sum(*fmt, &p, &bytes, *rb, col0, &mut out);
                for (i, o) in out.iter().enumerate() {
                    let want: f32 = 0.25 + (0..n_rows).map(|j| p[j] * deq[j * kv_dim + col0 + i]).sum::<f32>();
                    assert!(
                        (o - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "{fmt:?} {col0}+{hd} col {i}: {o} vs {want}"
                    );
                }
                super::super::cache::assert_pair_is_each_alone(
                    &p,
                    hd,
                    |p, o| weighted_sum(*fmt, p, &bytes, *rb, col0, o),
                    |p, o| weighted_sum_pair(*fmt, p, &bytes, *rb, col0, o),
                    &format!("{fmt:?} {col0}+{hd}"),
                );
            }
        }
    }
}
