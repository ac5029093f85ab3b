//! HF tensor names and layouts → GGUF tensors, checked against config.json.
//!
//! Every output tensor records where its values come from and which exact transform turns
//! the HF values into the GGUF ones, so conversion can stream one tensor at a time.

use duet_runtime::gguf_names::{self as names, LayerTensor as T};

use crate::error::ConvertError;
use crate::hf_config::{Arch, HfConfig, RopeScaling, llama3_rope_factors};
use crate::safetensors::Checkpoint;

/// How an output tensor's values are produced.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// Copied from one checkpoint tensor (HF `[out, in]` row-major = GGUF dims `[in, out]`).
    Copy(String),
    /// Q or K projection (weight `[heads·hd, in]` or bias `[heads·hd]`): rows permuted within
    /// each head so that RoPE pairs adjacent rows (llama.cpp's `permute`): new row 2i+j of a
    /// head is old row j·hd/2 + i.
    PermuteRope { name: String, n_heads: usize },
    /// attn_output with DEX folded in: for each adapted head h,
    /// `Wo[:, h·dv..(h+1)·dv] ← Wo[:, h·dv..(h+1)·dv] · (I − λ·W_D)ᵀ`.
    DexFold { wo: String, wd: String, lambda: String, heads: Vec<usize>, head_dim: usize },
    /// Computed values (llama3 RoPE frequency factors).
    Values(Vec<f32>),
}

#[derive(Clone, Debug)]
pub struct OutTensor {
    pub name: String,
    /// GGUF dims, fastest first.
    pub dims: Vec<usize>,
    pub source: Source,
    /// Layer index for the per-layer mixing rules.
    pub layer: Option<usize>,
}

impl OutTensor {
    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }
}

/// Options that change which tensors are written.
#[derive(Clone, Copy, Debug, Default)]
pub struct MappingOptions {
    /// Keep DEX matrices as tensors for duet's runtime instead of folding them.
    pub keep_dex: bool,
}

