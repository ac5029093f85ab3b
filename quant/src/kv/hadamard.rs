//! The orthonormal Walsh–Hadamard rotation that the rotated K/V cache formats store their
//! rows in (QuaRot's and llama.cpp's trick): `H = H_n / √n` with `H_n` Sylvester's ±1 matrix,
//! so `H = Hᵀ = H⁻¹`. Rotating both vectors of a dot product leaves it unchanged, and a
//! rotated vector's large coordinates are spread over all `n` of them, which is what makes
//! a rotated row cheap to quantize.
//!
//! The transform is a fixed sequence of butterflies (`a + b`, `a − b`, strides 1, 2, 4, …)
//! followed by one multiplication by `1/√n` (exact for n = 4^k): every implementation that
//! follows the same sequence (the GPU's `rotate.wgsl`) gets the same bits.

/// Largest rotation size used: one Hadamard block never spans more than this many values.
pub const MAX_SIZE: usize = 256;

/// The rotation block for heads of `head_dim` values: the largest power of two that divides
/// `head_dim`, at most [`MAX_SIZE`]. 1 means no rotation is possible.
pub fn block_size(head_dim: usize) -> usize {
    if head_dim == 0 {
        return 1;
    }
    (1usize << head_dim.trailing_zeros()).min(MAX_SIZE)
}

/// `1/√n` as every implementation multiplies by it.
pub fn norm(n: usize) -> f32 {
    (1.0 / (n as f64).sqrt()) as f32
}

/// Rotates `x` in place: `x ← H·x` for `x.len()` a power of two.
pub fn rotate(x: &mut [f32]) {
    let n = x.len();
    assert!(n.is_power_of_two(), "a Hadamard block is a power of two long, not {n}");
    let mut h = 1;
    while h < n {
        for i in (0..n).step_by(2 * h) {
            for j in i..i + h {
                let (a, b) = (x[j], x[j + h]);
                x[j] = a + b;
                x[j + h] = a - b;
            }
        }
        h *= 2;
    }
    let s = norm(n);
    for v in x.iter_mut() {
        *v *= s;
    }
}

/// Rotates every block of `block` values of `x` (`x.len()` a multiple of it).
pub fn rotate_blocks(x: &mut [f32], block: usize) {
    if block > 1 {
        for b in x.chunks_exact_mut(block) {
            rotate(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32 ^ seed).wrapping_mul(2_654_435_761) >> 9) as f32 / 8_388_608.0 - 1.0) * 3.0)
            .collect()
    }

    #[test]
    fn rotation_is_orthonormal_and_its_own_inverse() {
        for n in [2, 4, 16, 32, 64, 128, 256] {
            // Rows of H are orthonormal: H·e_i are unit vectors at right angles.
            let rows: Vec<Vec<f32>> = (0..n)
                .map(|i| {
                    let mut e = vec![0f32; n];
                    e[i] = 1.0;
                    rotate(&mut e);
                    e
                })
                .collect();
            for i in 0..n {
                for j in 0..n {
                    let d: f64 = rows[i].iter().zip(&rows[j]).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let want = if i == j { 1.0 } else { 0.0 };
                    assert!((d - want).abs() < 1e-6, "n={n} <H e{i}, H e{j}> = {d}");
                }
            }
            let x = data(n, 7);
            let mut y = x.clone();
            rotate(&mut y);
            rotate(&mut y);
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() <= 4.0 * f32::EPSILON * (1.0 + a.abs()) * (n as f32).log2(), "n={n}: {a} vs {b}");
            }
        }
    }

    /// q·k is preserved to f32 rounding: the property the rotated K cache relies on.
    #[test]
    fn dot_products_are_preserved() {
        for n in [32, 64, 128] {
            let (q, k) = (data(n, 1), data(n, 2));
            let (mut qr, mut kr) = (q.clone(), k.clone());
            rotate(&mut qr);
            rotate(&mut kr);
            let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum::<f64>();
            let (d0, d1) = (dot(&q, &k), dot(&qr, &kr));
            let mag: f64 = q.iter().zip(&k).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
            assert!((d0 - d1).abs() <= 1e-6 * mag, "n={n}: {d0} vs {d1}");
        }
    }

    /// An outlier coordinate is spread evenly: the reason rotation helps quantization.
    #[test]
    fn an_outlier_is_spread_over_the_block() {
        let mut x = vec![0.01f32; 64];
        x[5] = 20.0;
        rotate(&mut x);
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(amax < 20.0 / 8.0 + 0.1, "largest rotated value {amax}");
    }

    #[test]
    fn block_size_is_the_largest_power_of_two_factor() {
        assert_eq!(block_size(64), 64);
        assert_eq!(block_size(128), 128);
        assert_eq!(block_size(96), 32);
        assert_eq!(block_size(80), 16);
        assert_eq!(block_size(75), 1);
        assert_eq!(block_size(512), 256);
    }
}
