//! Causal attention over the K/V cache: the standard (Llama) form and the differential
//! (DIFF) form, both reading one shared cache. A DIFF head pair is two ordinary softmax
//! attentions over the same V, combined and normalised (diff-attention.md).

use half::f16;

use super::pool::ThreadPool;
use crate::backend::{AttentionKind, AttentionSpec};
use crate::kv_cache::{CacheType, KvCacheSpec};

/// One layer's K or V rows (`n_ctx × kv_dim`).
pub enum CacheRows {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl CacheRows {
    fn new(ty: CacheType, n: usize) -> CacheRows {
        match ty {
            CacheType::F32 => CacheRows::F32(vec![0.0; n]),
            CacheType::F16 => CacheRows::F16(vec![f16::ZERO; n]),
        }
    }

    fn write(&mut self, at: usize, values: &[f32]) {
        match self {
            CacheRows::F32(v) => v[at..at + values.len()].copy_from_slice(values),
            CacheRows::F16(v) => {
                for (d, &s) in v[at..at + values.len()].iter_mut().zip(values) {
                    *d = f16::from_f32(s);
                }
            }
        }
    }

    /// Dot of `q` with the `q.len()` values at `at`.
    #[inline]
    fn dot(&self, at: usize, q: &[f32]) -> f32 {
        match self {
            CacheRows::F32(v) => v[at..at + q.len()].iter().zip(q).map(|(a, b)| a * b).sum(),
            CacheRows::F16(v) => v[at..at + q.len()].iter().zip(q).map(|(a, b)| a.to_f32() * b).sum(),
        }
    }

    /// `acc += w · values[at..]`.
    #[inline]
    fn axpy(&self, at: usize, w: f32, acc: &mut [f32]) {
        let n = acc.len();
        match self {
            CacheRows::F32(v) => {
                for (a, &x) in acc.iter_mut().zip(&v[at..at + n]) {
                    *a += w * x;
                }
            }
            CacheRows::F16(v) => {
                for (a, x) in acc.iter_mut().zip(&v[at..at + n]) {
                    *a += w * x.to_f32();
                }
            }
        }
    }
}

pub struct CpuKvCache {
    pub spec: KvCacheSpec,
    pub k: Vec<CacheRows>,
    pub v: Vec<CacheRows>,
}

impl CpuKvCache {
    pub fn new(spec: &KvCacheSpec) -> CpuKvCache {
        let n = spec.n_ctx * spec.kv_dim;
        CpuKvCache {
            spec: spec.clone(),
            k: (0..spec.n_layers).map(|_| CacheRows::new(spec.k_type, n)).collect(),
            v: (0..spec.n_layers).map(|_| CacheRows::new(spec.v_type, n)).collect(),
        }
    }

    /// Stores rows of k and v (`rows × kv_dim`) at positions pos0.. of `layer`.
    pub fn store(&mut self, layer: usize, pos0: usize, k: &[f32], v: &[f32]) {
        let d = self.spec.kv_dim;
        assert!(pos0 + k.len() / d <= self.spec.n_ctx, "KV cache overflow: context is {} tokens", self.spec.n_ctx);
        self.k[layer].write(pos0 * d, k);
        self.v[layer].write(pos0 * d, v);
    }
}

/// Softmax attention of one query head over cache positions 0..=pos of one KV head:
/// fills `scores` with the probabilities and adds Σ p_j·V_j(kv_off..) into each `out`.
#[allow(clippy::too_many_arguments)]
fn attend(q: &[f32], k: &CacheRows, kv_dim: usize, k_off: usize, pos: usize, scale: f32, scores: &mut Vec<f32>) {
    scores.clear();
    let mut max = f32::NEG_INFINITY;
    for j in 0..=pos {
        let s = k.dot(j * kv_dim + k_off, q) * scale;
        max = max.max(s);
        scores.push(s);
    }
    let mut sum = 0f64;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s as f64;
    }
    let inv = (1.0 / sum) as f32;
    for s in scores.iter_mut() {
        *s *= inv;
    }
}

/// `out += Σ_j p_j · V[j][v_off..v_off+out.len()]`.
fn weighted_values(p: &[f32], v: &CacheRows, kv_dim: usize, v_off: usize, out: &mut [f32]) {
    for (j, &w) in p.iter().enumerate() {
        v.axpy(j * kv_dim + v_off, w, out);
    }
}

