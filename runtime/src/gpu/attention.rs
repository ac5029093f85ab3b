//! The K/V cache and attention: the new K/V rows are written into the cache, then one
//! kernel computes standard or differential attention over it — the decode shape (one
//! query row per workgroup) for a single token, the tiled prefill shape for more.

use std::sync::Arc;

use duet_shaders::{ATT_MAX_HEAD_DIM, AttnShape, EW_WG, Op, attn_tile};

use super::buffers::{Buf, GpuKvCache, GpuTensor};
use super::{GpuBackend, f, grid};
use crate::backend::{AttentionKind, AttentionSpec};
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

fn sub_norm_buf(b: &mut GpuBackend, w: &[f32]) -> Arc<Buf> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for v in w {
        v.to_bits().hash(&mut h);
    }
    let key = h.finish();
    if let Some(buf) = b.sub_norms.get(&key) {
        return Arc::clone(buf);
    }
    let buf = b.alloc.init(&b.ctx, bytemuck::cast_slice(w), "sub-norm weight");
    b.sub_norms.insert(key, Arc::clone(&buf));
    buf
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
    let sub_buf = match sub {
        Some(w) => sub_norm_buf(b, w),
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
    ];
    let op = Op::Attention { diff, shape, k: cache.k_elem, v: cache.v_elem };
    let (kc, vc) = (Arc::clone(&cache.k[layer]), Arc::clone(&cache.v[layer]));
    b.run(op, &params, &[&q.buf, &kc, &vc, &out.buf, &sub_buf], g);
}
