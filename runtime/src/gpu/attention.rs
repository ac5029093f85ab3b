//! The K/V cache and attention: the new K/V rows are written into the cache, then one
//! kernel computes standard or differential attention over it — the decode shape (one
//! query row per workgroup) for a single token, the tiled prefill shape for more.
//! Quantized attention logits take their absmax from a table the attention kernel reads:
//! static scales uploaded once, or the dynamic ones computed by logit_absmax (per row) and
//! reduced by logit_reduce (per head, per tensor) just before it.
//!
//! The rotated cache types take rotated copies of K (and Q, so that q·k is unchanged) or V
//! before the write (the rotate kernel); a rotated V's attention output is rotated back into
//! the caller's tensor, a DIFF sub-norm weight applied only then. A per-channel cache's
//! write quantizes the groups a batch completes (kv_write), then stores the rows past them
//! in its f16 window (kv_window).

use std::sync::Arc;

use duet_quant::kv::{channel, hadamard};
use duet_shaders::{
    ATT_MAX_CHUNKS, ATT_MAX_HEAD_DIM, AttentionParams, AttnCombineParams, AttnShape, CacheFormat, CacheKind, EW_WG,
    KvWindowParams, KvWriteChannelParams, KvWriteParams, LogitAbsmaxParams, LogitReduceParams, Op, RopeKvParams,
    RotateParams, attn_tile,
};

use super::buffers::{Buf, GpuKvCache, GpuTensor};
use super::{GpuBackend, grid};
use crate::backend::{AttentionKind, AttentionSpec, LogitScale, RopeSpec};
use crate::error::RuntimeError;
use crate::kv_cache::KvCacheSpec;
use crate::kv_pages::{PAGE, SeqPages};

pub fn new_kv_cache(b: &mut GpuBackend, spec: &KvCacheSpec) -> Result<GpuKvCache, RuntimeError> {
    if spec.head_dim > ATT_MAX_HEAD_DIM as usize {
        return Err(RuntimeError::Unsupported(format!(
            "the GPU attention kernels support head_dim up to {ATT_MAX_HEAD_DIM}, this model has {}",
            spec.head_dim
        )));
    }
    let cache = GpuKvCache::new(&b.ctx, &b.alloc, spec)?;
    // Every attention kernel this cache can need, now rather than at the first token.
    let mut ops = vec![Op::KvWrite(cache.k_elem), Op::KvWrite(cache.v_elem)];
    let elems = [cache.k_elem, cache.v_elem];
    if elems.iter().any(|e| matches!(e.kind(), CacheKind::Channel { .. })) {
        ops.push(Op::KvWindow);
    }
    if elems.iter().any(|e| e.rotated()) {
        ops.push(Op::Rotate);
    }
    if elems.iter().all(|e| e.kind() == CacheKind::Plain) {
        for rows in [false, true] {
            ops.push(Op::RopeKv { k: cache.k_elem, v: cache.v_elem, rows });
        }
        for diff in [false, true] {
            ops.push(Op::Attention { diff, shape: AttnShape::DecodeRows, k: cache.k_elem, v: cache.v_elem });
        }
    }
    ops.push(Op::AttnCombine { diff: false, paired: true });
    for diff in [false, true] {
        ops.push(Op::AttnCombine { diff, paired: false });
        for shape in [AttnShape::Decode, AttnShape::Prefill] {
            ops.push(Op::Attention { diff, shape, k: cache.k_elem, v: cache.v_elem });
        }
    }
    b.prepare(&ops)?;
    Ok(cache)
}

/// A buffer holding `w`, uploaded once per distinct content.
pub(super) fn constant_buf(b: &mut GpuBackend, w: &[f32], label: &str) -> Arc<Buf> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for v in w {
        v.to_bits().hash(&mut h);
    }
    let key = h.finish();
    if let Some(buf) = b.constants.get(&key) {
        return Arc::clone(buf);
    }
    let buf = b.alloc.init(&b.ctx, bytemuck::cast_slice(w), label);
    b.constants.insert(key, Arc::clone(&buf));
    buf
}

