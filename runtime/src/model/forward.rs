//! The forward pass: one layer skeleton ([`Model::run_layers`]) shared by
//! * [`Model::forward`]: a batch of consecutive tokens of one session (prompts, perplexity,
//!   decoding one sequence), and
//! * [`Model::forward_many`]: a chunk of tokens (one when decoding, a piece of a prompt
//!   when prefilling) for each of several sessions at once, their matrix multiplications
//!   over all rows together (the weights are read once for every sequence) and RoPE, the
//!   K/V cache and attention per sequence, with its own settings (sessions of one shared
//!   cache in one pass where the backend has it, [`Backend::attention_spans`])
//!   ([`Model::decode_many`]: one token each).
//!
//! Only the attention step differs between the two ("attend" below).

use std::sync::Arc;

use crate::backend::{Backend, Normed, Probe, SeqSpan};
use crate::error::RuntimeError;
use crate::kv_pages::SeqPages;
use crate::model::{Logits, Model, ModelConfig, Session, locked};

/// The activations a batch of rows flows through (allocated for `cap` rows).
pub(crate) struct Acts<B: Backend> {
    x: B::Tensor,   // rows × n_embd: the residual stream
    xn: B::Tensor,  // rows × n_embd: normalised
    q: B::Tensor,   // rows × q_dim
    k: B::Tensor,   // rows × kv_dim
    v: B::Tensor,   // rows × kv_dim
    att: B::Tensor, // rows × q_dim
    /// DIFF V2 only: (λ before its sigmoid, rows × n_heads/2; the combined heads, rows ×
    /// attn_out_dim).
    pairs: Option<(B::Tensor, B::Tensor)>,
    proj: B::Tensor, // rows × n_embd
    gate: B::Tensor, // rows × n_ff
    up: B::Tensor,   // rows × n_ff
    last: B::Tensor, // 1 × n_embd
    logits: B::Tensor,
    logits_rows: usize,
}

impl<B: Backend> Acts<B> {
    pub(crate) fn new(b: &mut B, c: &ModelConfig, cap: usize) -> Acts<B> {
        Acts {
            x: b.new_tensor(cap, c.n_embd),
            xn: b.new_tensor(cap, c.n_embd),
            q: b.new_tensor(cap, c.q_dim()),
            k: b.new_tensor(cap, c.kv_dim()),
            v: b.new_tensor(cap, c.kv_dim()),
            att: b.new_tensor(cap, c.q_dim()),
            pairs: (c.attn_out_dim() != c.q_dim())
                .then(|| (b.new_tensor(cap, c.n_heads / 2), b.new_tensor(cap, c.attn_out_dim()))),
            proj: b.new_tensor(cap, c.n_embd),
            gate: b.new_tensor(cap, c.n_ff),
            up: b.new_tensor(cap, c.n_ff),
            last: b.new_tensor(1, c.n_embd),
            logits: b.new_tensor(1, c.n_vocab),
            logits_rows: 1,
        }
    }

    fn set_rows(&mut self, b: &mut B, n: usize) {
        for t in [
            &mut self.x,
            &mut self.xn,
            &mut self.q,
            &mut self.k,
            &mut self.v,
            &mut self.att,
            &mut self.proj,
            &mut self.gate,
            &mut self.up,
        ] {
            b.set_rows(t, n);
        }
        if let Some((gate, combined)) = &mut self.pairs {
            b.set_rows(gate, n);
            b.set_rows(combined, n);
        }
    }
}

/// A forward pass's attention step for layer `il` ([`Model::run_layers`]): fills `a.att`,
/// or, asked to (the bool) and returning true, merges DIFF V2's head pairs itself.
type Attend<'f, B> = dyn FnMut(&mut B, usize, &mut Acts<B>, bool) -> bool + 'f;

/// Scratch activations for [`Model::forward_many`]: up to `cap` rows in all.
pub struct DecodeBatch<B: Backend> {
    acts: Acts<B>,
    cap: usize,
}