/// Plans every output tensor and checks every source tensor's shape against the config.
pub fn plan(cfg: &HfConfig, ckpt: &Checkpoint, opts: MappingOptions) -> Result<Vec<OutTensor>, ConvertError> {
    let (d, ff, hd) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
    // Query heads (nq) and the heads attn_output reads (nh): the same but for V2's pairs.
    let (nq, nh, nkv, v) = (cfg.q_heads(), cfg.n_heads, cfg.n_kv_heads, cfg.vocab_size);
    let mut out = Vec::new();
    let mut used = std::collections::HashSet::new();
    // Expect `hf` with HF shape `shape`; returns its name.
    let mut expect = |hf: String, shape: &[usize]| -> Result<String, ConvertError> {
        let meta = ckpt.meta(&hf).ok_or_else(|| {
            ConvertError::shape(format!("the checkpoint has no tensor '{hf}', which config.json implies"))
        })?;
        // A scalar and a 1-element vector mean the same here.
        let same = meta.shape == shape || (shape == [1] && meta.shape.is_empty());
        if !same {
            return Err(ConvertError::shape(format!(
                "{}: tensor '{hf}' has shape {:?} but config.json implies {:?}",
                ckpt.path_of(meta).display(),
                meta.shape,
                shape
            )));
        }
        used.insert(hf.clone());
        Ok(hf)
    };
    let gguf_dims = |shape: &[usize]| shape.iter().rev().copied().collect::<Vec<_>>();
    let mut push = |name: String, shape: &[usize], source: Source, layer: Option<usize>| {
        out.push(OutTensor { name, dims: gguf_dims(shape), source, layer });
    };

    push(names::TOKEN_EMBD.into(), &[v, d], Source::Copy(expect("model.embed_tokens.weight".into(), &[v, d])?), None);
    if let Some(s @ RopeScaling::Llama3 { .. }) = cfg.rope_scaling {
        push(names::ROPE_FREQS.into(), &[hd / 2], Source::Values(llama3_rope_factors(cfg.rope_theta, hd, s)), None);
    }
    for l in 0..cfg.n_layers {
        let p = format!("model.layers.{l}");
        let at = Some(l);
        push(
            T::AttnNorm.name(l),
            &[d],
            Source::Copy(expect(format!("{p}.input_layernorm.weight"), &[d])?),
            at,
        );
        let q = expect(format!("{p}.self_attn.q_proj.weight"), &[nq * hd, d])?;
        push(T::AttnQ.name(l), &[nq * hd, d], Source::PermuteRope { name: q, n_heads: nq }, at);
        let k = expect(format!("{p}.self_attn.k_proj.weight"), &[nkv * hd, d])?;
        push(T::AttnK.name(l), &[nkv * hd, d], Source::PermuteRope { name: k, n_heads: nkv }, at);
        let vname = expect(format!("{p}.self_attn.v_proj.weight"), &[nkv * hd, d])?;
        push(T::AttnV.name(l), &[nkv * hd, d], Source::Copy(vname), at);
        let wo = expect(format!("{p}.self_attn.o_proj.weight"), &[d, nh * hd])?;
        let dex_heads = cfg.dex.as_ref().map(|x| x.heads[l].clone()).unwrap_or_default();
        if dex_heads.is_empty() {
            push(T::AttnOutput.name(l), &[d, nh * hd], Source::Copy(wo), at);
        } else {
            let wd = expect(format!("{p}.self_attn.dex_proj.weight"), &[hd, hd])?;
            let lambda = expect(format!("{p}.self_attn.dex_lambda"), &[1])?;
            if opts.keep_dex {
                push(T::AttnOutput.name(l), &[d, nh * hd], Source::Copy(wo), at);
                push(T::AttnDex.name(l), &[hd, hd], Source::Copy(wd), at);
                push(T::AttnDexLambda.name(l), &[1], Source::Copy(lambda), at);
            } else {
                let src = Source::DexFold { wo, wd, lambda, heads: dex_heads, head_dim: hd };
                push(T::AttnOutput.name(l), &[d, nh * hd], src, at);
            }
        }
        if cfg.attention_bias {
            let qb = expect(format!("{p}.self_attn.q_proj.bias"), &[nq * hd])?;
            push(T::AttnQBias.name(l), &[nq * hd], Source::PermuteRope { name: qb, n_heads: nq }, at);
            let kb = expect(format!("{p}.self_attn.k_proj.bias"), &[nkv * hd])?;
            push(T::AttnKBias.name(l), &[nkv * hd], Source::PermuteRope { name: kb, n_heads: nkv }, at);
            push(
                T::AttnVBias.name(l),
                &[nkv * hd],
                Source::Copy(expect(format!("{p}.self_attn.v_proj.bias"), &[nkv * hd])?),
                at,
            );
            push(
                T::AttnOutputBias.name(l),
                &[d],
                Source::Copy(expect(format!("{p}.self_attn.o_proj.bias"), &[d])?),
                at,
            );
        }
        match cfg.arch {
            Arch::DiffLlama => {
                for (which, t) in
                    [("q1", T::AttnLambdaQ1), ("k1", T::AttnLambdaK1), ("q2", T::AttnLambdaQ2), ("k2", T::AttnLambdaK2)]
                {
                    let src = expect(format!("{p}.self_attn.lambda_{which}"), &[hd])?;
                    push(t.name(l), &[hd], Source::Copy(src), at);
                }
            }
            Arch::DiffLlamaV2 => {
                // Always F32 (quant_plan keeps unknown tensors): h × hidden is tiny.
                let src = expect(format!("{p}.self_attn.lambda_proj.weight"), &[nh, d])?;
                push(T::AttnLambda.name(l), &[nh, d], Source::Copy(src), at);
            }
            Arch::Llama => {}
        }
        push(
            T::FfnNorm.name(l),
            &[d],
            Source::Copy(expect(format!("{p}.post_attention_layernorm.weight"), &[d])?),
            at,
        );
        push(
            T::FfnGate.name(l),
            &[ff, d],
            Source::Copy(expect(format!("{p}.mlp.gate_proj.weight"), &[ff, d])?),
            at,
        );
        push(
            T::FfnUp.name(l),
            &[ff, d],
            Source::Copy(expect(format!("{p}.mlp.up_proj.weight"), &[ff, d])?),
            at,
        );
        push(
            T::FfnDown.name(l),
            &[d, ff],
            Source::Copy(expect(format!("{p}.mlp.down_proj.weight"), &[d, ff])?),
            at,
        );
        if cfg.mlp_bias {
            for (hf, t, n) in [("gate_proj", T::FfnGateBias, ff), ("up_proj", T::FfnUpBias, ff), ("down_proj", T::FfnDownBias, d)] {
                push(t.name(l), &[n], Source::Copy(expect(format!("{p}.mlp.{hf}.bias"), &[n])?), at);
            }
        }
    }
    push(names::OUTPUT_NORM.into(), &[d], Source::Copy(expect("model.norm.weight".into(), &[d])?), None);
    // Tied models may still ship an lm_head copy; llama.cpp omits output.weight when tied.
    if !cfg.tie_word_embeddings {
        push(names::OUTPUT.into(), &[v, d], Source::Copy(expect("lm_head.weight".into(), &[v, d])?), None);
    } else if ckpt.meta("lm_head.weight").is_some() {
        used.insert("lm_head.weight".to_string());
    }
    let unused: Vec<&str> =
        ckpt.names().filter(|n| !used.contains(*n) && !n.ends_with("rotary_emb.inv_freq")).collect();
    if !unused.is_empty() {
        let shown: Vec<&str> = unused.iter().take(5).copied().collect();
        return Err(ConvertError::shape(format!(
            "the checkpoint has {} tensor(s) this {} config does not explain (e.g. {}): refusing to drop weights silently",
            unused.len(),
            cfg.arch.name(),
            shown.join(", ")
        )));
    }
    Ok(out)
}