/// The logit scratch tables (rows × n_heads, n_heads), grown to fit `slots` (row, head) pairs.
fn logit_scratch(b: &mut GpuBackend, slots: usize) -> (Arc<Buf>, Arc<Buf>) {
    match &b.logit_scratch {
        Some((cap, rows, heads)) if *cap >= slots => (Arc::clone(rows), Arc::clone(heads)),
        _ => {
            let cap = slots.next_power_of_two().max(256);
            let rows = b.alloc.storage(&b.ctx, 4 * cap as u64, "logit absmax per row");
            let heads = b.alloc.storage(&b.ctx, 4 * cap as u64, "logit absmax per head");
            b.logit_scratch = Some((cap, Arc::clone(&rows), Arc::clone(&heads)));
            (rows, heads)
        }
    }
}

/// Scratch buffer `slot` of at least `bytes`: the rotated copies (0: Q, 1: K, 2: V, 3:
/// attention output) and the attend step's partials (4).
pub(super) fn scratch(b: &mut GpuBackend, slot: usize, bytes: u64) -> Arc<Buf> {
    if b.attn_scratch.len() <= slot {
        b.attn_scratch.resize(slot + 1, None);
    }
    match &b.attn_scratch[slot] {
        Some(buf) if buf.size >= bytes => Arc::clone(buf),
        _ => {
            let buf = b.alloc.storage(&b.ctx, bytes.next_power_of_two(), "attention scratch");
            b.attn_scratch[slot] = Some(Arc::clone(&buf));
            buf
        }
    }
}

/// `out` = `x` (rows × cols) with every block of `block` values Hadamard-rotated, then
/// multiplied by `weight[col mod len]` when given.
#[allow(clippy::too_many_arguments)]
fn rotate(
    b: &mut GpuBackend,
    x: &Arc<Buf>,
    out: &Arc<Buf>,
    rows: usize,
    cols: usize,
    block: usize,
    weight: Option<&Arc<Buf>>,
    w_len: usize,
) {
    let g = grid(rows * cols / block, 1);
    let params = RotateParams {
        rows: rows as u32,
        cols: cols as u32,
        block: block as u32,
        grid_x: g.0,
        norm: hadamard::norm(block),
        w_len: if weight.is_some() { w_len as u32 } else { 0 },
    };
    let w = weight.cloned().unwrap_or_else(|| Arc::clone(&b.dummy));
    b.run(Op::Rotate, &params, &[x, &w, out], g);
}

/// Makes the page-table row of `seq`'s slot hold its pages (a queued write, which lands
/// before the next submission, so before work recorded earlier that is not submitted yet:
/// within a batch a row only gains entries, for positions that work did not read, and a
/// row changes otherwise — truncated, shared — only between batches, each of which ends
/// with a read of its logits, a submission). Returns the row's first entry.
pub(super) fn sync_page_table(b: &mut GpuBackend, cache: &mut GpuKvCache, seq: &SeqPages) -> u32 {
    let base = seq.slot * cache.pages_per_seq;
    assert!(
        seq.pages.len() <= cache.pages_per_seq && seq.slot < cache.n_seqs && seq.sink < cache.n_seqs,
        "page table, slot or sink out of range"
    );
    let have = &mut cache.uploaded[seq.slot];
    if have.as_slice() != seq.pages {
        // Only the entries that changed (usually the one page just taken).
        let first = have.iter().zip(seq.pages).take_while(|(a, b)| a == b).count();
        if first < seq.pages.len() {
            let bytes: &[u8] = bytemuck::cast_slice(&seq.pages[first..]);
            b.ctx.queue.write_buffer(&cache.page_tables.buffer, (4 * (base + first)) as u64, bytes);
        }
        have.clear();
        have.extend_from_slice(seq.pages);
    }
    base as u32
}

/// The first word of f16 row `row`, counted from the end of the groups, of a per-channel
/// layer buffer: slot s's window starts at row s·PAGE, sink k at [`sink_row`].
fn f16_row_word(cache: &GpuKvCache, elem: CacheFormat, row: usize) -> u32 {
    ((cache.n_pages * elem.group_bytes(cache.kv_dim) + row * 2 * cache.kv_dim) / 4) as u32
}

/// The first f16 row, counted from the end of the groups, of sink `sink` in a per-channel
/// layer buffer: past every slot's window ([`CacheFormat::layer_bytes`]).
fn sink_row(cache: &GpuKvCache, sink: usize) -> u32 {
    (cache.n_seqs * PAGE + sink * channel::SINK) as u32
}

