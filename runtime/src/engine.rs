//! A loaded model ready to generate: backend, weights, tokenizer, chat template, and one
//! slot — a session whose K/V cache is reused across calls (a new prompt that starts with
//! the cached tokens only evaluates the rest) and the batch context that runs it, through
//! the same [`Model::decode`] as the server's scheduler runs its slots.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use duet_quant::gguf::GgufFile;
use web_time::Instant;

use crate::backend::Backend;
use crate::error::RuntimeError;
use crate::kv_cache::CacheFormat;
use crate::model::source::TensorSource;
use crate::model::{BatchContext, LogitGranularity, Logits, Model, ModelConfig, Session};
use crate::sampler::Sampler;
use crate::text::{ChatTemplate, TextStream, Tokenizer};

#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Context length (0: the model's training context, capped at 4096).
    pub n_ctx: usize,
    /// Largest batch of prompt tokens evaluated at once.
    pub batch: usize,
    pub k_type: CacheFormat,
    pub v_type: CacheFormat,
    /// Quantize the attention logits: (bits, granularity), see [`Model::set_logit_quant`].
    pub attn_logits: Option<(u32, LogitGranularity)>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions { n_ctx: 0, batch: 512, k_type: CacheFormat::F16, v_type: CacheFormat::F16, attn_logits: None }
    }
}

/// What one generation did.
#[derive(Clone, Debug, Default)]
pub struct GenStats {
    pub prompt_tokens: usize,
    /// Prompt tokens served from the cache (not evaluated again).
    pub reused_tokens: usize,
    pub prompt_time: Duration,
    pub generated: usize,
    pub gen_time: Duration,
    /// From the call to the first generated token's text (the prompt's evaluation and the
    /// first draw).
    pub first_token_time: Option<Duration>,
    pub stop: StopReason,
}

impl GenStats {
    pub fn prompt_tok_per_s(&self) -> f64 {
        let n = self.prompt_tokens - self.reused_tokens;
        if self.prompt_time.is_zero() { 0.0 } else { n as f64 / self.prompt_time.as_secs_f64() }
    }
    pub fn gen_tok_per_s(&self) -> f64 {
        if self.gen_time.is_zero() { 0.0 } else { self.generated as f64 / self.gen_time.as_secs_f64() }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StopReason {
    #[default]
    Limit,
    EndOfGeneration,
    ContextFull,
    Interrupted,
    /// The schema or grammar the output followed admits nothing more.
    GrammarComplete,
}

impl StopReason {
    /// Why generation stopped, in words.
    pub fn describe(self) -> &'static str {
        match self {
            StopReason::Limit => "reached the token limit",
            StopReason::EndOfGeneration => "the model ended its reply",
            StopReason::ContextFull => "the context is full",
            StopReason::Interrupted => "interrupted",
            StopReason::GrammarComplete => "the schema or grammar is complete",
        }
    }
}

pub struct Engine<B: Backend> {
    pub backend: B,
    pub model: Model<B>,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    pub session: Session<B>,
    /// Runs the session's batches (up to the options' batch size of prompt tokens a step).
    pub context: BatchContext<B>,
    /// Tokens whose K/V are in the session's cache, in order.
    cached: Vec<u32>,
    /// What loading changed from the options, and why (e.g. a cache type this model's
    /// head size cannot use, replaced by the nearest one that it can).
    pub notes: Vec<String>,
}

impl<B: Backend> Engine<B> {
    pub fn load(backend: B, path: &Path, opts: &EngineOptions) -> Result<Engine<B>, RuntimeError> {
        Self::from_gguf(backend, Arc::new(GgufFile::open(path)?), opts)
    }

    /// [`Engine::load`] of a file already open (or read into memory).
    pub fn from_gguf(backend: B, file: Arc<GgufFile>, opts: &EngineOptions) -> Result<Engine<B>, RuntimeError> {
        crate::ready::finish(Self::from_source(backend, &mut Arc::clone(&file), opts))
    }

