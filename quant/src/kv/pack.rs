//! Bit packing of 32 unsigned codes, shared by every K/V cache format so that each width
//! has exactly one byte layout (the one the CPU's SIMD loops and the WGSL readers decode):
//!
//! * 8 bits: 32 bytes, code j in byte j;
//! * 6 bits: 24 bytes, the low nibbles of codes j and j + 16 in byte j of the first 16 (low,
//!   high nibble), then the top 2 bits of codes j, j + 8, j + 16, j + 24 in bits 0-1, 2-3,
//!   4-5, 6-7 of byte 16 + j (j < 8);
//! * 4 bits: 16 bytes, code j in the low and code j + 16 in the high nibble of byte j
//!   (ggml's Q4_0 order).

/// Codes per packed group.
pub const N: usize = 32;

/// Bytes of 32 codes of `bits` (4, 6 or 8).
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
        _ => unreachable!("cache codes are 4, 6 or 8 bits"),
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
        _ => unreachable!("cache codes are 4, 6 or 8 bits"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_width_round_trips_every_code() {
        for bits in [4u32, 6, 8] {
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
}
