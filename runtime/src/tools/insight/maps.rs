//! Attention maps recomputed from the queries and keys a forward pass produced.
//!
//! [`QkCapture`] observes Q and K (after RoPE) of the selected layers on either backend;
//! [`layer_maps`] turns them into the weights each query row gives each key: for a standard
//! head `softmax(scale·q·Kᵀ)` over the causal positions, for a DIFF head pair its two
//! softmaxes A1 and A2 and their difference `A1 − λ·A2` (each row sums to 1 − λ), for a DIFF
//! V2 pair the softmaxes of its query heads 2i and 2i+1 and `A₂ᵢ − λₜ·A₂ᵢ₊₁` with each query
//! row's own gate λₜ = sigmoid(lambda_proj(x_t))ᵢ (rows sum to 1 − λₜ). The maps
//! are taken from the f32 Q and K, before the K cache rounds or quantizes them, and without
//! logit quantization: they show what the model's weights compute, not a cache format's
//! error.

use crate::backend::{AttentionKind, AttentionSpec, Probe};
use crate::observe::Observer;

/// Q and K (and DIFF V2's pair gates) of the selected layers over every position seen since
/// [`QkCapture::new`].
pub struct QkCapture {
    wanted: Vec<bool>,
    /// Per layer: positions × n_heads·head_dim.
    q: Vec<Vec<f32>>,
    /// Per layer: positions × n_kv_heads·head_dim.
    k: Vec<Vec<f32>>,
    /// Per layer, DIFF V2 only: positions × n_heads/2, before the sigmoid.
    gates: Vec<Vec<f32>>,
    q_cols: usize,
    k_cols: usize,
}

/// What the maps of one layer are computed from.
#[derive(Clone, Copy, Debug)]
pub struct LayerQk<'a> {
    /// positions × n_heads·head_dim, after RoPE.
    pub q: &'a [f32],
    /// positions × n_kv_heads·head_dim, after RoPE.
    pub k: &'a [f32],
    /// DIFF V2: positions × n_heads/2 gates before their sigmoid; empty otherwise.
    pub gates: &'a [f32],
}

impl QkCapture {
    /// Captures the layers whose entry in `wanted` is true.
    pub fn new(wanted: Vec<bool>) -> QkCapture {
        let n = wanted.len();
        QkCapture {
            wanted,
            q: vec![Vec::new(); n],
            k: vec![Vec::new(); n],
            gates: vec![Vec::new(); n],
            q_cols: 0,
            k_cols: 0,
        }
    }

    /// Positions captured for `layer`.
    pub fn positions(&self, layer: usize) -> usize {
        if self.k_cols == 0 { 0 } else { self.k.get(layer).map_or(0, |k| k.len() / self.k_cols) }
    }

    /// Q, K (and V2's gates) of `layer`.
    pub fn layer(&self, layer: usize) -> LayerQk<'_> {
        LayerQk { q: &self.q[layer], k: &self.k[layer], gates: &self.gates[layer] }
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
        matches!(probe, Probe::Q | Probe::K | Probe::PairGates) && self.wanted.get(layer).copied().unwrap_or(false)
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
            Probe::PairGates => put_rows(&mut self.gates[layer], pos0, data, cols),
            _ => {}
        }
    }
}

/// How a map's values read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapScale {
    /// Softmax weights, 0 to 1.
    Weights,
    /// DIFF's A1 − λ·A2 (V2: A₂ᵢ − λₜ·A₂ᵢ₊₁): negative weights too.
    Signed,
}