/// Writes `rows` rows of `src` (kv_dim values each) at positions pos0.. of the sequence in
/// `slot` (page table at `pt_base`, sink `sink`) in a cache layer.
#[allow(clippy::too_many_arguments)]
fn write_rows(
    b: &mut GpuBackend,
    src: &Arc<Buf>,
    dst: &Arc<Buf>,
    elem: CacheFormat,
    rows: usize,
    cache: &GpuKvCache,
    (pt_base, slot, sink): (u32, usize, usize),
    pos0: usize,
) {
    let kv_dim = cache.kv_dim;
    let pt = Arc::clone(&cache.page_tables);
    match elem.kind() {
        CacheKind::Plain | CacheKind::Blocks { .. } => {
            // Plain: one invocation per pair of values; blocks: a workgroup per pair of blocks.
            let g = match elem.kind() {
                CacheKind::Blocks { per_scale, .. } => grid(rows * (kv_dim / per_scale as usize).div_ceil(2), 1),
                _ => grid(rows * kv_dim / 2, EW_WG as usize),
            };
            let params =
                KvWriteParams { rows: rows as u32, kv_dim: kv_dim as u32, pos0: pos0 as u32, grid_x: g.0, pt_base };
            b.run(Op::KvWrite(elem), &params, &[src, dst, &pt], g);
        }
        CacheKind::Channel { .. } => {
            let (first, end) = (pos0 / 32, (pos0 + rows) / 32);
            let window_word = f16_row_word(cache, elem, slot * PAGE);
            let sink_word = f16_row_word(cache, elem, sink_row(cache, sink) as usize);
            if end > first {
                let g = grid((end - first) * (kv_dim / 32), 1);
                let params = KvWriteChannelParams {
                    rows: rows as u32,
                    kv_dim: kv_dim as u32,
                    pos0: pos0 as u32,
                    grid_x: g.0,
                    first_group: first as u32,
                    n_groups: (end - first) as u32,
                    pt_base,
                    window_word,
                    sink_word,
                };
                b.run(Op::KvWrite(elem), &params, &[src, dst, &pt], g);
            }
            // The window ends up as the CPU's, which passes every row through it: each slot
            // holds the last position that maps to it, so the batch's last 32 rows.
            let from_row = rows.saturating_sub(32);
            if from_row < rows {
                let g = grid((rows - from_row) * kv_dim / 2, EW_WG as usize);
                let params = KvWindowParams {
                    rows: rows as u32,
                    kv_dim: kv_dim as u32,
                    pos0: pos0 as u32,
                    grid_x: g.0,
                    from_row: from_row as u32,
                    window_word,
                };
                b.run(Op::KvWindow, &params, &[src, dst], g);
            }
        }
    }
}

/// Groups of 32 positions a per-channel cache holds, one per page (what its readers need),
/// else 0.
fn cache_groups(cache: &GpuKvCache) -> u32 {
    let channel = [cache.k_elem, cache.v_elem].iter().any(|e| matches!(e.kind(), CacheKind::Channel { .. }));
    if channel { cache.n_pages as u32 } else { 0 }
}

/// The absmax table of `spec`'s logit quantization for `rows` query rows at `pos0` and its
/// row stride (after the new K rows are in `kc`), or the unused binding when it has none.
#[allow(clippy::too_many_arguments)]
fn logit_absmax(
    b: &mut GpuBackend,
    q: &Arc<Buf>,
    kc: &Arc<Buf>,
    k_elem: CacheFormat,
    cache_groups: u32,
    (pt, pt_base, window, sink_row): (&Arc<Buf>, u32, u32, u32),
    (rope_table, rope_pairs): &(Arc<Buf>, u32),
    rows: usize,
    pos0: usize,
    spec: &AttentionSpec,
) -> (Arc<Buf>, u32) {
    let Some(lq) = &spec.logit_quant else { return (Arc::clone(&b.dummy), 0) };
    let nh = spec.n_heads;
    if let LogitScale::Static(v) = &lq.scale {
        assert_eq!(v.len(), nh, "one static logit absmax per query head");
        return (constant_buf(b, v, "static logit absmax"), 0);
    }
    let (per_row, per_head) = logit_scratch(b, rows * nh);
    let g = grid(rows * nh, 1);
    let params = LogitAbsmaxParams {
        rows: rows as u32,
        n_heads: nh as u32,
        n_kv_heads: spec.n_kv_heads as u32,
        head_dim: spec.head_dim as u32,
        pos0: pos0 as u32,
        q_dim: (nh * spec.head_dim) as u32,
        kv_dim: (spec.n_kv_heads * spec.head_dim) as u32,
        grid_x: g.0,
        scale: spec.scale,
        cache_groups,
        pt_base,
        window,
        sink_row,
        rope_pairs: *rope_pairs,
    };
    b.run(Op::LogitAbsmax(k_elem), &params, &[q, kc, &per_row, pt, rope_table], g);
    match lq.scale {
        LogitScale::Row => (per_row, nh as u32),
        _ => {
            let whole = u32::from(lq.scale == LogitScale::Tensor);
            let params = LogitReduceParams { rows: rows as u32, n_heads: nh as u32, whole_tensor: whole };
            b.run(Op::LogitReduce, &params, &[&per_row, &per_head], (1, 1));
            (per_head, 0)
        }
    }
}

