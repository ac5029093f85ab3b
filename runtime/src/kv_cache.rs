//! K/V cache description shared by the backends. The cache is allocated once (never grown
//! by concatenation) as pages of [`PAGE`] positions shared by up to `n_seqs` sequences
//! ([`crate::kv_pages`]): per layer, `n_pages · PAGE` rows of `kv_dim` values for K and the
//! same for V, in one of the formats below (K and V chosen independently).
//!
//! The formats (names, layouts, sizes) are defined once in [`duet_quant::kv::format`].
//!
//! Measured (docs/kv-cache-formats.md): `q4c` for K and `q4r` for V is the best 4-bit
//! cache; keys have fixed outlier channels that per-channel groups absorb, values have none
//! worth a window and profit from rotation.

use duet_quant::kv::channel;
use duet_quant::kv::hadamard;

use crate::error::RuntimeError;
use crate::kv_pages::pages_for;

pub use duet_quant::kv::{CacheFormat, CacheLayout};

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
    pub k_type: CacheFormat,
    pub v_type: CacheFormat,
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
                let next = if t.rotated() { t.absmax_twin() } else { CacheFormat::F16 };
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
        (self.k_type.layer_bytes(p, s, d, false) + self.v_type.layer_bytes(p, s, d, false)) * self.n_layers
    }
}

/// Why a cache of type `ty` cannot hold rows of `kv_dim` values in heads of `head_dim`.
fn unusable(ty: CacheFormat, kv_dim: usize, head_dim: usize) -> Option<String> {
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

    fn spec(kv_dim: usize, head_dim: usize, k: CacheFormat, v: CacheFormat) -> KvCacheSpec {
        KvCacheSpec { n_layers: 2, n_ctx: 4096, n_seqs: 1, kv_dim, head_dim, k_type: k, v_type: v }
    }

    #[test]
    fn recommended_four_bit_cache_is_under_0_30_of_f16() {
        for (kv_dim, hd) in [(192, 64), (128, 64), (1024, 128)] {
            let q = spec(kv_dim, hd, CacheFormat::Q4c, CacheFormat::Q4r).bytes() as f64;
            let f = spec(kv_dim, hd, CacheFormat::F16, CacheFormat::F16).bytes() as f64;
            assert!(q / f <= 0.30, "kv_dim {kv_dim}: {:.4}", q / f);
        }
    }

    #[test]
    fn truncating_keeps_whole_quantized_groups() {
        let mut s = spec(128, 64, CacheFormat::F16, CacheFormat::F16);
        assert_eq!(s.keepable(100, 50), 50);
        s.k_type = CacheFormat::Q4c;
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
        let mut s = spec(96, 32, CacheFormat::Q4c, CacheFormat::Q4r);
        let notes = s.resolve();
        assert_eq!((s.k_type, s.v_type), (CacheFormat::Q4c, CacheFormat::Q4));
        assert!(notes.len() == 1 && notes[0].contains("q4r V cache") && notes[0].contains("using q4"), "{notes:?}");
        assert!(s.check().is_ok());
        // 40-wide rows fit no block: everything quantized becomes f16.
        let mut s = spec(40, 20, CacheFormat::Q8r, CacheFormat::Q6c);
        let notes = s.resolve();
        assert_eq!((s.k_type, s.v_type), (CacheFormat::F16, CacheFormat::F16));
        assert_eq!(notes.len(), 3, "{notes:?}");
        // A head_dim that is not a power of two rotates in smaller blocks, and says so.
        let mut s = spec(640, 80, CacheFormat::F16, CacheFormat::Q4r);
        let notes = s.resolve();
        assert_eq!(s.v_type, CacheFormat::Q4r);
        assert!(notes[0].contains("blocks of 16"), "{notes:?}");
        // check() refuses what resolve() would replace.
        assert!(spec(96, 32, CacheFormat::Q4r, CacheFormat::F16).check().is_err());
    }
}
