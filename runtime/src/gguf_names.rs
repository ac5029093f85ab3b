//! The GGUF names of duet's architectures, defined once: the converter writes these tensors
//! and keys, the loader reads them. Llama's follow llama.cpp (`llama-arch.cpp`); the DIFF and
//! DEX tensors and the `duet.*` keys are duet's own (docs/gguf-format.md, "What the GGUF holds").

/// Token embeddings, `[n_embd, n_vocab]`.
pub const TOKEN_EMBD: &str = "token_embd.weight";
/// The final norm's weight, `[n_embd]`.
pub const OUTPUT_NORM: &str = "output_norm.weight";
/// The output projection, `[n_embd, n_vocab]`; absent when tied to [`TOKEN_EMBD`].
pub const OUTPUT: &str = "output.weight";
/// Llama 3's per-pair RoPE frequency divisors, `[n_rot / 2]`.
pub const ROPE_FREQS: &str = "rope_freqs.weight";
/// u8 per (layer, head): 1 where DEX applies (files converted with `--keep-dex`).
pub const DEX_HEAD_MASK: &str = "duet.dex.head_mask";

/// The layer N of a tensor named `blk.N.…`.
pub fn layer_of(name: &str) -> Option<usize> {
    let (n, _) = name.strip_prefix("blk.")?.split_once('.')?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok()
}

/// The tensors of layer N (`blk.N.*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerTensor {
    AttnNorm,
    AttnQ,
    AttnK,
    AttnV,
    AttnOutput,
    AttnQBias,
    AttnKBias,
    AttnVBias,
    AttnOutputBias,
    /// DIFF V1's λ vectors, `[head_dim]` each.
    AttnLambdaQ1,
    AttnLambdaK1,
    AttnLambdaQ2,
    AttnLambdaK2,
    /// DIFF V1's optional learned sub-norm weight (official checkpoints), `[2·head_dim]`.
    AttnSubNorm,
    /// DIFF V2's lambda_proj, `[n_embd, n_heads / 2]`.
    AttnLambda,
    /// DEX's W_D, `[head_dim, head_dim]`, and its λ, `[1]`.
    AttnDex,
    AttnDexLambda,
    FfnNorm,
    FfnGate,
    FfnUp,
    FfnDown,
    FfnGateBias,
    FfnUpBias,
    FfnDownBias,
}

impl LayerTensor {
    /// The name after `blk.N.`.
    pub fn suffix(self) -> &'static str {
        use LayerTensor::*;
        match self {
            AttnNorm => "attn_norm.weight",
            AttnQ => "attn_q.weight",
            AttnK => "attn_k.weight",
            AttnV => "attn_v.weight",
            AttnOutput => "attn_output.weight",
            AttnQBias => "attn_q.bias",
            AttnKBias => "attn_k.bias",
            AttnVBias => "attn_v.bias",
            AttnOutputBias => "attn_output.bias",
            AttnLambdaQ1 => "attn_lambda_q1.weight",
            AttnLambdaK1 => "attn_lambda_k1.weight",
            AttnLambdaQ2 => "attn_lambda_q2.weight",
            AttnLambdaK2 => "attn_lambda_k2.weight",
            AttnSubNorm => "attn_sub_norm.weight",
            AttnLambda => "attn_lambda.weight",
            AttnDex => "attn_dex.weight",
            AttnDexLambda => "attn_dex_lambda.weight",
            FfnNorm => "ffn_norm.weight",
            FfnGate => "ffn_gate.weight",
            FfnUp => "ffn_up.weight",
            FfnDown => "ffn_down.weight",
            FfnGateBias => "ffn_gate.bias",
            FfnUpBias => "ffn_up.bias",
            FfnDownBias => "ffn_down.bias",
        }
    }

    /// `blk.{layer}.{suffix}`.
    pub fn name(self, layer: usize) -> String {
        format!("blk.{layer}.{}", self.suffix())
    }
}

/// Hyper-parameter keys, each under the architecture's prefix ([`key`]).
pub mod keys {
    pub const CONTEXT_LENGTH: &str = "context_length";
    pub const EMBEDDING_LENGTH: &str = "embedding_length";
    pub const BLOCK_COUNT: &str = "block_count";
    pub const FEED_FORWARD_LENGTH: &str = "feed_forward_length";
    pub const HEAD_COUNT: &str = "attention.head_count";
    pub const HEAD_COUNT_KV: &str = "attention.head_count_kv";
    pub const KEY_LENGTH: &str = "attention.key_length";
    pub const VALUE_LENGTH: &str = "attention.value_length";
    pub const RMS_EPSILON: &str = "attention.layer_norm_rms_epsilon";
    pub const ROPE_DIMENSION_COUNT: &str = "rope.dimension_count";
    pub const ROPE_FREQ_BASE: &str = "rope.freq_base";
    pub const ROPE_SCALING_TYPE: &str = "rope.scaling.type";
    pub const ROPE_SCALING_FACTOR: &str = "rope.scaling.factor";
    pub const VOCAB_SIZE: &str = "vocab_size";
}

/// `{arch}.{key}`, e.g. `diffllama.block_count`.
pub fn key(arch: crate::model_config::Arch, key: &str) -> String {
    format!("{}.{key}", arch.name())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_llama_cpp_s() {
        assert_eq!(LayerTensor::AttnQ.name(3), "blk.3.attn_q.weight");
        assert_eq!(layer_of("blk.3.attn_q.weight"), Some(3));
        assert_eq!(layer_of("blk.12.ffn_up.bias"), Some(12));
        for other in ["token_embd.weight", "blk..x", "blk.+1.x", "blk.3", "blk.x1.y"] {
            assert_eq!(layer_of(other), None, "{other}");
        }
        assert_eq!(LayerTensor::FfnDownBias.name(0), "blk.0.ffn_down.bias");
        assert_eq!(key(crate::model_config::Arch::DiffLlamaV2, keys::BLOCK_COUNT), "diffllama_v2.block_count");
    }
}

/// A model's recommended sampling, llama.cpp's `general.sampling.*` keys: what `duet
/// convert` stores from `generation_config.json` and `run`, `chat` and `serve` use as their
/// defaults (a flag or a request field overrides each).
pub mod sampling {
    /// f32: `temperature`.
    pub const TEMP: &str = "general.sampling.temp";
    /// i32: `top_k`.
    pub const TOP_K: &str = "general.sampling.top_k";
    /// f32: `top_p`.
    pub const TOP_P: &str = "general.sampling.top_p";
    /// f32: `min_p`.
    pub const MIN_P: &str = "general.sampling.min_p";
    /// f32: `repetition_penalty`.
    pub const PENALTY_REPEAT: &str = "general.sampling.penalty_repeat";
}