/// Which source row each row of an output matrix is (see [`source_rows`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RowOrder {
    Same,
    /// [`Source::PermuteRope`]'s order: heads of `head_rows` rows, new row 2i+j of a head
    /// is its old row j·head_rows/2 + i.
    Rope {
        head_rows: usize,
    },
}

impl RowOrder {
    /// The source row of output row `r`.
    pub fn source(self, r: usize) -> usize {
        match self {
            RowOrder::Same => r,
            RowOrder::Rope { head_rows } => {
                let (h, k) = (r / head_rows, r % head_rows);
                h * head_rows + (k % 2) * (head_rows / 2) + k / 2
            }
        }
    }
}

/// For an output matrix whose rows are one checkpoint tensor's rows, in order or RoPE-
/// permuted: that tensor's name and the order. The converter then reads the rows straight
/// from the checkpoint in its threads instead of [`materialize`]-ing the whole tensor.
/// `None` for computed, folded and one-dimensional tensors.
pub fn source_rows(t: &OutTensor) -> Option<(&str, RowOrder)> {
    if t.dims.len() != 2 {
        return None;
    }
    match &t.source {
        Source::Copy(name) => Some((name, RowOrder::Same)),
        Source::PermuteRope { name, n_heads } if *n_heads > 0 && t.dims[1].is_multiple_of(2 * n_heads) => {
            Some((name, RowOrder::Rope { head_rows: t.dims[1] / n_heads }))
        }
        _ => None,
    }
}

/// Produces an output tensor's f32 values (GGUF order), reading its sources.
pub fn materialize(t: &OutTensor, ckpt: &Checkpoint) -> Result<Vec<f32>, ConvertError> {
    Ok(match &t.source {
        Source::Values(v) => v.clone(),
        Source::Copy(name) => ckpt.read_f32(name)?,
        Source::PermuteRope { name, n_heads } => {
            let x = ckpt.read_f32(name)?;
            let rows = t.dims.get(1).copied().unwrap_or(t.dims[0]);
            let row_len = if t.dims.len() > 1 { t.dims[0] } else { 1 };
            permute_rope_rows(&x, rows, row_len, *n_heads)
        }
        Source::DexFold { wo, wd, lambda, heads, head_dim } => {
            let mut w = ckpt.read_f32(wo)?;
            let wd = ckpt.read_f32(wd)?;
            let lambda = ckpt.read_f32(lambda)?[0];
            fold_dex(&mut w, t.dims[0], &wd, lambda, heads, *head_dim);
            w
        }
    })
}

