//! Causal attention over the K/V cache: the standard (Llama) form and the differential
//! (DIFF) form, both reading one shared cache. A DIFF head pair is two ordinary softmax
//! attentions over the same V, combined and normalised (docs/diff-attention.md).
//!
//! Every form is the same two steps per query row and head: attend (logits over the cached
//! keys, optionally quantized, softmax) and weigh the values; DIFF then combines its two
//! branches. A rotated K cache is met by queries rotated the same way (q·k is unchanged), a
//! rotated V cache's weighted sums are rotated back before anything else sees them.
//!
//! * [`cache`]: the storage of each cache type, and where a layer's rows are written;
//! * [`plain`], [`blocks`], [`channel`]: the inner loops over f32/f16 rows, block-quantized
//!   rows and per-channel groups;
//! * [`logit_quant`]: quantized attention logits;
//! * [`key_rope`], [`shared_keys`]: keys stored before RoPE, turned as they are read, once
//!   for all the query heads that read them.

mod blocks;
mod cache;
mod channel;
mod key_rope;
mod logit_quant;
mod plain;
mod shared_keys;

use duet_quant::kv::hadamard;

pub use cache::{CacheRows, CpuKvCache, Placement};
pub use key_rope::KeyRope;
pub use plain::keep_to_avx2;

use super::SharedMut;
use super::pool::ThreadPool;
use crate::backend::{AttentionKind, SeqSpan};
use logit_quant::Lq;
use shared_keys::{Heads, RowAt, SharedScores};

/// Where one query head's logits come from: its query against the cache, or the scores
/// computed ahead for its KV head's group ([`shared_keys`]).
enum Logits<'a> {
    Read { at: &'a Placement<'a>, q: &'a [f32], k: &'a CacheRows, kv_dim: usize, k_off: usize, scale: f32 },
    Shared { scores: &'a SharedScores, row: usize, head: usize },
}

/// The logits of query head `h` of batch row `r` (its query `q`, its KV head's K columns
/// at `k_off`): the scores computed ahead when there are, else read now.
#[allow(clippy::too_many_arguments)]
fn logits<'a>(
    shared: Option<&'a SharedScores>,
    p: &'a SpanPlan<'a>,
    k: &'a CacheRows,
    kv_dim: usize,
    (r, h): (usize, usize),
    q: &'a [f32],
    k_off: usize,
) -> Logits<'a> {
    match shared {
        Some(scores) => Logits::Shared { scores, row: r, head: h },
        None => Logits::Read { at: &p.at, q, k, kv_dim, k_off, scale: p.span.spec.scale },
    }
}

/// Softmax attention probabilities of one query head over cache positions 0..=pos (of one
/// KV head, its K columns at `k_off`) into `scores`, the logits quantized as `lq` says.
fn attend(logits: Logits, pos: usize, lq: Lq, rope: Option<&KeyRope>, scores: &mut Vec<f32>) {
    scores.clear();
    scores.resize(pos + 1, 0.0);
    match logits {
        Logits::Read { at, q, k, kv_dim, k_off, scale } => k.scores(at, q, kv_dim, k_off, scale, rope, scores),
        Logits::Shared { scores: shared, row, head } => shared.copy(row, head, scores),
    }
    lq.apply(scores);
    plain::softmax(scores);
}

/// What every query row of one span needs: where its positions are and how its logits are
/// quantized, per head.
struct SpanPlan<'a> {
    span: SeqSpan<'a>,
    at: Placement<'a>,
    lq: Vec<Lq>,
    /// Work items before this span's (rows × heads, or × head pairs for DIFF).
    first_item: usize,
}

