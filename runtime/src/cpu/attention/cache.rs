//! The CPU backend's K/V cache: per layer, one [`CacheRows`] for K and one for V, in the
//! layout of their [`CacheFormat`] ([`crate::kv_cache`]), `n_pages · PAGE` rows shared by the
//! sequences through their page tables ([`crate::kv_pages`]). Rows are written (quantized,
//! and for the rotated types rotated per head first) when a layer stores them, and read in
//! place by the attention loops, a run of adjacent rows at a time.

use duet_quant::kv::hadamard;
use half::f16;

use super::blocks::{self, RowBlocks};
use super::channel::ChannelRows;
use super::key_rope::KeyRope;
use super::plain;
use crate::backend::RopeSpec;
use crate::error::RuntimeError;
use crate::kv_cache::{CacheFormat, CacheLayout, KvCacheSpec};
use crate::kv_pages::{PAGE, Run, SeqPages};
use crate::memory::zeroed;

/// Where one sequence's positions are, as the loops read them: its pages, the runs of
/// adjacent rows covering positions `0..written`, and how many positions are written.
pub struct Placement<'a> {
    pub seq: SeqPages<'a>,
    pub runs: Vec<Run>,
    pub written: usize,
}

impl<'a> Placement<'a> {
    /// A sequence whose positions `0..written` are stored.
    pub fn new(seq: SeqPages<'a>, written: usize) -> Placement<'a> {
        Placement { seq, runs: seq.runs(0, written), written }
    }

    /// The runs covering positions `0..n`.
    fn runs_before(&self, n: usize) -> impl Iterator<Item = Run> + '_ {
        self.runs.iter().map_while(move |r| r.before(n))
    }
}

/// One layer's K or V rows (`n_pages · PAGE × kv_dim`).
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
    /// Per-channel groups (one per page) and each sequence's f16 window.
    Channel(ChannelRows),
}

impl CacheRows {
    /// A layer's rows for `n_pages` pages and `n_seqs` sequences, zeroed; an error (not an
    /// abort) when the memory cannot be had.
    fn new(
        ty: CacheFormat,
        n_pages: usize,
        n_seqs: usize,
        kv_dim: usize,
        head_dim: usize,
    ) -> Result<CacheRows, RuntimeError> {
        let n_rows = n_pages * PAGE;
        let n = n_rows * kv_dim;
        let layout = ty.layout();
        let what = "the K/V cache";
        let blocks = |fmt: RowBlocks, rotate: usize| -> Result<CacheRows, RuntimeError> {
            let row_bytes = kv_dim / fmt.per_scale * fmt.block_bytes();
            Ok(CacheRows::Blocks { fmt, layout, bytes: zeroed(n_rows * row_bytes, what)?, row_bytes, rotate })
        };
        Ok(match layout {
            CacheLayout::F32 => CacheRows::F32(zeroed(n, what)?),
            CacheLayout::F16 => CacheRows::F16(zeroed(n, what)?),
            CacheLayout::Absmax(f) => blocks(RowBlocks { bits: f.bits(), per_scale: 32, levels: None }, 1)?,
            CacheLayout::Rotated(f) => blocks(
                RowBlocks { bits: f.bits(), per_scale: duet_quant::kv::signed_max::BLOCK, levels: f.levels() },
                hadamard::block_size(head_dim),
            )?,
            CacheLayout::Channel(f) => CacheRows::Channel(ChannelRows::new(f, n_pages, n_seqs, kv_dim)?),
        })
    }

