//! Several sequences' decoded tokens (a server's slots, `decode_many`) attended in one pass
//! over their shared cache: one RoPE-and-write dispatch and one attend step for all rows,
//! each row finding its position and page table in the rows' table written past the page
//! tables, then one combine step — three dispatches a layer however many sequences, where
//! each sequence on its own took three, plus copies of its rows in and out.
//!
//! Taken where each sequence brings one token, every sequence's attention is the same
//! (same kind, no logit quantization), the caches are plain (f16, f32) and fusion is on;
//! otherwise the caller runs each sequence alone.

use std::sync::Arc;

use duet_shaders::{AttnShape, CacheKind};

use super::GpuBackend;
use super::attention::{Place, RopeKvAt, attend, prepare_rows, rope_kv};
use super::buffers::{GpuKvCache, GpuTensor};
use crate::backend::{RopeSpec, SeqSpan};

/// Whether [`attention_spans`] takes `spans`.
fn takes(b: &GpuBackend, cache: &GpuKvCache, q: &GpuTensor, spans: &[SeqSpan<'_>]) -> bool {
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

/// RoPE, K/V store and attention of `spans` (one row each, in batch-row order) over
/// `cache`'s `layer`, into `out`; false (nothing done) where this pass does not apply.
#[allow(clippy::too_many_arguments)]
pub fn attention_spans(
    b: &mut GpuBackend,
    q: &mut GpuTensor,
    k: &mut GpuTensor,
    v: &GpuTensor,
    cache: &mut GpuKvCache,
    layer: usize,
    spans: &[SeqSpan<'_>],
    rope: &RopeSpec,
    out: &mut GpuTensor,
) -> bool {
    if !takes(b, cache, q, spans) {
        return false;
    }
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
        // Lands before the next submission; the work recorded before it that read the table
        // belongs to earlier forward passes, submitted when their logits were read.
        let offset = (4 * cache.rows_table) as u64;
        b.ctx.queue.write_buffer(&cache.page_tables.buffer, offset, bytemuck::cast_slice(&table));
        cache.rows_uploaded = table;
    }
    let max_pos = spans.iter().map(|s| s.pos0).max().unwrap_or(0);
    let (q_dim, kv_dim) = (spec.n_heads * spec.head_dim, cache.kv_dim);
    assert!(q.cols == q_dim && k.cols == kv_dim && v.cols == kv_dim, "attention_spans: q, k, v widths");
    let rows_table = cache.rows_table as u32;

    // RoPE on every row's Q and K, K and V into the cache.
    let at = RopeKvAt { rows, pos0: 0, pt_base: rows_table, by_row: true, n_pos: max_pos + 1 };
    rope_kv(b, (q, k, v), cache, layer, rope, spec.head_dim, at);

    // Attend and combine, every row's chunks counted over the longest row's keys.
    let at = Place { shape: AttnShape::DecodeRows, rows, keys: max_pos + 1, pos0: 0, pt_base: rows_table, slot: 0 };
    let qb = Arc::clone(&q.buf);
    attend(b, &qb, &at, cache, layer, spec, None, out);
    true
}