/// Attention for several sequences' query rows of one batch (`spans`, in row order; their
/// positions up to pos0 + rows are stored) as one pool job over every (row, head) of all of
/// them, so that decoding many sequences costs one dispatch per layer and keeps every
/// thread busy. `q` and `out` are batch rows × (n_heads·head_dim). For DIFF, `branches`
/// (rows × 2·n_heads·head_dim) receives each head pair's `[A1·V | A2·V]` when given. The
/// model's shape is the first span's (every span's spec differs at most in its run
/// settings).
pub fn attention_spans(
    pool: &ThreadPool,
    cache: &CpuKvCache,
    layer: usize,
    q: &[f32],
    spans: &[SeqSpan],
    out: &mut [f32],
    branches: Option<&mut [f32]>,
) {
    let Some(first) = spans.first() else { return };
    let shape = first.spec;
    let hd = shape.head_dim;
    let kv_dim = shape.n_kv_heads * hd;
    let q_dim = shape.n_heads * hd;
    let gqa = shape.n_heads / shape.n_kv_heads;
    let rows: usize = spans.iter().map(|s| s.rows).sum();
    assert!(out.len() >= rows * q_dim && q.len() >= rows * q_dim, "attention: q/out hold fewer than {rows} rows");
    let (k, v) = (&cache.k[layer], &cache.v[layer]);
    let kr = cache.key_rope();
    // Queries in the K cache's basis (every head is rotated in the same blocks).
    let rotated_q;
    let q = if k.rotation() > 1 {
        let mut r = q[..rows * q_dim].to_vec();
        hadamard::rotate_blocks(&mut r, k.rotation());
        rotated_q = r;
        &rotated_q[..]
    } else {
        q
    };
    let diff = matches!(shape.kind, AttentionKind::Differential { .. });
    let units = if diff { shape.n_heads / 2 } else { shape.n_heads };
    let mut items = 0;
    let plans: Vec<SpanPlan> = spans
        .iter()
        .map(|&span| {
            assert_eq!(span.first * units, items, "spans are consecutive rows from the batch's first");
            let at = Placement::new(span.seq, span.pos0 + span.rows);
            let span_q = &q[span.first * q_dim..(span.first + span.rows) * q_dim];
            let lq = logit_quant::per_head(pool, k, kr, &at, span_q, span.rows, span.pos0, span.spec);
            let plan = SpanPlan { span, at, lq, first_item: items };
            items += span.rows * units;
            plan
        })
        .collect();
    // The span holding work item `item`, and the item's index within it.
    let locate = |item: usize| {
        let i = plans.partition_point(|p| p.first_item <= item) - 1;
        (&plans[i], item - plans[i].first_item)
    };
    let outp = SharedMut::new(out.as_mut_ptr());
    if let Some(b) = &branches {
        assert_eq!(b.len(), 2 * rows * q_dim, "branch capture is rows × 2·n_heads·head_dim");
    }
    let branchp = branches.map(|b| SharedMut::new(b.as_mut_ptr()));
    // Keys stored before RoPE are scored ahead, for all the heads of a KV head at once, in
    // blocks of rows; the softmaxes and value sums of each block follow.
    let shared_keys = match (kr, k) {
        (Some(kr), CacheRows::Channel(kc)) => Some((kr, kc)),
        _ => None,
    };
    let heads = Heads { n_heads: shape.n_heads, n_kv: shape.n_kv_heads, head_dim: hd };
    let widest = plans.iter().map(|p| p.span.pos0 + p.span.rows).max().unwrap_or(0);
    let block = if shared_keys.is_some() { SharedScores::rows_per_block(heads, widest) } else { rows.max(1) };
    // Batch row r's first work item is r·units (the spans are consecutive rows).
    let row_at = |r: usize| {
        let (p, i) = locate(r * units);
        RowAt { at: &p.at, pos: p.span.pos0 + i / units, scale: p.span.spec.scale }
    };
    for r0 in (0..rows).step_by(block) {
        let r1 = (r0 + block).min(rows);
        let shared = shared_keys.map(|(kr, kc)| SharedScores::compute(pool, kc, kr, heads, q, r0..r1, &row_at));
        let shared = shared.as_ref();
        let first = r0 * units;
        let block_items = (r1 - r0) * units;
        match &shape.kind {
            AttentionKind::Standard | AttentionKind::PairedHeads => {
                pool.for_chunks_tid(block_items, 1, &|_, range| {
                    let mut scores = Vec::new();
                    for item in range {
                        let (p, i) = locate(first + item);
                        let (r, h) = (p.span.first + i / units, i % units);
                        let pos = p.span.pos0 + i / units;
                        let qh = &q[r * q_dim + h * hd..r * q_dim + (h + 1) * hd];
                        let kv_off = (h / gqa) * hd;
                        attend(logits(shared, p, k, kv_dim, (r, h), qh, kv_off), pos, p.lq[h], kr, &mut scores);
                        // SAFETY: item (r, h) owns out[r][h·hd..(h+1)·hd].
                        let o = unsafe { std::slice::from_raw_parts_mut(outp.get().add(r * q_dim + h * hd), hd) };
                        v.values(&p.at, &scores, kv_dim, kv_off, o);
                    }
                });
            }
            AttentionKind::Differential { lambda, lambda_init, sub_norm } => {
                let half_heads = shape.n_heads / 2;
                let half_kv = shape.n_kv_heads / 2;
                pool.for_chunks_tid(block_items, 1, &|_, range| {
                    let mut p1 = Vec::new();
                    let mut p2 = Vec::new();
                    let mut tmp = vec![0f32; 2 * hd];
                    for item in range {
                        let (p, i) = locate(first + item);
                        let (r, j) = (p.span.first + i / units, i % units);
                        let pos = p.span.pos0 + i / units;
                        let at = &p.at;
                        let q1 = &q[r * q_dim + j * hd..r * q_dim + (j + 1) * hd];
                        let q2 = &q[r * q_dim + (j + half_heads) * hd..r * q_dim + (j + half_heads + 1) * hd];
                        let j2 = j + half_heads;
                        attend(logits(shared, p, k, kv_dim, (r, j), q1, (j / gqa) * hd), pos, p.lq[j], kr, &mut p1);
                        attend(logits(shared, p, k, kv_dim, (r, j2), q2, (j2 / gqa) * hd), pos, p.lq[j2], kr, &mut p2);
                        // Both softmaxes weight the same 2·hd-wide V: KV heads c and c + Hkv/2.
                        let c = j / gqa;
                        let (va, vb) = (c * hd, (c + half_kv) * hd);
                        // SAFETY: item (r, j) owns out[r][j·2hd..(j+1)·2hd].
                        let o =
                            unsafe { std::slice::from_raw_parts_mut(outp.get().add(r * q_dim + j * 2 * hd), 2 * hd) };
                        let ((oa, ob), (ta, tb)) = (o.split_at_mut(hd), tmp.split_at_mut(hd));
                        v.values_pair(at, [&p1, &p2], kv_dim, va, [oa, ta]);
                        v.values_pair(at, [&p1, &p2], kv_dim, vb, [ob, tb]);
                        if let Some(bp) = branchp {
                            // SAFETY: item (r, j) owns branches[r][j·4hd..(j+1)·4hd].
                            let b = unsafe {
                                std::slice::from_raw_parts_mut(bp.get().add(2 * r * q_dim + j * 4 * hd), 4 * hd)
                            };
                            b[..2 * hd].copy_from_slice(o);
                            b[2 * hd..].copy_from_slice(&tmp);
                        }
                        for (a, &b) in o.iter_mut().zip(&tmp) {
                            *a -= lambda * b;
                        }
                        tmp.copy_from_slice(o);
                        super::ops::rms_norm_row(&tmp, sub_norm.as_deref(), shape.rms_eps, o);
                        let s = 1.0 - lambda_init;
                        for a in o.iter_mut() {
                            *a *= s;
                        }
                    }
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{AttentionSpec, LogitQuant, LogitScale, RopeSpec};
    use crate::kv_cache::{CacheFormat, KvCacheSpec};
    use crate::kv_pages::SeqPages;
    use logit_quant::absmax;

    /// One sequence's `rows` query rows at `pos0`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        pool: &ThreadPool,
        cache: &CpuKvCache,
        seq: SeqPages,
        layer: usize,
        q: &[f32],
        rows: usize,
        pos0: usize,
        spec: &AttentionSpec,
        out: &mut [f32],
        branches: Option<&mut [f32]>,
    ) {
        attention_spans(pool, cache, layer, q, &[SeqSpan::whole(seq, rows, pos0, spec)], out, branches);
    }

    const N_HEADS: usize = 4;
    const N_KV: usize = 2;
    const HD: usize = 32;
    const KV_DIM: usize = N_KV * HD;
    /// Cache positions 0..30 are written first, then 12 query rows at 30..42: the per-channel
    /// formats complete a group of 32 in the second batch and keep 10 rows in their window.
    const POS0: usize = 30;
    const ROWS: usize = 12;
    const N_POS: usize = POS0 + ROWS;

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
        (data(ROWS * N_HEADS * HD, 1, 4.0), data(N_POS * KV_DIM, 2, 4.0), data(N_POS * KV_DIM, 3, 2.0))
    }

    /// The sequence's pages, out of order in a cache of four pages shared by two sequences
    /// (it is in the second slot).
    const PAGES: [u32; 2] = [3, 1];
    const SEQ: SeqPages = SeqPages { pages: &PAGES, slot: 1, sink: 1 };

    /// A cache of the given types holding k and v, stored in two batches (0..POS0, then the
    /// query rows).
    fn filled(ty_k: CacheFormat, ty_v: CacheFormat, k: &[f32], v: &[f32]) -> CpuKvCache {
        let cs =
            KvCacheSpec { n_layers: 1, n_ctx: 64, n_seqs: 2, kv_dim: KV_DIM, head_dim: HD, k_type: ty_k, v_type: ty_v };
        let mut cache = CpuKvCache::new(&cs, 0.0).unwrap();
        let split = POS0 * KV_DIM;
        cache.store(&SEQ, 0, 0, &k[..split], &v[..split]);
        cache.store(&SEQ, 0, POS0, &k[split..], &v[split..]);
        cache
    }

    fn run(ty_k: CacheFormat, ty_v: CacheFormat, k: &[f32], v: &[f32], q: &[f32], spec: &AttentionSpec) -> Vec<f32> {
        let pool = ThreadPool::new(3);
        let cache = filled(ty_k, ty_v, k, v);
        let mut out = vec![0f32; ROWS * N_HEADS * HD];
        attention(&pool, &cache, SEQ, 0, q, ROWS, POS0, spec, &mut out, None);
        out
    }

    /// What a cache of type `ty` holds for `x`, as attention reads it.
    fn stored(ty: CacheFormat, x: &[f32]) -> Vec<f32> {
        filled(ty, CacheFormat::F32, x, x).k[0].dequantized(&Placement::new(SEQ, N_POS), KV_DIM)
    }

    /// Largest Euclidean norm of one head's slice of a row of `x` (`width`-wide rows).
    fn head_norm(x: &[f32]) -> f32 {
        x.chunks(HD).map(|h| h.iter().map(|v| v * v).sum::<f32>().sqrt()).fold(0f32, f32::max)
    }

    /// A quantized cache is read in place exactly: the same as an f32 cache holding its
    /// dequantized values, for K and V, both attention kinds, every format — f32 summation
    /// order aside, and the integer score loops' rounding of the (scaled, rotated) query to
    /// i16: with every query and key coordinate, rotated or not, below its head's norm, and
    /// a per-channel group's codes spanning at most twice that, each logit moves by at most
    /// δ = scale·HD·2‖k‖·‖q‖/32767/2, so the output by at most max|v|·(e^{2δ} − 1).
    #[test]
    fn quantized_cache_reads_as_its_dequantized_values() {
        let (q, k, v) = inputs();
        let delta = spec(false, None).scale * HD as f32 * 2.0 * head_norm(&k) * head_norm(&q) / 32767.0 / 2.0;
        let q_rounding = absmax(&v) * ((2.0 * delta).exp() - 1.0);
        for diff in [false, true] {
            let s = spec(diff, None);
            for &ty in CacheFormat::QUANTIZED {
                let (kd, vd) = (stored(ty, &k), stored(ty, &v));
                for (tk, tv, kr, vr) in
                    [(ty, CacheFormat::F32, &kd, &v), (CacheFormat::F32, ty, &k, &vd), (ty, ty, &kd, &vd)]
                {
                    let got = run(tk, tv, &k, &v, &q, &s);
                    let want = run(CacheFormat::F32, CacheFormat::F32, kr, vr, &q, &s);
                    // DIFF is held to the same bound (its RMSNorm rescales by ~1 on these inputs).
                    let qr = if tk == CacheFormat::F32 { 0.0 } else { q_rounding };
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

    /// 4-, 3- and 2-bit keys read as stored before RoPE (scored ahead for the heads of each KV
    /// head; in unit tests a row a block, 32 positions an item) attend as an f32 cache
    /// holding their dequantized values turned by RoPE, both kinds (partial RoPE): f32
    /// summation order aside.
    #[test]
    fn keys_before_rope_attend_as_their_roped_values() {
        let (q, k, v) = inputs();
        let rope = RopeSpec { n_rot: HD - 8, freq_base: 10000.0, freq_scale: 0.5, freq_factors: None };
        let pool = ThreadPool::new(3);
        for diff in [false, true] {
            let s = spec(diff, None);
            for &ty in CacheFormat::QUANTIZED.iter().filter(|t| t.keys_before_rope()) {
                let mut roped = stored(ty, &k);
                for (p, row) in roped.chunks_mut(KV_DIM).enumerate() {
                    crate::cpu::ops::rope_row(row, N_KV, HD, p, &rope.thetas(), rope.freq_scale);
                }
                let mut cache = filled(ty, CacheFormat::F32, &k, &v);
                assert!(cache.keys_before_rope(Some(&rope), 64));
                let mut got = vec![0f32; ROWS * N_HEADS * HD];
                attention(&pool, &cache, SEQ, 0, &q, ROWS, POS0, &s, &mut got, None);
                let want = run(CacheFormat::F32, CacheFormat::F32, &roped, &v, &q, &s);
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!((a - b).abs() <= 2e-5 * (1.0 + b.abs()), "{ty} diff={diff} [{i}]: {a} vs {b}");
                }
            }
        }
    }

    /// Attention over each quantized cache against f16 within the bound its stored values'
    /// errors imply (each format's round-trip bound is tested in duet-quant): logits move by
    /// at most δ = scale·max Σ|q|·|k − k̂| (per query head and position), so each probability
    /// by a factor within e^{±2δ} and Σ|Δp| ≤ e^{2δ} − 1; the output moves by at most
    /// max|v − v̂| + max|v|·(e^{2δ} − 1). f16's own rounding (2⁻¹¹ relative) is added for the
    /// reference, and the integer loops' query rounding as above.
    #[test]
    fn quantized_cache_is_within_its_bound_of_f16() {
        let (q, k, v) = inputs();
        let s = spec(false, None);
        let f16 = run(CacheFormat::F16, CacheFormat::F16, &k, &v, &q, &s);
        let vmax = absmax(&v);
        let q_rounding = 2.0 * s.scale * HD as f32 * head_norm(&k) * head_norm(&q) / 32767.0 / 2.0;
        let gqa = N_HEADS / N_KV;
        let mut errors = Vec::new();
        for &ty in CacheFormat::QUANTIZED {
            let got = run(ty, ty, &k, &v, &q, &s);
            let (kd, vd) = (stored(ty, &k), stored(ty, &v));
            let f16_err = |x: &f32| x.abs() / 2048.0;
            let eps_v = v.iter().zip(&vd).map(|(a, b)| (a - b).abs() + f16_err(a)).fold(0f32, f32::max);
            let mut logit_err = 0f32;
            for r in 0..ROWS {
                for h in 0..N_HEADS {
                    let qh = &q[(r * N_HEADS + h) * HD..(r * N_HEADS + h + 1) * HD];
                    for j in 0..=POS0 + r {
                        let at = j * KV_DIM + (h / gqa) * HD;
                        let e: f32 =
                            (0..HD).map(|i| qh[i].abs() * ((k[at + i] - kd[at + i]).abs() + f16_err(&k[at + i]))).sum();
                        logit_err = logit_err.max(e);
                    }
                }
            }
            let delta = s.scale * logit_err + q_rounding;
            let bound = eps_v + vmax * ((2.0 * delta).exp() - 1.0);
            let err = got.iter().zip(&f16).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(err <= bound, "{ty}: max |Δ| {err} > bound {bound}");
            errors.push((std::mem::discriminant(&ty.layout()), ty.bits(), err));
        }
        // More bits, less error, in each family (QUANTIZED lists each family by falling bits).
        for w in errors.windows(2) {
            let ((fa, ba, ea), (fb, bb, eb)) = (w[0], w[1]);
            assert!(fa != fb || ea < eb, "{ba} bits: error {ea}, {bb} bits: {eb}");
        }
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
            let full = run(CacheFormat::F32, CacheFormat::F32, &k, &v, &q, &spec(diff, None));
            for bits in [8, 6, 4] {
                for scale in &scales {
                    let lq = LogitQuant { bits, scale: scale.clone() };
                    let got = run(CacheFormat::F32, CacheFormat::F32, &k, &v, &q, &spec(diff, Some(lq)));
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

    /// Several sequences' rows attended in one pass (`attention_spans`) give exactly what
    /// each sequence's rows give alone: every cache type (3- and 2-bit keys read before
    /// RoPE), both kinds, and each span with its own logit quantization (run settings travel
    /// with the sequence).
    #[test]
    fn spans_of_several_sequences_equal_each_alone() {
        // Sequence B: pages 0 and 2 of slot 0, 20 positions stored, then 5 query rows.
        const B_PAGES: [u32; 2] = [0, 2];
        const B: SeqPages = SeqPages { pages: &B_PAGES, slot: 0, sink: 0 };
        const B_POS0: usize = 20;
        const B_ROWS: usize = 5;
        let (qa, ka, va) = inputs();
        let (qb, kb, vb) = (
            data(B_ROWS * N_HEADS * HD, 4, 4.0),
            data((B_POS0 + B_ROWS) * KV_DIM, 5, 4.0),
            data((B_POS0 + B_ROWS) * KV_DIM, 6, 2.0),
        );
        let pool = ThreadPool::new(3);
        let q_dim = N_HEADS * HD;
        let rope = RopeSpec { n_rot: HD, freq_base: 10000.0, freq_scale: 1.0, freq_factors: None };
        for ty in CacheFormat::ALL {
            for diff in [false, true] {
                let mut cache = filled(ty, ty, &ka, &va);
                let split = B_POS0 * KV_DIM;
                cache.store(&B, 0, 0, &kb[..split], &vb[..split]);
                cache.store(&B, 0, B_POS0, &kb[split..], &vb[split..]);
                // 4-, 3- and 2-bit keys read as stored before RoPE: scored ahead for both
                // sequences' rows, a row a block and 32 positions an item in unit tests.
                cache.keys_before_rope(Some(&rope), 64);
                let spec_a = spec(diff, None);
                let spec_b = spec(diff, Some(LogitQuant { bits: 4, scale: LogitScale::Head }));
                let alone = |seq, q: &[f32], rows, pos0, s: &AttentionSpec| {
                    let mut out = vec![0f32; rows * q_dim];
                    attention(&pool, &cache, seq, 0, q, rows, pos0, s, &mut out, None);
                    out
                };
                let want = [alone(B, &qb, B_ROWS, B_POS0, &spec_b), alone(SEQ, &qa, ROWS, POS0, &spec_a)].concat();
                let spans = [
                    SeqSpan { seq: B, first: 0, rows: B_ROWS, pos0: B_POS0, spec: &spec_b },
                    SeqSpan { seq: SEQ, first: B_ROWS, rows: ROWS, pos0: POS0, spec: &spec_a },
                ];
                let mut got = vec![f32::NAN; want.len()];
                attention_spans(&pool, &cache, 0, &[qb.clone(), qa.clone()].concat(), &spans, &mut got, None);
                assert!(
                    got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{ty:?} diff={diff}: spans differ from each sequence alone"
                );
                // The 4-bit logits of B changed its rows (the per-span setting was applied).
                let plain_b = alone(B, &qb, B_ROWS, B_POS0, &spec_a);
                assert!(
                    plain_b.iter().zip(&got).any(|(a, b)| (a - b).abs() > 1e-4),
                    "{ty:?}: B's setting had no effect"
                );
            }
        }
    }
}
