//! The CPU backend's K/V cache: per layer, one [`CacheRows`] for K and one for V, in the
//! layout of their [`CacheType`] ([`crate::kv_cache`]). Rows are written (quantized, and
//! for the rotated types rotated per head first) when a layer stores them, and read in
//! place by the attention loops.

use duet_quant::kv::hadamard;
use half::f16;

use super::blocks::{self, RowBlocks};
use super::channel::ChannelRows;
use super::plain;
use crate::error::RuntimeError;
use crate::kv_cache::{CacheLayout, CacheType, KvCacheSpec};
use crate::memory::zeroed;

/// One layer's K or V rows (`n_ctx × kv_dim`).
#[derive(Clone)]
pub enum CacheRows {
    F32(Vec<f32>),
    F16(Vec<f16>),
    /// Each row in blocks along the row (`row_bytes` per row); `rotate` > 1: every head
    /// was rotated in Hadamard blocks of that size before quantizing.
    Blocks {
        fmt: RowBlocks,
        layout: CacheLayout,
        bytes: Vec<u8>,
        row_bytes: usize,
        rotate: usize,
    },
    /// Per-channel groups and the f16 window.
    Channel(ChannelRows),
}

impl CacheRows {
    /// A layer's rows for `n_ctx` positions, zeroed; an error (not an abort) when the memory
    /// cannot be had.
    fn new(ty: CacheType, n_ctx: usize, kv_dim: usize, head_dim: usize) -> Result<CacheRows, RuntimeError> {
        let n = n_ctx * kv_dim;
        let layout = ty.layout();
        let what = "the K/V cache";
        let blocks = |fmt: RowBlocks, rotate: usize| -> Result<CacheRows, RuntimeError> {
            let row_bytes = kv_dim / fmt.per_scale * fmt.block_bytes();
            Ok(CacheRows::Blocks { fmt, layout, bytes: zeroed(n_ctx * row_bytes, what)?, row_bytes, rotate })
        };
        Ok(match layout {
            CacheLayout::F32 => CacheRows::F32(zeroed(n, what)?),
            CacheLayout::F16 => CacheRows::F16(zeroed(n, what)?),
            CacheLayout::Absmax(f) => blocks(RowBlocks { bits: f.bits(), per_scale: 32 }, 1)?,
            CacheLayout::Rotated(f) => blocks(
                RowBlocks { bits: f.bits(), per_scale: duet_quant::kv::signed_max::BLOCK },
                hadamard::block_size(head_dim),
            )?,
            CacheLayout::Channel(f) => CacheRows::Channel(ChannelRows::new(f, n_ctx, kv_dim)?),
        })
    }

    /// Stores whole rows (`kv_dim` values each) at positions pos0...
    fn write(&mut self, pos0: usize, kv_dim: usize, values: &[f32]) {
        let at = pos0 * kv_dim;
        match self {
            CacheRows::F32(v) => v[at..at + values.len()].copy_from_slice(values),
            CacheRows::F16(v) => plain::f32_to_f16(values, &mut v[at..at + values.len()]),
            CacheRows::Blocks { layout, bytes, row_bytes, rotate, .. } => {
                let mut rotated = Vec::new();
                let values = if *rotate > 1 {
                    rotated.extend_from_slice(values);
                    hadamard::rotate_blocks(&mut rotated, *rotate);
                    &rotated[..]
                } else {
                    values
                };
                let dst = &mut bytes[pos0 * *row_bytes..(pos0 + values.len() / kv_dim) * *row_bytes];
                match layout {
                    CacheLayout::Absmax(f) => f.quantize_row(values, dst),
                    CacheLayout::Rotated(f) => f.quantize_row(values, dst),
                    _ => unreachable!("block rows are absmax or rotated"),
                }
            }
            CacheRows::Channel(c) => c.write(pos0, values),
        }
    }

    /// Hadamard block size the rows are rotated in (1: not rotated).
    pub fn rotation(&self) -> usize {
        match self {
            CacheRows::Blocks { rotate, .. } => *rotate,
            _ => 1,
        }
    }

