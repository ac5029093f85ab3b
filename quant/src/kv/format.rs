//! The K/V cache formats, defined once: every crate that stores, reads or sizes a cache (the
//! CPU backend, the GPU backend and its shaders, the CLI) names a format by [`CacheFormat`]
//! and takes its layout from here.
//!
//! | format | layout | bytes per 32 values (f16: 64) |
//! |---|---|---|
//! | `f32`, `f16` | plain | 128, 64 |
//! | `q8`, `q6`, `q4` | symmetric absmax blocks of 32 along the row ([`super::absmax`]) | 34, 26, 18 |
//! | `q8r`, `q6r`, `q4r`, `q3r`, `q2r` | each head Hadamard-rotated, then signed-max blocks of 64 ([`super::signed_max`]) | 33, 25, 17, 13, 9 |
//! | `q8c`, `q6c`, `q4c`, `q3c`, `q2c` | per channel over groups of 32 positions ([`super::channel`]; at 3 and 2 bits with compact headers, [`super::channel_header`]), the newest positions and the first (the attention sink) in f16 | 36, 28, 20, 14.1, 10.1 (+ the f16 window and sink) |
//!
//! A cache holds pages of [`PAGE`] positions (a per-channel group). On the GPU a block row is
//! padded to whole u32 words ([`CacheFormat::word_row_bytes`]).

use std::fmt;

use super::absmax::AbsmaxFormat;
use super::channel::{self, ChannelFormat};
use super::signed_max::{self, SignedMaxFormat};

/// Positions per page of a paged cache: one per-channel group.
pub const PAGE: usize = channel::GROUP;

/// A K or V cache's element format (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CacheFormat {
    F32,
    F16,
    Q8,
    Q6,
    Q4,
    Q8r,
    Q6r,
    Q4r,
    Q3r,
    Q2r,
    Q8c,
    Q6c,
    Q4c,
    Q3c,
    Q2c,
}

/// How a format stores its rows, with the quantizer of each kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheLayout {
    F32,
    F16,
    /// Each row in absmax blocks of 32.
    Absmax(AbsmaxFormat),
    /// Each row, every head Hadamard-rotated, in signed-max blocks of 64.
    Rotated(SignedMaxFormat),
    /// Groups of [`PAGE`] positions quantized per channel; the positions of the last,
    /// incomplete group kept in an f16 window, and a sequence's first [`channel::SINK`]
    /// positions (the attention sink) in f16 too.
    Channel(ChannelFormat),
}

/// The same layouts as the shaders read them: plain values, blocks along a row with one f16
/// scale per `per_scale` values, or per-channel groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheKind {
    Plain,
    Blocks { bits: u32, per_scale: u32 },
    Channel { bits: u32 },
}

impl CacheFormat {
    pub const ALL: [CacheFormat; 15] = [
        CacheFormat::F32,
        CacheFormat::F16,
        CacheFormat::Q8,
        CacheFormat::Q6,
        CacheFormat::Q4,
        CacheFormat::Q8r,
        CacheFormat::Q6r,
        CacheFormat::Q4r,
        CacheFormat::Q3r,
        CacheFormat::Q2r,
        CacheFormat::Q8c,
        CacheFormat::Q6c,
        CacheFormat::Q4c,
        CacheFormat::Q3c,
        CacheFormat::Q2c,
    ];
    /// The quantized formats: ALL past its first two (f32 and f16).
    pub const QUANTIZED: &'static [CacheFormat] = Self::ALL.split_at(2).1;
    pub const NAMES: &'static str = "f32, f16, q8, q6, q4, q8r, q6r, q4r, q3r, q2r, q8c, q6c, q4c, q3c or q2c";

