//! Causal attention over the K/V cache: the standard (Llama) form and the differential
//! (DIFF) form, both reading one shared cache. A DIFF head pair is two ordinary softmax
//! attentions over the same V, combined and normalised (diff-attention.md).

use half::f16;

use super::pool::ThreadPool;
use crate::backend::{AttentionKind, AttentionSpec, LogitQuant, LogitScale};
use crate::kv_cache::{CacheType, KvCacheSpec};
use duet_quant::absmax::AbsmaxFormat;

use super::SharedMut;
use super::kv_blocks;

/// One layer's K or V rows (`n_ctx × kv_dim`).
pub enum CacheRows {
    F32(Vec<f32>),
    F16(Vec<f16>),
    /// Each row in absmax blocks of 32 (`row_bytes` per row).
    Absmax {
        fmt: AbsmaxFormat,
        bytes: Vec<u8>,
        row_bytes: usize,
    },
}

impl CacheRows {
    fn new(ty: CacheType, n_rows: usize, kv_dim: usize) -> CacheRows {
        let n = n_rows * kv_dim;
        match ty.absmax() {
            None if ty == CacheType::F32 => CacheRows::F32(vec![0.0; n]),
            None => CacheRows::F16(vec![f16::ZERO; n]),
            Some(fmt) => CacheRows::Absmax { fmt, bytes: vec![0; fmt.bytes(n)], row_bytes: fmt.bytes(kv_dim) },
        }
    }

    /// Stores whole rows of values starting at value index `at` (a row boundary).
    fn write(&mut self, at: usize, values: &[f32]) {
        match self {
            CacheRows::F32(v) => v[at..at + values.len()].copy_from_slice(values),
            CacheRows::F16(v) => vec::f32_to_f16(values, &mut v[at..at + values.len()]),
            CacheRows::Absmax { fmt, bytes, .. } => {
                let (b0, b1) = (fmt.bytes(at), fmt.bytes(at + values.len()));
                fmt.quantize_row(values, &mut bytes[b0..b1]);
            }
        }
    }
}