/// One attention map: `rows` query positions × `cols` key positions, row-major; weights
/// past a query's own position are 0 (causal).
#[derive(Clone, Debug)]
pub struct Map {
    /// "A1", "A2", "A1 − λ·A2" (V2: "A₂ᵢ", "A₂ᵢ₊₁", "A₂ᵢ − λₜ·A₂ᵢ₊₁") or "softmax".
    pub name: String,
    pub scale: MapScale,
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

/// The maps of one head (standard) or one head pair (DIFF, DIFF V2) of a layer.
#[derive(Clone, Debug)]
pub struct HeadMaps {
    pub layer: usize,
    /// The query head (standard) or the pair index (DIFF: heads j and j + H/2; V2: 2j and
    /// 2j + 1).
    pub head: usize,
    /// The pair's two query heads (DIFF, V2).
    pub pair: Option<(usize, usize)>,
    /// DIFF: the layer's λ; V2: the mean of the rows' λₜ.
    pub lambda: Option<f32>,
    /// V2: each mapped query row's λₜ = sigmoid(lambda_proj(x_t)) of this pair; empty
    /// otherwise.
    pub row_lambdas: Vec<f32>,
    /// Standard: [softmax]; DIFF: [A1, A2, A1 − λ·A2]; V2: [A₂ᵢ, A₂ᵢ₊₁, A₂ᵢ − λₜ·A₂ᵢ₊₁].
    pub maps: Vec<Map>,
}

/// The number of selectable heads of a layer: query heads, or head pairs for DIFF and V2.
pub fn selectable_heads(spec: &AttentionSpec) -> usize {
    match spec.kind {
        AttentionKind::Differential { .. } | AttentionKind::PairedHeads => spec.n_heads / 2,
        AttentionKind::Standard => spec.n_heads,
    }
}

/// Whether a layer's heads are shown in pairs.
pub fn is_paired(spec: &AttentionSpec) -> bool {
    !matches!(spec.kind, AttentionKind::Standard)
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

/// The maps of `head` (a query head, or for DIFF and V2 a pair) of a layer from its
/// captured Q and K (and V2's gates), for the queries at `query_pos` over every captured key.
pub fn head_maps(qk: LayerQk<'_>, spec: &AttentionSpec, layer: usize, head: usize, query_pos: &[usize]) -> HeadMaps {
    let (q, k) = (qk.q, qk.k);
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
                pair: Some((head, head + spec.n_heads / 2)),
                lambda: Some(lambda),
                row_lambdas: Vec::new(),
                maps: vec![
                    map("A1", MapScale::Weights, a1),
                    map("A2", MapScale::Weights, a2),
                    map("A1 − λ·A2", MapScale::Signed, diff),
                ],
            }
        }
        AttentionKind::PairedHeads => {
            let (h0, h1) = (2 * head, 2 * head + 1);
            let a0 = softmax_map(q, k, spec, h0, query_pos, n_keys);
            let a1 = softmax_map(q, k, spec, h1, query_pos, n_keys);
            let n_pairs = spec.n_heads / 2;
            let lambdas: Vec<f32> = query_pos
                .iter()
                .map(|&p| qk.gates.get(p * n_pairs + head).map_or(f32::NAN, |&g| 1.0 / (1.0 + (-g).exp())))
                .collect();
            let mut combined = a0.clone();
            for ((row, l), r1) in combined.chunks_exact_mut(n_keys).zip(&lambdas).zip(a1.chunks_exact(n_keys)) {
                for (x, &y) in row.iter_mut().zip(r1) {
                    *x -= l * y;
                }
            }
            let mean = lambdas.iter().sum::<f32>() / lambdas.len().max(1) as f32;
            HeadMaps {
                layer,
                head,
                pair: Some((h0, h1)),
                lambda: Some(mean),
                row_lambdas: lambdas,
                maps: vec![
                    map("A₂ᵢ", MapScale::Weights, a0),
                    map("A₂ᵢ₊₁", MapScale::Weights, a1),
                    map("A₂ᵢ − λₜ·A₂ᵢ₊₁", MapScale::Signed, combined),
                ],
            }
        }
        AttentionKind::Standard => HeadMaps {
            layer,
            head,
            pair: None,
            lambda: None,
            row_lambdas: Vec::new(),
            maps: vec![map("softmax", MapScale::Weights, softmax_map(q, k, spec, head, query_pos, n_keys))],
        },
    }
}

impl HeadMaps {
    /// The map whose weights the model mixes V with: softmax, DIFF's A1 − λ·A2, or V2's
    /// A₂ᵢ − λₜ·A₂ᵢ₊₁.
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
        let m = head_maps(LayerQk { q: &q, k: &k, gates: &[] }, &s, 0, 0, &[0, 1]);
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
        let qk = LayerQk { q: &q, k: &k, gates: &[] };
        let m = head_maps(qk, &s, 0, 1, &pos);
        for r in 0..n {
            let row: f32 = m.maps[2].data[r * n..(r + 1) * n].iter().sum();
            assert!((row - (1.0 - lambda)).abs() < 1e-5, "row {r} sums to {row}");
        }
        // Pair 1 = query heads 1 and 3; with 4 heads over 2 KV heads they read KV heads 0 and 1.
        let std = spec(AttentionKind::Standard, 4, 2, 2);
        assert_eq!(m.maps[0].data, head_maps(qk, &std, 0, 1, &pos).maps[0].data);
        assert_eq!(m.maps[1].data, head_maps(qk, &std, 0, 3, &pos).maps[0].data);
    }

    #[test]
    fn v2_rows_sum_to_one_minus_their_own_gate_and_pair_heads_2i_and_2i_plus_1() {
        let s = spec(AttentionKind::PairedHeads, 4, 2, 2);
        let n = 5;
        let q: Vec<f32> = (0..n * 8).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.4).collect();
        let k: Vec<f32> = (0..n * 4).map(|i| ((i * 17 % 7) as f32 - 3.0) * 0.5).collect();
        // Gates per (position, pair): pair 1's are −1, 0, 1, 2, 3 → λ = σ(gate).
        let gates: Vec<f32> = (0..n).flat_map(|p| [9.0, p as f32 - 1.0]).collect();
        let pos: Vec<usize> = (0..n).collect();
        let qk = LayerQk { q: &q, k: &k, gates: &gates };
        let m = head_maps(qk, &s, 0, 1, &pos);
        assert_eq!(m.pair, Some((2, 3)));
        for r in 0..n {
            let lambda = 1.0 / (1.0 + (1.0 - r as f32).exp());
            let row: f32 = m.maps[2].data[r * n..(r + 1) * n].iter().sum();
            assert!((row - (1.0 - lambda)).abs() < 1e-5, "row {r} sums to {row}, λ {lambda}");
        }
        // Pair 1 = query heads 2 and 3 (both read KV head 1 with 4 heads over 2).
        let std = spec(AttentionKind::Standard, 4, 2, 2);
        assert_eq!(m.maps[0].data, head_maps(qk, &std, 0, 2, &pos).maps[0].data);
        assert_eq!(m.maps[1].data, head_maps(qk, &std, 0, 3, &pos).maps[0].data);
    }

    #[test]
    fn capture_keeps_rows_at_their_positions_across_batches() {
        let mut c = QkCapture::new(vec![false, true]);
        assert!(!c.wants(Probe::Q, 0) && c.wants(Probe::K, 1) && !c.wants(Probe::V, 1));
        c.observe(Probe::K, 1, 0, &[1.0, 2.0, 3.0, 4.0], 2, 2);
        c.observe(Probe::K, 1, 2, &[5.0, 6.0], 1, 2);
        assert_eq!(c.positions(1), 3);
        assert_eq!(c.layer(1).k, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    }
}
