//! The one model code path for Llama, DiffLlama and DEX: a Llama layer skeleton whose
//! attention variant is chosen per layer ([`AttentionKind`]), written once against
//! [`Backend`].

pub mod config;
mod load;

use std::sync::Arc;

use duet_quant::gguf::GgufFile;

pub use config::{Arch, ModelConfig};

use crate::backend::{AttentionSpec, Backend, LogitQuant, LogitScale, Probe, RopeSpec};
use crate::error::RuntimeError;
use crate::kv_cache::{CacheType, KvCacheSpec};

/// Where the absmax of a logit quantization comes from (see [`LogitScale`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LogitGranularity {
    Tensor,
    Head,
    Row,
    Static,
}

impl LogitGranularity {
    pub const ALL: [LogitGranularity; 4] =
        [LogitGranularity::Tensor, LogitGranularity::Head, LogitGranularity::Row, LogitGranularity::Static];

    pub fn name(self) -> &'static str {
        match self {
            LogitGranularity::Tensor => "tensor",
            LogitGranularity::Head => "head",
            LogitGranularity::Row => "row",
            LogitGranularity::Static => "static",
        }
    }

    pub fn parse(s: &str) -> Option<LogitGranularity> {
        LogitGranularity::ALL.into_iter().find(|g| g.name() == s)
    }
}

/// Weights of one transformer block. Shapes (rows × cols, i.e. out × in) in comments.
pub struct Layer<B: Backend> {
    pub attn_norm: B::Weight, // 1 × n_embd
    pub wq: B::Weight,        // n_heads·hd × n_embd
    pub wk: B::Weight,        // n_kv_heads·hd × n_embd
    pub wv: B::Weight,        // n_kv_heads·hd × n_embd
    pub wo: B::Weight,        // n_embd × n_heads·hd
    pub bq: Option<B::Weight>,
    pub bk: Option<B::Weight>,
    pub bv: Option<B::Weight>,
    pub bo: Option<B::Weight>,
    pub attention: AttentionSpec,
    /// DEX kept unfolded: (W_D hd × hd, λ, adapted heads).
    pub dex: Option<(B::Weight, f32, Vec<usize>)>,
    pub ffn_norm: B::Weight, // 1 × n_embd
    pub w_gate: B::Weight,   // n_ff × n_embd
    pub w_up: B::Weight,     // n_ff × n_embd
    pub w_down: B::Weight,   // n_embd × n_ff
    pub b_gate: Option<B::Weight>,
    pub b_up: Option<B::Weight>,
    pub b_down: Option<B::Weight>,
}

pub struct Model<B: Backend> {
    pub config: ModelConfig,
    pub file: Arc<GgufFile>,
    pub token_embd: B::Weight, // n_vocab × n_embd
    pub output_norm: B::Weight,
    /// None when tied to `token_embd`.
    pub output: Option<B::Weight>, // n_vocab × n_embd
    pub layers: Vec<Layer<B>>,
    pub rope: RopeSpec,
}

/// Which logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last position's (generation).
    Last,
    /// Every position's (perplexity, logit dumps).
    All,
}

/// Per-conversation state: the K/V cache, the number of cached positions, and scratch
/// activations sized for the largest batch.
pub struct Session<B: Backend> {
    pub cache: B::KvCache,
    /// What the cache holds and how.
    pub cache_spec: KvCacheSpec,
    pub n_past: usize,
    pub n_ctx: usize,
    pub max_batch: usize,
    x: B::Tensor,    // batch × n_embd: the residual stream
    xn: B::Tensor,   // batch × n_embd: normalised
    q: B::Tensor,    // batch × q_dim
    k: B::Tensor,    // batch × kv_dim
    v: B::Tensor,    // batch × kv_dim
    att: B::Tensor,  // batch × q_dim
    proj: B::Tensor, // batch × n_embd
    gate: B::Tensor, // batch × n_ff
    up: B::Tensor,   // batch × n_ff
    last: B::Tensor, // 1 × n_embd
    logits: B::Tensor,
    logits_rows: usize,
}