/// Attention's inner loops over cache rows (row j of a head at `j·stride`): AVX2 + FMA + F16C
/// on x86-64 when the CPU has them (one dispatch per head and query row, 8 lanes, the output
/// kept in registers, a vectorised exp), plain loops otherwise. The SIMD forms round
/// differently (summation order; exp within 2 ulp); f32 → f16 rounds to nearest even either
/// way.
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

    /// Rows `stride` apart of which the first `hd` values are read, `n` rows.
    fn check(len: usize, n: usize, stride: usize, hd: usize) {
        assert!(n == 0 || (n - 1) * stride + hd <= len, "attention rows out of the cache");
    }

    /// `out[j] = scale · q · K[j]` for j < out.len().
    pub fn scores_f32(q: &[f32], k: &[f32], stride: usize, scale: f32, out: &mut [f32]) {
        check(k.len(), out.len(), stride, q.len());
        #[cfg(target_arch = "x86_64")]
        if simd() {
            // SAFETY: features checked; rows checked in bounds.
            return unsafe { x86::scores::<false>(q, k.as_ptr() as *const u8, stride, scale, out) };
        }
        for (j, o) in out.iter_mut().enumerate() {
            *o = k[j * stride..j * stride + q.len()].iter().zip(q).map(|(a, b)| a * b).sum::<f32>() * scale;
        }
    }

    pub fn scores_f16(q: &[f32], k: &[f16], stride: usize, scale: f32, out: &mut [f32]) {
        check(k.len(), out.len(), stride, q.len());
        #[cfg(target_arch = "x86_64")]
        if simd() {
            // SAFETY: as above.
            return unsafe { x86::scores::<true>(q, k.as_ptr() as *const u8, stride, scale, out) };
        }
        for (j, o) in out.iter_mut().enumerate() {
            *o = k[j * stride..j * stride + q.len()].iter().zip(q).map(|(a, b)| a.to_f32() * b).sum::<f32>() * scale;
        }
    }

    /// `s = exp(s − max s) / Σ exp(s − max s)`, the normaliser summed in f64.
    pub fn softmax(s: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if simd() {
            // SAFETY: features checked.
            return unsafe { x86::softmax(s) };
        }
        let max = s.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let mut sum = 0f64;
        for v in s.iter_mut() {
            *v = (*v - max).exp();
            sum += *v as f64;
        }
        let inv = (1.0 / sum) as f32;
        for v in s.iter_mut() {
            *v *= inv;
        }
    }

    /// `out += Σ_j p[j] · V[j][..out.len()]`.
    pub fn weighted_sum_f32(p: &[f32], v: &[f32], stride: usize, out: &mut [f32]) {
        check(v.len(), p.len(), stride, out.len());
        #[cfg(target_arch = "x86_64")]
        if simd() {
            // SAFETY: as above.
            return unsafe { x86::weighted_sum::<false>(p, v.as_ptr() as *const u8, stride, out) };
        }
        for (j, &w) in p.iter().enumerate() {
            for (o, &x) in out.iter_mut().zip(&v[j * stride..]) {
                *o += w * x;
            }
        }
    }

    pub fn weighted_sum_f16(p: &[f32], v: &[f16], stride: usize, out: &mut [f32]) {
        check(v.len(), p.len(), stride, out.len());
        #[cfg(target_arch = "x86_64")]
        if simd() {
            // SAFETY: as above.
            return unsafe { x86::weighted_sum::<true>(p, v.as_ptr() as *const u8, stride, out) };
        }
        for (j, &w) in p.iter().enumerate() {
            for (o, x) in out.iter_mut().zip(&v[j * stride..]) {
                *o += w * x.to_f32();
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    // Scalar tails index rows through raw pointers by column.
    #[allow(clippy::needless_range_loop)]
    mod x86 {
        use std::arch::x86_64::*;

        use half::f16;

        use crate::cpu::simd::{exp, hsum};

        /// 8 values at element `i` of a row of f16 (`F16`) or f32.
        ///
        /// # Safety
        /// `p` + 8 elements at `i` must be readable.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn ld8<const F16: bool>(p: *const u8, i: usize) -> __m256 {
            // SAFETY: forwarded.
            unsafe {
                if F16 {
                    _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * i) as *const __m128i))
                } else {
                    _mm256_loadu_ps((p as *const f32).add(i))
                }
            }
        }

        /// One element (scalar tail).
        ///
        /// # Safety
        /// Element `i` must be readable.
        #[inline]
        unsafe fn ld1<const F16: bool>(p: *const u8, i: usize) -> f32 {
            // SAFETY: forwarded.
            unsafe {
                if F16 {
                    f16::from_bits((p as *const u16).add(i).read_unaligned()).to_f32()
                } else {
                    *(p as *const f32).add(i)
                }
            }
        }

        const fn esize(f16: bool) -> usize {
            if f16 { 2 } else { 4 }
        }

        // SAFETY (all below): the callers checked that every row j < n has `hd` readable
        // elements at `j·stride`; vector loads stay below hd (i + 8 <= hd), tails are scalar.
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
        pub unsafe fn scores<const F16: bool>(q: &[f32], k: *const u8, stride: usize, scale: f32, out: &mut [f32]) {
            let hd = q.len();
            let row_bytes = stride * esize(F16);
            for (j, o) in out.iter_mut().enumerate() {
                let row = k.wrapping_add(j * row_bytes);
                let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
                let mut i = 0;
                unsafe {
                    while i + 16 <= hd {
                        s0 = _mm256_fmadd_ps(ld8::<F16>(row, i), _mm256_loadu_ps(q.as_ptr().add(i)), s0);
                        s1 = _mm256_fmadd_ps(ld8::<F16>(row, i + 8), _mm256_loadu_ps(q.as_ptr().add(i + 8)), s1);
                        i += 16;
                    }
                    if i + 8 <= hd {
                        s0 = _mm256_fmadd_ps(ld8::<F16>(row, i), _mm256_loadu_ps(q.as_ptr().add(i)), s0);
                        i += 8;
                    }
                    let mut s = hsum(_mm256_add_ps(s0, s1));
                    for t in i..hd {
                        s += ld1::<F16>(row, t) * q[t];
                    }
                    *o = s * scale;
                }
            }
        }

        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn weighted_sum<const F16: bool>(p: &[f32], v: *const u8, stride: usize, out: &mut [f32]) {
            let hd = out.len();
            let row_bytes = stride * esize(F16);
            let mut c = 0;
            // Columns in blocks of 64 held in 8 registers across all rows.
            unsafe {
                while c + 64 <= hd {
                    let mut acc: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(out.as_ptr().add(c + 8 * i)));
                    for (j, &w) in p.iter().enumerate() {
                        let row = v.wrapping_add(j * row_bytes);
                        let wv = _mm256_set1_ps(w);
                        for (i, a) in acc.iter_mut().enumerate() {
                            *a = _mm256_fmadd_ps(wv, ld8::<F16>(row, c + 8 * i), *a);
                        }
                    }
                    for (i, a) in acc.iter().enumerate() {
                        _mm256_storeu_ps(out.as_mut_ptr().add(c + 8 * i), *a);
                    }
                    c += 64;
                }
                while c + 8 <= hd {
                    let mut a = _mm256_loadu_ps(out.as_ptr().add(c));
                    for (j, &w) in p.iter().enumerate() {
                        a = _mm256_fmadd_ps(_mm256_set1_ps(w), ld8::<F16>(v.wrapping_add(j * row_bytes), c), a);
                    }
                    _mm256_storeu_ps(out.as_mut_ptr().add(c), a);
                    c += 8;
                }
                for t in c..hd {
                    for (j, &w) in p.iter().enumerate() {
                        out[t] += w * ld1::<F16>(v.wrapping_add(j * row_bytes), t);
                    }
                }
            }
        }

        /// The softmax of the plain path, with the exponentials of `s − max` 8 at a time
        /// (Cephes' expf, within 2 ulp).
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn softmax(s: &mut [f32]) {
            let n = s.len();
            let mut i = 0;
            let mut mv = _mm256_set1_ps(f32::NEG_INFINITY);
            unsafe {
                while i + 8 <= n {
                    mv = _mm256_max_ps(mv, _mm256_loadu_ps(s.as_ptr().add(i)));
                    i += 8;
                }
            }
            let m = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let mut max = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
            for &v in &s[i..] {
                max = max.max(v);
            }
            let maxv = _mm256_set1_ps(max);
            let mut sum = _mm256_setzero_pd();
            let mut tail = 0f64;
            i = 0;
            unsafe {
                while i + 8 <= n {
                    let e = exp(_mm256_sub_ps(_mm256_loadu_ps(s.as_ptr().add(i)), maxv));
                    _mm256_storeu_ps(s.as_mut_ptr().add(i), e);
                    sum = _mm256_add_pd(sum, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
                    sum = _mm256_add_pd(sum, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
                    i += 8;
                }
            }
            for v in &mut s[i..] {
                *v = (*v - max).exp();
                tail += *v as f64;
            }
            let mut lanes = [0f64; 4];
            // SAFETY: 4 f64 into a 4-element array.
            unsafe { _mm256_storeu_pd(lanes.as_mut_ptr(), sum) };
            let inv = (1.0 / (lanes.iter().sum::<f64>() + tail)) as f32;
            let invv = _mm256_set1_ps(inv);
            i = 0;
            unsafe {
                while i + 8 <= n {
                    let p = s.as_mut_ptr().add(i);
                    _mm256_storeu_ps(p, _mm256_mul_ps(_mm256_loadu_ps(p), invv));
                    i += 8;
                }
            }
            for v in &mut s[i..] {
                *v *= inv;
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn simd_paths_match_plain_loops() {
            let n = 37;
            let (hd, stride) = (72, 80);
            let q: Vec<f32> = (0..hd).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1).collect();
            let kf: Vec<f32> = (0..n * stride).map(|i| ((i * 11 % 17) as f32 - 8.0) * 0.05).collect();
            let kh: Vec<f16> = kf.iter().map(|&v| f16::from_f32(v)).collect();
            let mut got = vec![0f32; n];
            scores_f16(&q, &kh, stride, 0.125, &mut got);
            for j in 0..n {
                let want: f32 = (0..hd).map(|i| kh[j * stride + i].to_f32() * q[i]).sum::<f32>() * 0.125;
                assert!((got[j] - want).abs() < 1e-5, "score {j}: {} vs {want}", got[j]);
            }
            let mut p = got.clone();
            softmax(&mut p);
            let max = got.iter().fold(f32::MIN, |m, &v| m.max(v));
            let z: f64 = got.iter().map(|&v| ((v - max) as f64).exp()).sum();
            for j in 0..n {
                let want = (((got[j] - max) as f64).exp() / z) as f32;
                assert!((p[j] - want).abs() <= 4.0 * f32::EPSILON * want.max(1e-30), "p {j}: {} vs {want}", p[j]);
            }
            let mut out = vec![0.5f32; hd];
            weighted_sum_f32(&p, &kf, stride, &mut out);
            for t in 0..hd {
                let want = 0.5 + (0..n).map(|j| p[j] * kf[j * stride + t]).sum::<f32>();
                assert!((out[t] - want).abs() < 1e-5, "out {t}: {} vs {want}", out[t]);
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
        let (n, d) = (spec.n_ctx, spec.kv_dim);
        CpuKvCache {
            spec: spec.clone(),
            k: (0..spec.n_layers).map(|_| CacheRows::new(spec.k_type, n, d)).collect(),
            v: (0..spec.n_layers).map(|_| CacheRows::new(spec.v_type, n, d)).collect(),
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

/// How one head's logits are quantized before its softmax.
#[derive(Clone, Copy)]
enum Lq {
    Off,
    /// Against the row's own absmax.
    Row {
        qmax: f32,
    },
    /// Against a given absmax.
    Fixed {
        qmax: f32,
        absmax: f32,
    },
}

/// `scale · q · K_j` for cache positions 0..=pos of one KV head (its K columns at `k_off`).
fn logits(q: &[f32], k: &CacheRows, kv_dim: usize, k_off: usize, pos: usize, scale: f32, scores: &mut Vec<f32>) {
    scores.clear();
    scores.resize(pos + 1, 0.0);
    match k {
        CacheRows::F32(v) => vec::scores_f32(q, &v[k_off..], kv_dim, scale, scores),
        CacheRows::F16(v) => vec::scores_f16(q, &v[k_off..], kv_dim, scale, scores),
        CacheRows::Absmax { fmt, bytes, row_bytes } => {
            kv_blocks::scores(*fmt, q, bytes, *row_bytes, k_off, scale, scores)
        }
    }
}

fn absmax(s: &[f32]) -> f32 {
    s.iter().fold(0f32, |m, v| m.max(v.abs()))
}

/// Softmax attention probabilities of one query head over cache positions 0..=pos of one
/// KV head (its K columns at `k_off`) into `scores`, the logits quantized as `lq` says.
#[allow(clippy::too_many_arguments)]
fn attend(
    q: &[f32],
    k: &CacheRows,
    kv_dim: usize,
    k_off: usize,
    pos: usize,
    scale: f32,
    lq: Lq,
    scores: &mut Vec<f32>,
) {
    logits(q, k, kv_dim, k_off, pos, scale, scores);
    match lq {
        Lq::Off => {}
        Lq::Row { qmax } => LogitQuant::apply(qmax, absmax(scores), scores),
        Lq::Fixed { qmax, absmax } => LogitQuant::apply(qmax, absmax, scores),
    }
    vec::softmax(scores);
}

/// Per query head, the absmax of its logits over all `rows` (for tensor and head scales: a
/// pass before the attention proper).
#[allow(clippy::too_many_arguments)]
fn head_absmax(
    pool: &ThreadPool,
    k: &CacheRows,
    q: &[f32],
    rows: usize,
    pos0: usize,
    spec: &AttentionSpec,
    whole_tensor: bool,
) -> Vec<f32> {
    let (hd, nh) = (spec.head_dim, spec.n_heads);
    let (kv_dim, q_dim, gqa) = (spec.n_kv_heads * hd, nh * hd, nh / spec.n_kv_heads);
    let mut item_max = vec![0f32; rows * nh];
    let outp = SharedMut::new(item_max.as_mut_ptr());
    pool.for_chunks_tid(rows * nh, 1, &|_, range| {
        let mut scores = Vec::new();
        for item in range {
            let (r, h) = (item / nh, item % nh);
            let qh = &q[r * q_dim + h * hd..r * q_dim + (h + 1) * hd];
            logits(qh, k, kv_dim, (h / gqa) * hd, pos0 + r, spec.scale, &mut scores);
            // SAFETY: each item writes its own slot.
            unsafe { *outp.get().add(item) = absmax(&scores) };
        }
    });
    let mut per_head = vec![0f32; nh];
    for (i, m) in item_max.iter().enumerate() {
        per_head[i % nh] = per_head[i % nh].max(*m);
    }
    if whole_tensor {
        let m = absmax(&per_head);
        per_head.fill(m);
    }
    per_head
}

/// `out += Σ_j p_j · V[j][v_off..v_off+out.len()]`.
fn weighted_values(p: &[f32], v: &CacheRows, kv_dim: usize, v_off: usize, out: &mut [f32]) {
    match v {
        CacheRows::F32(rows) => vec::weighted_sum_f32(p, &rows[v_off..], kv_dim, out),
        CacheRows::F16(rows) => vec::weighted_sum_f16(p, &rows[v_off..], kv_dim, out),
        CacheRows::Absmax { fmt, bytes, row_bytes } => kv_blocks::weighted_sum(*fmt, p, bytes, *row_bytes, v_off, out),
    }
}

/// Attention for `rows` query rows (row r at position pos0 + r) of layer `layer`.
/// `q` is rows × (n_heads·head_dim); `out` the same shape. For DIFF, `branches` (rows ×
/// 2·n_heads·head_dim) receives each head pair's `[A1·V | A2·V]` when given.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    pool: &ThreadPool,
    cache: &CpuKvCache,
    layer: usize,
    q: &[f32],
    rows: usize,
    pos0: usize,
    spec: &AttentionSpec,
    out: &mut [f32],
    branches: Option<&mut [f32]>,
) {
    let hd = spec.head_dim;
    let kv_dim = spec.n_kv_heads * hd;
    let q_dim = spec.n_heads * hd;
    let gqa = spec.n_heads / spec.n_kv_heads;
    let (k, v) = (&cache.k[layer], &cache.v[layer]);
    let outp = SharedMut::new(out.as_mut_ptr());
    if let Some(b) = &branches {
        assert_eq!(b.len(), 2 * rows * q_dim, "branch capture is rows × 2·n_heads·head_dim");
    }
    let branchp = branches.map(|b| SharedMut::new(b.as_mut_ptr()));
    // Logit quantization of query head h.
    let fixed = match spec.logit_quant.as_ref().map(|l| &l.scale) {
        Some(LogitScale::Tensor) => Some(head_absmax(pool, k, q, rows, pos0, spec, true)),
        Some(LogitScale::Head) => Some(head_absmax(pool, k, q, rows, pos0, spec, false)),
        Some(LogitScale::Static(v)) => Some(v.clone()),
        Some(LogitScale::Row) | None => None,
    };
    let lq = |h: usize| match (&spec.logit_quant, &fixed) {
        (None, _) => Lq::Off,
        (Some(l), None) => Lq::Row { qmax: l.qmax() },
        (Some(l), Some(a)) => Lq::Fixed { qmax: l.qmax(), absmax: a[h] },
    };
    match &spec.kind {
        AttentionKind::Standard => {
            let items = rows * spec.n_heads;
            pool.for_chunks_tid(items, 1, &|_, range| {
                let mut scores = Vec::new();
                for item in range {
                    let (r, h) = (item / spec.n_heads, item % spec.n_heads);
                    let pos = pos0 + r;
                    let qh = &q[r * q_dim + h * hd..r * q_dim + (h + 1) * hd];
                    let kv_off = (h / gqa) * hd;
                    attend(qh, k, kv_dim, kv_off, pos, spec.scale, lq(h), &mut scores);
                    // SAFETY: item (r, h) owns out[r][h·hd..(h+1)·hd].
                    let o = unsafe { std::slice::from_raw_parts_mut(outp.get().add(r * q_dim + h * hd), hd) };
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
                let mut p1 = Vec::new();
                let mut p2 = Vec::new();
                let mut tmp = vec![0f32; 2 * hd];
                for item in range {
                    let (r, j) = (item / half_heads, item % half_heads);
                    let pos = pos0 + r;
                    let q1 = &q[r * q_dim + j * hd..r * q_dim + (j + 1) * hd];
                    let q2 = &q[r * q_dim + (j + half_heads) * hd..r * q_dim + (j + half_heads + 1) * hd];
                    let j2 = j + half_heads;
                    attend(q1, k, kv_dim, (j / gqa) * hd, pos, spec.scale, lq(j), &mut p1);
                    attend(q2, k, kv_dim, (j2 / gqa) * hd, pos, spec.scale, lq(j2), &mut p2);
                    // Both softmaxes weight the same 2·hd-wide V: KV heads c and c + Hkv/2.
                    let c = j / gqa;
                    let (va, vb) = (c * hd, (c + half_kv) * hd);
                    // SAFETY: item (r, j) owns out[r][j·2hd..(j+1)·2hd].
                    let o = unsafe { std::slice::from_raw_parts_mut(outp.get().add(r * q_dim + j * 2 * hd), 2 * hd) };
                    o.fill(0.0);
                    tmp.fill(0.0);
                    weighted_values(&p1, v, kv_dim, va, &mut o[..hd]);
                    weighted_values(&p1, v, kv_dim, vb, &mut o[hd..]);
                    weighted_values(&p2, v, kv_dim, va, &mut tmp[..hd]);
                    weighted_values(&p2, v, kv_dim, vb, &mut tmp[hd..]);
                    if let Some(bp) = branchp {
                        // SAFETY: item (r, j) owns branches[r][j·4hd..(j+1)·4hd].
                        let b =
                            unsafe { std::slice::from_raw_parts_mut(bp.get().add(2 * r * q_dim + j * 4 * hd), 4 * hd) };
                        b[..2 * hd].copy_from_slice(o);
                        b[2 * hd..].copy_from_slice(&tmp);
                    }
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

#[cfg(test)]
mod tests {
    use super::*;

    const N_HEADS: usize = 4;
    const N_KV: usize = 2;
    const HD: usize = 32;
    const KV_DIM: usize = N_KV * HD;
    /// Cache positions 0..3 are written first, then 5 query rows at 3..8.
    const POS0: usize = 3;
    const ROWS: usize = 5;

    fn spec(diff: bool, logit_quant: Option<LogitQuant>) -> AttentionSpec {
        let kind = if diff {
            AttentionKind::Differential { lambda: 0.6, lambda_init: 0.2, sub_norm: None }
        } else {
            AttentionKind::Standard
        };
        AttentionSpec {
            kind,
            n_heads: N_HEADS,
            n_kv_heads: N_KV,
            head_dim: HD,
            scale: (HD as f32).powf(-0.5),
            rms_eps: 1e-5,
            logit_quant,
        }
    }

    fn data(n: usize, seed: u32, amp: f32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = (i as u32 ^ seed).wrapping_mul(2_654_435_761).rotate_left(7).wrapping_mul(747_796_405);
                ((h >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * amp
            })
            .collect()
    }

    /// (q, k, v) with keys large enough that logits span several units.
    fn inputs() -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let n = POS0 + ROWS;
        (data(ROWS * N_HEADS * HD, 1, 4.0), data(n * KV_DIM, 2, 4.0), data(n * KV_DIM, 3, 2.0))
    }

    fn run(ty_k: CacheType, ty_v: CacheType, k: &[f32], v: &[f32], q: &[f32], spec: &AttentionSpec) -> Vec<f32> {
        let pool = ThreadPool::new(3);
        let cs = KvCacheSpec { n_layers: 1, n_ctx: 16, kv_dim: KV_DIM, head_dim: HD, k_type: ty_k, v_type: ty_v };
        let mut cache = CpuKvCache::new(&cs);
        let split = POS0 * KV_DIM;
        cache.store(0, 0, &k[..split], &v[..split]);
        cache.store(0, POS0, &k[split..], &v[split..]);
        let mut out = vec![0f32; ROWS * N_HEADS * HD];
        attention(&pool, &cache, 0, q, ROWS, POS0, spec, &mut out, None);
        out
    }

    fn round_trip(fmt: AbsmaxFormat, x: &[f32]) -> Vec<f32> {
        let mut b = vec![0u8; fmt.bytes(x.len())];
        fmt.quantize_row(x, &mut b);
        let mut y = vec![0f32; x.len()];
        fmt.dequantize_row(&b, &mut y);
        y
    }

    const QUANT: [CacheType; 3] = [CacheType::Q8, CacheType::Q6, CacheType::Q4];

    /// A quantized cache is read in place exactly: the same as an f32 cache holding its
    /// dequantized values, for K and V, both attention kinds — f32 summation order aside,
    /// and the query's i16 rounding against a quantized K (kv_blocks): each logit moves by at
    /// most δ = scale·Σ|k|·(max|q|/32767)/2, so the output by at most max|v|·(e^{2δ} − 1).
    #[test]
    fn quantized_cache_reads_as_its_dequantized_values() {
        let (q, k, v) = inputs();
        let delta = spec(false, None).scale * HD as f32 * absmax(&k) * absmax(&q) / 32767.0 / 2.0;
        let q_rounding = absmax(&v) * ((2.0 * delta).exp() - 1.0);
        for diff in [false, true] {
            let s = spec(diff, None);
            for ty in QUANT {
                let fmt = ty.absmax().unwrap();
                let (kd, vd) = (round_trip(fmt, &k), round_trip(fmt, &v));
                for (tk, tv, kr, vr) in
                    [(ty, CacheType::F32, &kd, &v), (CacheType::F32, ty, &k, &vd), (ty, ty, &kd, &vd)]
                {
                    let got = run(tk, tv, &k, &v, &q, &s);
                    let want = run(CacheType::F32, CacheType::F32, kr, vr, &q, &s);
                    // DIFF is held to the same bound (its RMSNorm rescales by ~1 on these inputs).
                    let qr = if tk == CacheType::F32 { 0.0 } else { q_rounding };
                    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (a - b).abs() <= 2e-5 * (1.0 + b.abs()) + qr,
                            "{tk}/{tv} diff={diff} [{i}]: {a} vs {b} (query rounding bound {qr})"
                        );
                    }
                }
            }
        }
    }

    /// Attention over a q8 (q6, q4) cache against f16 within the bound that follows from the
    /// formats' round-trip bounds: logits move by at most δ = scale·Σ|q|·ε_K, so each
    /// probability by a factor within e^{±2δ} and Σ|Δp| ≤ e^{2δ} − 1; the output moves by at
    /// most max ε_V + max|v|·(e^{2δ} − 1). f16's own rounding (2⁻¹¹ relative) is added for
    /// the reference.
    #[test]
    fn quantized_cache_is_within_its_bound_of_f16() {
        let (q, k, v) = inputs();
        let s = spec(false, None);
        let f16 = run(CacheType::F16, CacheType::F16, &k, &v, &q, &s);
        let vmax = absmax(&v);
        let mut errors = Vec::new();
        for ty in QUANT {
            let fmt = ty.absmax().unwrap();
            let got = run(ty, ty, &k, &v, &q, &s);
            let eps =
                |x: &[f32]| x.chunks(32).map(|b| fmt.error_bound(absmax(b)) + absmax(b) / 2048.0).fold(0f32, f32::max);
            let (eps_k, eps_v) = (eps(&k), eps(&v));
            let qsum = q.chunks(HD).map(|h| h.iter().map(|x| x.abs()).sum::<f32>()).fold(0f32, f32::max);
            let delta = s.scale * qsum * eps_k;
            let bound = eps_v + vmax * ((2.0 * delta).exp() - 1.0);
            let err = got.iter().zip(&f16).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(err <= bound, "{ty}: max |Δ| {err} > bound {bound}");
            errors.push(err);
        }
        // More bits, less error.
        assert!(errors[0] < errors[1] && errors[1] < errors[2], "errors by bits 8/6/4: {errors:?}");
    }

    /// Direct reference: causal softmax attention in f64 with the logits quantized by the
    /// definition (absmax over the given set, step = absmax/m, round half away, clamp).
    fn reference(q: &[f32], k: &[f32], v: &[f32], diff: bool, bits: u32, scale: &LogitScale) -> Vec<f32> {
        let sc = 1.0 / (HD as f64).sqrt();
        let gqa = N_HEADS / N_KV;
        // logits[h][r] over positions 0..=POS0+r
        let mut lg: Vec<Vec<Vec<f64>>> = (0..N_HEADS)
            .map(|h| {
                (0..ROWS)
                    .map(|r| {
                        (0..=POS0 + r)
                            .map(|j| {
                                (0..HD)
                                    .map(|i| {
                                        q[r * N_HEADS * HD + h * HD + i] as f64
                                            * k[j * KV_DIM + (h / gqa) * HD + i] as f64
                                    })
                                    .sum::<f64>()
                                    * sc
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect();
        let m = ((1u32 << (bits - 1)) - 1) as f64;
        let amax = |it: &mut dyn Iterator<Item = f64>| it.fold(0f64, |a, x| a.max(x.abs()));
        let tensor_max = amax(&mut lg.iter().flatten().flatten().copied());
        for (h, head) in lg.iter_mut().enumerate() {
            let head_max = amax(&mut head.iter().flatten().copied());
            for row in head.iter_mut() {
                let a = match scale {
                    LogitScale::Tensor => tensor_max,
                    LogitScale::Head => head_max,
                    LogitScale::Row => amax(&mut row.iter().copied()),
                    LogitScale::Static(s) => s[h] as f64,
                };
                let step = a / m;
                for x in row.iter_mut() {
                    *x = step * (*x / step).round().clamp(-m, m);
                }
            }
        }
        let softmax = |row: &[f64]| {
            let mx = row.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
            let e: Vec<f64> = row.iter().map(|x| (x - mx).exp()).collect();
            let z: f64 = e.iter().sum();
            e.into_iter().map(|x| x / z).collect::<Vec<f64>>()
        };
        let mut out = vec![0f32; ROWS * N_HEADS * HD];
        for r in 0..ROWS {
            if !diff {
                for h in 0..N_HEADS {
                    let p = softmax(&lg[h][r]);
                    for i in 0..HD {
                        let o: f64 =
                            p.iter().enumerate().map(|(j, pj)| pj * v[j * KV_DIM + (h / gqa) * HD + i] as f64).sum();
                        out[r * N_HEADS * HD + h * HD + i] = o as f32;
                    }
                }
            } else {
                let half = N_HEADS / 2;
                for jh in 0..half {
                    let (p1, p2) = (softmax(&lg[jh][r]), softmax(&lg[jh + half][r]));
                    let c = jh / gqa;
                    let col = |i: usize| if i < HD { c * HD + i } else { (c + N_KV / 2) * HD + i - HD };
                    let o: Vec<f64> = (0..2 * HD)
                        .map(|i| {
                            (0..p1.len()).map(|j| (p1[j] - 0.6 * p2[j]) * v[j * KV_DIM + col(i)] as f64).sum::<f64>()
                        })
                        .collect();
                    let rms = (o.iter().map(|x| x * x).sum::<f64>() / (2 * HD) as f64 + 1e-5).sqrt();
                    for i in 0..2 * HD {
                        out[r * N_HEADS * HD + jh * 2 * HD + i] = (o[i] / rms * 0.8) as f32;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn quantized_logits_match_a_direct_reference() {
        let (q, k, v) = inputs();
        let scales = [
            LogitScale::Tensor,
            LogitScale::Head,
            LogitScale::Row,
            // Static absmax below the largest logits: clamping is exercised too.
            LogitScale::Static(vec![1.5, 2.0, 2.5, 3.0]),
        ];
        for diff in [false, true] {
            let full = run(CacheType::F32, CacheType::F32, &k, &v, &q, &spec(diff, None));
            for bits in [8, 6, 4] {
                for scale in &scales {
                    let lq = LogitQuant { bits, scale: scale.clone() };
                    let got = run(CacheType::F32, CacheType::F32, &k, &v, &q, &spec(diff, Some(lq)));
                    let want = reference(&q, &k, &v, diff, bits, scale);
                    let tol = if diff { 1e-3 } else { 1e-4 };
                    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (a - b).abs() <= tol * (1.0 + b.abs()),
                            "diff={diff} {bits} bits {scale:?} [{i}]: {a} vs {b}"
                        );
                    }
                    // Quantization changed something (the test sees the setting at all).
                    assert!(
                        got.iter().zip(&full).any(|(a, b)| (a - b).abs() > 1e-4),
                        "{bits} bits {scale:?} had no effect"
                    );
                }
            }
        }
    }
}
