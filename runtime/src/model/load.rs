//! Building a [`Model`] from GGUF tensors, checking every shape against the metadata.

use std::sync::Arc;

use duet_quant::gguf::{GgufFile, TensorInfo};

use super::source::TensorSource;
use super::{Arch, Layer, Model, ModelConfig};
use crate::backend::{AttentionKind, AttentionSpec, Backend, RopeSpec, WeightRole, WeightView};
use crate::error::RuntimeError;
use crate::gguf_names::{self as names, LayerTensor as T};

/// λ_init of DIFF layer `layer` (0-based): 0.8 − 0.6·exp(−0.3·layer).
pub fn lambda_init(layer: usize) -> f32 {
    (0.8 - 0.6 * (-0.3 * layer as f64).exp()) as f32
}

struct Loader<'a, B: Backend, S: TensorSource> {
    file: Arc<GgufFile>,
    src: &'a mut S,
    b: &'a mut B,
}

impl<B: Backend, S: TensorSource> Loader<'_, B, S> {
    fn missing(&self, name: &str) -> RuntimeError {
        RuntimeError::BadModel(format!("{}: the model has no tensor '{name}'", self.file.label()))
    }

    /// A tensor that must exist with GGUF dims `[cols, rows]` (or `[cols]` when rows == 1).
    async fn get(&mut self, name: &str, role: WeightRole, cols: usize, rows: usize) -> Result<B::Weight, RuntimeError> {
        self.opt(name, role, cols, rows).await?.ok_or_else(|| self.missing(name))
    }

    async fn opt(
        &mut self,
        name: &str,
        role: WeightRole,
        cols: usize,
        rows: usize,
    ) -> Result<Option<B::Weight>, RuntimeError> {
        let Some(info) = self.info(name, cols, rows)? else { return Ok(None) };
        self.src.fetch(&[&info]).await?;
        let view = Self::view(&self.file, self.src, &info, name, role, cols, rows)?;
        let w = self.b.load_weight(&view);
        self.src.release(&info);
        w.map(Some)
    }

    /// Matrices that must exist, (name, cols, rows) each, multiplied by the same input:
    /// loaded together ([`Backend::load_weight_group`]).
    async fn group(&mut self, tensors: &[(&str, usize, usize)]) -> Result<Vec<B::Weight>, RuntimeError> {
        let mut infos = Vec::with_capacity(tensors.len());
        for &(name, cols, rows) in tensors {
            infos.push(self.info(name, cols, rows)?.ok_or_else(|| self.missing(name))?);
        }
        self.src.fetch(&infos.iter().collect::<Vec<_>>()).await?;
        let mut views = Vec::with_capacity(tensors.len());
        for (info, &(name, cols, rows)) in infos.iter().zip(tensors) {
            views.push(Self::view(&self.file, self.src, info, name, WeightRole::Matrix, cols, rows)?);
        }
        let ws = self.b.load_weight_group(&views);
        for info in &infos {
            self.src.release(info);
        }
        ws
    }

    /// The tensor `name` if the file has it, checked to have GGUF dims `[cols, rows]` (or
    /// `[cols]` when rows == 1).
    fn info(&self, name: &str, cols: usize, rows: usize) -> Result<Option<TensorInfo>, RuntimeError> {
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
        Ok(Some(info.clone()))
    }

    /// A fetched tensor as the backend receives it.
    fn view<'v>(
        file: &'v Arc<GgufFile>,
        src: &'v S,
        info: &TensorInfo,
        name: &'v str,
        role: WeightRole,
        cols: usize,
        rows: usize,
    ) -> Result<WeightView<'v>, RuntimeError> {
        Ok(WeightView {
            name,
            role,
            ty: info.ggml_type(),
            cols,
            rows,
            data: src.data(info)?,
            file: src.in_file().then_some(file),
        })
    }

    /// A small tensor's values as f32 (λ vectors, rope factors), read on the host.
    async fn values(&mut self, name: &str, len: usize) -> Result<Option<Vec<f32>>, RuntimeError> {
        let Some(info) = self.file.tensor(name).cloned() else { return Ok(None) };
        if info.n_elements() != len as u64 {
            return Err(RuntimeError::BadModel(format!(
                "{}: tensor '{name}' has {} values, expected {len}",
                self.file.label(),
                info.n_elements()
            )));
        }
        self.src.fetch(&[&info]).await?;
        let mut v = vec![0f32; len];
        let r = duet_quant::dequantize(info.ggml_type(), self.src.data(&info)?, &mut v)
            .map_err(|e| RuntimeError::BadModel(format!("{}: tensor '{name}': {e}", self.file.label())));
        self.src.release(&info);
        r.map(|()| Some(v))
    }
}

