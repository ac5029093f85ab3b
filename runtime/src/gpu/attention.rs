//! The K/V cache and attention: the new K/V rows are written into the cache, then one
//! kernel computes standard or differential attention over it — the decode shape (one
//! query row per workgroup) for a single token, the tiled prefill shape for more.
//! Quantized attention logits take their absmax from a table the attention kernel reads:
//! static scales uploaded once, or the dynamic ones computed by logit_absmax (per row) and
//! reduced by logit_reduce (per head, per tensor) just before it.

use std::sync::Arc;

use duet_shaders::{ATT_MAX_HEAD_DIM, AttnShape, CacheElem, EW_WG, Op, attn_tile};

use super::buffers::{Buf, GpuKvCache, GpuTensor};
use super::{GpuBackend, f, grid};
use crate::backend::{AttentionKind, AttentionSpec, LogitScale};
use crate::error::RuntimeError;
use crate::kv_cache::KvCacheSpec;

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
    for diff in [false, true] {
        for shape in [AttnShape::Decode, AttnShape::Prefill] {
            ops.push(Op::Attention { diff, shape, k: cache.k_elem, v: cache.v_elem });
        }
    }
    b.prepare(&ops)?;
    Ok(cache)
}

/// A buffer holding `w`, uploaded once per distinct content.
fn constant_buf(b: &mut GpuBackend, w: &[f32], label: &str) -> Arc<Buf> {
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

/// The absmax table of `spec`'s logit quantization for `rows` query rows at `pos0` and its
/// row stride (after the new K rows are in `kc`), or the unused binding when it has none.
fn logit_absmax(
    b: &mut GpuBackend,
    q: &GpuTensor,
    kc: &Arc<Buf>,
    k_elem: CacheElem,
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
    let params = [
        rows as u32,
        nh as u32,
        spec.n_kv_heads as u32,
        spec.head_dim as u32,
        pos0 as u32,
        (nh * spec.head_dim) as u32,
        (spec.n_kv_heads * spec.head_dim) as u32,
        g.0,
        f(spec.scale),
    ];
    b.run(Op::LogitAbsmax(k_elem), &params, &[&q.buf, kc, &per_row], g);
    match lq.scale {
        LogitScale::Row => (per_row, nh as u32),
        _ => {
            let whole = u32::from(lq.scale == LogitScale::Tensor);
            b.run(Op::LogitReduce, &[rows as u32, nh as u32, whole], &[&per_row, &per_head], (1, 1));
            (per_head, 0)
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub fn attention(
    b: &mut GpuBackend,
    q: &GpuTensor,
    k: &GpuTensor,
    v: &GpuTensor,
    cache: &mut GpuKvCache,
    layer: usize,
    pos0: usize,
    spec: &AttentionSpec,
    out: &mut GpuTensor,
) {
    let rows = q.rows;
    let kv_dim = spec.n_kv_heads * spec.head_dim;
    assert_eq!(kv_dim, cache.kv_dim);
    assert!(pos0 + rows <= cache.n_ctx, "attention past the cache's {} positions", cache.n_ctx);
    // Store the new K and V rows.
    for (src, dst, elem) in [(k, &cache.k[layer], cache.k_elem), (v, &cache.v[layer], cache.v_elem)] {
        // f32/f16: one invocation per pair of values; absmax: per pair of 32-value blocks.
        let items = match elem.absmax_bits() {
            None => rows * kv_dim / 2,
            Some(_) => rows * (kv_dim / 32).div_ceil(2),
        };
        let g = grid(items, EW_WG as usize);
        let params = [rows as u32, kv_dim as u32, pos0 as u32, g.0];
        b.run(Op::KvWrite(elem), &params, &[&src.buf, dst], g);
    }
    let (diff, lambda, out_scale, sub) = match &spec.kind {
        AttentionKind::Standard => (false, 0.0, 1.0, None),
        AttentionKind::Differential { lambda, lambda_init, sub_norm } => {
            (true, *lambda, 1.0 - lambda_init, sub_norm.as_deref())
        }
    };
    let shape = if rows == 1 { AttnShape::Decode } else { AttnShape::Prefill };
    let units = if diff { spec.n_heads / 2 } else { spec.n_heads };
    let (br, _) = attn_tile(shape);
    let g = grid(rows.div_ceil(br as usize) * units, 1);
    let (kc, vc) = (Arc::clone(&cache.k[layer]), Arc::clone(&cache.v[layer]));
    let (la, la_stride) = logit_absmax(b, q, &kc, cache.k_elem, rows, pos0, spec);
    let sub_buf = match sub {
        Some(w) => constant_buf(b, w, "sub-norm weight"),
        None => Arc::clone(&b.dummy),
    };
    let params = [
        rows as u32,
        spec.n_heads as u32,
        spec.n_kv_heads as u32,
        spec.head_dim as u32,
        pos0 as u32,
        (spec.n_heads * spec.head_dim) as u32,
        kv_dim as u32,
        g.0,
        f(spec.scale),
        f(lambda),
        f(out_scale),
        f(spec.rms_eps),
        u32::from(sub.is_some()),
        units as u32,
        f(spec.logit_quant.as_ref().map_or(0.0, |l| l.qmax())),
        la_stride,
    ];
    let op = Op::Attention { diff, shape, k: cache.k_elem, v: cache.v_elem };
    b.run(op, &params, &[&q.buf, &kc, &vc, &out.buf, &sub_buf, &la], g);
}