    /// Stores whole rows (`kv_dim` values each) at positions pos0.. of sequence `seq`.
    fn write(&mut self, seq: &SeqPages, pos0: usize, kv_dim: usize, values: &[f32]) {
        if let CacheRows::Channel(c) = self {
            return c.write(seq, pos0, values);
        }
        let rotated;
        let values = match self {
            CacheRows::Blocks { rotate, .. } if *rotate > 1 => {
                let mut r = values.to_vec();
                hadamard::rotate_blocks(&mut r, *rotate);
                rotated = r;
                &rotated[..]
            }
            _ => values,
        };
        for run in seq.runs(pos0, pos0 + values.len() / kv_dim) {
            let src = &values[(run.pos - pos0) * kv_dim..(run.pos - pos0 + run.len) * kv_dim];
            let at = run.row * kv_dim;
            match self {
                CacheRows::F32(v) => v[at..at + src.len()].copy_from_slice(src),
                CacheRows::F16(v) => plain::f32_to_f16(src, &mut v[at..at + src.len()]),
                CacheRows::Blocks { layout, bytes, row_bytes, .. } => {
                    let dst = &mut bytes[run.row * *row_bytes..(run.row + run.len) * *row_bytes];
                    match layout {
                        CacheLayout::Absmax(f) => f.quantize_row(src, dst),
                        CacheLayout::Rotated(f) => f.quantize_row(src, dst),
                        _ => unreachable!("block rows are absmax or rotated"),
                    }
                }
                CacheRows::Channel(_) => unreachable!("stored above"),
            }
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
    /// its windows and sinks (f16 little-endian) — what the GPU's cache holds too (tests).
    pub fn stored_bytes(&self) -> Vec<u8> {
        match self {
            CacheRows::F32(v) => bytemuck::cast_slice(v).to_vec(),
            CacheRows::F16(v) => bytemuck::cast_slice(v).to_vec(),
            CacheRows::Blocks { bytes, .. } => bytes.clone(),
            CacheRows::Channel(c) => {
                [&c.groups[..], bytemuck::cast_slice(&c.windows), bytemuck::cast_slice(&c.sinks)].concat()
            }
        }
    }

    /// Positions `0..at.written` of a sequence as the attention reads them, in the original
    /// basis (for tests and tools; attention itself never dequantizes).
    pub fn dequantized(&self, at: &Placement, kv_dim: usize) -> Vec<f32> {
        let mut out = vec![0f32; at.written * kv_dim];
        if let CacheRows::Channel(c) = self {
            c.dequantized(at, &mut out);
            return out;
        }
        for (p, o) in out.chunks_exact_mut(kv_dim).enumerate() {
            let r = at.seq.row(p);
            match self {
                CacheRows::F32(v) => o.copy_from_slice(&v[r * kv_dim..(r + 1) * kv_dim]),
                CacheRows::F16(v) => o.iter_mut().zip(&v[r * kv_dim..]).for_each(|(o, h)| *o = h.to_f32()),
                CacheRows::Blocks { layout, bytes, row_bytes, rotate, .. } => {
                    let b = &bytes[r * row_bytes..(r + 1) * row_bytes];
                    match layout {
                        CacheLayout::Absmax(f) => f.dequantize_row(b, o),
                        CacheLayout::Rotated(f) => f.dequantize_row(b, o),
                        _ => unreachable!("block rows are absmax or rotated"),
                    }
                    hadamard::rotate_blocks(o, *rotate);
                }
                CacheRows::Channel(_) => unreachable!("read above"),
            }
        }
        out
    }

    /// `scores[j] = scale · q · K_j[col0..col0 + q.len()]` for positions j < scores.len();
    /// with `rope` (a per-channel cache of keys before RoPE, [`CpuKvCache::keys_before_rope`]),
    /// `K_j` rotated by its position.
    #[allow(clippy::too_many_arguments)]
    pub fn scores(
        &self,
        at: &Placement,
        q: &[f32],
        kv_dim: usize,
        col0: usize,
        scale: f32,
        rope: Option<&KeyRope>,
        scores: &mut [f32],
    ) {
        if let CacheRows::Channel(c) = self {
            return c.scores(at, q, col0, scale, rope, scores);
        }
        assert!(rope.is_none(), "only per-channel caches hold keys before RoPE");
        for Run { pos, row, len } in at.runs_before(scores.len()) {
            let s = &mut scores[pos..pos + len];
            match self {
                CacheRows::F32(v) => plain::scores_f32(q, &v[row * kv_dim + col0..], kv_dim, scale, s),
                CacheRows::F16(v) => plain::scores_f16(q, &v[row * kv_dim + col0..], kv_dim, scale, s),
                CacheRows::Blocks { fmt, bytes, row_bytes, .. } => {
                    blocks::scores(*fmt, q, &bytes[row * row_bytes..], *row_bytes, col0, scale, s)
                }
                CacheRows::Channel(_) => unreachable!("read above"),
            }
        }
    }

    /// `out += Σ_j p_j · V_j[col0..col0 + out.len()]` over positions j < p.len().
    pub fn weighted_sum(&self, at: &Placement, p: &[f32], kv_dim: usize, col0: usize, out: &mut [f32]) {
        if let CacheRows::Channel(c) = self {
            return c.weighted_sum(at, p, col0, out);
        }
        for Run { pos, row, len } in at.runs_before(p.len()) {
            let p = &p[pos..pos + len];
            match self {
                CacheRows::F32(v) => plain::weighted_sum_f32(p, &v[row * kv_dim + col0..], kv_dim, out),
                CacheRows::F16(v) => plain::weighted_sum_f16(p, &v[row * kv_dim + col0..], kv_dim, out),
                CacheRows::Blocks { fmt, bytes, row_bytes, .. } => {
                    blocks::weighted_sum(*fmt, p, &bytes[row * row_bytes..], *row_bytes, col0, out)
                }
                CacheRows::Channel(_) => unreachable!("read above"),
            }
        }
    }

    /// [`CacheRows::weighted_sum`] of two probability vectors over the same positions
    /// (`out[i] += Σ_j p[i][j] · V_j`): each value decoded once for both where the format's
    /// loop allows (the block rows, the per-channel groups), else two sums.
    pub fn weighted_sum_pair(&self, at: &Placement, p: [&[f32]; 2], kv_dim: usize, col0: usize, out: [&mut [f32]; 2]) {
        if let CacheRows::Channel(c) = self {
            return c.weighted_sum_pair(at, p, col0, out);
        }
        let [o0, o1] = out;
        let CacheRows::Blocks { fmt, bytes, row_bytes, .. } = self else {
            self.weighted_sum(at, p[0], kv_dim, col0, o0);
            return self.weighted_sum(at, p[1], kv_dim, col0, o1);
        };
        for Run { pos, row, len } in at.runs_before(p[0].len()) {
            let p = [&p[0][pos..pos + len], &p[1][pos..pos + len]];
            blocks::weighted_sum_pair(*fmt, p, &bytes[row * row_bytes..], *row_bytes, col0, [&mut *o0, &mut *o1]);
        }
    }

    /// `out = Σ_j p_j · V[j][v_off..v_off + out.len()]`, in the original basis also when
    /// this (V) cache is rotated.
    pub fn values(&self, at: &Placement, p: &[f32], kv_dim: usize, v_off: usize, out: &mut [f32]) {
        out.fill(0.0);
        self.weighted_sum(at, p, kv_dim, v_off, out);
        hadamard::rotate_blocks(out, self.rotation());
    }

    /// [`CacheRows::values`] of DIFF's two softmaxes `p` over the same columns, each value
    /// decoded once for both ([`CacheRows::weighted_sum_pair`]).
    pub fn values_pair(&self, at: &Placement, p: [&[f32]; 2], kv_dim: usize, v_off: usize, out: [&mut [f32]; 2]) {
        let [o0, o1] = out;
        o0.fill(0.0);
        o1.fill(0.0);
        self.weighted_sum_pair(at, p, kv_dim, v_off, [&mut *o0, &mut *o1]);
        hadamard::rotate_blocks(o0, self.rotation());
        hadamard::rotate_blocks(o1, self.rotation());
    }
}

/// Test of a pair of value sums (DIFF's two softmaxes): it gives each sum alone, bit for
/// bit. `alone` and `pair` add `Σ_j p_j·V_j` into their outputs; the pair weighs with `p`
/// and a second vector of the same length, its outputs starting where the sums alone do.
#[cfg(test)]
pub(super) fn assert_pair_is_each_alone(
    p: &[f32],
    hd: usize,
    alone: impl Fn(&[f32], &mut [f32]),
    pair: impl Fn([&[f32]; 2], [&mut [f32]; 2]),
    what: &str,
) {
    let p2: Vec<f32> = (0..p.len()).map(|j| 0.5 - j as f32 * 0.01).collect();
    let (mut alone0, mut alone1) = (vec![0.25f32; hd], vec![-0.5f32; hd]);
    alone(p, &mut alone0);
    alone(&p2, &mut alone1);
    let (mut pair0, mut pair1) = (vec![0.25f32; hd], vec![-0.5f32; hd]);
    pair([p, &p2], [&mut pair0, &mut pair1]);
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&pair0), bits(&alone0), "{what}: the pair's first sum");
    assert_eq!(bits(&pair1), bits(&alone1), "{what}: the pair's second sum");
}

