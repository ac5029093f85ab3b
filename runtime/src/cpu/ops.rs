//! Element-wise and row-wise CPU ops. Reductions accumulate in f64 (as ggml's rms_norm
//! does) so the CPU backend stays a trustworthy reference.

use crate::backend::RopeSpec;

/// `out = x / sqrt(mean(x²) + eps) · w` for one row (`w` = None: no weight).
pub fn rms_norm_row(x: &[f32], w: Option<&[f32]>, eps: f32, out: &mut [f32]) {
    let ss: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
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

/// The angular frequency of every rotated pair.
pub fn rope_thetas(rope: &RopeSpec) -> Vec<f32> {
    (0..rope.n_rot / 2).map(|i| rope.theta(i)).collect()
}

/// `gate = silu(gate) · up`.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let s = *g / (1.0 + (-*g).exp());
        *g = s * u;
    }
}

/// DEX on one row: for each head h in `heads`, `o_h[j] −= λ · Σ_i o_h[i] · W_D[i][j]`.
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
        let th = rope_thetas(&rope);
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
