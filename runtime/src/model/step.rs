//! One step of a batch ([`Model::decode`]): the rows of one or more sequences through one
//! layer skeleton ([`Model::run_layers`]), the matrix products over all rows together, the
//! attention step over the sequences' spans ([`Backend::attention`]), and the logits of the
//! rows that want them.

use crate::backend::{Backend, Normed, Probe, SeqSpan};
use crate::error::RuntimeError;
use crate::model::batch::BatchSeq;
use crate::model::{Logits, Model, ModelConfig, Session, locked};

/// The activations a step's rows flow through (allocated for `cap` rows).
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
    /// outs × n_embd: the rows that want logits, gathered (see [`Model::run_layers`]).
    outs: B::Tensor,
    logits: B::Tensor, // outs × n_vocab, grown to fit
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
            outs: b.new_tensor(cap, c.n_embd),
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

/// One sequence's chunk in a step: its tokens `start..start + len`, at step rows
/// `first..first + len`; `last` when the chunk ends the sequence's tokens in the batch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Part {
    pub seq: usize,
    pub start: usize,
    pub len: usize,
    pub first: usize,
    pub logits: Logits,
    pub last: bool,
}

impl Part {
    /// How many of the chunk's rows want logits.
    pub fn logit_rows(&self) -> usize {
        match self.logits {
            Logits::All => self.len,
            Logits::Last => usize::from(self.last),
        }
    }

    /// The step rows that want logits.
    fn out_rows(&self) -> std::ops::Range<usize> {
        let end = self.first + self.len;
        end - self.logit_rows()..end
    }
}

/// A step's attention for layer `il` ([`Model::run_layers`]): fills `a.att`, or, asked to
/// (the bool) and returning true, merges DIFF V2's head pairs into `a.pairs` itself.
type Attend<'f, B> = dyn FnMut(&mut B, usize, &mut Acts<B>, bool) -> bool + 'f;

/// Copies rows `rows` (ascending) of `src` into rows 0.. of `dst`, a copy per run of
/// consecutive rows.
fn gather<B: Backend>(b: &mut B, src: &B::Tensor, rows: &[usize], dst: &mut B::Tensor) {
    b.set_rows(dst, rows.len());
    let mut i = 0;
    while i < rows.len() {
        let run = rows[i..].iter().enumerate().take_while(|&(j, &r)| r == rows[i] + j).count();
        b.copy_rows(src, rows[i], dst, i, run);
        i += run;
    }
}

impl<B: Backend> Model<B> {
    /// Runs the step `parts` of `seqs` (each part's tokens at its session's `n_past`) and
    /// returns the logits of the rows that want them, in row order. Async only for the
    /// readback of the logits ([`Backend::read_rows_async`]).
    pub(crate) async fn run_step(
        &self,
        b: &mut B,
        a: &mut Acts<B>,
        seqs: &mut [BatchSeq<'_, '_, B>],
        parts: &[Part],
    ) -> Result<Vec<f32>, RuntimeError> {
        let c = &self.config;
        let tokens: Vec<u32> =
            parts.iter().flat_map(|p| &seqs[p.seq].tokens[p.start..p.start + p.len]).copied().collect();
        for p in parts {
            seqs[p.seq].session.reserve(p.len)?;
        }
        a.set_rows(b, tokens.len());
        let outs: Vec<usize> = parts.iter().flat_map(Part::out_rows).collect();
        let sessions: Vec<&Session<B>> = parts.iter().map(|p| &*seqs[p.seq].session).collect();
        // Probes report one sequence's positions: observed sequences run alone (plan_step).
        let probes = (parts.len() == 1).then(|| sessions[0].n_past);
        // The cache's lock and the sessions' borrows end with the layers, before the
        // logits' readback is awaited.
        let narrowed = {
            let mut cache = locked(&sessions[0].cache);
            let mut attend = |b: &mut B, il: usize, a: &mut Acts<B>, merge: bool| {
                let spans: Vec<SeqSpan> = parts
                    .iter()
                    .zip(&sessions)
                    .map(|(p, s)| SeqSpan {
                        seq: s.pages(),
                        first: p.first,
                        rows: p.len,
                        pos0: s.n_past,
                        spec: &s.attention[il],
                    })
                    .collect();
                let Acts { q, k, v, att, pairs, .. } = a;
                let watched = probes.is_some() && [Probe::Q, Probe::K, Probe::V].into_iter().any(|p| b.observes(p, il));
                if !watched {
                    // Nobody looks at the rotated rows: the backend may rotate them as it stores
                    // (and merge DIFF V2's head pairs as it combines).
                    let pairs = match (merge, pairs) {
                        (true, Some((gate, combined))) => Some((&*gate, combined)),
                        _ => None,
                    };
                    let merged = pairs.is_some();
                    b.attention(q, k, v, &mut cache.kv, il, &spans, Some(&self.rope), pairs, att);
                    return merged;
                }
                // Watched: Q and K are rotated here, for the observer, and stored as they are. A K
                // cache that holds keys before RoPE (q4c, q3c, q2c) then holds this step's keys after
                // it, read without rotation: a session watched at every step (as the tools that
                // watch Q, K or V run theirs) is consistent, but measures the post-RoPE keys.
                let pos0 = spans[0].pos0;
                b.rope(q, c.n_heads, c.head_dim, pos0, &self.rope);
                b.rope(k, c.n_kv_heads, c.head_dim, pos0, &self.rope);
                // Keys first: an observer recomputing attention logits needs them for the queries.
                b.observe(Probe::K, il, pos0, k);
                b.observe(Probe::V, il, pos0, v);
                b.observe(Probe::Q, il, pos0, q);
                b.attention(q, k, v, &mut cache.kv, il, &spans, None, None, att);
                false
            };
            self.run_layers(b, a, &tokens, probes, &outs, &mut attend)
        };
        drop(sessions);
        let logits = self.logits(b, a, &outs, tokens.len(), narrowed, probes).await?;
        // Positions count once the step's results are in (a failed step advances nobody).
        for p in parts {
            seqs[p.seq].session.n_past += p.len;
        }
        Ok(logits)
    }

