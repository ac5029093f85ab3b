//! The GPU's attention step for a batch ([`Backend::attention`](crate::backend::Backend)):
//! one sequence's rows go to [`attention::attention`]; several sequences' decoded tokens (a
//! server's slots) are attended in one pass over their shared cache: one RoPE-and-write
//! dispatch and one attend step for all rows, each row finding its position and page table
//! in the rows' table written past the page tables, then one combine step — three dispatches
//! a layer however many sequences.
//!
//! The one pass is taken where each sequence brings one token, every sequence's attention
//! is the same (same kind, no logit quantization), the caches are plain (f16, f32), fusion
//! is on and the rows are not rotated yet; otherwise each sequence's rows are copied into
//! the backend's span scratch, attended alone, and copied back (a prompt's chunk beside
//! decoding tokens, the quantized caches).

use std::sync::Arc;

use duet_shaders::{AttnShape, CacheKind};

use super::GpuBackend;
use super::attention::{self, Place, RopeKvAt, attend, prepare_rows, rope_kv};
use super::buffers::{GpuKvCache, GpuTensor};
use crate::backend::{Backend, RopeSpec, SeqSpan};

/// One sequence's rows of Q, K, V and its attention output, for the sequences of a batch
/// attended one at a time (grown to the longest span).
pub(super) struct SpanScratch {
    q: GpuTensor,
    k: GpuTensor,
    v: GpuTensor,
    out: GpuTensor,
}