/// A part of the model that [`load_from`] loads in one go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    TokenEmbd,
    Layer(usize),
    OutputNorm,
    Output,
    RopeFreqs,
}

/// The parts in the order the file stores them (each by its first tensor): a streamed file
/// is then read about one part ahead of the model — one layer, or the token table — however
/// its converter ordered them (llama.cpp's conversions of HF checkpoints store `blk.10`
/// before `blk.2`, and may store `output.weight` first). Parts the file lacks come last, in
/// the usual order (a missing one's error is then the first missing tensor).
fn load_order(file: &GgufFile, n_layers: usize) -> Vec<Part> {
    let mut parts = vec![Part::TokenEmbd];
    parts.extend((0..n_layers).map(Part::Layer));
    parts.extend([Part::OutputNorm, Part::Output, Part::RopeFreqs]);
    // Each part's slot in `parts`, computed (not searched: a file may hold many tensors).
    let slot = |name: &str| match (name, names::layer_of(name)) {
        (_, Some(il)) if il < n_layers => Some(1 + il),
        (names::TOKEN_EMBD, _) => Some(0),
        (names::OUTPUT_NORM, _) => Some(n_layers + 1),
        (names::OUTPUT, _) => Some(n_layers + 2),
        (names::ROPE_FREQS, _) => Some(n_layers + 3),
        _ => None,
    };
    let mut first = vec![usize::MAX; parts.len()];
    for (i, t) in file.tensors().iter().enumerate() {
        if let Some(k) = slot(t.name()) {
            first[k] = first[k].min(i);
        }
    }
    let mut order: Vec<usize> = (0..parts.len()).collect();
    order.sort_by_key(|&k| (first[k], k));
    order.into_iter().map(|k| parts[k]).collect()
}

/// Loads a model from a file at hand (see [`load_from`]).
pub fn load<B: Backend>(b: &mut B, file: Arc<GgufFile>) -> Result<Model<B>, RuntimeError> {
    crate::ready::finish(load_from(b, &mut Arc::clone(&file)))
}

