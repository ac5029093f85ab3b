//! Attention maps recomputed from the queries and keys a forward pass produced.
//!
//! [`QkCapture`] observes Q and K (after RoPE) of the selected layers on either backend;
//! [`layer_maps`] turns them into the weights each query row gives each key: for a standard
//! head `softmax(scale·q·Kᵀ)` over the causal positions, for a DIFF head pair its two
//! softmaxes A1 and A2 and their difference `A1 − λ·A2` (each row sums to 1 − λ). The maps
//! are taken from the f32 Q and K, before the K cache rounds or quantizes them, and without
//! logit quantization: they show what the model's weights compute, not a cache format's
//! error.

use crate::backend::{AttentionKind, AttentionSpec, Probe};
use crate::calibrate::Observer;

/// Q and K of the selected layers over every position seen since [`QkCapture::new`].
pub struct QkCapture {
    wanted: Vec<bool>,
    /// Per layer: positions × n_heads·head_dim.
    q: Vec<Vec<f32>>,
    /// Per layer: positions × n_kv_heads·head_dim.
    k: Vec<Vec<f32>>,
    q_cols: usize,
    k_cols: usize,
}

impl QkCapture {
    /// Captures the layers whose entry in `wanted` is true.
    pub fn new(wanted: Vec<bool>) -> QkCapture {
        let n = wanted.len();
        QkCapture { wanted, q: vec![Vec::new(); n], k: vec![Vec::new(); n], q_cols: 0, k_cols: 0 }
    }

    /// Positions captured for `layer`.
    pub fn positions(&self, layer: usize) -> usize {
        if self.k_cols == 0 { 0 } else { self.k.get(layer).map_or(0, |k| k.len() / self.k_cols) }
    }

    /// (Q, K) of `layer`: positions × n_heads·head_dim and positions × n_kv_heads·head_dim.
    pub fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        (&self.q[layer], &self.k[layer])
    }
}

/// Writes `rows × cols` at row `pos0` of `dst`, growing it as needed.
fn put_rows(dst: &mut Vec<f32>, pos0: usize, data: &[f32], cols: usize) {
    let end = pos0 * cols + data.len();
    if dst.len() < end {
        dst.resize(end, 0.0);
    }
    dst[pos0 * cols..end].copy_from_slice(data);
}

impl Observer for QkCapture {
    fn wants(&self, probe: Probe, layer: usize) -> bool {
        matches!(probe, Probe::Q | Probe::K) && self.wanted.get(layer).copied().unwrap_or(false)
    }

    fn observe(&mut self, probe: Probe, layer: usize, pos0: usize, data: &[f32], _rows: usize, cols: usize) {
        if !self.wants(probe, layer) {
            return;
        }
        match probe {
            Probe::Q => {
                self.q_cols = cols;
                put_rows(&mut self.q[layer], pos0, data, cols);
            }
            Probe::K => {
                self.k_cols = cols;
                put_rows(&mut self.k[layer], pos0, data, cols);
            }
            _ => {}
        }
    }
}

/// How a map's values read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapScale {
    /// Softmax weights, 0 to 1.
    Weights,
    /// DIFF's A1 − λ·A2: negative weights too.
    Signed,
}

