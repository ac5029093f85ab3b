//! Bit packing of 32 unsigned codes, shared by every K/V cache format so that each width
//! has exactly one byte layout (the one the CPU's SIMD loops and the WGSL readers decode):
//!
//! * 8 bits: 32 bytes, code j in byte j;
//! * 6 bits: 24 bytes, the low nibbles of codes j and j + 16 in byte j of the first 16 (low,
//!   high nibble), then the top 2 bits of codes j, j + 8, j + 16, j + 24 in bits 0-1, 2-3,
//!   4-5, 6-7 of byte 16 + j (j < 8);
//! * 4 bits: 16 bytes, code j in the low and code j + 16 in the high nibble of byte j
//!   (ggml's Q4_0 order);
//! * 3 bits: 12 bytes, the low 2 bits of the codes as at 2 bits (8 bytes), then a
//!   little-endian u32 whose bit j is bit 2 of code j (Q5_0's `qh` order);
//! * 2 bits: 8 bytes, code j in bits 2·(j / 8) and up of byte j % 8 — the layout of the top
//!   2 bits at 6 bits, so one SIMD shift-and-mask decodes both (a 64-bit word shifted by 0,
//!   2, 4, 6 gives codes 0-7, 8-15, 16-23, 24-31 in its bytes).

/// Codes per packed group.
pub const N: usize = 32;

/// Bytes of 32 codes of `bits` (2, 3, 4, 6 or 8).
pub const fn packed_bytes(bits: u32) -> usize {
    N * bits as usize / 8
}

/// Packs 32 codes (each below 2^bits) into `out` (`packed_bytes(bits)` bytes).
#[inline]
pub fn pack32(bits: u32, u: &[u8; N], out: &mut [u8]) {
    match bits {
        8 => out[..N].copy_from_slice(u),
        6 => {
            for j in 0..16 {
                out[j] = (u[j] & 15) | ((u[j + 16] & 15) << 4);
            }
            for j in 0..8 {
                out[16 + j] = (u[j] >> 4) | ((u[j + 8] >> 4) << 2) | ((u[j + 16] >> 4) << 4) | ((u[j + 24] >> 4) << 6);
            }
        }
        4 => {
            for j in 0..16 {
                out[j] = (u[j] & 15) | (u[j + 16] << 4);
            }
        }
        3 => {
            pack_2bit(u, out);
            let high = (0..N).fold(0u32, |w, j| w | (((u[j] >> 2) as u32 & 1) << j));
            out[8..12].copy_from_slice(&high.to_le_bytes());
        }
        2 => pack_2bit(u, out),
        _ => unreachable!("cache codes are 2, 3, 4, 6 or 8 bits"),
    }
}

/// The low 2 bits of 32 codes in 8 bytes: code j in bits 2·(j / 8) of byte j % 8.
#[inline]
fn pack_2bit(u: &[u8; N], out: &mut [u8]) {
    for j in 0..8 {
        out[j] = (u[j] & 3) | ((u[j + 8] & 3) << 2) | ((u[j + 16] & 3) << 4) | ((u[j + 24] & 3) << 6);
    }
}

/// The 32 codes packed in `bytes`.
#[inline]
pub fn unpack32(bits: u32, bytes: &[u8], u: &mut [u8; N]) {
    match bits {
        8 => u.copy_from_slice(&bytes[..N]),
        6 => {
            for j in 0..16 {
                let hi = |k: usize| (bytes[16 + k % 8] >> (2 * (k / 8))) & 3;
                u[j] = (bytes[j] & 15) | (hi(j) << 4);
                u[j + 16] = (bytes[j] >> 4) | (hi(j + 16) << 4);
            }
        }
        4 => {
            for j in 0..16 {
                u[j] = bytes[j] & 15;
                u[j + 16] = bytes[j] >> 4;
            }
        }
        3 => {
            let high = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
            for j in 0..N {
                u[j] = ((bytes[j % 8] >> (2 * (j / 8))) & 3) | ((((high >> j) & 1) as u8) << 2);
            }
        }
        2 => {
            for j in 0..N {
                u[j] = (bytes[j % 8] >> (2 * (j / 8))) & 3;
            }
        }
        _ => unreachable!("cache codes are 2, 3, 4, 6 or 8 bits"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_width_round_trips_every_code() {
        for bits in [2u32, 3, 4, 6, 8] {
            let top = (1u32 << bits) as usize;
            for shift in 0..top {
                let u: [u8; N] = std::array::from_fn(|i| ((i * 7 + shift) % top) as u8);
                let mut b = vec![0u8; packed_bytes(bits)];
                pack32(bits, &u, &mut b);
                let mut back = [0u8; N];
                unpack32(bits, &b, &mut back);
                assert_eq!(back, u, "{bits} bits, shift {shift}");
            }
        }
    }

    /// The documented byte positions of the 3- and 2-bit layouts.
    #[test]
    fn narrow_layouts_put_codes_where_the_docs_say() {
        let mut u = [0u8; N];
        u[9] = 0b111; // 2-bit part: byte 1, bits 2-3; high bit: bit 9 of the word
        u[30] = 0b010; // byte 6, bits 6-7
        let mut b = [0u8; 12];
        pack32(3, &u, &mut b);
        assert_eq!(b, [0, 0b1100, 0, 0, 0, 0, 0b1000_0000, 0, 0, 0b10, 0, 0]);
        let mut b2 = [0u8; 8];
        pack32(2, &u, &mut b2);
        assert_eq!(b2, b[..8]);
    }
}
