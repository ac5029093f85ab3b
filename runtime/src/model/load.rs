//! Building a [`Model`] from GGUF tensors, checking every shape against the metadata.

use std::sync::Arc;

use duet_quant::gguf::GgufFile;

use super::{Arch, Layer, Model, ModelConfig};
use crate::backend::{AttentionKind, AttentionSpec, Backend, RopeSpec, WeightView};
use crate::error::RuntimeError;

/// λ_init of DIFF layer `layer` (0-based): 0.8 − 0.6·exp(−0.3·layer).
pub fn lambda_init(layer: usize) -> f32 {
    (0.8 - 0.6 * (-0.3 * layer as f64).exp()) as f32
}

struct Loader<'a, B: Backend> {
    file: &'a Arc<GgufFile>,
    b: &'a mut B,
}

impl<B: Backend> Loader<'_, B> {
    /// A tensor that must exist with GGUF dims `[cols, rows]` (or `[cols]` when rows == 1).
    fn get(&mut self, name: &str, cols: usize, rows: usize) -> Result<B::Weight, RuntimeError> {
        self.opt(name, cols, rows)?
            .ok_or_else(|| RuntimeError::BadModel(format!("{}: the model has no tensor '{name}'", self.file.label())))
    }

    fn opt(&mut self, name: &str, cols: usize, rows: usize) -> Result<Option<B::Weight>, RuntimeError> {
        let Some(info) = self.file.tensor(name) else { return Ok(None) };
        let dims = info.dims();
        let ok = match dims {
            [c] => *c as usize == cols && rows == 1,
            [c, r] => *c as usize == cols && *r as usize == rows,
            _ => false,
        };
        if !ok {
            let want = if rows == 1 { vec![cols] } else { vec![cols, rows] };
            return Err(RuntimeError::BadModel(format!(
                "{}: tensor '{name}' has shape {dims:?}, the metadata implies {want:?}",
                self.file.label()
            )));
        }
        let view =
            WeightView { name, ty: info.ggml_type(), cols, rows, data: self.file.tensor_data(info), file: self.file };
        self.b.load_weight(&view).map(Some)
    }

    /// A small tensor's values as f32 (λ vectors, rope factors), read on the host.
    fn values(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>, RuntimeError> {
        let Some(info) = self.file.tensor(name) else { return Ok(None) };
        if info.n_elements() != len as u64 {
            return Err(RuntimeError::BadModel(format!(
                "{}: tensor '{name}' has {} values, expected {len}",
                self.file.label(),
                info.n_elements()
            )));
        }
        let mut v = vec![0f32; len];
        duet_quant::dequantize(info.ggml_type(), self.file.tensor_data(info), &mut v)
            .map_err(|e| RuntimeError::BadModel(format!("{}: tensor '{name}': {e}", self.file.label())))?;
        Ok(Some(v))
    }
}

