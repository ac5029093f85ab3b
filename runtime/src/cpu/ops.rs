//! Element-wise and row-wise CPU ops. Reductions accumulate in f64 (as ggml's rms_norm
//! does) so the CPU backend stays a trustworthy reference.

/// `out = x / sqrt(mean(x²) + eps) · w` for one row (`w` = None: no weight).
pub fn rms_norm_row(x: &[f32], w: Option<&[f32]>, eps: f32, out: &mut [f32]) {
    let ss = sum_squares_f64(x);
    let inv = 1.0 / ((ss / x.len() as f64) as f32 + eps).sqrt();
    match w {
        Some(w) => {
            for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
                *o = g * (v * inv);
            }
        }
        None => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = v * inv;
            }
        }
    }
}

/// Rotates adjacent pairs of the first `n_rot` dims of every head of one row at `pos`.
/// `thetas[i]` is pair i's angular frequency.
pub fn rope_row(x: &mut [f32], n_heads: usize, head_dim: usize, pos: usize, thetas: &[f32], freq_scale: f32) {
    let p = pos as f32 * freq_scale;
    for (i, &th) in thetas.iter().enumerate() {
        // Same order of operations as the reference: angle in f32, then cos/sin.
        let angle = p * th;
        let (sin, cos) = angle.sin_cos();
        for h in 0..n_heads {
            let base = h * head_dim + 2 * i;
            let (a, b) = (x[base], x[base + 1]);
            x[base] = a * cos - b * sin;
            x[base + 1] = a * sin + b * cos;
        }
    }
}

/// [`rope_row`] on each row of `rows` (`cols` wide), row r at position pos0 + r.
#[allow(clippy::too_many_arguments)]
pub fn rope_rows(
    rows: &mut [f32],
    cols: usize,
    n_heads: usize,
    head_dim: usize,
    pos0: usize,
    thetas: &[f32],
    freq_scale: f32,
) {
    for (r, row) in rows.chunks_exact_mut(cols).enumerate() {
        rope_row(row, n_heads, head_dim, pos0 + r, thetas, freq_scale);
    }
}

/// Σ x² accumulated in f64 (AVX2: 4 f64 lanes, then a sum of the lanes).
pub fn sum_squares_f64(x: &[f32]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA.
        return unsafe { x86::sum_squares_f64(x) };
    }
    x.iter().map(|&v| v as f64 * v as f64).sum()
}