/// Checks a batch of `rows` new rows at `pos0` against the cache and the sequence's pages,
/// and makes its page-table row current: the row's first entry.
pub(super) fn prepare_rows(
    b: &mut GpuBackend,
    cache: &mut GpuKvCache,
    seq: &SeqPages,
    rows: usize,
    pos0: usize,
    spec: &AttentionSpec,
) -> u32 {
    assert_eq!(spec.n_kv_heads * spec.head_dim, cache.kv_dim);
    assert!(pos0 + rows <= cache.n_ctx, "attention past the cache's {} positions", cache.n_ctx);
    assert!(
        seq.pages.len() * PAGE >= pos0 + rows,
        "positions up to {} stored in {} pages",
        pos0 + rows,
        seq.pages.len()
    );
    sync_page_table(b, cache, seq)
}

/// One sequence's attention step: RoPE on `q` and `k` (where `rope` is given; else they are
/// rotated already), K and V into the cache, then attention into `out`; with `pairs`
/// (DIFF V2's gates), the query-head pairs merged as the combine step writes them (where V
/// is not rotated: its output is rotated back per head first), `out` then scratch and the
/// combined heads in `pairs.1`. Into plain caches (f16, f32) with fusion on, one kernel
/// rotates Q and K and writes K and V ([`Op::RopeKv`]): one dispatch, not four. The
/// rotated cache types take rotated copies of K with Q, and of V.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    b: &mut GpuBackend,
    q: &mut GpuTensor,
    k: &mut GpuTensor,
    v: &GpuTensor,
    cache: &mut GpuKvCache,
    seq: SeqPages,
    layer: usize,
    pos0: usize,
    rope: Option<&RopeSpec>,
    spec: &AttentionSpec,
    pairs: Option<(&GpuTensor, &mut GpuTensor)>,
    out: &mut GpuTensor,
) {
    let plain = [cache.k_elem, cache.v_elem].iter().all(|e| e.kind() == CacheKind::Plain);
    let pairs_fused = b.ctx.fuse && !cache.v_elem.rotated();
    // (The heads' output, where the pairs are combined after it.)
    let (gate, att_out) = match pairs {
        Some((gate, combined)) if pairs_fused => (Some(gate), combined),
        Some((gate, combined)) => {
            attention(b, q, k, v, cache, seq, layer, pos0, rope, spec, None, out);
            return super::ops::pair_combine(b, out, gate, spec.head_dim, combined);
        }
        None => (None, out),
    };
    let fused_write = b.ctx.fuse && plain && rope.is_some();
    if let (false, Some(rope)) = (fused_write, rope) {
        super::ops::rope(b, q, spec.n_heads, spec.head_dim, pos0, rope);
        // A K cache of keys before RoPE stores them as they are; its reader rotates them.
        if !cache.k_elem.keys_before_rope() {
            super::ops::rope(b, k, spec.n_kv_heads, spec.head_dim, pos0, rope);
        }
    }
    let rows = q.rows;
    let pt_base = prepare_rows(b, cache, &seq, rows, pos0, spec);
    let (hd, q_dim, kv_dim) = (spec.head_dim, spec.n_heads * spec.head_dim, cache.kv_dim);
    assert!(q.cols == q_dim && k.cols == kv_dim && v.cols == kv_dim, "attention: q, k, v widths");
    let qb = match rope {
        Some(rope) if fused_write => {
            let at = RopeKvAt { rows, pos0, pt_base, by_row: false, n_pos: pos0 + rows };
            rope_kv(b, (q, k, v), cache, layer, rope, hd, at);
            Arc::clone(&q.buf)
        }
        _ => {
            // Rotated copies where the cache types ask for them: K with Q, V alone.
            let rot = hadamard::block_size(hd);
            let (mut qb, mut kb, mut vb) = (Arc::clone(&q.buf), Arc::clone(&k.buf), Arc::clone(&v.buf));
            if cache.k_elem.rotated() {
                qb = scratch(b, 0, (rows * q_dim * 4) as u64);
                kb = scratch(b, 1, (rows * kv_dim * 4) as u64);
                rotate(b, &q.buf, &qb, rows, q_dim, rot, None, 0);
                rotate(b, &k.buf, &kb, rows, kv_dim, rot, None, 0);
            }
            if cache.v_elem.rotated() {
                vb = scratch(b, 2, (rows * kv_dim * 4) as u64);
                rotate(b, &v.buf, &vb, rows, kv_dim, rot, None, 0);
            }
            let (kc, vc) = (Arc::clone(&cache.k[layer]), Arc::clone(&cache.v[layer]));
            write_rows(b, &kb, &kc, cache.k_elem, rows, cache, (pt_base, seq.slot, seq.sink), pos0);
            write_rows(b, &vb, &vc, cache.v_elem, rows, cache, (pt_base, seq.slot, seq.sink), pos0);
            qb
        }
    };
    attend(b, &qb, &Place::of(rows, pos0, pt_base, &seq), cache, layer, spec, rope, gate, att_out);
}

