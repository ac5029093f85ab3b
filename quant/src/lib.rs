//! duet-quant: the bottom layer of duet. It knows nothing about models.
//!
//! * [`GgmlType`]: every ggml tensor type id with its block geometry.
//! * [`blocks`]: `#[repr(C)]` block layouts, byte-for-byte as ggml stores them.
//! * [`quantize`] / [`dequantize`]: whole rows, bit-exact with ggml's `quantize_row_*_ref`
//!   (and with `quantize_*` when an importance matrix is given).
//! * [`dot`]: the CPU dot products a matmul needs, scalar reference plus AVX2/NEON paths
//!   chosen at run time.
//! * [`kv`]: the K/V cache's block formats (absmax, signed-max and per-channel groups) and
//!   the Hadamard rotation.
//! * [`gguf`]: a checked, zero-copy GGUF v3 reader over a memory map and a streaming writer.

#[cfg(target_endian = "big")]
compile_error!("duet-quant reads and writes little-endian block bytes in place; big-endian hosts are not supported");

pub mod blocks;
pub mod dot;
pub mod fp;
pub mod gemm;
mod ggml_type;
pub mod gguf;
pub mod input;
pub mod kquants;
pub mod kv;
pub mod legacy;
pub mod output;
mod rounding;
mod row;
mod search;
mod search_x8;
pub mod second_level;

pub use ggml_type::{GgmlType, UnknownGgmlType};
pub use row::{QuantError, dequantize, quantize, quantize_with_imatrix, row_bytes};
