//! Packed-weight matrix multiplication: `out[t][r] = Σ_k W[r][k] · x[t][k]` for many rows at
//! once, the CPU backend's matmul for prompt processing (several tokens) and decoding (one).
//!
//! The per-row kernels in [`crate::dot`] read one weight row in its GGUF block layout at a
//! time. Here a matrix is repacked once, at load, into groups of [`GROUP`] = 16 rows whose
//! blocks are interleaved so that one 64-byte line holds 4 bytes of each of the 16 rows: one
//! AVX-512 register (two AVX2 registers, four NEON registers) then carries 4 quant bytes of
//! every row of the group, and a single `vpdpbusd` with a broadcast of 4 activation bytes
//! advances 16 row dot products at once. The block scales of the 16 rows are stored together
//! (16 f16 are converted by one `vcvtph2ps`). Several tokens share every unpacked weight
//! register (tiles of 16 rows × up to 8 tokens).
//!
//! Integer arithmetic is exact, as in [`crate::dot::scalar`]: nibbles and 6-bit levels are
//! multiplied unsigned (u8 × i8), and each format's offset (−8 for Q4_0, −16 for Q5_0, −32 for
//! Q6_K, and −128 for Q8_0 whose bytes are stored with the sign bit flipped) is subtracted
//! through per-block activation sums that [`QActs`] caches next to the activations. (The
//! 16-bit forms of two-level prompts, q6k.rs and q8_0.rs, multiply i16 × i16 and take the
//! offset off the unpacked weights instead.) The
//! activation quantization itself is the bit-exact reference ([`crate::legacy::quantize_row_q8_0`],
//! [`crate::legacy::quantize_row_q8_1`], [`crate::kquants::quantize_row_q8_k`]). Only the
//! order and grouping of float operations differ from the scalar reference; `tests.rs` states
//! the bound for every type. (Two places round an integer, a relative 2⁻²⁴ at its conversion
//! to f32, as a float operation would: two-level Q8_0, whose merged pair's sum reaches ~6.7e7,
//! above 2²⁴, and Q4_K on AVX2 without VNNI, whose scaled sub-blocks add up in i32 to ~3.1e7
//! a super-block, ~2e9 for four sub-blocks of a pair; q4k_q5k.rs.)
//!
//! Memory layout of a [`PackedMatrix`]: groups one after the other, each
//! `[bulk: nb × BULK bytes][meta: nb × META bytes]` (padded to 64 bytes), where `nb` is the
//! number of blocks per row. The bulk (quants) of a block is a sequence of 64-byte *lines*; in
//! a line, bytes `4r..4r+4` belong to row `r` of the group. The meta part holds the scales,
//! row `r`'s f16 at bytes `2r..2r+2` of each 32-byte scale array. Per type (s = step):
//!
//! | type | bulk per block | meta per block |
//! |---|---|---|
//! | Q4_0 | 4 lines: line s = `qs[4s..4s+4]` (low nibbles: elements 4s.., high: 16+4s..) | d[16] |
//! | Q4_1 | as Q4_0 | d[16], m[16] |
//! | Q5_0 | 8 × u64 fifth-bit masks (index 2s+h, bit 4r+j = bit 4 of element 16h+4s+j), then as Q4_0 | d[16] |
//! | Q5_1 | as Q5_0 | d[16], m[16] |
//! | Q8_0 | 8 lines: line s = `qs[4s..4s+4] ^ 0x80` (unsigned: q + 128) | d[16] |
//! | Q4_K | 32 lines: line 8c+s = `qs[32c+4s..+4]` (low: elements 64c+4s.., high: 64c+32+4s..) | d[16], dmin[16], 3 lines of `scales[4p..4p+4]` |
//! | Q5_K | 64 × u64 masks (index 2(8c+s)+h, bit 4r+j = bit 2c+h of `qh[4s+j]`), then as Q4_K | as Q4_K |
//! | Q6_K | for half h, step s: 3 lines; byte j of line k: 6-bit level `q[128h+32k+4s+j]` in bits 0-5, bits 2k..2k+2 of `q[128h+96+4s+j]` in bits 6-7 | scales as `[sub-block][row]` i8 (256 bytes), d[16] |
//! | F16/BF16 | blocks of 16 columns: for column k, the 16 rows' values (32 bytes) | — |
//!
//! Rows past the end of the matrix (the last group) are zero and their results are dropped.

mod acts;
mod q4k_q5k;
mod kernels;
mod pack;
mod portable;
mod q6k;
mod q8_0;
mod quantize;
mod registry;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use acts::*;
pub use pack::*;
pub use registry::*;
