//! K/V cache description shared by the backends. The cache is allocated once for the whole
//! context (never grown by concatenation): per layer, `n_ctx` rows of `kv_dim` values for K
//! and the same for V.

use std::fmt;

use duet_quant::absmax::AbsmaxFormat;

use crate::error::RuntimeError;

/// Element type of a cache.
///
/// q8, q6 and q4 store each cache row (n_kv_heads·head_dim values) in symmetric absmax
/// blocks of 32 consecutive values with an f16 scale ([`duet_quant::absmax`]): 34, 26 and 18
/// bytes per 32 values against f16's 64. With head_dim ≥ 32 (every real model) a block
/// lies inside one head; smaller heads share blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheType {
    F32,
    F16,
    Q8,
    Q6,
    Q4,
}

impl CacheType {
    pub const NAMES: &'static str = "f32, f16, q8, q6 or q4";

    pub fn parse(s: &str) -> Option<CacheType> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Some(CacheType::F32),
            "f16" => Some(CacheType::F16),
            "q8" | "q8_0" => Some(CacheType::Q8),
            "q6" => Some(CacheType::Q6),
            "q4" => Some(CacheType::Q4),
            _ => None,
        }
    }

    /// The block format of a quantized cache type.
    pub fn absmax(self) -> Option<AbsmaxFormat> {
        match self {
            CacheType::F32 | CacheType::F16 => None,
            CacheType::Q8 => Some(AbsmaxFormat::Q8),
            CacheType::Q6 => Some(AbsmaxFormat::Q6),
            CacheType::Q4 => Some(AbsmaxFormat::Q4),
        }
    }

    /// Bytes for `n` values (a multiple of 32 for the quantized types).
    pub fn bytes(self, n: usize) -> usize {
        match self {
            CacheType::F32 => 4 * n,
            CacheType::F16 => 2 * n,
            q => q.absmax().expect("quantized").bytes(n),
        }
    }
}

impl fmt::Display for CacheType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CacheType::F32 => "f32",
            CacheType::F16 => "f16",
            CacheType::Q8 => "q8",
            CacheType::Q6 => "q6",
            CacheType::Q4 => "q4",
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
    /// Refuses quantized cache types whose blocks would not tile a cache row.
    pub fn check(&self) -> Result<(), RuntimeError> {
        for (which, ty) in [("K", self.k_type), ("V", self.v_type)] {
            if ty.absmax().is_some() && !self.kv_dim.is_multiple_of(duet_quant::absmax::BLOCK) {
                return Err(RuntimeError::Unsupported(format!(
                    "a {ty} {which} cache stores rows in blocks of {}, but this model's K/V rows have {} values",
                    duet_quant::absmax::BLOCK,
                    self.kv_dim
                )));
            }
        }
        Ok(())
    }

    /// Total bytes of the cache.
    pub fn bytes(&self) -> usize {
        let per_layer = self.k_type.bytes(self.n_ctx * self.kv_dim) + self.v_type.bytes(self.n_ctx * self.kv_dim);
        per_layer * self.n_layers
    }
}