/// Where the query rows of an attend step sit: one sequence's rows at `pos0..` (page table
/// at `pt_base`, window of `slot`, sink `sink`), or ([`AttnShape::DecodeRows`]) one decoded token of
/// each of several sequences, described by the rows' table at `pt_base`.
pub(super) struct Place {
    pub shape: AttnShape,
    pub rows: usize,
    /// Keys of the longest row: what the chunks are counted over.
    pub keys: usize,
    pub pos0: usize,
    pub pt_base: u32,
    pub slot: u32,
    pub sink: u32,
}

impl Place {
    /// `rows` rows of one sequence at `pos0`: the decode shape for one, else prefill.
    fn of(rows: usize, pos0: usize, pt_base: u32, seq: &SeqPages) -> Place {
        let shape = if rows == 1 { AttnShape::Decode } else { AttnShape::Prefill };
        Place { shape, rows, keys: pos0 + rows, pos0, pt_base, slot: seq.slot as u32, sink: seq.sink as u32 }
    }
}

/// The attend and combine steps over the cache of `layer` (its new rows already stored),
/// for the queries in `qb` (rotated where the K cache is) at `at`; a rotated V's output
/// rotated back into `out`. With `gate` (DIFF V2, V not rotated) the combine step merges
/// each pair of query heads: `out` holds the combined heads. `rope`: the step's RoPE, which
/// the K reader applies where the cache holds keys before it.
#[allow(clippy::too_many_arguments)]
pub(super) fn attend(
    b: &mut GpuBackend,
    qb: &Arc<Buf>,
    at: &Place,
    cache: &GpuKvCache,
    layer: usize,
    spec: &AttentionSpec,
    rope: Option<&RopeSpec>,
    gate: Option<&GpuTensor>,
    out: &mut GpuTensor,
) {
    let key_rope = match rope {
        Some(r) if cache.k_elem.keys_before_rope() => (b.rope_table(r, at.keys), (r.n_rot / 2) as u32),
        _ => (Arc::clone(&b.dummy), 0),
    };
    let (rows, pos0, pt_base, shape) = (at.rows, at.pos0, at.pt_base, at.shape);
    let (hd, rot) = (spec.head_dim, hadamard::block_size(spec.head_dim));
    let q_dim = spec.n_heads * hd;
    let kv_dim = cache.kv_dim;
    let pt = Arc::clone(&cache.page_tables);
    let (kc, vc) = (Arc::clone(&cache.k[layer]), Arc::clone(&cache.v[layer]));
    let (diff, lambda, out_scale, sub) = match &spec.kind {
        AttentionKind::Standard | AttentionKind::PairedHeads => (false, 0.0, 1.0, None),
        AttentionKind::Differential { lambda, lambda_init, sub_norm } => {
            (true, *lambda, 1.0 - lambda_init, sub_norm.as_deref())
        }
    };
    // Softmaxes per unit; a DIFF unit is a head pair attending over 2·head_dim-wide V.
    let ns = if diff { 2 } else { 1 };
    let (units, vd) = (spec.n_heads / ns, hd * ns);
    let (br, bc) = attn_tile(shape);
    let (chunk_keys, n_chunks) = key_chunks(shape, at.keys, rows * units, bc as usize, b.ctx.decode_workgroups);
    let g = grid(rows.div_ceil(br as usize) * units * n_chunks, 1);
    let groups = cache_groups(cache);
    let (slot, sink) = (at.slot, sink_row(cache, at.sink as usize));
    assert!(
        shape != AttnShape::DecodeRows || spec.logit_quant.is_none(),
        "the batched decode step quantizes no logits"
    );
    let (la, la_stride) =
        logit_absmax(b, qb, &kc, cache.k_elem, groups, (&pt, pt_base, slot, sink), &key_rope, rows, pos0, spec);
    let sub_buf = match sub {
        Some(w) => constant_buf(b, w, "sub-norm weight"),
        None => Arc::clone(&b.dummy),
    };
    // A rotated V's output is rotated back afterwards, the sub-norm weight applied then.
    let v_rot = cache.v_elem.rotated();
    let ob = if v_rot { scratch(b, 3, (rows * q_dim * 4) as u64) } else { Arc::clone(&out.buf) };
    let partials = scratch(b, 4, (rows * units * n_chunks * ns * (2 + vd) * 4) as u64);
    let params = AttentionParams {
        rows: rows as u32,
        n_heads: spec.n_heads as u32,
        n_kv_heads: spec.n_kv_heads as u32,
        head_dim: hd as u32,
        pos0: pos0 as u32,
        q_dim: q_dim as u32,
        kv_dim: kv_dim as u32,
        grid_x: g.0,
        scale: spec.scale,
        chunk_keys: chunk_keys as u32,
        n_chunks: n_chunks as u32,
        units: units as u32,
        lq_qmax: spec.logit_quant.as_ref().map_or(0.0, |l| l.qmax()),
        lq_stride: la_stride,
        cache_groups: groups,
        pt_base,
        window: slot,
        sink_row: sink,
        rope_pairs: key_rope.1,
    };
    let op = Op::Attention { diff, shape, k: cache.k_elem, v: cache.v_elem };
    b.run(op, &params, &[qb, &kc, &vc, &partials, &la, &pt, &key_rope.0], g);
    let paired = gate.is_some();
    assert!(!(paired && (diff || v_rot)), "pairs merge standard units of an unrotated V");
    let g = grid(rows * if paired { units / 2 } else { units }, 1);
    let params = AttnCombineParams {
        rows: rows as u32,
        units: units as u32,
        head_dim: hd as u32,
        n_chunks: n_chunks as u32,
        q_dim: if paired { q_dim / 2 } else { q_dim } as u32,
        grid_x: g.0,
        lambda,
        out_scale,
        eps: spec.rms_eps,
        has_sub_norm: u32::from(sub.is_some() && !v_rot),
    };
    let sn = gate.map_or(sub_buf.clone(), |g| Arc::clone(&g.buf));
    b.run(Op::AttnCombine { diff, paired }, &params, &[&partials, &sn, &ob], g);
    if v_rot {
        let w = sub.map(|_| &sub_buf);
        rotate(b, &ob, &out.buf, rows, q_dim, rot, w, 2 * hd);
    }
}