    /// The stored bytes: the block rows back to back, or a per-channel cache's groups then
    /// its window (f16 little-endian) — what the GPU's cache holds too (tests).
    pub fn stored_bytes(&self) -> Vec<u8> {
        match self {
            CacheRows::F32(v) => bytemuck::cast_slice(v).to_vec(),
            CacheRows::F16(v) => bytemuck::cast_slice(v).to_vec(),
            CacheRows::Blocks { bytes, .. } => bytes.clone(),
            CacheRows::Channel(c) => [&c.groups[..], bytemuck::cast_slice(&c.window)].concat(),
        }
    }

    /// The first `n` rows as the attention reads them, in the original basis (for tests and
    /// tools; attention itself never dequantizes).
    pub fn dequantized(&self, n: usize, kv_dim: usize) -> Vec<f32> {
        let mut out = vec![0f32; n * kv_dim];
        match self {
            CacheRows::F32(v) => out.copy_from_slice(&v[..n * kv_dim]),
            CacheRows::F16(v) => out.iter_mut().zip(v).for_each(|(o, h)| *o = h.to_f32()),
            CacheRows::Blocks { layout, bytes, row_bytes, rotate, .. } => {
                for (r, o) in out.chunks_exact_mut(kv_dim).enumerate() {
                    let b = &bytes[r * row_bytes..(r + 1) * row_bytes];
                    match layout {
                        CacheLayout::Absmax(f) => f.dequantize_row(b, o),
                        CacheLayout::Rotated(f) => f.dequantize_row(b, o),
                        _ => unreachable!("block rows are absmax or rotated"),
                    }
                    hadamard::rotate_blocks(o, *rotate);
                }
            }
            CacheRows::Channel(c) => c.dequantized(n, &mut out),
        }
        out
    }

    /// `scores[j] = scale · q · K_j[col0..col0 + q.len()]` for positions j < scores.len().
    pub fn scores(&self, q: &[f32], kv_dim: usize, col0: usize, scale: f32, scores: &mut [f32]) {
        match self {
            CacheRows::F32(v) => plain::scores_f32(q, &v[col0..], kv_dim, scale, scores),
            CacheRows::F16(v) => plain::scores_f16(q, &v[col0..], kv_dim, scale, scores),
            CacheRows::Blocks { fmt, bytes, row_bytes, .. } => {
                blocks::scores(*fmt, q, bytes, *row_bytes, col0, scale, scores)
            }
            CacheRows::Channel(c) => c.scores(q, col0, scale, scores),
        }
    }

    /// `out += Σ_j p_j · V_j[col0..col0 + out.len()]` over positions j < p.len().
    pub fn weighted_sum(&self, p: &[f32], kv_dim: usize, col0: usize, out: &mut [f32]) {
        match self {
            CacheRows::F32(rows) => plain::weighted_sum_f32(p, &rows[col0..], kv_dim, out),
            CacheRows::F16(rows) => plain::weighted_sum_f16(p, &rows[col0..], kv_dim, out),
            CacheRows::Blocks { fmt, bytes, row_bytes, .. } => {
                blocks::weighted_sum(*fmt, p, bytes, *row_bytes, col0, out)
            }
            CacheRows::Channel(c) => c.weighted_sum(p, col0, out),
        }
    }
}

pub struct CpuKvCache {
    pub spec: KvCacheSpec,
    pub k: Vec<CacheRows>,
    pub v: Vec<CacheRows>,
    /// [`JITTER_VAR`]'s relative perturbation of every stored value (0: off).
    jitter: f32,
}

impl CpuKvCache {
    /// Makes this cache hold what `src` holds (the same spec), reusing its memory.
    pub fn copy_from(&mut self, src: &CpuKvCache) {
        self.k.clone_from(&src.k);
        self.v.clone_from(&src.v);
    }
}