    pub fn name(self) -> &'static str {
        match self {
            CacheFormat::F32 => "f32",
            CacheFormat::F16 => "f16",
            CacheFormat::Q8 => "q8",
            CacheFormat::Q6 => "q6",
            CacheFormat::Q4 => "q4",
            CacheFormat::Q8r => "q8r",
            CacheFormat::Q6r => "q6r",
            CacheFormat::Q4r => "q4r",
            CacheFormat::Q3r => "q3r",
            CacheFormat::Q2r => "q2r",
            CacheFormat::Q8c => "q8c",
            CacheFormat::Q6c => "q6c",
            CacheFormat::Q4c => "q4c",
            CacheFormat::Q3c => "q3c",
            CacheFormat::Q2c => "q2c",
        }
    }

    /// A name as `--cache-type-k` takes it (any case; `q8_0` is `q8`, ggml's name).
    pub fn parse(s: &str) -> Option<CacheFormat> {
        let s = s.to_ascii_lowercase();
        if s == "q8_0" {
            return Some(CacheFormat::Q8);
        }
        CacheFormat::ALL.into_iter().find(|t| t.name() == s)
    }

    pub fn layout(self) -> CacheLayout {
        match self {
            CacheFormat::F32 => CacheLayout::F32,
            CacheFormat::F16 => CacheLayout::F16,
            CacheFormat::Q8 => CacheLayout::Absmax(AbsmaxFormat::Q8),
            CacheFormat::Q6 => CacheLayout::Absmax(AbsmaxFormat::Q6),
            CacheFormat::Q4 => CacheLayout::Absmax(AbsmaxFormat::Q4),
            CacheFormat::Q8r => CacheLayout::Rotated(SignedMaxFormat::Q8),
            CacheFormat::Q6r => CacheLayout::Rotated(SignedMaxFormat::Q6),
            CacheFormat::Q4r => CacheLayout::Rotated(SignedMaxFormat::Q4),
            CacheFormat::Q3r => CacheLayout::Rotated(SignedMaxFormat::Q3),
            CacheFormat::Q2r => CacheLayout::Rotated(SignedMaxFormat::Q2),
            CacheFormat::Q8c => CacheLayout::Channel(ChannelFormat::Q8),
            CacheFormat::Q6c => CacheLayout::Channel(ChannelFormat::Q6),
            CacheFormat::Q4c => CacheLayout::Channel(ChannelFormat::Q4),
            CacheFormat::Q3c => CacheLayout::Channel(ChannelFormat::Q3),
            CacheFormat::Q2c => CacheLayout::Channel(ChannelFormat::Q2),
        }
    }

    pub fn kind(self) -> CacheKind {
        match self.layout() {
            CacheLayout::F32 | CacheLayout::F16 => CacheKind::Plain,
            CacheLayout::Absmax(f) => CacheKind::Blocks { bits: f.bits(), per_scale: super::absmax::BLOCK as u32 },
            CacheLayout::Rotated(f) => CacheKind::Blocks { bits: f.bits(), per_scale: signed_max::BLOCK as u32 },
            CacheLayout::Channel(f) => CacheKind::Channel { bits: f.bits() },
        }
    }

    /// Bits per stored value (16 and 32 for the plain formats).
    pub fn bits(self) -> u32 {
        match self.layout() {
            CacheLayout::F32 => 32,
            CacheLayout::F16 => 16,
            CacheLayout::Absmax(f) => f.bits(),
            CacheLayout::Rotated(f) => f.bits(),
            CacheLayout::Channel(f) => f.bits(),
        }
    }

    /// Whether rows are stored in each head's Hadamard basis (queries are rotated to match,
    /// attention outputs rotated back).
    pub fn rotated(self) -> bool {
        matches!(self.layout(), CacheLayout::Rotated(_))
    }

    /// Whether a K cache of this format holds the keys as they were before RoPE, the
    /// attention rotating each key by its position as it reads it
    /// ([`ChannelFormat::keys_before_rope`]). A V cache stores its rows as given.
    pub fn keys_before_rope(self) -> bool {
        matches!(self.layout(), CacheLayout::Channel(f) if f.keys_before_rope())
    }

    /// The block a row must be a whole multiple of (1 for the plain formats).
    pub fn row_multiple(self) -> usize {
        match self.layout() {
            CacheLayout::F32 | CacheLayout::F16 => 1,
            CacheLayout::Absmax(_) | CacheLayout::Channel(_) => super::pack::N,
            CacheLayout::Rotated(_) => signed_max::BLOCK,
        }
    }

    /// The same bits in absmax blocks (4 for the 3- and 2-bit formats: a symmetric absmax
    /// block has only 7 or 3 levels there): what a rotated format falls back to where a head
    /// cannot be rotated.
    pub fn absmax_twin(self) -> CacheFormat {
        match self.bits() {
            8 => CacheFormat::Q8,
            6 => CacheFormat::Q6,
            _ => CacheFormat::Q4,
        }
    }

    /// Bytes of one `kv_dim`-wide row as the CPU stores it (the per-row layouts).
    ///
    /// # Panics
    /// For the per-channel formats, whose rows are not stored alone.
    pub fn row_bytes(self, kv_dim: usize) -> usize {
        match self.layout() {
            CacheLayout::F32 => 4 * kv_dim,
            CacheLayout::F16 => 2 * kv_dim,
            CacheLayout::Absmax(f) => f.bytes(kv_dim),
            CacheLayout::Rotated(f) => f.bytes(kv_dim),
            CacheLayout::Channel(_) => panic!("a per-channel cache has no rows of its own"),
        }
    }

    /// [`CacheFormat::row_bytes`] padded to whole u32 words, as the GPU stores rows so that
    /// each starts word-aligned.
    pub fn word_row_bytes(self, kv_dim: usize) -> usize {
        self.row_bytes(kv_dim).next_multiple_of(4)
    }

    /// Bytes of one per-channel group of [`PAGE`] positions.
    ///
    /// # Panics
    /// For the per-row formats.
    pub fn group_bytes(self, kv_dim: usize) -> usize {
        match self.layout() {
            CacheLayout::Channel(f) => f.group_bytes(kv_dim),
            _ => panic!("a per-row cache has no groups"),
        }
    }

    /// Bytes one layer needs for `n_pages` pages of `kv_dim`-wide rows and `n_seqs`
    /// sequences, everything included: scales, offsets and, in a per-channel format, after
    /// the groups `n_seqs` f16 windows of [`PAGE`] rows, then `n_seqs` f16 sinks of
    /// [`channel::SINK`] rows (a sink belongs to the page holding a sequence's group 0, so
    /// sequences sharing that page share it; at most one in use per sequence).
    /// `word_rows`: rows padded as the GPU stores them.
    pub fn layer_bytes(self, n_pages: usize, n_seqs: usize, kv_dim: usize, word_rows: bool) -> usize {
        match self.layout() {
            CacheLayout::Channel(f) => n_pages * f.group_bytes(kv_dim) + n_seqs * (PAGE + channel::SINK) * 2 * kv_dim,
            _ if word_rows => n_pages * PAGE * self.word_row_bytes(kv_dim),
            _ => n_pages * PAGE * self.row_bytes(kv_dim),
        }
    }
}

