//! Hyper-parameters read from GGUF metadata alone (`{arch}.*` keys), for the `llama`,
//! `diffllama` and `diffllama_v2` architectures.

use duet_quant::gguf::GgufFile;

use crate::error::RuntimeError;
use crate::gguf_names::keys;

/// The widest dimension a model may have ([`ModelConfig`]'s check).
const MAX_WIDTH: u64 = 1 << 24;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    DiffLlama,
    /// DIFF Transformer V2: standard attention over `attention.head_count` query heads, whose
    /// outputs 2i and 2i+1 are combined as `o_2i − sigmoid(λ_i(x))·o_2i+1` (see
    /// docs/diff-attention.md and docs/gguf-format.md).
    DiffLlamaV2,
}

impl Arch {
    pub const ALL: [Arch; 3] = [Arch::Llama, Arch::DiffLlama, Arch::DiffLlamaV2];

    /// As GGUF's `general.architecture` names it.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::DiffLlama => "diffllama",
            Arch::DiffLlamaV2 => "diffllama_v2",
        }
    }
}

#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub rms_eps: f32,
    /// Training context length (`{arch}.context_length`).
    pub n_ctx_train: usize,
    pub rope: RopeConfig,
}

#[derive(Clone, Debug)]
pub struct RopeConfig {
    /// Rotated dimensions per head (the first `n_rot` of `head_dim`).
    pub n_rot: usize,
    pub freq_base: f32,
    /// Linear scaling: positions are multiplied by this (1 / factor).
    pub freq_scale: f32,
}