/// The checkpoint tensors an output tensor reads (to release their pages afterwards).
pub fn source_names(t: &OutTensor) -> Vec<&str> {
    match &t.source {
        Source::Copy(n) | Source::PermuteRope { name: n, .. } => vec![n],
        Source::DexFold { wo, wd, lambda, .. } => vec![wo, wd, lambda],
        Source::Values(_) => vec![],
    }
}

/// llama.cpp's q/k permutation on `rows` rows of `row_len` values, `n_heads` heads.
pub fn permute_rope_rows(x: &[f32], rows: usize, row_len: usize, n_heads: usize) -> Vec<f32> {
    let hd = rows / n_heads;
    let half = hd / 2;
    let mut out = vec![0f32; x.len()];
    for h in 0..n_heads {
        for i in 0..half {
            for j in 0..2 {
                let dst = h * hd + 2 * i + j;
                let src = h * hd + j * half + i;
                out[dst * row_len..(dst + 1) * row_len].copy_from_slice(&x[src * row_len..(src + 1) * row_len]);
            }
        }
    }
    out
}

/// Folds DEX into `wo` (`[hidden][n_heads·hd]` row-major, `cols` = n_heads·hd):
/// `Wo[r][h·hd + j] −= λ · Σ_k Wo[r][h·hd + k] · W_D[j][k]` for each adapted head h.
pub fn fold_dex(wo: &mut [f32], cols: usize, wd: &[f32], lambda: f32, heads: &[usize], hd: usize) {
    let mut block = vec![0f32; hd];
    for row in wo.chunks_exact_mut(cols) {
        for &h in heads {
            let seg = &mut row[h * hd..(h + 1) * hd];
            block.copy_from_slice(seg);
            for j in 0..hd {
                // f64 accumulation keeps the fold exact to f32 rounding.
                let dot: f64 = (0..hd).map(|k| block[k] as f64 * wd[j * hd + k] as f64).sum();
                seg[j] = (block[j] as f64 - lambda as f64 * dot) as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RowOrder::Rope names, for every output row, the row permute_rope_rows puts there.
    #[test]
    fn rope_row_order_matches_the_permutation() {
        let (n_heads, hd, row_len) = (3, 8, 2);
        let rows = n_heads * hd;
        let x: Vec<f32> = (0..rows * row_len).map(|i| i as f32).collect();
        let permuted = permute_rope_rows(&x, rows, row_len, n_heads);
        let order = RowOrder::Rope { head_rows: hd };
        for r in 0..rows {
            let src = order.source(r);
            assert_eq!(&permuted[r * row_len..(r + 1) * row_len], &x[src * row_len..(src + 1) * row_len], "row {r}");
        }
        assert_eq!(RowOrder::Same.source(5), 5);
    }

    #[test]
    fn permutation_pairs_rotate_half_partners() {
        // One head of 4 rows (hd = 4), rows numbered: NeoX pairs (0,2), (1,3) become adjacent.
        let x: Vec<f32> = (0..8).map(|i| i as f32).collect(); // 4 rows × 2 columns
        let p = permute_rope_rows(&x, 4, 2, 1);
        assert_eq!(p, vec![0., 1., 4., 5., 2., 3., 6., 7.]);
    }

    #[test]
    fn dex_fold_matches_explicit_matrix_product() {
        let (hd, heads_total, hidden) = (2usize, 2usize, 3usize);
        let wo: Vec<f32> = (0..hidden * heads_total * hd).map(|i| (i as f32 * 0.37).sin()).collect();
        let wd = [0.5f32, -1.0, 0.25, 2.0];
        let lambda = 0.3;
        let mut folded = wo.clone();
        fold_dex(&mut folded, heads_total * hd, &wd, lambda, &[1], hd);
        for r in 0..hidden {
            for c in 0..heads_total * hd {
                let (h, j) = (c / hd, c % hd);
                let want = if h == 1 {
                    // (Wo_h · (I − λ W_D)ᵀ)[r][j] = Σ_k Wo_h[r][k] · (δ_jk − λ W_D[j][k])
                    (0..hd)
                        .map(|k| wo[r * 4 + h * hd + k] * (if j == k { 1.0 } else { 0.0 } - lambda * wd[j * hd + k]))
                        .sum::<f32>()
                } else {
                    wo[r * 4 + c]
                };
                assert!((folded[r * 4 + c] - want).abs() < 1e-6);
            }
        }
    }
}