pub struct CpuKvCache {
    pub spec: KvCacheSpec,
    pub k: Vec<CacheRows>,
    pub v: Vec<CacheRows>,
    /// Relative perturbation of every stored value ([`CpuKvCache::new`]; 0: off).
    jitter: f32,
    /// RoPE as the keys are read, where the K cache holds them before RoPE.
    key_rope: Option<KeyRope>,
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
    /// `jitter` = REL multiplies every K and V value stored by 1 + REL·u, u ∈ [−1, 1) a fixed
    /// pseudo-random number per (layer, K or V, position, column). A diagnostic (`duet`'s
    /// `DUET_KV_JITTER`): it shows how far a result moves under rounding-sized changes of its
    /// inputs, e.g. the f32 rounding by which the GPU's K and V differ from the CPU's, which
    /// a quantized cache can turn into different codes (runtime/bench/kv_cache_accuracy.sh).
    pub fn new(spec: &KvCacheSpec, jitter: f32) -> Result<CpuKvCache, RuntimeError> {
        if !(jitter.is_finite() && (0.0..1.0).contains(&jitter)) {
            return Err(RuntimeError::Usage(format!(
                "K/V jitter {jitter}: expected a relative size in [0, 1), e.g. 1e-6"
            )));
        }
        let (p, s, d, hd) = (spec.n_pages(), spec.n_seqs, spec.kv_dim, spec.head_dim);
        Ok(CpuKvCache {
            spec: spec.clone(),
            k: (0..spec.n_layers).map(|_| CacheRows::new(spec.k_type, p, s, d, hd)).collect::<Result<_, _>>()?,
            v: (0..spec.n_layers).map(|_| CacheRows::new(spec.v_type, p, s, d, hd)).collect::<Result<_, _>>()?,
            jitter,
            key_rope: None,
        })
    }