impl<B: Backend> Model<B> {
    /// Loads a model from an open GGUF file onto `backend`.
    pub fn load(backend: &mut B, file: Arc<GgufFile>) -> Result<Model<B>, RuntimeError> {
        load::load(backend, file)
    }

    /// Quantizes the attention logits of every layer (`None`: full precision). `bits` 2 to
    /// 16; `granularity` one of tensor, head, row, or static (scales from the file's
    /// calibration, `duet.calibration.logits.absmax`).
    pub fn set_logit_quant(&mut self, setting: Option<(u32, LogitGranularity)>) -> Result<(), RuntimeError> {
        let Some((bits, granularity)) = setting else {
            for l in &mut self.layers {
                l.attention.logit_quant = None;
            }
            return Ok(());
        };
        if !(2..=16).contains(&bits) {
            return Err(RuntimeError::Usage(format!("attention-logit bits must be 2 to 16, got {bits}")));
        }
        let c = &self.config;
        let statics = match granularity {
            LogitGranularity::Static => {
                let key = "duet.calibration.logits.absmax";
                let v = match self.file.get(key) {
                    Some(_) => self.file.get_f32_array(key)?.to_vec(),
                    None => {
                        return Err(RuntimeError::Usage(format!(
                            "{} has no attention-logit calibration ({key}): convert it with --calibrate TEXT for static scales",
                            self.file.label()
                        )));
                    }
                };
                if v.len() != c.n_layers * c.n_heads || v.iter().any(|a| !a.is_finite() || *a <= 0.0) {
                    return Err(RuntimeError::BadModel(format!(
                        "{}: {key} must hold {} positive values (n_layers × n_heads), found {}",
                        self.file.label(),
                        c.n_layers * c.n_heads,
                        v.len()
                    )));
                }
                Some(v)
            }
            _ => None,
        };
        let n_heads = c.n_heads;
        for (il, l) in self.layers.iter_mut().enumerate() {
            let scale = match granularity {
                LogitGranularity::Tensor => LogitScale::Tensor,
                LogitGranularity::Head => LogitScale::Head,
                LogitGranularity::Row => LogitScale::Row,
                LogitGranularity::Static => {
                    LogitScale::Static(statics.as_ref().expect("read above")[il * n_heads..(il + 1) * n_heads].to_vec())
                }
            };
            l.attention.logit_quant = Some(LogitQuant { bits, scale });
        }
        Ok(())
    }

    /// The K/V cache of this model for `n_ctx` positions in the given types.
    pub fn cache_spec(&self, n_ctx: usize, k_type: CacheType, v_type: CacheType) -> KvCacheSpec {
        let c = &self.config;
        KvCacheSpec { n_layers: c.n_layers, n_ctx, kv_dim: c.kv_dim(), head_dim: c.head_dim, k_type, v_type }
    }