pub fn load<B: Backend>(b: &mut B, file: Arc<GgufFile>) -> Result<Model<B>, RuntimeError> {
    let c = ModelConfig::from_gguf(&file)?;
    let mut ld = Loader { file: &file, b };
    let (d, hd, ff) = (c.n_embd, c.head_dim, c.n_ff);
    let (qd, kvd, od) = (c.q_dim(), c.kv_dim(), c.attn_out_dim());

    let freq_factors = ld.values("rope_freqs.weight", c.rope.n_rot / 2)?;
    let rope =
        RopeSpec { n_rot: c.rope.n_rot, freq_base: c.rope.freq_base, freq_scale: c.rope.freq_scale, freq_factors };

    let dex_mask: Option<Vec<u8>> = match file.get("duet.dex.head_mask") {
        Some(duet_quant::gguf::Value::Array(duet_quant::gguf::Array::U8(m))) if m.len() == c.n_layers * c.n_heads => {
            Some(m.clone())
        }
        Some(_) => {
            return Err(RuntimeError::BadModel(format!(
                "{}: duet.dex.head_mask must be a u8 array of n_layers × n_heads",
                file.label()
            )));
        }
        None => None,
    };

    let token_embd = ld.get("token_embd.weight", d, c.n_vocab)?;
    let output_norm = ld.get("output_norm.weight", d, 1)?;
    let output = ld.opt("output.weight", d, c.n_vocab)?;

    let mut layers = Vec::with_capacity(c.n_layers);
    for il in 0..c.n_layers {
        let p = |n: &str| format!("blk.{il}.{n}");
        let kind = match c.arch {
            Arch::Llama => AttentionKind::Standard,
            // V2 attends like a Llama with n_heads query heads; its pairs meet afterwards.
            Arch::DiffLlamaV2 => AttentionKind::PairedHeads,
            Arch::DiffLlama => {
                let mut vecs = Vec::with_capacity(4);
                for which in ["q1", "k1", "q2", "k2"] {
                    let name = p(&format!("attn_lambda_{which}.weight"));
                    vecs.push(ld.values(&name, hd)?.ok_or_else(|| {
                        RuntimeError::BadModel(format!("{}: diffllama layer {il} has no '{name}'", file.label()))
                    })?);
                }
                // λ = exp(Σ λ_q1·λ_k1) − exp(Σ λ_q2·λ_k2) + λ_init, once per layer.
                let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
                let li = lambda_init(il);
                let lambda = dot(&vecs[0], &vecs[1]).exp() - dot(&vecs[2], &vecs[3]).exp() + li;
                AttentionKind::Differential {
                    lambda,
                    lambda_init: li,
                    sub_norm: ld.values(&p("attn_sub_norm.weight"), 2 * hd)?,
                }
            }
        };
        let attention = AttentionSpec {
            kind,
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: hd,
            scale: (hd as f32).powf(-0.5),
            rms_eps: c.rms_eps,
            logit_quant: None,
        };
        let dex = match &dex_mask {
            Some(mask) => {
                let heads: Vec<usize> = (0..c.n_heads).filter(|&h| mask[il * c.n_heads + h] != 0).collect();
                if heads.is_empty() {
                    None
                } else {
                    let w_d = ld.get(&p("attn_dex.weight"), hd, hd)?;
                    let lambda = ld.values(&p("attn_dex_lambda.weight"), 1)?.ok_or_else(|| {
                        RuntimeError::BadModel(format!(
                            "{}: DEX layer {il} has no attn_dex_lambda.weight",
                            file.label()
                        ))
                    })?[0];
                    Some((w_d, lambda, heads))
                }
            }
            None => None,
        };
        layers.push(Layer {
            attn_norm: ld.get(&p("attn_norm.weight"), d, 1)?,
            wq: ld.get(&p("attn_q.weight"), d, qd)?,
            wk: ld.get(&p("attn_k.weight"), d, kvd)?,
            wv: ld.get(&p("attn_v.weight"), d, kvd)?,
            wo: ld.get(&p("attn_output.weight"), od, d)?,
            bq: ld.opt(&p("attn_q.bias"), qd, 1)?,
            bk: ld.opt(&p("attn_k.bias"), kvd, 1)?,
            bv: ld.opt(&p("attn_v.bias"), kvd, 1)?,
            bo: ld.opt(&p("attn_output.bias"), d, 1)?,
            attention,
            lambda_proj: match c.arch {
                Arch::DiffLlamaV2 => Some(ld.get(&p("attn_lambda.weight"), d, c.n_heads / 2)?),
                Arch::Llama | Arch::DiffLlama => None,
            },
            dex,
            ffn_norm: ld.get(&p("ffn_norm.weight"), d, 1)?,
            w_gate: ld.get(&p("ffn_gate.weight"), d, ff)?,
            w_up: ld.get(&p("ffn_up.weight"), d, ff)?,
            w_down: ld.get(&p("ffn_down.weight"), ff, d)?,
            b_gate: ld.opt(&p("ffn_gate.bias"), ff, 1)?,
            b_up: ld.opt(&p("ffn_up.bias"), ff, 1)?,
            b_down: ld.opt(&p("ffn_down.bias"), d, 1)?,
        });
    }
    Ok(Model { config: c, file: Arc::clone(&file), token_embd, output_norm, output, layers, rope })
}