/// Workgroups the decode step aims for: enough to fill a large GPU (an H200 has 132
/// multiprocessors) when a single query row has few units, at most ATT_MAX_CHUNKS chunks
/// a unit (the combine step holds a weight for each). On an H200 at depth 4,096 (32 heads)
/// 4,096 decoded 1.19× faster than 2,048, 512 0.62× as fast
/// (gpu-h200-2026-11-27-81c320c.md).
pub const DECODE_WORKGROUPS: usize = 4096;

/// (keys per chunk, chunks) of the attend step over keys `0..keys`. Prefill: one chunk, its
/// row tiles already fill the GPU. Decode: few query rows, so the keys are split (in whole
/// tiles of `tile` keys) until `units` (of all rows) × chunks reaches `workgroups`
/// ([`DECODE_WORKGROUPS`] by default): flash-decoding.
/// Unsplit, one workgroup per unit walked all 4,096 keys of a deep cache alone.
pub fn key_chunks(shape: AttnShape, keys: usize, units: usize, tile: usize, workgroups: usize) -> (usize, usize) {
    let tiles = keys.div_ceil(tile).max(1);
    let chunks = match shape {
        AttnShape::Prefill => 1,
        AttnShape::Decode | AttnShape::DecodeRows => {
            (workgroups / units.max(1)).clamp(1, tiles).min(ATT_MAX_CHUNKS as usize)
        }
    };
    let chunk_keys = tiles.div_ceil(chunks) * tile;
    (chunk_keys, keys.div_ceil(chunk_keys).max(1))
}

