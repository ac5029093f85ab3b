//! K/V cache description shared by the backends. The cache is allocated once (never grown
//! by concatenation) as pages of [`PAGE`] positions shared by up to `n_seqs` sequences
//! ([`crate::kv_pages`]): per layer, `n_pages · PAGE` rows of `kv_dim` values for K and the
//! same for V, in one of the formats below (K and V chosen independently).
//!
//! | type | layout | bytes per 32 values (f16: 64) |
//! |---|---|---|
//! | `f32`, `f16` | plain | 128, 64 |
//! | `q8`, `q6`, `q4` | symmetric absmax blocks of 32 along the row ([`duet_quant::kv::absmax`]) | 34, 26, 18 |
//! | `q8r`, `q6r`, `q4r` | each head Hadamard-rotated, then signed-max blocks of 64 ([`duet_quant::kv::signed_max`]) | 33, 25, 17 |
//! | `q8c`, `q6c`, `q4c` | per channel over groups of 32 positions ([`duet_quant::kv::channel`]), the newest positions in f16 | 36, 28, 20 (+ the f16 window) |
//!
//! Measured (README, "K/V cache formats"): `q4c` for K and `q4r` for V is the best 4-bit
//! cache; keys have fixed outlier channels that per-channel groups absorb, values have none
//! worth a window and profit from rotation.

use std::fmt;

use duet_quant::kv::absmax::AbsmaxFormat;
use duet_quant::kv::channel::{self, ChannelFormat};
use duet_quant::kv::hadamard;
use duet_quant::kv::signed_max::{self, SignedMaxFormat};

use crate::error::RuntimeError;
use crate::kv_pages::{PAGE, pages_for};

/// Element type of a cache (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CacheType {
    F32,
    F16,
    Q8,
    Q6,
    Q4,
    Q8r,
    Q6r,
    Q4r,
    Q8c,
    Q6c,
    Q4c,
}

/// How a cache type stores its rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheLayout {
    F32,
    F16,
    /// Each row in absmax blocks of 32.
    Absmax(AbsmaxFormat),
    /// Each row, every head Hadamard-rotated, in signed-max blocks of 64.
    Rotated(SignedMaxFormat),
    /// Groups of 32 positions quantized per channel; the positions of the last, incomplete
    /// group kept in an f16 window.
    Channel(ChannelFormat),
}

impl CacheType {
    pub const ALL: [CacheType; 11] = [
        CacheType::F32,
        CacheType::F16,
        CacheType::Q8,
        CacheType::Q6,
        CacheType::Q4,
        CacheType::Q8r,
        CacheType::Q6r,
        CacheType::Q4r,
        CacheType::Q8c,
        CacheType::Q6c,
        CacheType::Q4c,
    ];
    /// The quantized types: ALL past its first two (f32 and f16, the unquantized ones).
    pub const QUANTIZED: &'static [CacheType] = Self::ALL.split_at(2).1;
    pub const NAMES: &'static str = "f32, f16, q8, q6, q4, q8r, q6r, q4r, q8c, q6c or q4c";

