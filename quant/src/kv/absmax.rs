//! Symmetric absmax block formats at 8, 6 and 4 bits, for the K/V cache.
//!
//! A block holds 32 consecutive values of a row: an f16 scale `d` (2 bytes, little-endian),
//! then the values `q ∈ [−qmax, qmax]` packed; the value is `d·q`. `d = absmax / qmax`, and
//! `q = round(x / d)` with halves away from zero (as ggml's `roundf`), computed with the
//! unrounded `d` and stored against its f16 rounding — exactly ggml's Q8_0 recipe, so
//!
//! * [`AbsmaxFormat::Q8`] (qmax 127, 34 bytes) is byte for byte a ggml Q8_0 block;
//! * [`AbsmaxFormat::Q6`] (qmax 31, 26 bytes): `u = q + 32` in 6 bits, the low nibbles of
//!   values j and j + 16 in byte j of 16, then the high 2 bits of values j, j + 8, j + 16,
//!   j + 24 in byte j of 8 (bits 0-1, 2-3, 4-5, 6-7);
//! * [`AbsmaxFormat::Q4`] (qmax 7, 18 bytes): `u = q + 8` in 4 bits, value j in the low and
//!   value j + 16 in the high nibble of byte j — a valid ggml Q4_0 block (its scale chosen
//!   symmetrically), 0.28× the bytes of f16.
//!
//! Round-trip error bound, per value of a block with largest magnitude `a`:
//! `|x − d₁₆·q| ≤ a / (2·qmax) + qmax·max(d·2⁻¹¹, 2⁻²⁵)` (half a step, plus the f16
//! rounding of `d = a/qmax` times `|q| ≤ qmax`; 2⁻²⁵ is half f16's subnormal spacing, which
//! takes over for blocks below ~qmax·2⁻¹⁴) — [`AbsmaxFormat::error_bound`].

use crate::fp::f16_bits_to_f32;

pub use super::pack::N as BLOCK;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AbsmaxFormat {
    Q8,
    Q6,
    Q4,
}

impl AbsmaxFormat {
    pub fn bits(self) -> u32 {
        match self {
            AbsmaxFormat::Q8 => 8,
            AbsmaxFormat::Q6 => 6,
            AbsmaxFormat::Q4 => 4,
        }
    }

    /// Largest quantized magnitude, `2^(bits−1) − 1`.
    pub fn qmax(self) -> i32 {
        (1 << (self.bits() - 1)) - 1
    }

    /// Bytes of one block of 32 values.
    pub fn block_bytes(self) -> usize {
        2 + BLOCK * self.bits() as usize / 8
    }

    /// Bytes of `n` values (`n` a multiple of 32).
    pub fn bytes(self, n: usize) -> usize {
        n / BLOCK * self.block_bytes()
    }

    /// The round-trip error bound of a value in a block whose largest magnitude is `absmax`.
    pub fn error_bound(self, absmax: f32) -> f32 {
        let qmax = self.qmax() as f32;
        let d = absmax / qmax;
        d / 2.0 + qmax * (d / 2048.0).max(1.0 / (1u32 << 25) as f32)
    }

    /// Quantizes `x` (a multiple of 32 values) into `out` (`bytes(x.len())`).
    pub fn quantize_row(self, x: &[f32], out: &mut [u8]) {
        assert!(x.len().is_multiple_of(BLOCK), "absmax rows are whole blocks of {BLOCK}");
        assert_eq!(out.len(), self.bytes(x.len()), "output is not the row's size");
        for (xb, ob) in x.chunks_exact(BLOCK).zip(out.chunks_exact_mut(self.block_bytes())) {
            self.quantize_block(xb.try_into().expect("32 values"), ob);
        }
    }

    fn quantize_block(self, x: &[f32; BLOCK], out: &mut [u8]) {
        // ggml's fold: a NaN input propagates into d.
        let amax = x.iter().fold(0.0f32, |m, v| if m > v.abs() { m } else { v.abs() });
        let d = amax / self.qmax() as f32;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out[..2].copy_from_slice(&crate::fp::f32_to_f16_bits(d).to_le_bytes());
        let qmax = self.qmax() as f32;
        let q: [i32; BLOCK] = std::array::from_fn(|i| {
            // roundf; the clamp only matters for NaN (→ 0) and cannot bite otherwise.
            let v = (x[i] * id).round();
            if v.is_nan() { 0 } else { v.clamp(-qmax, qmax) as i32 }
        });
        // Codes as the packing stores them: q8 the two's-complement byte (Q8_0), q6/q4 q + 2^(bits−1).
        let u: [u8; BLOCK] = std::array::from_fn(|i| match self {
            AbsmaxFormat::Q8 => q[i] as i8 as u8,
            _ => (q[i] + self.qmax() + 1) as u8,
        });
        super::pack::pack32(self.bits(), &u, &mut out[2..]);
    }

