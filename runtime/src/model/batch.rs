//! The batch seam, as llama.cpp's `llama_batch`: a [`Batch`] holds tokens for one sequence
//! or many (each continuing its [`Session`] at its position), which logits each wants, and
//! [`Model::decode`] runs it: one code path for a prompt, one decoded token, a server's
//! slots decoding together, or prompts' chunks beside decoding tokens, probes included.
//!
//! A batch larger than its [`BatchContext`] holds runs as several steps (ubatches), each of
//! at most `cap` rows; a step's rows belong to sequences of one K/V cache, and while an
//! observer is installed to one sequence (probes report one sequence's positions). See
//! docs/batch-seam.md.

use std::sync::Arc;

use crate::backend::Backend;
use crate::error::RuntimeError;
use crate::model::step::{Acts, Part};
use crate::model::{Logits, Model, ModelConfig, Session};
use crate::observe::Probe;

/// One sequence's share of a [`Batch`].
pub struct BatchSeq<'s, 't, B: Backend> {
    /// The sequence: its tokens continue at `session.n_past`.
    pub session: &'s mut Session<B>,
    pub tokens: &'t [u32],
    /// `Last`: the last token's logits (n_vocab values); `All`: every token's.
    pub logits: Logits,
}

/// Tokens of one or more sequences to run together ([`Model::decode`]); each sequence at
/// most once.
pub struct Batch<'s, 't, B: Backend> {
    pub seqs: Vec<BatchSeq<'s, 't, B>>,
}

impl<'s, 't, B: Backend> Batch<'s, 't, B> {
    pub fn new() -> Self {
        Batch { seqs: Vec::new() }
    }

    /// A batch of one sequence (llama.cpp's `llama_batch_get_one`).
    pub fn one(session: &'s mut Session<B>, tokens: &'t [u32], logits: Logits) -> Self {
        Batch { seqs: vec![BatchSeq { session, tokens, logits }] }
    }

    /// Adds `tokens` continuing `session`.
    pub fn push(&mut self, session: &'s mut Session<B>, tokens: &'t [u32], logits: Logits) {
        self.seqs.push(BatchSeq { session, tokens, logits });
    }
}

impl<B: Backend> Default for Batch<'_, '_, B> {
    fn default() -> Self {
        Batch::new()
    }
}

/// What runs batches: the activations of up to `cap` rows (tokens of all sequences of a
/// step together), shared by every session it serves.
pub struct BatchContext<B: Backend> {
    pub(crate) acts: Acts<B>,
    cap: usize,
}

impl<B: Backend> BatchContext<B> {
    /// The most rows one step holds.
    pub fn cap(&self) -> usize {
        self.cap
    }
}

/// Refuses a context for steps of `cap` rows where `b` cannot bind the model's activations
/// or one row of its logits: before anything is allocated (and, loading, before the weights).
pub fn check_context<B: Backend>(c: &ModelConfig, b: &B, cap: usize) -> Result<(), RuntimeError> {
    let Some(limit) = b.max_tensor_bytes() else { return Ok(()) };
    // In u64: a 32-bit usize would overflow (the widths are checked against
    // ModelConfig's bound, so one row's bytes fit either way).
    let widest = [c.n_embd, c.q_dim(), c.kv_dim(), c.n_ff].into_iter().max().unwrap_or(1).max(1) as u64;
    let logits_row = c.n_vocab as u64 * 4;
    if logits_row.max(widest * 4) > limit {
        return Err(RuntimeError::Device(format!(
            "one row of logits ({} values, {logits_row} bytes) or of activations ({widest} values) is more than the device binds at once ({limit} bytes): the model does not fit this device",
            c.n_vocab
        )));
    }
    let acts = (cap as u64).saturating_mul(widest * 4);
    if acts > limit {
        return Err(RuntimeError::Device(format!(
            "a batch of {cap} tokens needs activations of {acts} bytes, more than {} binds at once ({limit} bytes): lower --batch-size to {} or less",
            b.describe(),
            limit / (widest * 4)
        )));
    }
    Ok(())
}

impl<B: Backend> Model<B> {
    /// A context for steps of up to `cap` rows in all (a prompt's batch size, or `cap`
    /// sequences decoding), refused before anything is allocated where the backend cannot
    /// bind its activations.
    pub fn new_context(&self, b: &mut B, cap: usize) -> Result<BatchContext<B>, RuntimeError> {
        let c = &self.config;
        let cap = cap.max(1);
        check_context(c, b, cap)?;
        Ok(BatchContext { acts: Acts::new(b, c, cap), cap })
    }

    /// Runs `batch` and returns each sequence's logits, in the batch's order (`Last`:
    /// n_vocab values; `All`: tokens × n_vocab). The matrix products of a step run over
    /// all its rows together (the weights are read once per step, whatever mix of prompts
    /// and decoding sequences it holds); RoPE, the K/V cache and attention per sequence,
    /// each with its session's cache, positions and run settings. A sequence's result is
    /// that of running it alone up to arithmetic order (batched products may round the same
    /// values in another order).
    ///
    /// A batch refused before it runs changes nothing. One that fails in a later step (out
    /// of cache pages, a device error) gives each session back its positions from before
    /// the batch ([`Session::truncate`]: where a per-channel cache or a shared page keeps
    /// fewer, fewer; the caller compares `n_past`).
    pub fn decode(
        &self,
        b: &mut B,
        ctx: &mut BatchContext<B>,
        batch: Batch<'_, '_, B>,
    ) -> Result<Vec<Vec<f32>>, RuntimeError> {
        crate::ready::finish(self.decode_async(b, ctx, batch))
    }