/// `DUET_KV_JITTER=REL` multiplies every K and V value the CPU backend stores by 1 + REL·u,
/// u ∈ [−1, 1) a fixed pseudo-random number per (layer, K or V, position, column). A
/// diagnostic: it shows how far a result moves under rounding-sized changes of its inputs,
/// e.g. the f32 rounding by which the GPU's K and V differ from the CPU's, which a quantized
/// cache can turn into different codes (runtime/bench/kv_cache_accuracy.sh's GPU part).
pub const JITTER_VAR: &str = "DUET_KV_JITTER";

fn jitter_from_env() -> Result<f32, RuntimeError> {
    match std::env::var(JITTER_VAR) {
        Err(_) => Ok(0.0),
        Ok(v) => match v.trim().parse::<f32>() {
            Ok(x) if x.is_finite() && (0.0..1.0).contains(&x) => Ok(x),
            _ => Err(RuntimeError::Usage(format!("{JITTER_VAR}={v}: expected a relative size in [0, 1), e.g. 1e-6"))),
        },
    }
}

/// `x · (1 + rel·u)` for each value, u from a hash of (seed, first + its index).
fn jittered(x: &[f32], rel: f32, seed: u64, first: usize) -> Vec<f32> {
    x.iter()
        .enumerate()
        .map(|(i, &v)| {
            let at = (first + i) as u64;
            let h = (seed ^ at.wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_mul(0xd6e8_feb8_6659_fd93);
            let u = (h >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
            v * (1.0 + rel * u)
        })
        .collect()
}

impl CpuKvCache {
    pub fn new(spec: &KvCacheSpec) -> Result<CpuKvCache, RuntimeError> {
        let (n, d, hd) = (spec.n_ctx, spec.kv_dim, spec.head_dim);
        Ok(CpuKvCache {
            spec: spec.clone(),
            k: (0..spec.n_layers).map(|_| CacheRows::new(spec.k_type, n, d, hd)).collect::<Result<_, _>>()?,
            v: (0..spec.n_layers).map(|_| CacheRows::new(spec.v_type, n, d, hd)).collect::<Result<_, _>>()?,
            jitter: jitter_from_env()?,
        })
    }

    /// Stores rows of k and v (`rows × kv_dim`) at positions pos0.. of `layer`.
    pub fn store(&mut self, layer: usize, pos0: usize, k: &[f32], v: &[f32]) {
        let d = self.spec.kv_dim;
        assert!(pos0 + k.len() / d <= self.spec.n_ctx, "KV cache overflow: context is {} tokens", self.spec.n_ctx);
        if self.jitter > 0.0 {
            let seed = |which: u64| ((2 * layer as u64 + which) << 40).wrapping_mul(0x2545_f491_4f6c_dd1d);
            self.k[layer].write(pos0, d, &jittered(k, self.jitter, seed(0), pos0 * d));
            self.v[layer].write(pos0, d, &jittered(v, self.jitter, seed(1), pos0 * d));
            return;
        }
        self.k[layer].write(pos0, d, k);
        self.v[layer].write(pos0, d, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The jitter stays within its relative size, moves (nearly) every value, and depends on
    /// the absolute index, not on how the rows were batched.
    #[test]
    fn jitter_is_bounded_and_batch_independent() {
        let x: Vec<f32> = (0..400).map(|i| (i as f32 * 0.37).sin() * 10.0).collect();
        let rel = 1e-3;
        let all = jittered(&x, rel, 7, 0);
        let mut moved = 0;
        for (a, b) in all.iter().zip(&x) {
            assert!((a - b).abs() <= rel * b.abs() * 1.0001, "{a} vs {b}");
            moved += (a != b) as usize;
        }
        assert!(moved > 390, "only {moved} of 400 values moved");
        let split = [jittered(&x[..100], rel, 7, 0), jittered(&x[100..], rel, 7, 100)].concat();
        assert_eq!(all, split);
        assert_ne!(all, jittered(&x, rel, 8, 0));
    }
}
