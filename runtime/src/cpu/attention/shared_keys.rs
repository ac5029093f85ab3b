//! Scores over a K cache that holds keys before RoPE, for every query head that reads each
//! KV head at once, ahead of the softmaxes ([`super::attention_spans`]).
//!
//! Reading such a key costs a decode and a turn by its position before the one
//! multiply-add per value that a query head needs ([`super::key_rope`]); the heads of a
//! GQA group (SmolLM2's 3, Llama 3's 4) and DIFF's two softmaxes read the same keys, so
//! scoring them together pays the decode and the turn once. The work is split by (row, KV
//! head, chunk of positions) — a decode step at depth 4,096 on SmolLM2 is 3 × 8 items,
//! enough for every thread, where one item per KV head would leave a thread idle — and the
//! scores wait in a buffer of at most [`MAX_VALUES`], taken for a block of rows at a time.

use duet_quant::kv::channel::GROUP;

use super::channel::ChannelRows;
use super::key_rope::KeyRope;
use super::{Placement, SharedMut};
use crate::cpu::pool::ThreadPool;

/// Positions of one work item: this many groups (in unit tests one, so that their few
/// positions span several items).
#[cfg(not(test))]
const CHUNK_GROUPS: usize = 16;
#[cfg(test)]
const CHUNK_GROUPS: usize = 1;
const CHUNK: usize = CHUNK_GROUPS * GROUP;

/// Scores held at once (4 MiB): a decode step of any model here, and prompts in blocks of
/// rows (SmolLM2 at 4,096 positions: 28 rows a block; in unit tests a row a block).
#[cfg(not(test))]
const MAX_VALUES: usize = 1 << 20;
#[cfg(test)]
const MAX_VALUES: usize = 1;

/// Where a batch row's query sits: its sequence, its position, its logit scale.
pub(super) struct RowAt<'a> {
    pub at: &'a Placement<'a>,
    pub pos: usize,
    pub scale: f32,
}

/// The query heads' scores of a block of batch rows, laid out by work item: row, KV head,
/// chunk, then each of the KV head's query heads' [`CHUNK`] positions.
pub(super) struct SharedScores {
    first_row: usize,
    n_kv: usize,
    gqa: usize,
    chunks: usize,
    scores: Vec<f32>,
}

/// The shape of the attention: heads and their width.
#[derive(Clone, Copy)]
pub(super) struct Heads {
    pub n_heads: usize,
    pub n_kv: usize,
    pub head_dim: usize,
}

impl SharedScores {
    /// Batch rows per block when the longest row attends to `positions` positions.
    pub fn rows_per_block(heads: Heads, positions: usize) -> usize {
        (MAX_VALUES / (heads.n_heads * positions.next_multiple_of(CHUNK))).max(1)
    }

    /// Scores of batch rows `rows` (`q`: the batch's rows × n_heads·head_dim, already in the
    /// cache's basis), each row `row_at(r)`.
    pub fn compute<'a>(
        pool: &ThreadPool,
        k: &ChannelRows,
        rope: &KeyRope,
        heads: Heads,
        q: &[f32],
        rows: std::ops::Range<usize>,
        row_at: &(dyn Fn(usize) -> RowAt<'a> + Sync),
    ) -> SharedScores {
        let Heads { n_heads, n_kv, head_dim: hd } = heads;
        let gqa = n_heads / n_kv;
        let widest = rows.clone().map(|r| row_at(r).pos + 1).max().unwrap_or(0);
        let chunks = widest.div_ceil(CHUNK);
        let mut scores = vec![0f32; rows.len() * n_heads * chunks * CHUNK];
        let item_len = gqa * CHUNK;
        let outp = SharedMut::new(scores.as_mut_ptr());
        pool.for_chunks_tid(rows.len() * n_kv * chunks, 1, &|_, range| {
            for item in range {
                let (r, c, t) = (rows.start + item / (n_kv * chunks), item / chunks % n_kv, item % chunks);
                let row = row_at(r);
                let n = row.pos + 1;
                if t * CHUNK >= n {
                    continue;
                }
                let qh = &q[(r * n_heads + c * gqa) * hd..(r * n_heads + (c + 1) * gqa) * hd];
                // SAFETY: item (r, c, t) owns its item_len values (items are laid out in order).
                let out = unsafe { std::slice::from_raw_parts_mut(outp.get().add(item * item_len), item_len) };
                let groups = t * CHUNK_GROUPS..(t + 1) * CHUNK_GROUPS;
                k.scores_before_rope(row.at, qh, c * hd, row.scale, rope, n, groups, out, CHUNK);
            }
        });
        SharedScores { first_row: rows.start, n_kv, gqa, chunks, scores }
    }

    /// Head `h`'s scores of batch row `r` over positions 0..out.len(), into `out`.
    pub fn copy(&self, r: usize, h: usize, out: &mut [f32]) {
        let (c, i) = (h / self.gqa, h % self.gqa);
        let row_item = ((r - self.first_row) * self.n_kv + c) * self.chunks;
        for (t, o) in out.chunks_mut(CHUNK).enumerate() {
            let at = ((row_item + t) * self.gqa + i) * CHUNK;
            o.copy_from_slice(&self.scores[at..at + o.len()]);
        }
    }
}