/// Whether the one pass takes `spans` (their rows not yet rotated).
fn one_pass(b: &GpuBackend, cache: &GpuKvCache, q: &GpuTensor, spans: &[SeqSpan<'_>]) -> bool {
    let Some(first) = spans.first() else { return false };
    let plain = [cache.k_elem, cache.v_elem].iter().all(|e| e.kind() == CacheKind::Plain);
    b.ctx.fuse
        && plain
        && spans.len() > 1
        && spans.len() <= cache.n_seqs
        && q.rows == spans.len()
        && first.spec.logit_quant.is_none()
        && spans.iter().enumerate().all(|(i, s)| s.rows == 1 && s.first == i && s.spec == first.spec)
}

/// RoPE (where `rope` is given), K/V store and attention of `spans` (in batch-row order,
/// covering every row) over `cache`'s `layer` into `out`, then DIFF V2's pair combine into
/// `pairs.1` where given.
#[allow(clippy::too_many_arguments)]
pub fn attention_spans(
    b: &mut GpuBackend,
    q: &mut GpuTensor,
    k: &mut GpuTensor,
    v: &GpuTensor,
    cache: &mut GpuKvCache,
    layer: usize,
    spans: &[SeqSpan<'_>],
    rope: Option<&RopeSpec>,
    pairs: Option<(&GpuTensor, &mut GpuTensor)>,
    out: &mut GpuTensor,
) {
    let Some(first) = spans.first() else { return };
    let rows: usize = spans.iter().map(|s| s.rows).sum();
    assert!(rows == q.rows && rows == k.rows && rows == v.rows, "attention: spans cover {rows} of {} rows", q.rows);
    if let [s] = spans {
        return attention::attention(b, q, k, v, cache, s.seq, layer, s.pos0, rope, s.spec, pairs, out);
    }
    match rope {
        Some(rope) if one_pass(b, cache, q, spans) => decode_rows(b, q, k, v, cache, layer, spans, rope, out),
        _ => each_alone(b, q, k, v, cache, layer, spans, rope, out),
    }
    if let Some((gate, combined)) = pairs {
        super::ops::pair_combine(b, out, gate, first.spec.head_dim, combined);
    }
}

/// The one pass over several sequences' decoded tokens ([`one_pass`] holds).
#[allow(clippy::too_many_arguments)]
fn decode_rows(
    b: &mut GpuBackend,
    q: &mut GpuTensor,
    k: &mut GpuTensor,
    v: &GpuTensor,
    cache: &mut GpuKvCache,
    layer: usize,
    spans: &[SeqSpan<'_>],
    rope: &RopeSpec,
    out: &mut GpuTensor,
) {
    let spec = spans[0].spec;
    let rows = spans.len();
    // The rows' table: (position, first page-table entry) per row, each sequence's page
    // table made current first.
    let mut table = Vec::with_capacity(2 * rows);
    for s in spans {
        let pt_base = prepare_rows(b, cache, &s.seq, 1, s.pos0, spec);
        table.extend([s.pos0 as u32, pt_base]);
    }
    if cache.rows_uploaded != table {
        // Lands before the next submission. The work recorded before it that read the
        // table belongs to earlier steps, submitted already: a step this pass takes has a
        // row that wants logits (its first sequence's one row is its last token, plan_step)
        // and so ends with their read.
        let offset = (4 * cache.rows_table) as u64;
        b.ctx.queue.write_buffer(&cache.page_tables.buffer, offset, bytemuck::cast_slice(&table));
        cache.rows_uploaded = table;
    }
    let max_pos = spans.iter().map(|s| s.pos0).max().unwrap_or(0);
    let (q_dim, kv_dim) = (spec.n_heads * spec.head_dim, cache.kv_dim);
    assert!(q.cols == q_dim && k.cols == kv_dim && v.cols == kv_dim, "attention: q, k, v widths");
    let rows_table = cache.rows_table as u32;

    // RoPE on every row's Q and K, K and V into the cache.
    let at = RopeKvAt { rows, pos0: 0, pt_base: rows_table, by_row: true, n_pos: max_pos + 1 };
    rope_kv(b, (q, k, v), cache, layer, rope, spec.head_dim, at);

    // Attend and combine, every row's chunks counted over the longest row's keys.
    let at =
        Place { shape: AttnShape::DecodeRows, rows, keys: max_pos + 1, pos0: 0, pt_base: rows_table, slot: 0, sink: 0 };
    let qb = Arc::clone(&q.buf);
    attend(b, &qb, &at, cache, layer, spec, Some(rope), None, out);
}

/// Each span attended alone: its rows copied into the span scratch, through
/// [`attention::attention`], and its output rows copied back.
#[allow(clippy::too_many_arguments)]
fn each_alone(
    b: &mut GpuBackend,
    q: &GpuTensor,
    k: &GpuTensor,
    v: &GpuTensor,
    cache: &mut GpuKvCache,
    layer: usize,
    spans: &[SeqSpan<'_>],
    rope: Option<&RopeSpec>,
    out: &mut GpuTensor,
) {
    let longest = spans.iter().map(|s| s.rows).max().unwrap_or(1);
    let mut sc = match b.span_scratch.take() {
        Some(sc) if sc.q.cap_rows >= longest && sc.q.cols == q.cols && sc.k.cols == k.cols => sc,
        _ => SpanScratch {
            q: b.new_tensor(longest, q.cols),
            k: b.new_tensor(longest, k.cols),
            v: b.new_tensor(longest, v.cols),
            out: b.new_tensor(longest, out.cols),
        },
    };
    for s in spans {
        for t in [&mut sc.q, &mut sc.k, &mut sc.v, &mut sc.out] {
            b.set_rows(t, s.rows);
        }
        b.copy_rows(q, s.first, &mut sc.q, 0, s.rows);
        b.copy_rows(k, s.first, &mut sc.k, 0, s.rows);
        b.copy_rows(v, s.first, &mut sc.v, 0, s.rows);
        let SpanScratch { q: sq, k: sk, v: sv, out: so } = &mut sc;
        attention::attention(b, sq, sk, sv, cache, s.seq, layer, s.pos0, rope, s.spec, None, so);
        b.copy_rows(&sc.out, 0, out, s.first, s.rows);
    }
    b.span_scratch = Some(sc);
}