    /// [`Engine::load`] of the file `src` gives: one at hand, or one streamed tensor by tensor
    /// (in a browser, the page's fetch: [`crate::model::source::Streamed`]).
    pub async fn from_source<S: TensorSource>(
        mut backend: B,
        src: &mut S,
        opts: &EngineOptions,
    ) -> Result<Engine<B>, RuntimeError> {
        // Before the weights (a stream's download): whether the backend binds the model's
        // activations, from the header alone.
        let config = ModelConfig::from_gguf(src.file())?;
        let n_ctx = if opts.n_ctx == 0 { config.n_ctx_train.min(4096) } else { opts.n_ctx };
        let batch = opts.batch.min(n_ctx);
        crate::model::check_context(&config, &backend, batch.max(1))?;
        // The model first: an unsupported architecture is the more useful error.
        let model = Model::load_from(&mut backend, src).await?;
        let file = Arc::clone(&model.file);
        let tokenizer = Tokenizer::from_gguf(&file)?;
        let has_chatml =
            tokenizer.token_to_id("<|im_start|>").is_some() && tokenizer.token_to_id("<|im_end|>").is_some();
        let text_of = |id: Option<u32>| id.and_then(|i| tokenizer.id_to_token(i)).unwrap_or_default();
        let template = ChatTemplate::new(
            file.get_str_opt("tokenizer.chat_template")?,
            has_chatml,
            &text_of(tokenizer.bos),
            &text_of(tokenizer.eos),
        )?;
        let mut spec = model.cache_spec(n_ctx, opts.k_type, opts.v_type);
        let mut notes = spec.resolve();
        if let Some(why) = &template.broken {
            notes.push(format!(
                "the model's chat template does not parse ({why}): chat and the server's chat endpoint will refuse, plain prompts run"
            ));
        }
        let n_train = model.config.n_ctx_train;
        if n_train > 0 && n_ctx > n_train {
            notes.push(format!(
                "a context of {n_ctx} tokens is longer than the model's training context of {n_train}: expect its output to degrade past {n_train} tokens"
            ));
        }
        backend.check_session(&model.config, &spec, batch)?;
        let context = model.new_context(&mut backend, batch)?;
        let mut session = model.new_session(&mut backend, n_ctx, spec.k_type, spec.v_type)?;
        model.set_logit_quant(&mut session, opts.attn_logits)?;
        Ok(Engine { backend, model, tokenizer, template, session, context, cached: Vec::new(), notes })
    }

    pub fn n_ctx(&self) -> usize {
        self.session.n_ctx
    }

    /// Quantizes the attention logits of this engine's session from now on (`None`: full
    /// precision); see [`Model::set_logit_quant`].
    pub fn set_logit_quant(&mut self, setting: Option<(u32, LogitGranularity)>) -> Result<(), RuntimeError> {
        self.model.set_logit_quant(&mut self.session, setting)?;
        // Cached K/V stay valid (logit quantization does not change them), but logits
        // computed from them would not match a fresh run: start over.
        self.reset();
        Ok(())
    }

    /// Forgets the cache.
    pub fn reset(&mut self) {
        self.session.reset();
        self.cached.clear();
    }

    /// Evaluates `tokens` as the whole context, reusing the longest cached prefix, and
    /// returns the last position's logits.
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<(Vec<f32>, usize), RuntimeError> {
        crate::ready::finish(self.prefill_async(tokens))
    }

    /// [`Engine::prefill`] as a future ([`Model::decode_async`]).
    pub async fn prefill_async(&mut self, tokens: &[u32]) -> Result<(Vec<f32>, usize), RuntimeError> {
        if tokens.is_empty() {
            return Err(RuntimeError::Usage("the prompt is empty".into()));
        }
        if tokens.len() > self.n_ctx() {
            return Err(RuntimeError::ContextFull { n_ctx: self.n_ctx(), needed: tokens.len() });
        }
        let mut common = self.cached.iter().zip(tokens).take_while(|(a, b)| a == b).count();
        // At least one token must be evaluated to get logits.
        if common == tokens.len() {
            common -= 1;
        }
        let common = self.session.truncate(common);
        self.cached.truncate(common);
        let logits = self.eval_async(&tokens[common..], Logits::Last).await?;
        Ok((logits, common))
    }

