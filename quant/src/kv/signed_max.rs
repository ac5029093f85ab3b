//! Signed-max blocks: ggml Q4_0's rule at 8, 6, 4 and 2 bits, for the rotated cache types
//! (`q8r`/`q6r`/`q4r`/`q3r`/`q2r`, whose rows are stored in the Hadamard basis of each head, see
//! [`super::hadamard`]); at 3 bits the same blocks hold codes of [`super::lloyd_max`]'s
//! uneven levels instead.
//!
//! A block holds [`BLOCK`] consecutive values of a row: an f16 scale `d`, then the codes
//! packed 32 at a time ([`super::pack`]). With `h = 2^(bits−1)` and `m` the value of
//! largest magnitude (the first one found), `d = f16(m / −h)` maps `m` onto the level `−h`,
//! so all `2^bits` levels `−h ..= h − 1` are in use (a symmetric absmax scale wastes one);
//! `q = clamp(round(x / d), −h, h − 1)` (halves away from zero, `d = 0` gives `q = 0`) and
//! the value is `d·q`. The codes are those of the absmax blocks: `q + h` below 8 bits
//! (Q4_0's), the two's-complement byte at 8 (Q8_0's), so one decoder serves both formats. Only a correctly rounded division and
//! additions are involved, so the GPU's write kernel reproduces the bytes exactly.
//!
//! `q3r` is the exception: its code `u` stands for the level [`lloyd_max::LEVELS`]`[u]`, the
//! scale `d = f16(a · lloyd_max::SCALE)` from the largest magnitude `a`, each value the
//! nearest level of `x / d` ([`lloyd_max::code`]) — at 3 bits these levels leave a rotated
//! row 13% less squared error, and SmolLM2 ~0.9 points less perplexity (V alone).

use super::lloyd_max;
use super::pack::{N, pack32, packed_bytes, unpack32};
use crate::fp::{f16_bits_to_f32, f32_to_f16_bits};

/// Values per block.
pub const BLOCK: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SignedMaxFormat {
    Q8,
    Q6,
    Q4,
    Q3,
    Q2,
}

impl SignedMaxFormat {
    pub const ALL: [SignedMaxFormat; 5] =
        [SignedMaxFormat::Q8, SignedMaxFormat::Q6, SignedMaxFormat::Q4, SignedMaxFormat::Q3, SignedMaxFormat::Q2];

    pub fn bits(self) -> u32 {
        match self {
            SignedMaxFormat::Q8 => 8,
            SignedMaxFormat::Q6 => 6,
            SignedMaxFormat::Q4 => 4,
            SignedMaxFormat::Q3 => 3,
            SignedMaxFormat::Q2 => 2,
        }
    }

    /// `h = 2^(bits−1)`: levels run from −h to h − 1.
    pub fn half(self) -> i32 {
        1 << (self.bits() - 1)
    }