    /// [`Model::decode`] as a future: the same steps, each awaiting its logits' readback —
    /// for a device whose results arrive only after the caller yields (WebGPU in a
    /// browser). [`Model::decode`] is this, driven where it stands ([`crate::ready`]).
    pub async fn decode_async(
        &self,
        b: &mut B,
        ctx: &mut BatchContext<B>,
        mut batch: Batch<'_, '_, B>,
    ) -> Result<Vec<Vec<f32>>, RuntimeError> {
        let seqs = &mut batch.seqs;
        if seqs.is_empty() || seqs.iter().any(|s| s.tokens.is_empty()) {
            return Err(RuntimeError::Usage(
                "nothing to evaluate: the batch or one of its token lists is empty".into(),
            ));
        }
        for s in seqs.iter() {
            let needed = s.session.n_past + s.tokens.len();
            if needed > s.session.n_ctx {
                return Err(RuntimeError::ContextFull { n_ctx: s.session.n_ctx, needed });
            }
            if let Some(&bad) = s.tokens.iter().find(|&&t| t as usize >= self.config.n_vocab) {
                return Err(RuntimeError::Usage(format!(
                    "token id {bad} is outside the vocabulary of {}",
                    self.config.n_vocab
                )));
            }
        }
        // All logits of a step live in one tensor: on backends with a buffer limit, a step
        // holds as many logit rows as it binds (new_context checked that one row fits).
        let logit_rows = match b.max_tensor_bytes() {
            Some(limit) => (limit as usize / (4 * self.config.n_vocab)).max(1),
            None => usize::MAX,
        };
        let observed = self.observed(b);
        let mut done = vec![0usize; seqs.len()];
        let mut results: Vec<Vec<f32>> = vec![Vec::new(); seqs.len()];
        loop {
            let parts = plan_step(seqs, &done, ctx.cap, logit_rows, observed);
            if parts.is_empty() {
                break;
            }
            let logits = match self.run_step(b, &mut ctx.acts, seqs, &parts).await {
                Ok(l) => l,
                Err(e) => {
                    for (s, &d) in seqs.iter_mut().zip(&done) {
                        // (A failed step advanced no session: n_past counts completed steps.)
                        let before = s.session.n_past - d;
                        s.session.truncate(before);
                    }
                    return Err(e);
                }
            };
            let n_vocab = self.config.n_vocab;
            let mut at = 0;
            for p in &parts {
                let n = p.logit_rows() * n_vocab;
                let out = &mut results[p.seq];
                if seqs[p.seq].logits == Logits::Last {
                    out.clear();
                }
                out.extend_from_slice(&logits[at..at + n]);
                at += n;
                done[p.seq] += p.len;
            }
        }
        Ok(results)
    }

    /// [`Model::decode`] of a batch of one sequence ([`Batch::one`]): its logits.
    pub fn decode_one(
        &self,
        b: &mut B,
        ctx: &mut BatchContext<B>,
        session: &mut Session<B>,
        tokens: &[u32],
        logits: Logits,
    ) -> Result<Vec<f32>, RuntimeError> {
        crate::ready::finish(self.decode_one_async(b, ctx, session, tokens, logits))
    }

    /// [`Model::decode_one`] as a future ([`Model::decode_async`]).
    pub async fn decode_one_async(
        &self,
        b: &mut B,
        ctx: &mut BatchContext<B>,
        session: &mut Session<B>,
        tokens: &[u32],
        logits: Logits,
    ) -> Result<Vec<f32>, RuntimeError> {
        let mut out = self.decode_async(b, ctx, Batch::one(session, tokens, logits)).await?;
        Ok(out.pop().expect("one sequence's logits"))
    }

    /// Whether an installed observer wants any probe of any layer.
    fn observed(&self, b: &B) -> bool {
        (0..=self.config.n_layers).any(|il| Probe::ALL.iter().any(|&p| b.observes(p, il)))
    }
}

/// The next step of a batch: each sequence's next chunk, in batch order, while rows fit in
/// `cap` and logit rows in `logit_rows`, of sequences sharing the first one's cache (and
/// only one sequence when `observed`).
fn plan_step<B: Backend>(
    seqs: &[BatchSeq<'_, '_, B>],
    done: &[usize],
    cap: usize,
    logit_rows: usize,
    observed: bool,
) -> Vec<Part> {
    let mut parts: Vec<Part> = Vec::new();
    let (mut rows, mut outs) = (0, 0);
    for (i, s) in seqs.iter().enumerate() {
        let left = s.tokens.len() - done[i];
        if left == 0 {
            continue;
        }
        if let Some(first) = parts.first()
            && (observed || !Arc::ptr_eq(&seqs[first.seq].session.cache, &s.session.cache))
        {
            continue;
        }
        let mut len = left.min(cap - rows);
        if s.logits == Logits::All {
            len = len.min(logit_rows - outs);
        }
        if len == 0 {
            break;
        }
        let part = Part { seq: i, start: done[i], len, first: rows, logits: s.logits, last: len == left };
        if outs + part.logit_rows() > logit_rows {
            break;
        }
        rows += len;
        outs += part.logit_rows();
        parts.push(part);
        if rows == cap {
            break;
        }
    }
    parts
}