    /// Evaluates one more token after the cached ones.
    pub fn step(&mut self, token: u32) -> Result<Vec<f32>, RuntimeError> {
        self.eval(&[token], Logits::Last)
    }

    /// [`Engine::step`] as a future.
    pub async fn step_async(&mut self, token: u32) -> Result<Vec<f32>, RuntimeError> {
        self.eval_async(&[token], Logits::Last).await
    }

    /// Runs `tokens` after the cached ones (a batch of this one sequence), which then hold
    /// them too, and returns their logits as `want` says.
    pub fn eval(&mut self, tokens: &[u32], want: Logits) -> Result<Vec<f32>, RuntimeError> {
        crate::ready::finish(self.eval_async(tokens, want))
    }

    /// [`Engine::eval`] as a future.
    pub async fn eval_async(&mut self, tokens: &[u32], want: Logits) -> Result<Vec<f32>, RuntimeError> {
        match self.model.decode_one_async(&mut self.backend, &mut self.context, &mut self.session, tokens, want).await {
            Ok(logits) => {
                self.cached.extend_from_slice(tokens);
                Ok(logits)
            }
            Err(e) => {
                // decode gave the session back its positions, or fewer.
                self.cached.truncate(self.session.n_past);
                Err(e)
            }
        }
    }

    /// Generates after `prompt` until an end-of-generation token, `max_new` tokens, a full
    /// context, the end of `sampler`'s grammar, or `on_text` returning false. `on_text`
    /// receives text as soon as it is complete UTF-8. The generated tokens end up in the
    /// cache (an end token too). A grammar's next mask is computed on a helper thread while
    /// the forward pass runs.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        max_new: usize,
        sampler: &mut Sampler,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<(Vec<u32>, GenStats), RuntimeError> {
        let mut stats = GenStats { prompt_tokens: prompt.len(), ..Default::default() };
        let t0 = Instant::now();
        let (mut logits, reused) = self.prefill(prompt)?;
        stats.reused_tokens = reused;
        stats.prompt_time = t0.elapsed();
        let t1 = Instant::now();
        let mut history: Vec<u32> = prompt.to_vec();
        let mut out = Vec::new();
        let mut stream = TextStream::new();
        loop {
            if out.len() >= max_new {
                stats.stop = StopReason::Limit;
                break;
            }
            check_logits(&logits, out.len())?;
            let tok = sampler.sample(&mut logits, &history);
            if let Some(e) = sampler.error() {
                return Err(RuntimeError::Grammar(e.to_string()));
            }
            if self.tokenizer.is_eog(tok) {
                stats.stop = StopReason::EndOfGeneration;
                break;
            }
            out.push(tok);
            history.push(tok);
            let text = stream.push(&self.tokenizer, tok)?;
            stats.first_token_time.get_or_insert_with(|| t0.elapsed());
            if !text.is_empty() && !on_text(&text) {
                stats.stop = StopReason::Interrupted;
                break;
            }
            if sampler.is_complete() {
                stats.stop = StopReason::GrammarComplete;
                break;
            }
            if self.cached.len() >= self.n_ctx() {
                stats.stop = StopReason::ContextFull;
                break;
            }
            logits = if sampler.is_constrained() {
                std::thread::scope(|scope| {
                    scope.spawn(|| sampler.prepare());
                    self.step(tok)
                })?
            } else {
                self.step(tok)?
            };
        }
        let rest = stream.flush(&self.tokenizer)?;
        if !rest.is_empty() {
            on_text(&rest);
        }
        stats.generated = out.len();
        stats.gen_time = t1.elapsed();
        Ok((out, stats))
    }
}

/// Refuses logits that are not all finite (a NaN once sampled as the end of generation: 0
/// tokens, exit 0, no word of why): an error naming the step and the first bad value.
pub fn check_logits(logits: &[f32], generated: usize) -> Result<(), RuntimeError> {
    match logits.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(id) => Err(RuntimeError::BadModel(format!(
            "the model's logits for generated token {} are not finite ({} for token id {id}): its weights or this run's settings (cache type, attention-logit bits) produce non-numbers",
            generated + 1,
            logits[id]
        ))),
    }
}
