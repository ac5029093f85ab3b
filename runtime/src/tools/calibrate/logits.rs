//! Attention logits recomputed from the observed queries and keys: `q·k/√d` for every
//! query row and every causal position, the values both softmaxes of a DIFF layer see.

use super::Calibrator;

/// Adds the logits of `rows` query rows (positions pos0..) of `layer`; the layer's keys for
/// positions 0..=pos0+rows−1 were observed just before.
pub(super) fn add_logits(cal: &mut Calibrator, layer: usize, pos0: usize, q: &[f32], rows: usize) {
    let hd = cal.cfg.head_dim;
    let (nh, nkv) = (cal.cfg.n_heads, cal.cfg.n_kv_heads);
    let gqa = nh / nkv;
    let kv_dim = nkv * hd;
    let scale = (hd as f32).powf(-0.5);
    let keys = std::mem::take(&mut cal.keys[layer]);
    for r in 0..rows {
        let pos = pos0 + r;
        if (pos + 1) * kv_dim > keys.len() {
            break; // keys not observed (should not happen): skip rather than misreport
        }
        for h in 0..nh {
            let qh = &q[r * nh * hd + h * hd..r * nh * hd + (h + 1) * hd];
            let g = h / gqa;
            let st = &mut cal.logits.stats[layer * nh + h];
            for j in 0..=pos {
                let k = &keys[j * kv_dim + g * hd..j * kv_dim + (g + 1) * hd];
                let s: f32 = qh.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * scale;
                st.add(s);
                cal.logits_top.add(s);
                cal.logits_all.add(s);
            }
        }
    }
    cal.keys[layer] = keys;
}