    pub fn name(self) -> &'static str {
        match self {
            CacheType::F32 => "f32",
            CacheType::F16 => "f16",
            CacheType::Q8 => "q8",
            CacheType::Q6 => "q6",
            CacheType::Q4 => "q4",
            CacheType::Q8r => "q8r",
            CacheType::Q6r => "q6r",
            CacheType::Q4r => "q4r",
            CacheType::Q8c => "q8c",
            CacheType::Q6c => "q6c",
            CacheType::Q4c => "q4c",
        }
    }

    pub fn parse(s: &str) -> Option<CacheType> {
        let s = s.to_ascii_lowercase();
        if s == "q8_0" {
            return Some(CacheType::Q8);
        }
        CacheType::ALL.into_iter().find(|t| t.name() == s)
    }

    pub fn layout(self) -> CacheLayout {
        match self {
            CacheType::F32 => CacheLayout::F32,
            CacheType::F16 => CacheLayout::F16,
            CacheType::Q8 => CacheLayout::Absmax(AbsmaxFormat::Q8),
            CacheType::Q6 => CacheLayout::Absmax(AbsmaxFormat::Q6),
            CacheType::Q4 => CacheLayout::Absmax(AbsmaxFormat::Q4),
            CacheType::Q8r => CacheLayout::Rotated(SignedMaxFormat::Q8),
            CacheType::Q6r => CacheLayout::Rotated(SignedMaxFormat::Q6),
            CacheType::Q4r => CacheLayout::Rotated(SignedMaxFormat::Q4),
            CacheType::Q8c => CacheLayout::Channel(ChannelFormat::Q8),
            CacheType::Q6c => CacheLayout::Channel(ChannelFormat::Q6),
            CacheType::Q4c => CacheLayout::Channel(ChannelFormat::Q4),
        }
    }

    /// Bits per stored value (16 and 32 for the plain types).
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

    /// The block the type's rows must be whole multiples of (1 for the plain types).
    pub fn row_multiple(self) -> usize {
        match self.layout() {
            CacheLayout::F32 | CacheLayout::F16 => 1,
            CacheLayout::Absmax(_) | CacheLayout::Channel(_) => duet_quant::kv::pack::N,
            CacheLayout::Rotated(_) => signed_max::BLOCK,
        }
    }

    /// The same bits in legacy absmax blocks, the fallback of `q*r`.
    fn absmax_twin(self) -> CacheType {
        match self.bits() {
            8 => CacheType::Q8,
            6 => CacheType::Q6,
            _ => CacheType::Q4,
        }
    }

    /// Bytes one layer of this type needs for `n_pages` pages of `kv_dim`-wide rows and
    /// `n_seqs` sequences, everything included: scales, offsets and the channel formats'
    /// f16 window of each sequence (a page is one quantized group).
    pub fn layer_bytes(self, n_pages: usize, n_seqs: usize, kv_dim: usize) -> usize {
        let n = n_pages * PAGE * kv_dim;
        match self.layout() {
            CacheLayout::F32 => 4 * n,
            CacheLayout::F16 => 2 * n,
            CacheLayout::Absmax(f) => f.bytes(n),
            CacheLayout::Rotated(f) => f.bytes(n),
            CacheLayout::Channel(f) => n_pages * f.group_bytes(kv_dim) + n_seqs * PAGE * 2 * kv_dim,
        }
    }
}

impl fmt::Display for CacheType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct KvCacheSpec {
    pub n_layers: usize,
    /// Positions one sequence holds at most.
    pub n_ctx: usize,
    /// Sequences sharing the cache; it holds [`KvCacheSpec::n_pages`] pages, enough for
    /// each to reach `n_ctx`.
    pub n_seqs: usize,
    /// n_kv_heads · head_dim.
    pub kv_dim: usize,
    pub head_dim: usize,
    pub k_type: CacheType,
    pub v_type: CacheType,
}

impl KvCacheSpec {
    /// Refuses cache types whose blocks would not tile a cache row, or that need a rotation
    /// the head size does not allow.
    pub fn check(&self) -> Result<(), RuntimeError> {
        for (which, ty) in [("K", self.k_type), ("V", self.v_type)] {
            if let Some(why) = unusable(ty, self.kv_dim, self.head_dim) {
                return Err(RuntimeError::Unsupported(format!("a {ty} {which} cache {why}")));
            }
        }
        Ok(())
    }

    /// Replaces cache types this model cannot use by the nearest that it can (`q*r` → the
    /// same bits in absmax blocks → f16), with one note per replacement saying why.
    pub fn resolve(&mut self) -> Vec<String> {
        let mut notes = Vec::new();
        let (kv_dim, hd) = (self.kv_dim, self.head_dim);
        for (which, ty) in [("K", &mut self.k_type), ("V", &mut self.v_type)] {
            let mut t = *ty;
            while let Some(why) = unusable(t, kv_dim, hd) {
                let next = if t.rotated() { t.absmax_twin() } else { CacheType::F16 };
                notes.push(format!("a {t} {which} cache {why}: using {next} instead"));
                t = next;
            }
            if t.rotated() && hadamard::block_size(hd) < hd {
                notes.push(format!(
                    "{t} {which} cache: head_dim {hd} is not a power of two, so each head is rotated in blocks of {}",
                    hadamard::block_size(hd)
                ));
            }
            *ty = t;
        }
        notes
    }

    /// How many of `n_past` cached positions can be kept when the first `n` are wanted: `n`,
    /// except that a per-channel cache keeps a quantized group whole or not at all (its
    /// positions' f16 values are gone), so it keeps `n` rounded down to a group.
    pub fn keepable(&self, n_past: usize, n: usize) -> usize {
        let n = n.min(n_past);
        let channel = [self.k_type, self.v_type].iter().any(|t| matches!(t.layout(), CacheLayout::Channel(_)));
        let g = channel::GROUP;
        // Positions from here on are still in the f16 window.
        let window_start = (n_past / g).min(self.n_ctx / g) * g;
        if !channel || n >= window_start { n } else { n / g * g }
    }

    /// Pages of [`PAGE`] positions the cache holds: `n_ctx` positions for each sequence.
    pub fn n_pages(&self) -> usize {
        self.n_seqs * pages_for(self.n_ctx)
    }