    /// Whether keys are to be stored as they were before RoPE: where this K cache's format
    /// holds them so ([`CacheFormat::keys_before_rope`]) and the model rotates keys (`rope`).
    /// Then RoPE is readied for the reads of positions below `n_pos` ([`Self::key_rope`]).
    pub fn keys_before_rope(&mut self, rope: Option<&RopeSpec>, n_pos: usize) -> bool {
        let Some(rope) = rope.filter(|_| self.spec.k_type.keys_before_rope()) else {
            self.key_rope = None;
            return false;
        };
        let hd = self.spec.head_dim;
        if !self.key_rope.as_ref().is_some_and(|k| k.is_for(rope, hd)) {
            self.key_rope = Some(KeyRope::new(rope, hd));
        }
        self.key_rope.as_mut().expect("set above").reach(n_pos);
        true
    }

    /// RoPE for reading the keys, where they are stored before it.
    pub fn key_rope(&self) -> Option<&KeyRope> {
        self.key_rope.as_ref()
    }

    /// Stores rows of k and v (`rows × kv_dim`) at positions pos0.. of sequence `seq` in
    /// `layer`.
    pub fn store(&mut self, seq: &SeqPages, layer: usize, pos0: usize, k: &[f32], v: &[f32]) {
        let d = self.spec.kv_dim;
        let end = pos0 + k.len() / d;
        assert!(end <= self.spec.n_ctx, "KV cache overflow: context is {} tokens", self.spec.n_ctx);
        assert!(seq.pages.len() * PAGE >= end, "positions up to {end} stored in {} pages", seq.pages.len());
        if self.jitter > 0.0 {
            let seed = |which: u64| ((2 * layer as u64 + which) << 40).wrapping_mul(0x2545_f491_4f6c_dd1d);
            self.k[layer].write(seq, pos0, d, &jittered(k, self.jitter, seed(0), pos0 * d));
            self.v[layer].write(seq, pos0, d, &jittered(v, self.jitter, seed(1), pos0 * d));
            return;
        }
        self.k[layer].write(seq, pos0, d, k);
        self.v[layer].write(seq, pos0, d, v);
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