/// Loads a model from `src`, asking for its tensors in about the order the file stores them
/// (the token table, the layers in file order, the output and the rest), so that a streamed
/// file is held one layer at a time.
pub async fn load_from<B: Backend, S: TensorSource>(b: &mut B, src: &mut S) -> Result<Model<B>, RuntimeError> {
    let file = Arc::clone(src.file());
    let c = ModelConfig::from_gguf(&file)?;
    let mut ld = Loader { file: Arc::clone(&file), src, b };
    let d = c.n_embd;

    let dex_mask: Option<Vec<u8>> = match file.get(names::DEX_HEAD_MASK) {
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

    // The tensors every model needs, checked (name and shape) before any is read: a stream
    // lacking one is refused before its download.
    for (name, role_cols, rows) in [(names::TOKEN_EMBD, d, c.n_vocab), (names::OUTPUT_NORM, d, 1)] {
        ld.info(name, role_cols, rows)?.ok_or_else(|| ld.missing(name))?;
    }
    let (mut token_embd, mut output_norm, mut output, mut freq_factors) = (None, None, None, None);
    let mut layers: Vec<Option<Layer<B>>> = (0..c.n_layers).map(|_| None).collect();
    for part in load_order(&file, c.n_layers) {
        match part {
            Part::TokenEmbd => token_embd = Some(ld.get(names::TOKEN_EMBD, WeightRole::Embedding, d, c.n_vocab).await?),
            Part::Layer(il) => layers[il] = Some(load_layer(&mut ld, &c, il, dex_mask.as_deref()).await?),
            Part::OutputNorm => output_norm = Some(ld.get(names::OUTPUT_NORM, WeightRole::Vector, d, 1).await?),
            Part::Output => output = ld.opt(names::OUTPUT, WeightRole::Matrix, d, c.n_vocab).await?,
            Part::RopeFreqs => freq_factors = ld.values(names::ROPE_FREQS, c.rope.n_rot / 2).await?,
        }
    }
    let rope =
        RopeSpec { n_rot: c.rope.n_rot, freq_base: c.rope.freq_base, freq_scale: c.rope.freq_scale, freq_factors };
    let (Some(token_embd), Some(output_norm)) = (token_embd, output_norm) else {
        unreachable!("load_order has every part, and a missing required tensor is an error")
    };
    let layers = layers.into_iter().map(|l| l.expect("load_order has every layer")).collect();
    Ok(Model { config: c, file: Arc::clone(&file), token_embd, output_norm, output, layers, rope })
}

/// Layer `il` (`dex_mask`: the file's DEX heads, n_layers × n_heads).
async fn load_layer<B: Backend, S: TensorSource>(
    ld: &mut Loader<'_, B, S>,
    c: &ModelConfig,
    il: usize,
    dex_mask: Option<&[u8]>,
) -> Result<Layer<B>, RuntimeError> {
    let file = Arc::clone(&ld.file);
    let (d, hd, ff) = (c.n_embd, c.head_dim, c.n_ff);
    let (qd, kvd, od) = (c.q_dim(), c.kv_dim(), c.attn_out_dim());
    let kind = match c.arch {
        Arch::Llama => AttentionKind::Standard,
        // V2 attends like a Llama with n_heads query heads; its pairs meet afterwards.
        Arch::DiffLlamaV2 => AttentionKind::PairedHeads,
        Arch::DiffLlama => {
            let mut vecs = Vec::with_capacity(4);
            for which in [T::AttnLambdaQ1, T::AttnLambdaK1, T::AttnLambdaQ2, T::AttnLambdaK2] {
                let name = which.name(il);
                vecs.push(ld.values(&name, hd).await?.ok_or_else(|| {
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
                sub_norm: ld.values(&T::AttnSubNorm.name(il), 2 * hd).await?,
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
                let w_d = ld.get(&T::AttnDex.name(il), WeightRole::HeadMatrix, hd, hd).await?;
                let lambda = ld.values(&T::AttnDexLambda.name(il), 1).await?.ok_or_else(|| {
                    RuntimeError::BadModel(format!(
                        "{}: DEX layer {il} has no {}",
                        file.label(),
                        T::AttnDexLambda.name(il)
                    ))
                })?[0];
                Some((w_d, lambda, heads))
            }
        }
        None => None,
    };
    // q, k, v (and V2's λ) read the same normalised input, gate and up likewise: each
    // group loaded together, so that a backend may multiply it in one pass.
    let (q, k, v, lam) = (T::AttnQ.name(il), T::AttnK.name(il), T::AttnV.name(il), T::AttnLambda.name(il));
    let mut qkv = vec![(q.as_str(), d, qd), (k.as_str(), d, kvd), (v.as_str(), d, kvd)];
    if c.arch == Arch::DiffLlamaV2 {
        qkv.push((lam.as_str(), d, c.n_heads / 2));
    }
    let mut qkv = ld.group(&qkv).await?.into_iter();
    let (wq, wk, wv) = (qkv.next().expect("q"), qkv.next().expect("k"), qkv.next().expect("v"));
    let lambda_proj = qkv.next();
    let (gate, up) = (T::FfnGate.name(il), T::FfnUp.name(il));
    let mut ffn = ld.group(&[(gate.as_str(), d, ff), (up.as_str(), d, ff)]).await?.into_iter();
    let (w_gate, w_up) = (ffn.next().expect("gate"), ffn.next().expect("up"));
    Ok(Layer {
        attn_norm: ld.get(&T::AttnNorm.name(il), WeightRole::Vector, d, 1).await?,
        wq,
        wk,
        wv,
        wo: ld.get(&T::AttnOutput.name(il), WeightRole::Matrix, od, d).await?,
        bq: ld.opt(&T::AttnQBias.name(il), WeightRole::Vector, qd, 1).await?,
        bk: ld.opt(&T::AttnKBias.name(il), WeightRole::Vector, kvd, 1).await?,
        bv: ld.opt(&T::AttnVBias.name(il), WeightRole::Vector, kvd, 1).await?,
        bo: ld.opt(&T::AttnOutputBias.name(il), WeightRole::Vector, d, 1).await?,
        attention,
        lambda_proj,
        dex,
        ffn_norm: ld.get(&T::FfnNorm.name(il), WeightRole::Vector, d, 1).await?,
        w_gate,
        w_up,
        w_down: ld.get(&T::FfnDown.name(il), WeightRole::Matrix, ff, d).await?,
        b_gate: ld.opt(&T::FfnGateBias.name(il), WeightRole::Vector, ff, 1).await?,
        b_up: ld.opt(&T::FfnUpBias.name(il), WeightRole::Vector, ff, 1).await?,
        b_down: ld.opt(&T::FfnDownBias.name(il), WeightRole::Vector, d, 1).await?,
    })
}