impl<B: Backend> Model<B> {
    /// Scratch for steps of up to `cap` tokens in all (e.g. `cap` sequences decoding).
    pub fn new_decode_batch(&self, b: &mut B, cap: usize) -> DecodeBatch<B> {
        DecodeBatch { acts: Acts::new(b, &self.config, cap.max(1)), cap: cap.max(1) }
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<(), RuntimeError> {
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.config.n_vocab) {
            return Err(RuntimeError::Usage(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.config.n_vocab
            )));
        }
        Ok(())
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
        self.check_tokens(tokens)?;
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
        s.reserve(n)?;
        let seq = SeqPages { pages: &s.pages, slot: s.slot };
        let (a, specs) = (&mut s.acts, &s.attention);
        let mut cache = locked(&s.cache);
        a.set_rows(b, n);
        let mut attend = |b: &mut B, il: usize, a: &mut Acts<B>, pairs: bool| {
            if ![Probe::Q, Probe::K, Probe::V].into_iter().any(|p| b.observes(p, il)) {
                // Nobody looks at the rotated rows: the backend may rotate them as it stores
                // (and merge DIFF V2's head pairs as it combines).
                let Acts { q, k, v, att, pairs: gated, .. } = a;
                let (kv, spec) = (&mut cache.kv, &specs[il]);
                if let (true, Some((gate, combined))) = (pairs, gated) {
                    b.rope_attention_pairs(q, k, v, kv, seq, il, pos0, &self.rope, spec, (gate, att, combined));
                    return true;
                }
                b.rope_attention(q, k, v, kv, seq, il, pos0, &self.rope, spec, att);
                return false;
            }
            b.rope(&mut a.q, c.n_heads, c.head_dim, pos0, &self.rope);
            b.rope(&mut a.k, c.n_kv_heads, c.head_dim, pos0, &self.rope);
            // Keys first: an observer recomputing attention logits needs them for the queries.
            b.observe(Probe::K, il, pos0, &a.k);
            b.observe(Probe::V, il, pos0, &a.v);
            b.observe(Probe::Q, il, pos0, &a.q);
            b.attention(&a.q, &a.k, &a.v, &mut cache.kv, seq, il, pos0, &specs[il], &mut a.att);
            false
        };
        let last_done = self.run_layers(b, a, tokens, pos0, want == Logits::Last, &mut attend);
        drop(cache);
        s.n_past += n;
        let a = &mut s.acts;
        let output = self.output.as_ref().unwrap_or(&self.token_embd);
        match want {
            Logits::Last => {
                // The last row: `a.last` already (the narrowed last layer), `a.x` itself
                // when it is the only row (decoding), else copied out.
                if !last_done && n > 1 {
                    b.copy_row(&a.x, n - 1, &mut a.last, 0);
                }
                let last = if !last_done && n == 1 { &a.x } else { &a.last };
                b.set_rows(&mut a.xn, 1);
                // The final norm folded into the output product.
                if a.logits_rows < 1 {
                    a.logits = b.new_tensor(1, c.n_vocab);
                    a.logits_rows = 1;
                }
                b.set_rows(&mut a.logits, 1);
                let n = Normed { x: last, weight: &self.output_norm, eps: c.rms_eps, xn: &mut a.xn };
                b.norm_matmul_group(n, &[output], &mut [&mut a.logits]);
                b.read_rows(&a.logits, 0..1)
            }
            Logits::All => {
                b.rms_norm(&a.x, &self.output_norm, c.rms_eps, &mut a.xn);
                b.observe(Probe::OutputIn, c.n_layers, pos0, &a.xn);
                self.output_logits(b, a, n, output)
            }
        }
    }

    /// The logits of the first `n` rows of `a.xn`.
    fn output_logits(
        &self,
        b: &mut B,
        a: &mut Acts<B>,
        n: usize,
        output: &B::Weight,
    ) -> Result<Vec<f32>, RuntimeError> {
        if a.logits_rows < n {
            a.logits = b.new_tensor(n, self.config.n_vocab);
            a.logits_rows = n;
        }
        b.set_rows(&mut a.logits, n);
        b.matmul(output, &a.xn, &mut a.logits);
        b.read_rows(&a.logits, 0..n)
    }

    /// One decode step for several sequences: `tokens[i]` continues `sessions[i]` (at its
    /// position `n_past`), and each sequence's next-token logits come back (n_vocab each).
    /// [`Model::forward_many`] with one token per sequence.
    pub fn decode_many(
        &self,
        b: &mut B,
        batch: &mut DecodeBatch<B>,
        sessions: &mut [&mut Session<B>],
        tokens: &[u32],
    ) -> Result<Vec<Vec<f32>>, RuntimeError> {
        let chunks: Vec<&[u32]> = tokens.iter().map(std::slice::from_ref).collect();
        self.forward_many(b, batch, sessions, &chunks)
    }

    /// One step for several sequences at once, as llama.cpp's `llama_batch`: `chunks[i]`
    /// (one token when decoding, a piece of a prompt when prefilling) continues
    /// `sessions[i]` at its position `n_past`, and the logits of each chunk's last token come
    /// back (n_vocab each). The matrix products run over all rows together (the weights are
    /// read once per step, whatever mix of prompts and decoding sequences it holds); RoPE, the
    /// K/V cache and attention run per sequence, each with its session's cache, positions
    /// and run settings (slots of one shared cache in one pass on the CPU). The result is
    /// that of [`Model::forward`] on each session alone up to arithmetic order (batched
    /// matrix products round the same values in a different order). No activation probes.
    pub fn forward_many(
        &self,
        b: &mut B,
        batch: &mut DecodeBatch<B>,
        sessions: &mut [&mut Session<B>],
        chunks: &[&[u32]],
    ) -> Result<Vec<Vec<f32>>, RuntimeError> {
        let c = &self.config;
        let n_seq = chunks.len();
        let rows: usize = chunks.iter().map(|t| t.len()).sum();
        if n_seq != sessions.len() || n_seq == 0 || rows > batch.cap || chunks.iter().any(|t| t.is_empty()) {
            return Err(RuntimeError::Usage(format!(
                "forward_many: {n_seq} chunks ({rows} tokens, none may be empty) for {} sessions (a batch holds 1 to {} tokens)",
                sessions.len(),
                batch.cap
            )));
        }
        for (s, t) in sessions.iter().zip(chunks) {
            if t.len() > s.max_batch {
                return Err(RuntimeError::Usage(format!(
                    "forward_many: a chunk of {} tokens for a session of batch {}",
                    t.len(),
                    s.max_batch
                )));
            }
            if s.n_past + t.len() > s.n_ctx {
                return Err(RuntimeError::ContextFull { n_ctx: s.n_ctx, needed: s.n_past + t.len() });
            }
        }
        let tokens: Vec<u32> = chunks.concat();
        self.check_tokens(&tokens)?;
        for (s, t) in sessions.iter_mut().zip(chunks) {
            s.reserve(t.len())?;
            s.acts.set_rows(b, t.len());
        }
        let a = &mut batch.acts;
        a.set_rows(b, rows);
        // Sessions of one cache (a server's slots) attend in one pass where the backend has
        // it; otherwise sequence i's rows move into its own scratch for RoPE at its
        // positions and attention over its cache, and its output rows move back.
        let one_cache = sessions.windows(2).all(|w| Arc::ptr_eq(&w[0].cache, &w[1].cache));
        let mut attend = |b: &mut B, il: usize, a: &mut Acts<B>, _pairs: bool| {
            if one_cache {
                let mut first = 0;
                let spans: Vec<SeqSpan> = sessions
                    .iter()
                    .zip(chunks)
                    .map(|(s, t)| {
                        let seq = SeqPages { pages: &s.pages, slot: s.slot };
                        let span = SeqSpan { seq, first, rows: t.len(), pos0: s.n_past, spec: &s.attention[il] };
                        first += t.len();
                        span
                    })
                    .collect();
                let mut cache = locked(&sessions[0].cache);
                if b.attention_spans(&mut a.q, &mut a.k, &a.v, &mut cache.kv, il, &spans, &self.rope, &mut a.att) {
                    return false;
                }
            }
            let mut first = 0;
            for (s, t) in sessions.iter_mut().zip(chunks) {
                let pos = s.n_past;
                let own = &mut s.acts;
                b.copy_rows(&a.q, first, &mut own.q, 0, t.len());
                b.copy_rows(&a.k, first, &mut own.k, 0, t.len());
                b.copy_rows(&a.v, first, &mut own.v, 0, t.len());
                let seq = SeqPages { pages: &s.pages, slot: s.slot };
                let mut cache = locked(&s.cache);
                let spec = &s.attention[il];
                b.rope_attention(
                    &mut own.q,
                    &mut own.k,
                    &own.v,
                    &mut cache.kv,
                    seq,
                    il,
                    pos,
                    &self.rope,
                    spec,
                    &mut own.att,
                );
                drop(cache);
                b.copy_rows(&own.att, 0, &mut a.att, first, t.len());
                first += t.len();
            }
            false
        };
        self.run_layers(b, a, &tokens, usize::MAX, false, &mut attend);
        // Each chunk's last row (gathered into `proj`, free after the layers) gets logits.
        b.set_rows(&mut a.proj, n_seq);
        let mut first = 0;
        for (i, (s, t)) in sessions.iter_mut().zip(chunks).enumerate() {
            s.n_past += t.len();
            first += t.len();
            b.copy_row(&a.x, first - 1, &mut a.proj, i);
        }
        b.set_rows(&mut a.xn, n_seq);
        b.rms_norm(&a.proj, &self.output_norm, c.rms_eps, &mut a.xn);
        let output = self.output.as_ref().unwrap_or(&self.token_embd);
        let all = self.output_logits(b, a, n_seq, output)?;
        Ok(all.chunks_exact(c.n_vocab).map(<[f32]>::to_vec).collect())
    }

    /// Embeds `tokens` into `a.x` and runs every layer on those rows; `attend` fills `a.att`
    /// from `a.q`, `a.k`, `a.v` (before RoPE) for layer `il` — or, asked to merge DIFF V2's
    /// head pairs (its last argument) and returning true, fills `a.pairs`' combined heads
    /// instead (`a.att` then scratch). Probes report positions from
    /// `pos0` (`usize::MAX`: rows of several sequences, not reported). With `last_row_only`
    /// the last layer's feed-forward block may run on the last row alone: then the result
    /// is that row, in `a.last` (1 × n_embd), `a.x`'s rows are stale, and this returns true.
    fn run_layers(
        &self,
        b: &mut B,
        a: &mut Acts<B>,
        tokens: &[u32],
        pos0: usize,
        last_row_only: bool,
        attend: &mut Attend<'_, B>,
    ) -> bool {
        let c = &self.config;
        let n = tokens.len();
        let mut narrowed = false;
        let probes = pos0 != usize::MAX;
        let observe = |b: &mut B, probe: Probe, il: usize, t: &B::Tensor| {
            if probes {
                b.observe(probe, il, pos0, t);
            }
        };
        b.embed(&self.token_embd, tokens, &mut a.x);
        for (il, l) in self.layers.iter().enumerate() {
            // Attention block: q, k, v (and DIFF V2's λ, before its sigmoid) from the same
            // normalised input, one group; the norm folded into the products unless an
            // observer looks at it.
            let fold = !(probes && b.observes(Probe::AttnIn, il));
            if !fold {
                b.rms_norm(&a.x, &l.attn_norm, c.rms_eps, &mut a.xn);
                observe(b, Probe::AttnIn, il, &a.xn);
            }
            let normed = Normed { x: &a.x, weight: &l.attn_norm, eps: c.rms_eps, xn: &mut a.xn };
            match (&l.lambda_proj, &mut a.pairs, fold) {
                (Some(w_lambda), Some((gate, _)), true) => {
                    let ws = [&l.wq, &l.wk, &l.wv, w_lambda];
                    b.norm_matmul_group(normed, &ws, &mut [&mut a.q, &mut a.k, &mut a.v, gate])
                }
                (Some(w_lambda), Some((gate, _)), false) => {
                    let ws = [&l.wq, &l.wk, &l.wv, w_lambda];
                    b.matmul_group(&ws, normed.xn, &mut [&mut a.q, &mut a.k, &mut a.v, gate])
                }
                (_, _, true) => {
                    b.norm_matmul_group(normed, &[&l.wq, &l.wk, &l.wv], &mut [&mut a.q, &mut a.k, &mut a.v])
                }
                (_, _, false) => b.matmul_group(&[&l.wq, &l.wk, &l.wv], normed.xn, &mut [&mut a.q, &mut a.k, &mut a.v]),
            }
            for (t, bias) in [(&mut a.q, &l.bq), (&mut a.k, &l.bk), (&mut a.v, &l.bv)] {
                if let Some(bias) = bias {
                    b.add_bias(t, bias);
                }
            }
            // DIFF V2: each query-head pair becomes one head, weighed by λ (computed with
            // q/k/v). The pair's heads are its two branches: merged by attention itself
            // unless something looks at them (or DEX changes them first).
            let branch_probes =
                [Probe::AttnBranches, Probe::PairGates].into_iter().any(|p| probes && b.observes(p, il));
            let merge = l.lambda_proj.is_some() && l.dex.is_none() && !branch_probes;
            let merged = attend(b, il, a, merge);
            if let Some((w_d, lambda, heads)) = &l.dex {
                b.dex(&mut a.att, w_d, *lambda, heads, c.head_dim);
            }
            let att = match (&l.lambda_proj, &mut a.pairs) {
                (Some(_), Some((gate, combined))) => {
                    if !merged {
                        observe(b, Probe::AttnBranches, il, &a.att);
                        observe(b, Probe::PairGates, il, gate);
                        b.pair_combine(&a.att, gate, c.head_dim, combined);
                    }
                    &*combined
                }
                _ => &a.att,
            };
            observe(b, Probe::AttnOut, il, att);
            match &l.bo {
                None => b.matmul_add(&l.wo, att, &mut a.proj, &mut a.x),
                Some(bias) => {
                    b.matmul(&l.wo, att, &mut a.proj);
                    b.add_bias(&mut a.proj, bias);
                    b.add(&mut a.x, &a.proj);
                }
            }
            // Only the last row's logits wanted: the last layer's feed-forward block (~80% of
            // a layer's multiplies) runs on that row alone, as llama.cpp's does. `x` trades
            // places with the one-row `last` until the loop ends. (Not when an observer wants
            // this block's rows.)
            if last_row_only
                && !narrowed
                && n > 1
                && il + 1 == self.layers.len()
                && ![Probe::FfnIn, Probe::FfnDownIn, Probe::Hidden].into_iter().any(|p| probes && b.observes(p, il))
            {
                b.copy_row(&a.x, n - 1, &mut a.last, 0);
                std::mem::swap(&mut a.x, &mut a.last);
                for t in [&mut a.xn, &mut a.gate, &mut a.up, &mut a.proj] {
                    b.set_rows(t, 1);
                }
                narrowed = true;
            }
            // Feed-forward block (SwiGLU), the norm folded in as above.
            let biased = l.b_gate.is_some() || l.b_up.is_some();
            let looked_at = probes && b.observes(Probe::FfnIn, il);
            if !biased && !looked_at {
                let normed = Normed { x: &a.x, weight: &l.ffn_norm, eps: c.rms_eps, xn: &mut a.xn };
                b.norm_matmul_swiglu(normed, &l.w_gate, &l.w_up, &mut a.gate, &mut a.up);
            } else if !biased {
                b.rms_norm(&a.x, &l.ffn_norm, c.rms_eps, &mut a.xn);
                observe(b, Probe::FfnIn, il, &a.xn);
                b.matmul_swiglu(&l.w_gate, &l.w_up, &a.xn, &mut a.gate, &mut a.up);
            } else {
                b.rms_norm(&a.x, &l.ffn_norm, c.rms_eps, &mut a.xn);
                observe(b, Probe::FfnIn, il, &a.xn);
                b.matmul(&l.w_gate, &a.xn, &mut a.gate);
                b.matmul(&l.w_up, &a.xn, &mut a.up);
                if let Some(bias) = &l.b_gate {
                    b.add_bias(&mut a.gate, bias);
                }
                if let Some(bias) = &l.b_up {
                    b.add_bias(&mut a.up, bias);
                }
                b.swiglu(&mut a.gate, &a.up);
            }
            observe(b, Probe::FfnDownIn, il, &a.gate);
            match &l.b_down {
                None => b.matmul_add(&l.w_down, &a.gate, &mut a.proj, &mut a.x),
                Some(bias) => {
                    b.matmul(&l.w_down, &a.gate, &mut a.proj);
                    b.add_bias(&mut a.proj, bias);
                    b.add(&mut a.x, &a.proj);
                }
            }
            observe(b, Probe::Hidden, il, &a.x);
        }
        if narrowed {
            // Back: `a.x` the full tensor again, `a.last` the row.
            std::mem::swap(&mut a.x, &mut a.last);
        }
        narrowed
    }
}