    /// A new session with a K/V cache for `n_ctx` positions.
    pub fn new_session(
        &self,
        b: &mut B,
        n_ctx: usize,
        max_batch: usize,
        k_type: CacheType,
        v_type: CacheType,
    ) -> Result<Session<B>, RuntimeError> {
        let c = &self.config;
        let spec = self.cache_spec(n_ctx, k_type, v_type);
        spec.check()?;
        let mb = max_batch.max(1);
        if let Some(limit) = b.max_tensor_bytes() {
            let widest = [c.n_embd, c.q_dim(), c.kv_dim(), c.n_ff].into_iter().max().unwrap_or(0);
            if (c.n_vocab * 4) as u64 > limit {
                return Err(RuntimeError::Device(format!(
                    "one row of logits ({} values) exceeds the largest buffer {} binds ({limit} bytes)",
                    c.n_vocab,
                    b.describe()
                )));
            }
            if (mb * widest * 4) as u64 > limit {
                return Err(RuntimeError::Device(format!(
                    "a batch of {mb} tokens needs activations of {} bytes, more than {} binds at once ({limit} bytes): lower --batch-size to {} or less",
                    mb * widest * 4,
                    b.describe(),
                    limit as usize / (widest * 4)
                )));
            }
        }
        Ok(Session {
            cache: b.new_kv_cache(&spec)?,
            cache_spec: spec,
            n_past: 0,
            n_ctx,
            max_batch: mb,
            x: b.new_tensor(mb, c.n_embd),
            xn: b.new_tensor(mb, c.n_embd),
            q: b.new_tensor(mb, c.q_dim()),
            k: b.new_tensor(mb, c.kv_dim()),
            v: b.new_tensor(mb, c.kv_dim()),
            att: b.new_tensor(mb, c.q_dim()),
            proj: b.new_tensor(mb, c.n_embd),
            gate: b.new_tensor(mb, c.n_ff),
            up: b.new_tensor(mb, c.n_ff),
            last: b.new_tensor(1, c.n_embd),
            logits: b.new_tensor(1, c.n_vocab),
            logits_rows: 1,
        })
    }