/// One attention map: `rows` query positions × `cols` key positions, row-major; weights
/// past a query's own position are 0 (causal).
#[derive(Clone, Debug)]
pub struct Map {
    /// "A1", "A2", "A1 − λ·A2" or "softmax".
    pub name: String,
    pub scale: MapScale,
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

/// The maps of one head (standard) or one head pair (DIFF) of a layer.
#[derive(Clone, Debug)]
pub struct HeadMaps {
    pub layer: usize,
    /// The query head (standard) or the pair index (DIFF, pairing heads j and j + H/2).
    pub head: usize,
    /// DIFF: the layer's λ.
    pub lambda: Option<f32>,
    /// Standard: [softmax]; DIFF: [A1, A2, A1 − λ·A2].
    pub maps: Vec<Map>,
}

/// The number of selectable heads of a layer: query heads, or head pairs for DIFF.
pub fn selectable_heads(spec: &AttentionSpec) -> usize {
    match spec.kind {
        AttentionKind::Differential { .. } => spec.n_heads / 2,
        AttentionKind::Standard => spec.n_heads,
    }
}

/// Softmax weights of query head `head` for the queries at `query_pos` (rows of `q`, each
/// `n_heads·head_dim` wide) over keys `0..n_keys` (rows of `k`), causal: `query_pos × n_keys`.
fn softmax_map(
    q: &[f32],
    k: &[f32],
    spec: &AttentionSpec,
    head: usize,
    query_pos: &[usize],
    n_keys: usize,
) -> Vec<f32> {
    let d = spec.head_dim;
    let (q_cols, k_cols) = (spec.n_heads * d, spec.n_kv_heads * d);
    let kv_head = head / (spec.n_heads / spec.n_kv_heads);
    let mut out = vec![0f32; query_pos.len() * n_keys];
    let mut logits = vec![0f64; n_keys];
    for (r, &p) in query_pos.iter().enumerate() {
        let qh = &q[p * q_cols + head * d..p * q_cols + (head + 1) * d];
        let visible = (p + 1).min(n_keys);
        let mut max = f64::NEG_INFINITY;
        for (j, l) in logits[..visible].iter_mut().enumerate() {
            let kh = &k[j * k_cols + kv_head * d..j * k_cols + (kv_head + 1) * d];
            let dot: f64 = qh.iter().zip(kh).map(|(&a, &b)| a as f64 * b as f64).sum();
            *l = dot * spec.scale as f64;
            max = max.max(*l);
        }
        let sum: f64 = logits[..visible].iter().map(|l| (l - max).exp()).sum();
        for (o, l) in out[r * n_keys..r * n_keys + visible].iter_mut().zip(&logits[..visible]) {
            *o = ((l - max).exp() / sum) as f32;
        }
    }
    out
}

/// The maps of `head` (a query head, or for DIFF a pair) of a layer from its captured Q
/// and K (positions × cols), for the queries at `query_pos` over every captured key.
pub fn head_maps(
    q: &[f32],
    k: &[f32],
    spec: &AttentionSpec,
    layer: usize,
    head: usize,
    query_pos: &[usize],
) -> HeadMaps {
    let n_keys = k.len() / (spec.n_kv_heads * spec.head_dim).max(1);
    let rows = query_pos.len();
    let map = |name: &str, scale, data| Map { name: name.into(), scale, rows, cols: n_keys, data };
    match spec.kind {
        AttentionKind::Differential { lambda, .. } => {
            let a1 = softmax_map(q, k, spec, head, query_pos, n_keys);
            let a2 = softmax_map(q, k, spec, head + spec.n_heads / 2, query_pos, n_keys);
            let diff = a1.iter().zip(&a2).map(|(&x, &y)| x - lambda * y).collect();
            HeadMaps {
                layer,
                head,
                lambda: Some(lambda),
                maps: vec![
                    map("A1", MapScale::Weights, a1),
                    map("A2", MapScale::Weights, a2),
                    map("A1 − λ·A2", MapScale::Signed, diff),
                ],
            }
        }
        AttentionKind::Standard => HeadMaps {
            layer,
            head,
            lambda: None,
            maps: vec![map("softmax", MapScale::Weights, softmax_map(q, k, spec, head, query_pos, n_keys))],
        },
    }
}

impl HeadMaps {
    /// The map whose weights the model mixes V with: softmax, or DIFF's A1 − λ·A2.
    pub fn effective(&self) -> &Map {
        self.maps.last().expect("every head has a map")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: AttentionKind, n_heads: usize, n_kv_heads: usize, head_dim: usize) -> AttentionSpec {
        AttentionSpec {
            kind,
            n_heads,
            n_kv_heads,
            head_dim,
            scale: (head_dim as f32).powf(-0.5),
            rms_eps: 1e-5,
            logit_quant: None,
        }
    }

    #[test]
    fn softmax_rows_match_a_hand_computed_example() {
        // One head, d = 1, scale 1: position 1 sees keys 0 and 1 with logits 1·0 and 1·ln 3.
        let s = AttentionSpec { scale: 1.0, ..spec(AttentionKind::Standard, 1, 1, 1) };
        let q = [0.0, 1.0];
        let k = [0.0, 3f32.ln()];
        let m = head_maps(&q, &k, &s, 0, 0, &[0, 1]);
        let w = &m.maps[0].data;
        assert_eq!(w[..2], [1.0, 0.0], "position 0 sees only itself");
        assert!((w[2] - 0.25).abs() < 1e-6 && (w[3] - 0.75).abs() < 1e-6, "{w:?}");
    }

    #[test]
    fn diff_rows_sum_to_one_minus_lambda_and_pair_heads_j_and_j_plus_half() {
        let lambda = 0.3;
        let kind = AttentionKind::Differential { lambda, lambda_init: 0.2, sub_norm: None };
        let s = spec(kind, 4, 2, 2);
        let n = 5;
        let q: Vec<f32> = (0..n * 8).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.4).collect();
        let k: Vec<f32> = (0..n * 4).map(|i| ((i * 17 % 7) as f32 - 3.0) * 0.5).collect();
        let pos: Vec<usize> = (0..n).collect();
        let m = head_maps(&q, &k, &s, 0, 1, &pos);
        for r in 0..n {
            let row: f32 = m.maps[2].data[r * n..(r + 1) * n].iter().sum();
            assert!((row - (1.0 - lambda)).abs() < 1e-5, "row {r} sums to {row}");
        }
        // Pair 1 = query heads 1 and 3; with 4 heads over 2 KV heads they read KV heads 0 and 1.
        let std = spec(AttentionKind::Standard, 4, 2, 2);
        assert_eq!(m.maps[0].data, head_maps(&q, &k, &std, 0, 1, &pos).maps[0].data);
        assert_eq!(m.maps[1].data, head_maps(&q, &k, &std, 0, 3, &pos).maps[0].data);
    }

    #[test]
    fn capture_keeps_rows_at_their_positions_across_batches() {
        let mut c = QkCapture::new(vec![false, true]);
        assert!(!c.wants(Probe::Q, 0) && c.wants(Probe::K, 1) && !c.wants(Probe::V, 1));
        c.observe(Probe::K, 1, 0, &[1.0, 2.0, 3.0, 4.0], 2, 2);
        c.observe(Probe::K, 1, 2, &[5.0, 6.0], 1, 2);
        assert_eq!(c.positions(1), 3);
        assert_eq!(c.layer(1).1, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    }
}