impl ModelConfig {
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig, RuntimeError> {
        let label = file.label().to_string();
        let arch_name = file.get_str("general.architecture")?.to_string();
        let Some(arch) = Arch::ALL.into_iter().find(|a| a.name() == arch_name) else {
            return Err(RuntimeError::Unsupported(format!(
                "{label}: architecture '{arch_name}' is not supported (duet runs 'llama', 'diffllama' and 'diffllama_v2')"
            )));
        };
        let key = |k: &str| crate::gguf_names::key(arch, k);
        let u = |k: &str| -> Result<usize, RuntimeError> { Ok(file.get_u32(&key(k))? as usize) };
        let n_embd = u(keys::EMBEDDING_LENGTH)?;
        let n_heads = u(keys::HEAD_COUNT)?;
        let n_kv_heads = match file.get_u32_opt(&key(keys::HEAD_COUNT_KV))? {
            Some(n) => n as usize,
            None => n_heads,
        };
        let bad = |msg: String| RuntimeError::BadModel(format!("{label}: {msg}"));
        if n_heads == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
            return Err(bad(format!("{n_heads} attention heads cannot share {n_kv_heads} KV heads evenly")));
        }
        let head_dim = match file.get_u32_opt(&key(keys::KEY_LENGTH))? {
            Some(d) => d as usize,
            None if n_embd % n_heads == 0 => n_embd / n_heads,
            None => return Err(bad(format!("embedding length {n_embd} is not a multiple of {n_heads} heads"))),
        };
        if let Some(vl) = file.get_u32_opt(&key(keys::VALUE_LENGTH))?
            && vl as usize != head_dim
        {
            return Err(bad(format!("value length {vl} differs from key length {head_dim}; not supported")));
        }
        if arch == Arch::DiffLlama && (n_heads % 2 != 0 || n_kv_heads % 2 != 0) {
            return Err(bad(format!(
                "diffllama needs even head counts, got {n_heads} heads and {n_kv_heads} KV heads"
            )));
        }
        if arch == Arch::DiffLlamaV2 && n_heads % 2 != 0 {
            return Err(bad(format!(
                "diffllama_v2 pairs its query heads (2i, 2i+1): attention.head_count {n_heads} is odd"
            )));
        }
        let n_rot = match file.get_u32_opt(&key(keys::ROPE_DIMENSION_COUNT))? {
            Some(n) => n as usize,
            None => head_dim,
        };
        if n_rot > head_dim || n_rot % 2 != 0 {
            return Err(bad(format!("rope dimension count {n_rot} does not fit head size {head_dim}")));
        }
        let freq_scale = match file.get_str_opt(&key(keys::ROPE_SCALING_TYPE))? {
            None | Some("none") => 1.0,
            Some("linear") => 1.0 / file.get_f32(&key(keys::ROPE_SCALING_FACTOR))?,
            Some(other) => return Err(RuntimeError::Unsupported(format!("{label}: rope scaling '{other}'"))),
        };
        let n_vocab = match file.get_u32_opt(&key(keys::VOCAB_SIZE))? {
            Some(n) => n as usize,
            None => match file.tensor("token_embd.weight").map(|t| t.dims()) {
                Some([_, rows]) => *rows as usize,
                Some(dims) => {
                    return Err(bad(format!(
                        "token_embd.weight has shape {dims:?}; expected [n_embd, n_vocab], 2 dimensions"
                    )));
                }
                None => return Err(bad("no token_embd.weight tensor".into())),
            },
        };
        let c = ModelConfig {
            arch,
            n_vocab,
            n_embd,
            n_ff: u(keys::FEED_FORWARD_LENGTH)?,
            n_layers: u(keys::BLOCK_COUNT)?,
            n_heads,
            n_kv_heads,
            head_dim,
            rms_eps: file.get_f32(&key(keys::RMS_EPSILON))?,
            n_ctx_train: u(keys::CONTEXT_LENGTH)?,
            rope: RopeConfig {
                n_rot,
                freq_base: file.get_f32_opt(&key(keys::ROPE_FREQ_BASE))?.unwrap_or(10000.0),
                freq_scale,
            },
        };
        c.check(file).map_err(bad)?;
        Ok(c)
    }

    /// Values no model has, refused before anything is sized by them: zero sizes, a layer
    /// count the file's tensors do not back (block_count 2^31 once sized an allocation of
    /// 7.7 TB), a negative or non-finite epsilon, RoPE base or scale.
    fn check(&self, file: &GgufFile) -> Result<(), String> {
        for (what, v) in [
            ("embedding_length", self.n_embd),
            ("feed_forward_length", self.n_ff),
            ("block_count", self.n_layers),
            ("vocabulary size", self.n_vocab),
            ("attention.key_length", self.head_dim),
        ] {
            if v == 0 {
                return Err(format!("{what} is 0"));
            }
        }
        // Widths beyond any model's (the largest have 16,384-wide embeddings, 53,248-wide
        // feed-forwards, 256k vocabularies): products of them then fit a 32-bit usize.
        for (what, v) in [
            ("embedding_length", self.n_embd as u64),
            ("feed_forward_length", self.n_ff as u64),
            ("head_count × key_length", self.n_heads as u64 * self.head_dim as u64),
            ("head_count_kv × key_length", self.n_kv_heads as u64 * self.head_dim as u64),
            ("vocabulary size", self.n_vocab as u64),
        ] {
            if v > MAX_WIDTH {
                return Err(format!("{what} is {v}, more than duet handles ({MAX_WIDTH})"));
            }
        }
        // Every layer has its own tensors: the last layer's must be in the file.
        let last = format!("blk.{}.attn_norm.weight", self.n_layers - 1);
        if self.n_layers > file.tensors().len() || file.tensor(&last).is_none() {
            return Err(format!(
                "block_count is {}, but the file holds {} tensors and no '{last}'",
                self.n_layers,
                file.tensors().len()
            ));
        }
        if !(self.rms_eps.is_finite() && self.rms_eps >= 0.0) {
            return Err(format!("attention.layer_norm_rms_epsilon is {}: not a finite value ≥ 0", self.rms_eps));
        }
        if !(self.rope.freq_base.is_finite() && self.rope.freq_base > 0.0) {
            return Err(format!("rope.freq_base is {}: not a finite value > 0", self.rope.freq_base));
        }
        if !(self.rope.freq_scale.is_finite() && self.rope.freq_scale > 0.0) {
            return Err(format!(
                "the RoPE scale is {} (from rope.scaling.factor): not finite and > 0",
                self.rope.freq_scale
            ));
        }
        Ok(())
    }

    /// Query heads per KV head.
    pub fn gqa(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }

    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// The width of attn_output's input: V2 combines each pair of query heads into one.
    pub fn attn_out_dim(&self) -> usize {
        match self.arch {
            Arch::DiffLlamaV2 => self.q_dim() / 2,
            Arch::Llama | Arch::DiffLlama => self.q_dim(),
        }
    }
}
