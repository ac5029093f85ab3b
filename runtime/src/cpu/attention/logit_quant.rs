//! Attention-logit quantization before each softmax (the DIFF paper's §3.7, see
//! [`crate::backend::LogitQuant`]): which absmax each query head's logits are quantized
//! against, and the pass that finds the per-head and per-tensor maxima.

use super::SharedMut;
use super::cache::{CacheRows, Placement};
use super::key_rope::KeyRope;
use crate::backend::{AttentionSpec, LogitQuant, LogitScale};
use crate::cpu::pool::ThreadPool;

/// How one head's logits are quantized before its softmax.
#[derive(Clone, Copy)]
pub enum Lq {
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

impl Lq {
    /// Quantizes one row of logits in place.
    pub fn apply(self, scores: &mut [f32]) {
        match self {
            Lq::Off => {}
            Lq::Row { qmax } => LogitQuant::apply(qmax, absmax(scores), scores),
            Lq::Fixed { qmax, absmax } => LogitQuant::apply(qmax, absmax, scores),
        }
    }
}

pub fn absmax(s: &[f32]) -> f32 {
    s.iter().fold(0f32, |m, v| m.max(v.abs()))
}

/// The quantization of every query head's logits for `rows` query rows at pos0 (`q` in the
/// K cache's basis): the tensor and head scales take a pass over all logits first.
#[allow(clippy::too_many_arguments)]
pub fn per_head(
    pool: &ThreadPool,
    k: &CacheRows,
    rope: Option<&KeyRope>,
    at: &Placement,
    q: &[f32],
    rows: usize,
    pos0: usize,
    spec: &AttentionSpec,
) -> Vec<Lq> {
    let Some(l) = &spec.logit_quant else { return vec![Lq::Off; spec.n_heads] };
    let qmax = l.qmax();
    let fixed = match &l.scale {
        LogitScale::Row => return vec![Lq::Row { qmax }; spec.n_heads],
        LogitScale::Static(v) => v.clone(),
        LogitScale::Tensor => head_absmax(pool, k, rope, at, q, rows, pos0, spec, true),
        LogitScale::Head => head_absmax(pool, k, rope, at, q, rows, pos0, spec, false),
    };
    fixed.into_iter().map(|absmax| Lq::Fixed { qmax, absmax }).collect()
}

/// Per query head, the absmax of its logits over all `rows` (or of the whole tensor).
#[allow(clippy::too_many_arguments)]
fn head_absmax(
    pool: &ThreadPool,
    k: &CacheRows,
    rope: Option<&KeyRope>,
    at: &Placement,
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
            scores.clear();
            scores.resize(pos0 + r + 1, 0.0);
            k.scores(at, qh, kv_dim, (h / gqa) * hd, spec.scale, rope, &mut scores);
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
