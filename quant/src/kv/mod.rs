//! The K/V cache's block formats. Each is a documented byte layout that the CPU backend
//! reads in place and the GPU writes and reads byte for byte the same:
//!
//! * [`absmax`]: symmetric absmax blocks of 32 along a row (`q8`/`q6`/`q4`; q8 is ggml's
//!   Q8_0);
//! * [`signed_max`]: ggml Q4_0's signed-maximum rule (at 3 bits [`lloyd_max`]'s levels) in blocks of 64 along a row, for rows
//!   stored in the [`hadamard`] basis (`q8r`/`q6r`/`q4r`/`q3r`/`q2r`);
//! * [`channel`]: per-column asymmetric groups of 32 rows (`q8c`/`q6c`/`q4c`/`q3c`/`q2c`,
//!   KIVI's keys).
//!
//! All pack their codes with [`pack`], one layout per bit width. [`format`] names them
//! ([`CacheFormat`]) for every crate.

pub mod absmax;
pub mod channel;
pub mod channel_header;
mod channel_lanes;
pub mod format;
pub mod hadamard;
pub mod lloyd_max;
pub mod pack;
pub mod signed_max;

pub use format::{CacheFormat, CacheKind, CacheLayout, PAGE};