    /// The logits of step rows `outs` (of `rows`) after [`Model::run_layers`] (which
    /// `narrowed` them or not); probes as there.
    async fn logits(
        &self,
        b: &mut B,
        a: &mut Acts<B>,
        outs: &[usize],
        rows: usize,
        narrowed: bool,
        probes: Option<usize>,
    ) -> Result<Vec<f32>, RuntimeError> {
        let c = &self.config;
        let n_out = outs.len();
        if n_out == 0 {
            return Ok(Vec::new());
        }
        // The rows that want logits: gathered already (the narrowed last layer), all rows,
        // or gathered now.
        if !narrowed && n_out < rows {
            gather(b, &a.x, outs, &mut a.outs);
        }
        let fin = if narrowed || n_out < rows { &a.outs } else { &a.x };
        let output = self.output.as_ref().unwrap_or(&self.token_embd);
        if a.logits_rows < n_out {
            a.logits = b.new_tensor(n_out, c.n_vocab);
            a.logits_rows = n_out;
        }
        b.set_rows(&mut a.logits, n_out);
        b.set_rows(&mut a.xn, n_out);
        let watched = probes.is_some() && b.observes(Probe::OutputIn, c.n_layers);
        if n_out == 1 && !watched {
            // The final norm folded into the output product.
            let n = Normed { x: fin, weight: &self.output_norm, eps: c.rms_eps, xn: &mut a.xn };
            b.norm_matmul_group(n, &[output], &mut [&mut a.logits]);
        } else {
            b.rms_norm(fin, &self.output_norm, c.rms_eps, &mut a.xn);
            if let Some(pos0) = probes.filter(|_| watched) {
                b.observe(Probe::OutputIn, c.n_layers, pos0 + outs[0], &a.xn);
            }
            b.matmul(output, &a.xn, &mut a.logits);
        }
        b.read_rows_async(&a.logits, 0..n_out).await
    }

    /// Embeds `tokens` into `a.x` and runs every layer on those rows; `attend` fills `a.att`
    /// from `a.q`, `a.k`, `a.v` (before RoPE) for layer `il` — or, asked to merge DIFF V2's
    /// head pairs (its last argument) and returning true, fills `a.pairs`' combined heads
    /// instead (`a.att` then scratch). Probes report positions from `probes` (None: rows of
    /// several sequences, not reported). Only the rows `outs` want logits: the last layer's
    /// feed-forward block runs on those rows alone where they are fewer — then they are the
    /// result, in `a.outs` (outs × n_embd), `a.x`'s rows are stale, and this returns true —
    /// and not at all where there are none (false: nothing is the result).
    fn run_layers(
        &self,
        b: &mut B,
        a: &mut Acts<B>,
        tokens: &[u32],
        probes: Option<usize>,
        outs: &[usize],
        attend: &mut Attend<'_, B>,
    ) -> bool {
        let c = &self.config;
        let n = tokens.len();
        let mut narrowed = false;
        let observe = |b: &mut B, probe: Probe, il: usize, t: &B::Tensor| {
            if let Some(pos0) = probes {
                b.observe(probe, il, pos0, t);
            }
        };
        b.embed(&self.token_embd, tokens, &mut a.x);
        for (il, l) in self.layers.iter().enumerate() {
            // Attention block: q, k, v (and DIFF V2's λ, before its sigmoid) from the same
            // normalised input, one group; the norm folded into the products unless an
            // observer looks at it.
            let fold = !(probes.is_some() && b.observes(Probe::AttnIn, il));
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
                [Probe::AttnBranches, Probe::PairGates].into_iter().any(|p| probes.is_some() && b.observes(p, il));
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
            // Fewer rows want logits than run (a prompt's last row, say): the last layer's
            // feed-forward block (~80% of a layer's multiplies) runs on those rows alone, as
            // llama.cpp's does, and not at all for none. `x` trades places with the gathered
            // `outs` until the loop ends. (Not when an observer wants this block's rows.)
            if outs.len() < n
                && il + 1 == self.layers.len()
                && ![Probe::FfnIn, Probe::FfnDownIn, Probe::Hidden]
                    .into_iter()
                    .any(|p| probes.is_some() && b.observes(p, il))
            {
                if outs.is_empty() {
                    break;
                }
                gather(b, &a.x, outs, &mut a.outs);
                std::mem::swap(&mut a.x, &mut a.outs);
                for t in [&mut a.xn, &mut a.gate, &mut a.up, &mut a.proj] {
                    b.set_rows(t, outs.len());
                }
                narrowed = true;
            }
            // Feed-forward block (SwiGLU), the norm folded in as above.
            let biased = l.b_gate.is_some() || l.b_up.is_some();
            let looked_at = probes.is_some() && b.observes(Probe::FfnIn, il);
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
            // Back: `a.x` the full tensor again, `a.outs` the rows that want logits.
            std::mem::swap(&mut a.x, &mut a.outs);
        }
        narrowed
    }
}
