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
            CacheRows::F16(v) => vec::f32_to_f16(values, &mut v[at..at + values.len()]),
        }
    }

    /// Dot of `q` with the `q.len()` values at `at`.
    #[inline]
    fn dot(&self, at: usize, q: &[f32]) -> f32 {
        match self {
            CacheRows::F32(v) => vec::dot_f32(&v[at..at + q.len()], q),
            CacheRows::F16(v) => vec::dot_f16(&v[at..at + q.len()], q),
        }
    }

    /// `acc += w · values[at..]`.
    #[inline]
    fn axpy(&self, at: usize, w: f32, acc: &mut [f32]) {
        let n = acc.len();
        match self {
            CacheRows::F32(v) => vec::axpy_f32(w, &v[at..at + n], acc),
            CacheRows::F16(v) => vec::axpy_f16(w, &v[at..at + n], acc),
        }
    }
}

/// Dot and axpy over cache rows: AVX2 + FMA + F16C on x86-64 when the CPU has them (8
/// lanes, f16 converted by `vcvtph2ps`), plain loops otherwise. The SIMD forms sum in a
/// different order (float rounding only); f32 → f16 rounds to nearest even either way.
mod vec {
    use half::f16;

    #[cfg(target_arch = "x86_64")]
    #[inline]
    fn simd() -> bool {
        // std caches the CPUID results; this is a couple of loads.
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
    }

    pub fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
        #[cfg(target_arch = "x86_64")]
        if simd() {
            // SAFETY: the CPU has the features (checked above).
            return unsafe { x86::f32_to_f16(src, dst) };
        }
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = f16::from_f32(s);
        }
    }

    #[inline]
    pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if simd() {
            // SAFETY: as above.
            return unsafe { x86::dot_f32(a, b) };
        }
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[inline]
    pub fn dot_f16(a: &[f16], b: &[f32]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if simd() {
            // SAFETY: as above.
            return unsafe { x86::dot_f16(a, b) };
        }
        a.iter().zip(b).map(|(x, y)| x.to_f32() * y).sum()
    }

    #[inline]
    pub fn axpy_f32(w: f32, x: &[f32], acc: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if simd() {
            // SAFETY: as above.
            return unsafe { x86::axpy_f32(w, x, acc) };
        }
        for (a, &v) in acc.iter_mut().zip(x) {
            *a += w * v;
        }
    }

    #[inline]
    pub fn axpy_f16(w: f32, x: &[f16], acc: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if simd() {
            // SAFETY: as above.
            return unsafe { x86::axpy_f16(w, x, acc) };
        }
        for (a, v) in acc.iter_mut().zip(x) {
            *a += w * v.to_f32();
        }
    }

    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use std::arch::x86_64::*;

        use half::f16;

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        fn hsum(v: __m256) -> f32 {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
        }

        // SAFETY (all below): loads and stores stay inside the slices (i + 8 <= n, n = the
        // shorter length); tails are scalar.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
            let n = src.len().min(dst.len());
            let mut i = 0;
            unsafe {
                while i + 8 <= n {
                    let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.as_ptr().add(i)));
                    _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
                    i += 8;
                }
            }
            for j in i..n {
                dst[j] = f16::from_f32(src[j]);
            }
        }

        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
            let n = a.len().min(b.len());
            let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut i = 0;
            unsafe {
                while i + 16 <= n {
                    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i)), _mm256_loadu_ps(b.as_ptr().add(i)), s0);
                    s1 = _mm256_fmadd_ps(
                        _mm256_loadu_ps(a.as_ptr().add(i + 8)),
                        _mm256_loadu_ps(b.as_ptr().add(i + 8)),
                        s1,
                    );
                    i += 16;
                }
                while i + 8 <= n {
                    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(i)), _mm256_loadu_ps(b.as_ptr().add(i)), s0);
                    i += 8;
                }
            }
            let mut s = hsum(_mm256_add_ps(s0, s1));
            for j in i..n {
                s += a[j] * b[j];
            }
            s
        }

        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn dot_f16(a: &[f16], b: &[f32]) -> f32 {
            let n = a.len().min(b.len());
            let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut i = 0;
            unsafe {
                let ld = |i: usize| _mm256_cvtph_ps(_mm_loadu_si128(a.as_ptr().add(i) as *const __m128i));
                while i + 16 <= n {
                    s0 = _mm256_fmadd_ps(ld(i), _mm256_loadu_ps(b.as_ptr().add(i)), s0);
                    s1 = _mm256_fmadd_ps(ld(i + 8), _mm256_loadu_ps(b.as_ptr().add(i + 8)), s1);
                    i += 16;
                }
                while i + 8 <= n {
                    s0 = _mm256_fmadd_ps(ld(i), _mm256_loadu_ps(b.as_ptr().add(i)), s0);
                    i += 8;
                }
            }
            let mut s = hsum(_mm256_add_ps(s0, s1));
            for j in i..n {
                s += a[j].to_f32() * b[j];
            }
            s
        }

        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn axpy_f32(w: f32, x: &[f32], acc: &mut [f32]) {
            let n = x.len().min(acc.len());
            let wv = _mm256_set1_ps(w);
            let mut i = 0;
            unsafe {
                while i + 8 <= n {
                    let p = acc.as_mut_ptr().add(i);
                    _mm256_storeu_ps(p, _mm256_fmadd_ps(wv, _mm256_loadu_ps(x.as_ptr().add(i)), _mm256_loadu_ps(p)));
                    i += 8;
                }
            }
            for j in i..n {
                acc[j] += w * x[j];
            }
        }

        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn axpy_f16(w: f32, x: &[f16], acc: &mut [f32]) {
            let n = x.len().min(acc.len());
            let wv = _mm256_set1_ps(w);
            let mut i = 0;
            unsafe {
                while i + 8 <= n {
                    let p = acc.as_mut_ptr().add(i);
                    let xv = _mm256_cvtph_ps(_mm_loadu_si128(x.as_ptr().add(i) as *const __m128i));
                    _mm256_storeu_ps(p, _mm256_fmadd_ps(wv, xv, _mm256_loadu_ps(p)));
                    i += 8;
                }
            }
            for j in i..n {
                acc[j] += w * x[j].to_f32();
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