    /// Runs `tokens` at positions `s.n_past..` and returns logits (`Last`: n_vocab values;
    /// `All`: tokens.len() × n_vocab). Long inputs are processed in batches of
    /// `s.max_batch`.
    pub fn forward(
        &self,
        b: &mut B,
        s: &mut Session<B>,
        tokens: &[u32],
        want: Logits,
    ) -> Result<Vec<f32>, RuntimeError> {
        if tokens.is_empty() {
            return Err(RuntimeError::Usage("nothing to evaluate: the token list is empty".into()));
        }
        if s.n_past + tokens.len() > s.n_ctx {
            return Err(RuntimeError::ContextFull { n_ctx: s.n_ctx, needed: s.n_past + tokens.len() });
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.config.n_vocab) {
            return Err(RuntimeError::Usage(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.config.n_vocab
            )));
        }
        let mut all = Vec::new();
        let mut last = Vec::new();
        // All logits of a batch live in one tensor: on backends with a buffer limit, batches
        // shrink so that it fits (new_session checked that one row does).
        let batch = match (want, b.max_tensor_bytes()) {
            (Logits::All, Some(limit)) => s.max_batch.min((limit as usize / (4 * self.config.n_vocab)).max(1)),
            _ => s.max_batch,
        };
        for chunk in tokens.chunks(batch) {
            let out = self.forward_batch(b, s, chunk, want)?;
            match want {
                Logits::All => all.extend(out),
                Logits::Last => last = out,
            }
        }
        Ok(if want == Logits::All { all } else { last })
    }

    fn forward_batch(
        &self,
        b: &mut B,
        s: &mut Session<B>,
        tokens: &[u32],
        want: Logits,
    ) -> Result<Vec<f32>, RuntimeError> {
        let c = &self.config;
        let n = tokens.len();
        let pos0 = s.n_past;
        for t in [&mut s.x, &mut s.xn, &mut s.q, &mut s.k, &mut s.v, &mut s.att, &mut s.proj, &mut s.gate, &mut s.up] {
            b.set_rows(t, n);
        }
        b.embed(&self.token_embd, tokens, &mut s.x);
        for (il, l) in self.layers.iter().enumerate() {
            // Attention block.
            b.rms_norm(&s.x, &l.attn_norm, c.rms_eps, &mut s.xn);
            b.observe(Probe::AttnIn, il, pos0, &s.xn);
            b.matmul(&l.wq, &s.xn, &mut s.q);
            b.matmul(&l.wk, &s.xn, &mut s.k);
            b.matmul(&l.wv, &s.xn, &mut s.v);
            for (t, bias) in [(&mut s.q, &l.bq), (&mut s.k, &l.bk), (&mut s.v, &l.bv)] {
                if let Some(bias) = bias {
                    b.add_bias(t, bias);
                }
            }
            b.rope(&mut s.q, c.n_heads, c.head_dim, pos0, &self.rope);
            b.rope(&mut s.k, c.n_kv_heads, c.head_dim, pos0, &self.rope);
            // Keys first: an observer recomputing attention logits needs them for the queries.
            b.observe(Probe::K, il, pos0, &s.k);
            b.observe(Probe::V, il, pos0, &s.v);
            b.observe(Probe::Q, il, pos0, &s.q);
            b.attention(&s.q, &s.k, &s.v, &mut s.cache, il, pos0, &l.attention, &mut s.att);
            if let Some((w_d, lambda, heads)) = &l.dex {
                b.dex(&mut s.att, w_d, *lambda, heads, c.head_dim);
            }
            b.observe(Probe::AttnOut, il, pos0, &s.att);
            b.matmul(&l.wo, &s.att, &mut s.proj);
            if let Some(bias) = &l.bo {
                b.add_bias(&mut s.proj, bias);
            }
            b.add(&mut s.x, &s.proj);
            // Feed-forward block (SwiGLU).
            b.rms_norm(&s.x, &l.ffn_norm, c.rms_eps, &mut s.xn);
            b.observe(Probe::FfnIn, il, pos0, &s.xn);
            b.matmul(&l.w_gate, &s.xn, &mut s.gate);
            b.matmul(&l.w_up, &s.xn, &mut s.up);
            if let Some(bias) = &l.b_gate {
                b.add_bias(&mut s.gate, bias);
            }
            if let Some(bias) = &l.b_up {
                b.add_bias(&mut s.up, bias);
            }
            b.swiglu(&mut s.gate, &s.up);
            b.observe(Probe::FfnDownIn, il, pos0, &s.gate);
            b.matmul(&l.w_down, &s.gate, &mut s.proj);
            if let Some(bias) = &l.b_down {
                b.add_bias(&mut s.proj, bias);
            }
            b.add(&mut s.x, &s.proj);
            b.observe(Probe::Hidden, il, pos0, &s.x);
        }
        s.n_past += n;
        let output = self.output.as_ref().unwrap_or(&self.token_embd);
        match want {
            Logits::Last => {
                b.copy_row(&s.x, n - 1, &mut s.last);
                b.set_rows(&mut s.xn, 1);
                b.rms_norm(&s.last, &self.output_norm, c.rms_eps, &mut s.xn);
                if s.logits_rows != 1 {
                    s.logits = b.new_tensor(1, c.n_vocab);
                    s.logits_rows = 1;
                }
                b.set_rows(&mut s.logits, 1);
                b.matmul(output, &s.xn, &mut s.logits);
                b.read_rows(&s.logits, 0..1)
            }
            Logits::All => {
                b.rms_norm(&s.x, &self.output_norm, c.rms_eps, &mut s.xn);
                b.observe(Probe::OutputIn, c.n_layers, pos0, &s.xn);
                if s.logits_rows < n {
                    s.logits = b.new_tensor(n, c.n_vocab);
                    s.logits_rows = n;
                }
                b.set_rows(&mut s.logits, n);
                b.matmul(output, &s.xn, &mut s.logits);
                b.read_rows(&s.logits, 0..n)
            }
        }
    }
}

impl<B: Backend> Session<B> {
    /// Forgets everything: the next forward starts at position 0.
    pub fn reset(&mut self) {
        self.n_past = 0;
    }

    /// Drops cached positions from `n` on (they will be overwritten) and returns how many
    /// stay: `n`, or fewer where the cache keeps only whole groups
    /// ([`KvCacheSpec::keepable`]).
    pub fn truncate(&mut self, n: usize) -> usize {
        self.n_past = self.cache_spec.keepable(self.n_past, n);
        self.n_past
    }
}