impl fmt::Display for CacheFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back() {
        for t in CacheFormat::ALL {
            assert_eq!(CacheFormat::parse(t.name()), Some(t));
            assert!(CacheFormat::NAMES.contains(t.name()));
        }
        assert_eq!(CacheFormat::parse("Q4C"), Some(CacheFormat::Q4c));
        assert_eq!(CacheFormat::parse("q8_0"), Some(CacheFormat::Q8));
        assert_eq!(CacheFormat::parse("q5"), None);
    }

    #[test]
    fn quantized_is_every_format_but_f32_and_f16() {
        let want: Vec<CacheFormat> = CacheFormat::ALL
            .into_iter()
            .filter(|t| !matches!(t.layout(), CacheLayout::F32 | CacheLayout::F16))
            .collect();
        assert_eq!(CacheFormat::QUANTIZED, &want[..]);
    }

    /// The module docs' table: bytes per 32 values of a 64-wide row, and the padding.
    #[test]
    fn sizes_match_the_table() {
        let per32 = |t: CacheFormat| match t.kind() {
            CacheKind::Channel { .. } => t.group_bytes(64) / PAGE / 2,
            _ => t.row_bytes(64) / 2,
        };
        let want = [128, 64, 34, 26, 18, 33, 25, 17, 13, 9, 36, 28, 20, 14, 10];
        for (t, w) in CacheFormat::ALL.into_iter().zip(want) {
            assert_eq!(per32(t), w, "{t}");
        }
        // 96 values of q6: three blocks of 26 bytes, 78, padded to 80 on the GPU.
        assert_eq!((CacheFormat::Q6.row_bytes(96), CacheFormat::Q6.word_row_bytes(96)), (78, 80));
    }
}
