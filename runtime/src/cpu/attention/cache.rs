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
}

impl CpuKvCache {
    pub fn new(spec: &KvCacheSpec) -> Result<CpuKvCache, RuntimeError> {
        let (n, d, hd) = (spec.n_ctx, spec.kv_dim, spec.head_dim);
        Ok(CpuKvCache {
            spec: spec.clone(),
            k: (0..spec.n_layers).map(|_| CacheRows::new(spec.k_type, n, d, hd)).collect::<Result<_, _>>()?,
            v: (0..spec.n_layers).map(|_| CacheRows::new(spec.v_type, n, d, hd)).collect::<Result<_, _>>()?,
        })
    }

    /// Stores rows of k and v (`rows × kv_dim`) at positions pos0.. of `layer`.
    pub fn store(&mut self, layer: usize, pos0: usize, k: &[f32], v: &[f32]) {
        let d = self.spec.kv_dim;
        assert!(pos0 + k.len() / d <= self.spec.n_ctx, "KV cache overflow: context is {} tokens", self.spec.n_ctx);
        self.k[layer].write(pos0, d, k);
        self.v[layer].write(pos0, d, v);
    }
}
