//! K/V cache description shared by the backends. The cache is allocated once for the whole
//! context (never grown by concatenation): per layer, `n_ctx` rows of `kv_dim` values for K
//! and the same for V.

use std::fmt;

/// Element type of a cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheType {
    F32,
    F16,
}

impl CacheType {
    pub fn parse(s: &str) -> Option<CacheType> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Some(CacheType::F32),
            "f16" => Some(CacheType::F16),
            _ => None,
        }
    }

    /// Bytes for `n` values.
    pub fn bytes(self, n: usize) -> usize {
        match self {
            CacheType::F32 => 4 * n,
            CacheType::F16 => 2 * n,
        }
    }
}

impl fmt::Display for CacheType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CacheType::F32 => "f32",
            CacheType::F16 => "f16",
        })
    }
}

#[derive(Clone, Debug)]
pub struct KvCacheSpec {
    pub n_layers: usize,
    pub n_ctx: usize,
    /// n_kv_heads · head_dim.
    pub kv_dim: usize,
    pub head_dim: usize,
    pub k_type: CacheType,
    pub v_type: CacheType,
}

impl KvCacheSpec {
    /// Total bytes of the cache.
    pub fn bytes(&self) -> usize {
        let per_layer = self.k_type.bytes(self.n_ctx * self.kv_dim) + self.v_type.bytes(self.n_ctx * self.kv_dim);
        per_layer * self.n_layers
    }
}