/// Where [`rope_kv`] works: `rows` rows of Q/K/V; their positions from `pos0` and cache rows
/// from page-table entry `pt_base` on (one sequence), or (`by_row`) each row's position and
/// page table from the rows' table at `pt_base`; the RoPE table covers `n_pos` positions.
pub(super) struct RopeKvAt {
    pub rows: usize,
    pub pos0: usize,
    pub pt_base: u32,
    pub by_row: bool,
    pub n_pos: usize,
}

/// RoPE on Q and K with K and V stored into `cache`'s `layer`, one dispatch (the fused
/// kernel).
pub(super) fn rope_kv(
    b: &mut GpuBackend,
    (q, k, v): (&GpuTensor, &GpuTensor, &GpuTensor),
    cache: &GpuKvCache,
    layer: usize,
    rope: &RopeSpec,
    head_dim: usize,
    at: RopeKvAt,
) {
    let (q_dim, kv_dim) = (q.cols, cache.kv_dim);
    let table = b.rope_table(rope, at.n_pos);
    let g = grid(at.rows * (q_dim / 2 + kv_dim), EW_WG as usize);
    let params = RopeKvParams {
        rows: at.rows as u32,
        q_dim: q_dim as u32,
        kv_dim: kv_dim as u32,
        head_dim: head_dim as u32,
        n_pairs: (rope.n_rot / 2) as u32,
        pos0: at.pos0 as u32,
        grid_x: g.0,
        pt_base: at.pt_base,
    };
    let (kc, vc, pt) = (Arc::clone(&cache.k[layer]), Arc::clone(&cache.v[layer]), Arc::clone(&cache.page_tables));
    let op = Op::RopeKv { k: cache.k_elem, v: cache.v_elem, rows: at.by_row };
    b.run(op, &params, &[&table, &q.buf, &k.buf, &v.buf, &kc, &vc, &pt], g);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_chunks_cover_the_keys_without_an_empty_chunk() {
        for shape in [AttnShape::Decode, AttnShape::Prefill] {
            for keys in [1, 2, 63, 64, 65, 127, 700, 4096, 4097, 100_000] {
                for units in [1, 4, 16, 32, 64, 600] {
                    let (chunk, n) = key_chunks(shape, keys, units, 64, DECODE_WORKGROUPS);
                    assert_eq!(chunk % 64, 0, "whole tiles");
                    assert!(n * chunk >= keys && (n - 1) * chunk < keys, "{keys} keys in {n} × {chunk}");
                    if shape == AttnShape::Prefill {
                        assert_eq!(n, 1);
                    }
                }
            }
        }
        // 32 heads at depth 4,096 in tiles of 64: 64 chunks of one tile (2,048 workgroups).
        assert_eq!(key_chunks(AttnShape::Decode, 4096, 32, 64, DECODE_WORKGROUPS), (64, 64));
        // 16 heads at depth 8,192: 256 chunks of 32 keys in tiles of 16 (4,096 workgroups).
        assert_eq!(key_chunks(AttnShape::Decode, 8192, 16, 16, DECODE_WORKGROUPS), (32, 256));
        // One unit: 256 chunks at most (of 4 tiles of 16 keys here).
        assert_eq!(key_chunks(AttnShape::Decode, 16384, 1, 16, DECODE_WORKGROUPS), (64, 256));
        // 32 heads over 100 keys: a chunk per tile.
        assert_eq!(key_chunks(AttnShape::Decode, 100, 32, 16, DECODE_WORKGROUPS), (16, 7));
    }
}