#[derive(Clone, Copy)]
struct SharedMut(*mut f32);
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}

/// Attention for `rows` query rows (row r at position pos0 + r) of layer `layer`.
/// `q` is rows × (n_heads·head_dim); `out` the same shape.
pub fn attention(
    pool: &ThreadPool,
    cache: &CpuKvCache,
    layer: usize,
    q: &[f32],
    rows: usize,
    pos0: usize,
    spec: &AttentionSpec,
    out: &mut [f32],
) {
    let hd = spec.head_dim;
    let kv_dim = spec.n_kv_heads * hd;
    let q_dim = spec.n_heads * hd;
    let gqa = spec.n_heads / spec.n_kv_heads;
    let (k, v) = (&cache.k[layer], &cache.v[layer]);
    let outp = SharedMut(out.as_mut_ptr());
    match &spec.kind {
        AttentionKind::Standard => {
            let items = rows * spec.n_heads;
            pool.for_chunks_tid(items, 1, &|_, range| {
                let outp = outp;
                let mut scores = Vec::new();
                for item in range {
                    let (r, h) = (item / spec.n_heads, item % spec.n_heads);
                    let pos = pos0 + r;
                    let qh = &q[r * q_dim + h * hd..r * q_dim + (h + 1) * hd];
                    let kv_off = (h / gqa) * hd;
                    attend(qh, k, kv_dim, kv_off, pos, spec.scale, &mut scores);
                    // SAFETY: item (r, h) owns out[r][h·hd..(h+1)·hd].
                    let o = unsafe { std::slice::from_raw_parts_mut(outp.0.add(r * q_dim + h * hd), hd) };
                    o.fill(0.0);
                    weighted_values(&scores, v, kv_dim, kv_off, o);
                }
            });
        }
        AttentionKind::Differential { lambda, lambda_init, sub_norm } => {
            let half_heads = spec.n_heads / 2;
            let half_kv = spec.n_kv_heads / 2;
            let items = rows * half_heads;
            pool.for_chunks_tid(items, 1, &|_, range| {
                let outp = outp;
                let mut p1 = Vec::new();
                let mut p2 = Vec::new();
                let mut tmp = vec![0f32; 2 * hd];
                for item in range {
                    let (r, j) = (item / half_heads, item % half_heads);
                    let pos = pos0 + r;
                    let q1 = &q[r * q_dim + j * hd..r * q_dim + (j + 1) * hd];
                    let q2 = &q[r * q_dim + (j + half_heads) * hd..r * q_dim + (j + half_heads + 1) * hd];
                    attend(q1, k, kv_dim, (j / gqa) * hd, pos, spec.scale, &mut p1);
                    attend(q2, k, kv_dim, ((j + half_heads) / gqa) * hd, pos, spec.scale, &mut p2);
                    // Both softmaxes weight the same 2·hd-wide V: KV heads c and c + Hkv/2.
                    let c = j / gqa;
                    let (va, vb) = (c * hd, (c + half_kv) * hd);
                    // SAFETY: item (r, j) owns out[r][j·2hd..(j+1)·2hd].
                    let o = unsafe { std::slice::from_raw_parts_mut(outp.0.add(r * q_dim + j * 2 * hd), 2 * hd) };
                    o.fill(0.0);
                    tmp.fill(0.0);
                    weighted_values(&p1, v, kv_dim, va, &mut o[..hd]);
                    weighted_values(&p1, v, kv_dim, vb, &mut o[hd..]);
                    weighted_values(&p2, v, kv_dim, va, &mut tmp[..hd]);
                    weighted_values(&p2, v, kv_dim, vb, &mut tmp[hd..]);
                    for (a, &b) in o.iter_mut().zip(&tmp) {
                        *a -= lambda * b;
                    }
                    tmp.copy_from_slice(o);
                    super::ops::rms_norm_row(&tmp, sub_norm.as_deref(), spec.rms_eps, o);
                    let s = 1.0 - lambda_init;
                    for a in o.iter_mut() {
                        *a *= s;
                    }
                }
            });
        }
    }
}