    /// The quantized values of one block into `q`; returns the scale `d`.
    #[inline]
    pub fn unpack_block(self, block: &[u8], q: &mut [i8; BLOCK]) -> f32 {
        let d = f16_bits_to_f32(u16::from_le_bytes([block[0], block[1]]));
        let mut u = [0u8; BLOCK];
        super::pack::unpack32(self.bits(), &block[2..self.block_bytes()], &mut u);
        for (o, &c) in q.iter_mut().zip(&u) {
            *o = match self {
                AbsmaxFormat::Q8 => c as i8,
                _ => (c as i32 - self.qmax() - 1) as i8,
            };
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
    use crate::blocks::{BlockQ4_0, BlockQ8_0};
    use crate::legacy::test_util::normal;

    const ALL: [AbsmaxFormat; 3] = [AbsmaxFormat::Q8, AbsmaxFormat::Q6, AbsmaxFormat::Q4];

    fn rows() -> Vec<Vec<f32>> {
        let mut rows = vec![normal(256, 5), vec![0.0; 64], vec![-3.5; 32]];
        // One outlier per block, tiny values, and exact half-steps (ties round away from 0).
        let mut outlier = normal(128, 6);
        for b in 0..4 {
            outlier[32 * b + 3 * b] = 250.0 * if b % 2 == 0 { 1.0 } else { -1.0 };
        }
        rows.push(outlier);
        rows.push(normal(64, 7).iter().map(|v| v * 1e-6).collect());
        rows.push((0..32).map(|i| (i as f32 - 15.5) * 0.5).collect());
        rows
    }

    #[test]
    fn round_trip_error_is_within_the_analytic_bound() {
        for f in ALL {
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
                    // The largest value comes back (nearly) exactly while the scale is an f16
                    // normal: the scale is tight.
                    if amax / f.qmax() as f32 >= 1.0 / 16384.0 {
                        assert!(bb.iter().fold(0f32, |m, v| m.max(v.abs())) >= amax * (1.0 - 1.0 / 1024.0));
                    }
                }
            }
        }
    }

    #[test]
    fn quantized_values_use_the_full_range_and_round_half_away() {
        for f in ALL {
            let qmax = f.qmax();
            // Values k·d for every level, and (k + ½)·d: each tie goes away from zero.
            let d = 0.25f32; // exact in f16
            let x: Vec<f32> = (0..32).map(|i| d * (i - 16).clamp(-qmax, qmax) as f32).collect();
            let mut x = x;
            x[0] = -(qmax as f32) * d;
            x[31] = qmax as f32 * d;
            let mut bytes = vec![0u8; f.bytes(32)];
            f.quantize_row(&x, &mut bytes);
            let mut q = [0i8; BLOCK];
            assert_eq!(f.unpack_block(&bytes, &mut q), d);
            for (i, &v) in q.iter().enumerate() {
                assert_eq!(v as f32 * d, x[i], "{f:?} value {i}");
            }
            let mut ties = [0.0f32; 32];
            ties[0] = qmax as f32 * d;
            ties[1] = 1.5 * d;
            ties[2] = -2.5 * d;
            f.quantize_row(&ties, &mut bytes);
            f.unpack_block(&bytes, &mut q);
            assert_eq!((q[0] as i32, q[1], q[2]), (qmax, 2, -3), "{f:?}");
        }
    }

    #[test]
    fn q8_is_ggml_q8_0_and_q4_reads_as_q4_0() {
        for x in rows() {
            let mut ours = vec![0u8; AbsmaxFormat::Q8.bytes(x.len())];
            AbsmaxFormat::Q8.quantize_row(&x, &mut ours);
            let mut ggml = vec![BlockQ8_0::default(); x.len() / 32];
            crate::legacy::quantize_row_q8_0(&x, &mut ggml);
            assert_eq!(ours, bytemuck::cast_slice::<BlockQ8_0, u8>(&ggml));

            let mut q4 = vec![0u8; AbsmaxFormat::Q4.bytes(x.len())];
            AbsmaxFormat::Q4.quantize_row(&x, &mut q4);
            let mut ours_back = vec![0f32; x.len()];
            AbsmaxFormat::Q4.dequantize_row(&q4, &mut ours_back);
            let blocks: &[BlockQ4_0] = bytemuck::cast_slice(&q4);
            let mut ggml_back = vec![0f32; x.len()];
            crate::legacy::dequantize_row_q4_0(blocks, &mut ggml_back);
            assert_eq!(ours_back, ggml_back);
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(AbsmaxFormat::Q8.block_bytes(), 34);
        assert_eq!(AbsmaxFormat::Q6.block_bytes(), 26);
        assert_eq!(AbsmaxFormat::Q4.block_bytes(), 18);
        // q4: 18 bytes per 32 values against f16's 64.
        assert!(AbsmaxFormat::Q4.bytes(4096) as f64 <= 0.3 * 2.0 * 4096.0);
    }
}