    /// Total bytes of the cache, everything included.
    pub fn bytes(&self) -> usize {
        let (p, s, d) = (self.n_pages(), self.n_seqs, self.kv_dim);
        (self.k_type.layer_bytes(p, s, d) + self.v_type.layer_bytes(p, s, d)) * self.n_layers
    }
}

/// Why a cache of type `ty` cannot hold rows of `kv_dim` values in heads of `head_dim`.
fn unusable(ty: CacheType, kv_dim: usize, head_dim: usize) -> Option<String> {
    let m = ty.row_multiple();
    if !kv_dim.is_multiple_of(m) {
        return Some(format!("stores rows in blocks of {m} values, but this model's K/V rows have {kv_dim}"));
    }
    if ty.rotated() && hadamard::block_size(head_dim) < 2 {
        return Some(format!("rotates each head by a Hadamard matrix, which needs an even head_dim, not {head_dim}"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kv_dim: usize, head_dim: usize, k: CacheType, v: CacheType) -> KvCacheSpec {
        KvCacheSpec { n_layers: 2, n_ctx: 4096, n_seqs: 1, kv_dim, head_dim, k_type: k, v_type: v }
    }

    #[test]
    fn names_parse_back() {
        for t in CacheType::ALL {
            assert_eq!(CacheType::parse(t.name()), Some(t));
            assert!(CacheType::NAMES.contains(t.name()));
        }
        assert_eq!(CacheType::parse("Q4C"), Some(CacheType::Q4c));
        assert_eq!(CacheType::parse("q5"), None);
    }

    #[test]
    fn quantized_is_every_type_but_f32_and_f16() {
        let want: Vec<CacheType> =
            CacheType::ALL.into_iter().filter(|t| !matches!(t.layout(), CacheLayout::F32 | CacheLayout::F16)).collect();
        assert_eq!(CacheType::QUANTIZED, &want[..]);
    }

    /// The 4-bit pair the README recommends fits in 0.30 × f16 at 4,096 positions, window,
    /// offsets and scales included.
    #[test]
    fn recommended_four_bit_cache_is_under_0_30_of_f16() {
        for (kv_dim, hd) in [(192, 64), (128, 64), (1024, 128)] {
            let q = spec(kv_dim, hd, CacheType::Q4c, CacheType::Q4r).bytes() as f64;
            let f = spec(kv_dim, hd, CacheType::F16, CacheType::F16).bytes() as f64;
            assert!(q / f <= 0.30, "kv_dim {kv_dim}: {:.4}", q / f);
        }
    }

    #[test]
    fn truncating_keeps_whole_quantized_groups() {
        let mut s = spec(128, 64, CacheType::F16, CacheType::F16);
        assert_eq!(s.keepable(100, 50), 50);
        s.k_type = CacheType::Q4c;
        // Groups 0..3 (positions 0..96) are quantized, 96..100 in the window.
        assert_eq!(s.keepable(100, 98), 98);
        assert_eq!(s.keepable(100, 96), 96);
        assert_eq!(s.keepable(100, 95), 64);
        assert_eq!(s.keepable(100, 31), 0);
        assert_eq!(s.keepable(100, 200), 100);
        // The tail past the last whole group of the context never leaves the window.
        s.n_ctx = 100;
        assert_eq!(s.keepable(100, 97), 97);
    }

    #[test]
    fn unusable_types_fall_back_with_a_note() {
        // 96-wide rows: not whole blocks of 64, so q4r becomes q4 (blocks of 32).
        let mut s = spec(96, 32, CacheType::Q4c, CacheType::Q4r);
        let notes = s.resolve();
        assert_eq!((s.k_type, s.v_type), (CacheType::Q4c, CacheType::Q4));
        assert!(notes.len() == 1 && notes[0].contains("q4r V cache") && notes[0].contains("using q4"), "{notes:?}");
        assert!(s.check().is_ok());
        // 40-wide rows fit no block: everything quantized becomes f16.
        let mut s = spec(40, 20, CacheType::Q8r, CacheType::Q6c);
        let notes = s.resolve();
        assert_eq!((s.k_type, s.v_type), (CacheType::F16, CacheType::F16));
        assert_eq!(notes.len(), 3, "{notes:?}");
        // A head_dim that is not a power of two rotates in smaller blocks, and says so.
        let mut s = spec(640, 80, CacheType::F16, CacheType::Q4r);
        let notes = s.resolve();
        assert_eq!(s.v_type, CacheType::Q4r);
        assert!(notes[0].contains("blocks of 16"), "{notes:?}");
        // check() refuses what resolve() would replace.
        assert!(spec(96, 32, CacheType::Q4r, CacheType::F16).check().is_err());
    }
}