    /// The levels the codes stand for when they are not evenly spaced: `q3r`'s Lloyd–Max
    /// levels (code `u` is `levels[u]·d`); `None`: code `u` is level `u − h` (two's
    /// complement at 8 bits).
    pub fn levels(self) -> Option<&'static [i8; 8]> {
        (self == SignedMaxFormat::Q3).then_some(&lloyd_max::LEVELS)
    }

    /// The stored code of level `q`.
    fn code(self, q: i32) -> u8 {
        if self.bits() == 8 { q as i8 as u8 } else { (q + self.half()) as u8 }
    }

    /// Bytes of one block.
    pub fn block_bytes(self) -> usize {
        2 + BLOCK / N * packed_bytes(self.bits())
    }

    /// Bytes of `n` values (a multiple of [`BLOCK`]).
    pub fn bytes(self, n: usize) -> usize {
        n / BLOCK * self.block_bytes()
    }

    /// Largest round-trip error in a block whose largest magnitude is `absmax`: one step —
    /// half a step anywhere, but a value of the other sign than `m` and nearly as large is
    /// clipped to level `h − 1`, a whole step short — with the step at most 2⁻¹¹ off
    /// `absmax/h` (f16 rounding, or half f16's subnormal spacing for tiny blocks), an error
    /// the levels multiply up to `h` times.
    /// At 3 bits (Lloyd–Max): half the widest gap between levels (13·d/2), or a value
    /// beyond the outer level clipped to it ((1 − OUTER)·absmax), whichever is larger, with
    /// the same f16 rounding of `d` times the outer level.
    pub fn error_bound(self, absmax: f32) -> f32 {
        if self.levels().is_some() {
            let d = absmax * lloyd_max::SCALE;
            let off = (d / 2048.0).max(1.0 / (1u32 << 25) as f32);
            return (6.5 * d).max((1.0 - lloyd_max::OUTER) * absmax) + 35.0 * off;
        }
        let h = self.half() as f32;
        let d = absmax / h;
        let off = (d / 2048.0).max(1.0 / (1u32 << 25) as f32);
        d + off + h * off
    }

    /// Quantizes `x` (a multiple of [`BLOCK`] values) into `out` (`bytes(x.len())`).
    pub fn quantize_row(self, x: &[f32], out: &mut [u8]) {
        assert!(x.len().is_multiple_of(BLOCK), "signed-max rows are whole blocks of {BLOCK}");
        assert_eq!(out.len(), self.bytes(x.len()), "output is not the row's size");
        for (xb, ob) in x.chunks_exact(BLOCK).zip(out.chunks_exact_mut(self.block_bytes())) {
            self.quantize_block(xb, ob);
        }
    }

    fn quantize_block(self, x: &[f32], out: &mut [u8]) {
        let m = x.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        if self.levels().is_some() {
            return self.quantize_block_lloyd_max(m.abs(), x, out);
        }
        let h = self.half();
        // −1/h is a power of two: the product is exact (before the f16 rounding).
        let d_bits = f32_to_f16_bits(m * (-1.0 / h as f32));
        out[..2].copy_from_slice(&d_bits.to_le_bytes());
        let d = f16_bits_to_f32(d_bits);
        for (xs, dst) in x.chunks_exact(N).zip(out[2..].chunks_exact_mut(packed_bytes(self.bits()))) {
            let u: [u8; N] = std::array::from_fn(|j| {
                let t = if d == 0.0 { 0.0 } else { (xs[j] / d).round() };
                // NaN (from a NaN or infinite block) → level 0.
                let q = if t.is_nan() { 0 } else { t.clamp(-h as f32, (h - 1) as f32) as i32 };
                self.code(q)
            });
            pack32(self.bits(), &u, dst);
        }
    }

    /// [`Self::quantize_block`] at 3 bits: the scale from the largest magnitude `a`, each
    /// value's nearest Lloyd–Max level.
    fn quantize_block_lloyd_max(self, a: f32, x: &[f32], out: &mut [u8]) {
        let d_bits = f32_to_f16_bits(a * lloyd_max::SCALE);
        out[..2].copy_from_slice(&d_bits.to_le_bytes());
        let d = f16_bits_to_f32(d_bits);
        for (xs, dst) in x.chunks_exact(N).zip(out[2..].chunks_exact_mut(packed_bytes(self.bits()))) {
            let u: [u8; N] = std::array::from_fn(|j| lloyd_max::code_of(xs[j], d));
            pack32(self.bits(), &u, dst);
        }
    }

    /// One block's scale and its values' levels `q` (`BLOCK` of them).
    pub fn unpack_block(self, block: &[u8], q: &mut [i8; BLOCK]) -> f32 {
        let d = f16_bits_to_f32(u16::from_le_bytes([block[0], block[1]]));
        let h = self.half();
        let pb = packed_bytes(self.bits());
        let mut u = [0u8; N];
        for (k, qs) in q.chunks_exact_mut(N).enumerate() {
            unpack32(self.bits(), &block[2 + k * pb..2 + (k + 1) * pb], &mut u);
            for (o, &c) in qs.iter_mut().zip(&u) {
                *o = match self.levels() {
                    Some(l) => l[c as usize],
                    None if self.bits() == 8 => c as i8,
                    None => (c as i32 - h) as i8,
                };
            }
        }
        d
    }

    /// Dequantizes a row of blocks into `out`.
    pub fn dequantize_row(self, bytes: &[u8], out: &mut [f32]) {
        assert_eq!(bytes.len(), self.bytes(out.len()), "input is not the row's size");
        let mut q = [0i8; BLOCK];
        for (b, o) in bytes.chunks_exact(self.block_bytes()).zip(out.chunks_exact_mut(BLOCK)) {
            let d = self.unpack_block(b, &mut q);
            for (o, &v) in o.iter_mut().zip(&q) {
                *o = d * v as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legacy::test_util::normal;

    fn rows() -> Vec<Vec<f32>> {
        let mut outlier = normal(4 * BLOCK, 6);
        for b in 0..4 {
            outlier[BLOCK * b + 3 * b] = 250.0 * if b % 2 == 0 { 1.0 } else { -1.0 };
        }
        vec![
            normal(4 * BLOCK, 5),
            vec![0.0; BLOCK],
            vec![-3.5; BLOCK],
            outlier,
            normal(2 * BLOCK, 7).iter().map(|v| v * 1e-6).collect(),
            // Both extremes: the positive one is clipped to level h − 1.
            (0..BLOCK)
                .map(|i| {
                    if i == 0 {
                        -4.0
                    } else if i == 1 {
                        4.0
                    } else {
                        i as f32 / BLOCK as f32
                    }
                })
                .collect(),
        ]
    }

    #[test]
    fn round_trip_error_is_within_the_analytic_bound() {
        for f in SignedMaxFormat::ALL {
            for x in rows() {
                let mut bytes = vec![0u8; f.bytes(x.len())];
                f.quantize_row(&x, &mut bytes);
                let mut back = vec![0f32; x.len()];
                f.dequantize_row(&bytes, &mut back);
                for (xb, bb) in x.chunks(BLOCK).zip(back.chunks(BLOCK)) {
                    let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let bound = f.error_bound(amax);
                    for (a, b) in xb.iter().zip(bb) {
                        assert!((a - b).abs() <= bound, "{f:?}: {a} -> {b}, bound {bound}");
                    }
                }
            }
        }
    }

    /// The signed extreme lands on level −h exactly (up to the scale's f16 rounding), so
    /// every level is reachable and the largest value costs no clipping.
    #[test]
    fn the_signed_maximum_maps_to_the_lowest_level() {
        for f in SignedMaxFormat::ALL.into_iter().filter(|f| f.levels().is_none()) {
            let mut x = vec![0.0f32; BLOCK];
            x[1] = -1.0;
            x[7] = 6.0;
            let mut bytes = vec![0u8; f.block_bytes()];
            f.quantize_row(&x, &mut bytes);
            let mut q = [0i8; BLOCK];
            let d = f.unpack_block(&bytes, &mut q);
            assert_eq!(q[7] as i32, -f.half(), "{f:?}");
            assert_eq!(d * q[7] as f32, 6.0, "{f:?}: 6/−h is exact in f16");
            assert_eq!(q[0], 0);
        }
    }

    /// At 3 bits the codes are Lloyd–Max levels: the largest magnitude sits at the outer level
    /// only when it is 1/OUTER beyond the next value's level, a zero block reads back zero, and
    /// every value goes to its nearest level of `x/d`.
    #[test]
    fn three_bits_take_the_nearest_lloyd_max_level() {
        let f = SignedMaxFormat::Q3;
        let mut x: Vec<f32> = (0..BLOCK).map(|i| (i as f32 - 31.5) / 8.0).collect();
        x[5] = -7.0;
        let mut bytes = vec![0u8; f.block_bytes()];
        f.quantize_row(&x, &mut bytes);
        let mut q = [0i8; BLOCK];
        let d = f.unpack_block(&bytes, &mut q);
        assert_eq!(d, half::f16::from_f32(7.0 * lloyd_max::SCALE).to_f32());
        assert_eq!(q[5], -35, "−7 beyond the outer level −35·d = −5.95: clipped to it");
        for (&v, &l) in x.iter().zip(&q) {
            let best = lloyd_max::LEVELS.iter().map(|&m| (v / d - m as f32).abs()).fold(f32::INFINITY, f32::min);
            assert_eq!((v / d - l as f32).abs(), best, "{v}: level {l}");
        }
        f.quantize_row(&[0.0; BLOCK], &mut bytes);
        let mut back = [1f32; BLOCK];
        f.dequantize_row(&bytes, &mut back);
        assert_eq!(back, [0.0; BLOCK]);
    }

    #[test]
    fn sizes() {
        assert_eq!(SignedMaxFormat::Q4.block_bytes(), 2 + BLOCK / 2);
        assert_eq!(SignedMaxFormat::Q8.bytes(2 * BLOCK), 2 * (2 + BLOCK));
    }
}
