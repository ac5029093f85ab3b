//! The attention maps of duet_runtime::tools::insight are the attention the model computes: on the
//! committed fixtures (a GQA DiffLlama, a tied DiffLlama with llama3 RoPE, a GQA Llama, two
//! DIFF V2), each head's map times the layer's V reproduces the attention output the forward
//! pass produced (for DIFF: RMSNorm((A1 − λ·A2)·[V_a | V_b]) · (1 − λ_init), the sub-norm
//! weight when there is one; for V2: (A₂ᵢ − λₜ·A₂ᵢ₊₁)·V of the pair's KV head, the output of
//! the pair combine). An f32 cache, so the only difference is arithmetic order.

mod common;

use std::sync::{Arc, Mutex};

use duet_convert::Preset;
use duet_quant::gguf::GgufFile;
use duet_runtime::backend::{AttentionKind, AttentionSpec, Backend, Probe};
use duet_runtime::observe::Observer;
use duet_runtime::cpu::CpuBackend;
use duet_runtime::tools::insight::maps::{LayerQk, head_maps, selectable_heads};
use duet_runtime::kv_cache::CacheFormat;
use duet_runtime::model::{Logits, Model};

use common::convert;

/// Q, K, V, V2's pair gates and the attention output of every layer.
#[derive(Default)]
struct Acts {
    q: Vec<Vec<f32>>,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    gates: Vec<Vec<f32>>,
    out: Vec<Vec<f32>>,
}

impl Observer for Acts {
    fn observe(&mut self, probe: Probe, layer: usize, _pos0: usize, data: &[f32], _rows: usize, _cols: usize) {
        let slot = match probe {
            Probe::Q => &mut self.q,
            Probe::K => &mut self.k,
            Probe::V => &mut self.v,
            Probe::PairGates => &mut self.gates,
            Probe::AttnOut => &mut self.out,
            _ => return,
        };
        if slot.len() <= layer {
            slot.resize(layer + 1, Vec::new());
        }
        slot[layer] = data.to_vec();
    }
}

/// The attention output of `head` (a query head, or a DIFF / V2 pair) from its maps and V:
/// head_dim values (standard, V2) or 2·head_dim (DIFF), per position.
fn output_from_maps(qk: LayerQk<'_>, v: &[f32], spec: &AttentionSpec, head: usize, n: usize) -> Vec<Vec<f32>> {
    let d = spec.head_dim;
    let kv_cols = spec.n_kv_heads * d;
    let group = spec.n_heads / spec.n_kv_heads;
    let pos: Vec<usize> = (0..n).collect();
    let maps = head_maps(qk, spec, 0, head, &pos);
    let w = &maps.effective().data;
    // The V heads the output mixes: its KV head (standard), the pair's two halves (DIFF),
    // or the one KV head both heads of the pair read (V2).
    let v_heads = match spec.kind {
        AttentionKind::Differential { .. } => vec![head / group, head / group + spec.n_kv_heads / 2],
        AttentionKind::PairedHeads => vec![2 * head / group],
        AttentionKind::Standard => vec![head / group],
    };
    let mut rows = Vec::new();
    for i in 0..n {
        let mut o = vec![0f64; d * v_heads.len()];
        for j in 0..n {
            let wij = w[i * n + j] as f64;
            for (vi, &vh) in v_heads.iter().enumerate() {
                for c in 0..d {
                    o[vi * d + c] += wij * v[j * kv_cols + vh * d + c] as f64;
                }
            }
        }
        if let AttentionKind::Differential { lambda_init, sub_norm, .. } = &spec.kind {
            let rms = (o.iter().map(|x| x * x).sum::<f64>() / o.len() as f64 + spec.rms_eps as f64).sqrt();
            for (c, x) in o.iter_mut().enumerate() {
                let g = sub_norm.as_ref().map_or(1.0, |s| s[c] as f64);
                *x = *x / rms * g * (1.0 - *lambda_init as f64);
            }
        }
        rows.push(o.iter().map(|&x| x as f32).collect());
    }
    rows
}

fn check(fixture: &str) {
    let path = convert(fixture, Preset::F32, false);
    let mut b = CpuBackend::new(2);
    let model = Model::load(&mut b, Arc::new(GgufFile::open(&path).unwrap())).unwrap();
    let n = 24;
    let tokens: Vec<u32> = (0..n as u32).map(|i| (i * 37 + 11) % model.config.n_vocab as u32).collect();
    let acts = Arc::new(Mutex::new(Acts::default()));
    b.set_observer(Some(Box::new(Arc::clone(&acts))));
    let mut s = model.new_session(&mut b, n, CacheFormat::F32, CacheFormat::F32).unwrap();
    let mut ctx = model.new_context(&mut b, n).unwrap();
    model.decode_one(&mut b, &mut ctx, &mut s, &tokens, Logits::Last).unwrap();
    b.set_observer(None);
    let _ = std::fs::remove_file(&path);
    let acts = acts.lock().unwrap();
    let mut worst = 0f32;
    for (il, layer) in model.layers.iter().enumerate() {
        let spec = &layer.attention;
        // Output values per selectable head: 2·head_dim for a DIFF pair, head_dim otherwise.
        let width = match spec.kind {
            AttentionKind::Differential { .. } => 2 * spec.head_dim,
            _ => spec.head_dim,
        };
        let out_cols = selectable_heads(spec) * width;
        let gates = acts.gates.get(il).map_or(&[][..], Vec::as_slice);
        let qk = LayerQk { q: &acts.q[il], k: &acts.k[il], gates };
        for h in 0..selectable_heads(spec) {
            let rows = output_from_maps(qk, &acts.v[il], spec, h, n);
            for (i, row) in rows.iter().enumerate() {
                let got = &acts.out[il][i * out_cols + h * width..i * out_cols + (h + 1) * width];
                let scale = got.iter().fold(1e-3f32, |m, x| m.max(x.abs()));
                for (a, b) in row.iter().zip(got) {
                    worst = worst.max((a - b).abs() / scale);
                }
            }
        }
    }
    // f32 attention against an f64 re-computation from the same Q, K and V: rounding only.
    assert!(
        worst < 1e-4,
        "{fixture}: maps·V differs from the attention output by {worst:e} (relative to the row's max)"
    );
}

#[test]
fn diff_gqa_maps_reproduce_the_attention_output() {
    check("diffllama-gqa");
}

#[test]
fn diff_tied_llama3_maps_reproduce_the_attention_output() {
    check("diffllama-tied-llama3");
}

#[test]
fn llama_gqa_maps_reproduce_the_attention_output() {
    check("llama-gqa");
}

#[test]
fn v2_maps_reproduce_the_attention_output() {
    check("diffllama-v2-gqa");
    check("diffllama-v2-mha-tied");
}