/// `gate = silu(gate) · up`.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA.
        return unsafe { x86::swiglu(gate, up) };
    }
    for (g, &u) in gate.iter_mut().zip(up) {
        let s = *g / (1.0 + (-*g).exp());
        *g = s * u;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::simd::exp;

    // SAFETY (both): vector loads/stores stay below the slices' common length; tails scalar.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn sum_squares_f64(x: &[f32]) -> f64 {
        let (mut a, mut b) = (_mm256_setzero_pd(), _mm256_setzero_pd());
        let mut i = 0;
        unsafe {
            while i + 8 <= x.len() {
                let v = _mm256_loadu_ps(x.as_ptr().add(i));
                let lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
                let hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
                a = _mm256_fmadd_pd(lo, lo, a);
                b = _mm256_fmadd_pd(hi, hi, b);
                i += 8;
            }
            let mut lanes = [0f64; 4];
            _mm256_storeu_pd(lanes.as_mut_ptr(), _mm256_add_pd(a, b));
            lanes.iter().sum::<f64>() + x[i..].iter().map(|&v| v as f64 * v as f64).sum::<f64>()
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn swiglu(gate: &mut [f32], up: &[f32]) {
        let n = gate.len().min(up.len());
        let mut i = 0;
        let one = _mm256_set1_ps(1.0);
        let sign = _mm256_set1_ps(-0.0);
        unsafe {
            while i + 8 <= n {
                let p = gate.as_mut_ptr().add(i);
                let g = _mm256_loadu_ps(p);
                let s = _mm256_div_ps(g, _mm256_add_ps(one, exp(_mm256_xor_ps(g, sign))));
                _mm256_storeu_ps(p, _mm256_mul_ps(s, _mm256_loadu_ps(up.as_ptr().add(i))));
                i += 8;
            }
        }
        for j in i..n {
            let g = gate[j];
            gate[j] = g / (1.0 + (-g).exp()) * up[j];
        }
    }
}

/// DEX on one row: for each head h in `heads`, `o_h[j] −= λ · Σ_i o_h[i] · W_D[i][j]`.
/// One row of DIFF V2's combine ([`crate::backend::Backend::pair_combine`]): `att` holds
/// 2·n_pairs heads, `gate` n_pairs values, `out` n_pairs heads.
pub fn pair_combine_row(att: &[f32], gate: &[f32], head_dim: usize, out: &mut [f32]) {
    for ((o, a), &g) in out.chunks_exact_mut(head_dim).zip(att.chunks_exact(2 * head_dim)).zip(gate) {
        let lambda = 1.0 / (1.0 + (-g).exp());
        let (a0, a1) = a.split_at(head_dim);
        for ((o, &x), &y) in o.iter_mut().zip(a0).zip(a1) {
            *o = x - lambda * y;
        }
    }
}

pub fn dex_row(x: &mut [f32], w_d: &[f32], lambda: f32, heads: &[usize], head_dim: usize) {
    let mut seg = vec![0f32; head_dim];
    for &h in heads {
        let o = &mut x[h * head_dim..(h + 1) * head_dim];
        seg.copy_from_slice(o);
        for (j, out) in o.iter_mut().enumerate() {
            let mut acc = 0f64;
            for (i, &s) in seg.iter().enumerate() {
                acc += s as f64 * w_d[i * head_dim + j] as f64;
            }
            *out = seg[j] - lambda * acc as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::RopeSpec;

    #[test]
    fn swiglu_and_sum_squares_match_plain_loops() {
        let g0: Vec<f32> = (0..203).map(|i| (i as f32 - 100.0) * 0.37).collect();
        let up: Vec<f32> = (0..203).map(|i| 1.0 + i as f32 * 0.01).collect();
        let mut g = g0.clone();
        swiglu(&mut g, &up);
        for i in 0..g0.len() {
            let want = (g0[i] as f64 / (1.0 + (-g0[i] as f64).exp()) * up[i] as f64) as f32;
            assert!((g[i] - want).abs() <= 4e-7 * want.abs().max(1e-30), "{i}: {} vs {want}", g[i]);
        }
        let want: f64 = g0.iter().map(|&v| v as f64 * v as f64).sum();
        assert!((sum_squares_f64(&g0) - want).abs() <= 1e-12 * want);
    }

    #[test]
    fn rms_norm_of_constant_row_is_one() {
        let x = [3.0f32; 8];
        let mut out = [0.0; 8];
        rms_norm_row(&x, None, 0.0, &mut out);
        assert!(out.iter().all(|v| (v - 1.0).abs() < 1e-6));
    }

    #[test]
    fn rope_preserves_pair_norms_and_is_identity_at_zero() {
        let rope = RopeSpec { n_rot: 4, freq_base: 10000.0, freq_scale: 1.0, freq_factors: None };
        let th = rope.thetas();
        let orig = [1.0f32, 2.0, 3.0, 4.0];
        let mut x = orig;
        rope_row(&mut x, 1, 4, 0, &th, 1.0);
        assert_eq!(x, orig);
        rope_row(&mut x, 1, 4, 7, &th, 1.0);
        assert!(((x[0] * x[0] + x[1] * x[1]) - 5.0).abs() < 1e-5);
        assert!(((x[2] * x[2] + x[3] * x[3]) - 25.0).abs() < 1e-4);
        // Pair 0 turns by 7 radians.
        assert!((x[0] - (7f32.cos() - 2.0 * 7f32.sin())).abs() < 1e-5);
    }
}
