//! GGUF v3 reading and writing.
//!
//! * [`GgufFile`] memory-maps a file (or copies a buffer), checks the whole header and gives
//!   metadata as [`Value`]s and tensor data as borrowed byte slices.
//! * [`GgufWriter`] collects metadata and tensor declarations, validates them, then
//!   [`GgufDataWriter`] streams the tensor data into a temporary file that replaces the
//!   target only when [`GgufDataWriter::finish`] succeeds.
//!
//! # What is checked
//!
//! The reader enforces what llama.cpp's `gguf.cpp` enforces, and a little more:
//! magic `GGUF`; version 3 (version 2, which has the same layout, is accepted too);
//! every count, length and offset against the bytes that remain; valid UTF-8 in keys, string
//! values and tensor names; unique, non-empty keys; `general.alignment`, if present, a u32
//! power of two (default 32); bools 0 or 1; tensor names shorter than 64 bytes and unique;
//! at most 4 dimensions, each and their product at most `i64::MAX`; known ggml types;
//! `dims[0]` a multiple of the type's block size; offsets exactly sequential
//! (`offset_0 = 0`, `offset_{i+1} = offset_i + align_up(nbytes_i)`); every tensor's data
//! inside the file. Arrays of arrays are read (gguf-py writes them; llama.cpp refuses them)
//! up to [`MAX_ARRAY_DEPTH`] levels.
//!
//! # Memory
//!
//! No count is trusted: before anything is reserved, a count is checked against the
//! remaining bytes divided by the smallest size one entry can take, and reservations are
//! further capped at the number of remaining bytes. Strings, numeric and bool arrays and
//! string arrays (one buffer plus one offset per string, see [`StringArray`]) are allocated
//! once, at exactly their final size, which never exceeds their encoding. The key-value list
//! costs 8 bytes per pair (each pair is boxed), less than the 14 bytes the smallest pair
//! takes on disk. The tensor list is allocated only after every tensor info has been
//! validated and every tensor's data found inside the file. So no single allocation made
//! while parsing exceeds the file's size, with two exceptions for crafted but valid files,
//! both bounded by a small factor: arrays of arrays (48 bytes in memory per inner array,
//! at least 12 on disk) and tensor lists of thousands of zero-size tensors (about 100 bytes
//! per entry, at least 33 on disk).
//!
//! Multi-byte values are little-endian; the crate refuses to build on big-endian hosts.

mod error;
mod reader;
mod value;
mod writer;

pub use error::{GgufError, GgufErrorKind};
pub use reader::{GgufFile, TensorInfo};
pub use value::{Array, StringArray, StringArrayIter, Summary, Value, ValueType};
pub use writer::{GgufDataWriter, GgufWriter, TensorSpec};

pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";
/// The version this crate writes.
pub const GGUF_VERSION: u32 = 3;
pub const DEFAULT_ALIGNMENT: u32 = 32;
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// Tensor names must be shorter than ggml's `GGML_MAX_NAME` (64) bytes.
pub const MAX_NAME_LEN: usize = 63;
pub const MAX_DIMS: usize = 4;
/// Deepest nesting of arrays read or written; a flat array is depth 1. Real files use 1;
/// the limit keeps the recursive decoder's stack use bounded.
pub const MAX_ARRAY_DEPTH: usize = 16;

/// `x` rounded up to a multiple of `align` (a power of two), or `None` on overflow.
pub(crate) fn align_up(x: u64, align: u64) -> Option<u64> {
    let mask = align.checked_sub(1)?;
    x.checked_add(mask).map(|v| v & !mask)
}
