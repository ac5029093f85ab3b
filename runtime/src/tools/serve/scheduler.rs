//! Slots, the queue and one engine step (see the module docs of [`crate::tools::serve`]).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::backend::Backend;
use crate::engine::Engine;
use crate::error::RuntimeError;
use crate::grammar::{Constraint, Grammars};
use crate::kv_pages::PAGE;
use crate::model::{Batch, BatchContext, Logits, Model, Session};
use crate::sampler::Sampler;
use crate::text::token_bytes::SPECIAL_MARKER;
use crate::text::{ChatTemplate, IdBytes, TextStream, Tokenizer};
use crate::tools::serve::logprobs::Distribution;
use crate::tools::serve::metrics::Metrics;
use crate::tools::serve::prompt::{Encoded, PromptEncoder};
use crate::tools::serve::stop::StopText;
use crate::tools::serve::{FinishReason, GenEvent, GenRequest, Sink, SubmitError, TokenLogprob};

/// `(&v[src], &mut v[dst])` for `src != dst`.
fn two<T>(v: &mut [T], src: usize, dst: usize) -> (&T, &mut T) {
    if src < dst {
        let (a, b) = v.split_at_mut(dst);
        (&a[src], &mut b[0])
    } else {
        let (a, b) = v.split_at_mut(src);
        (&b[0], &mut a[dst])
    }
}

/// A request in a slot.
struct Active {
    sink: Sink,
    sampler: Sampler,
    prompt: Vec<u32>,
    /// Prompt tokens evaluated so far.
    prefilled: usize,
    /// Prompt and generated tokens (for the repetition penalty).
    history: Vec<u32>,
    /// The sampled token the next decode step feeds.
    next: Option<u32>,
    generated: usize,
    max_tokens: Option<usize>,
    ignore_eos: bool,
    stream: TextStream,
    stop: StopText,
    /// Alternatives reported with each token's log probability (None: no log
    /// probabilities).
    logprobs: Option<usize>,
    group: Option<u64>,
    /// Log probabilities waiting for their token's text to go out (a stop string's start
    /// is held back, and a stop string's own tokens are never reported), each with where its
    /// bytes end in the reply.
    held_logprobs: std::collections::VecDeque<(TokenLogprob, usize)>,
    /// Bytes of the text the drawn tokens made so far, and of the text sent.
    drawn_bytes: usize,
    sent_bytes: usize,
}

struct Waiting {
    tokens: Vec<u32>,
    req: GenRequest,
    constraint: Option<Constraint>,
}

/// How one token's acceptance went.
enum Outcome {
    Continue,
    /// The reason, and whether a stop string ended it.
    Finish(FinishReason, bool),
    /// The client went away.
    Gone,
}

pub struct Scheduler<B: Backend> {
    backend: B,
    model: Model<B>,
    tokenizer: Arc<Tokenizer>,
    template: Arc<ChatTemplate>,
    sessions: Vec<Session<B>>,
    /// Per slot, the tokens whose K/V its session holds (kept after a request ends, for
    /// prefix reuse).
    cached: Vec<Vec<u32>>,
    active: Vec<Option<Active>>,
    queue: VecDeque<Waiting>,
    max_queue: usize,
    /// Runs every pass: the engine's context, grown to hold every slot's next token.
    context: BatchContext<B>,
    /// Prompt tokens evaluated per step, beside the decoding slots' tokens (one prompt's
    /// chunk or pieces of several).
    chunk: usize,
    n_ctx: usize,
    metrics: Arc<Mutex<Metrics>>,
    /// Special-token text in chat messages becomes those tokens (`--special`).
    allow_special: bool,
    /// Compiles requests' schemas and grammars (on the submitting threads).
    grammars: Grammars,
    /// Each id's bytes, for log probabilities (made at the first request for them).
    pieces: std::sync::OnceLock<IdBytes>,
}

impl<B: Backend> Scheduler<B> {
    /// `slots` sequences of `engine`'s context each (its session's cache types and run
    /// settings) sharing one paged K/V cache, at most `max_queue` requests waiting while
    /// every slot is busy.
    pub fn new(engine: Engine<B>, slots: usize, max_queue: usize) -> Result<Scheduler<B>, RuntimeError> {
        let Engine { mut backend, model, tokenizer, template, session, context, .. } = engine;
        let slots = slots.max(1);
        let n_ctx = session.n_ctx;
        let chunk = context.cap();
        let spec = session.cache_spec.clone();
        let attention = session.attention.clone();
        // Engine::load checked one session; refuse all of them together before allocating
        // (the engine's own cache is given back first).
        drop(session);
        let all = crate::kv_cache::KvCacheSpec { n_seqs: slots, ..spec.clone() };
        backend.check_session(&model.config, &all, chunk.max(slots)).map_err(|e| {
            RuntimeError::OutOfMemory(format!(
                "{slots} slots of {n_ctx} tokens do not fit (the contexts of all slots together: {e}); lower --parallel or -c"
            ))
        })?;
        let mut sessions = model.new_sessions(&mut backend, slots, n_ctx, spec.k_type, spec.v_type)?;
        for s in &mut sessions {
            s.attention.clone_from(&attention);
        }
        // A pass holds up to `chunk` prompt tokens, or every slot's next token.
        let context = if slots > chunk {
            drop(context);
            model.new_context(&mut backend, slots).map_err(|e| {
                RuntimeError::Device(format!(
                    "a step of every slot's next token ({slots} rows) does not fit: {e}; lower --parallel"
                ))
            })?
        } else {
            context
        };
        let metrics = Arc::new(Mutex::new(Metrics { slots, ..Default::default() }));
        let tokenizer = Arc::new(tokenizer);
        let grammars = Grammars::new(Arc::clone(&tokenizer), model.config.n_vocab);
        Ok(Scheduler {
            backend,
            model,
            tokenizer,
            template: Arc::new(template),
            sessions,
            cached: vec![Vec::new(); slots],
            active: (0..slots).map(|_| None).collect(),
            queue: VecDeque::new(),
            max_queue,
            context,
            chunk,
            n_ctx,
            metrics,
            allow_special: false,
            grammars,
            pieces: std::sync::OnceLock::new(),
        })
    }

    pub fn metrics(&self) -> Arc<Mutex<Metrics>> {
        Arc::clone(&self.metrics)
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Nothing queued and no slot busy.
    pub fn idle(&self) -> bool {
        self.queue.is_empty() && self.active.iter().all(Option::is_none)
    }

    /// What checks requests and tokenizes their prompts, on any thread (special-token text
    /// in a chat message stays text unless --special: role injection).
    pub fn encoder(&self) -> PromptEncoder {
        PromptEncoder::new(
            Arc::clone(&self.tokenizer),
            Arc::clone(&self.template),
            self.allow_special,
            self.n_ctx,
            self.grammars.clone(),
        )
    }

    /// The embedding of `tokens` ([`crate::tools::embed`]), in a cache of its own: the
    /// slots' caches and requests are untouched.
    pub fn embed(&mut self, tokens: &[u32]) -> Result<Vec<f32>, RuntimeError> {
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.model.config.n_vocab) {
            return Err(RuntimeError::Usage(format!("token id {bad} is outside the model's vocabulary")));
        }
        crate::tools::embed::embed(&self.model, &mut self.backend, &mut self.context, tokens)
    }

    /// Lets special-token text in chat messages become those tokens (`--special`).
    pub fn set_allow_special(&mut self, allow: bool) {
        self.allow_special = allow;
    }

    /// Checks and tokenizes `req` here, then queues it ([`Scheduler::submit_encoded`]);
    /// returns its prompt's length in tokens.
    pub fn submit(&mut self, req: GenRequest) -> Result<usize, SubmitError> {
        let e = self.encoder().encode(req)?;
        self.submit_encoded(e)
    }

    /// Queues a request its [`Scheduler::encoder`] checked and tokenized; returns its
    /// prompt's length in tokens.
    pub fn submit_encoded(&mut self, e: Encoded) -> Result<usize, SubmitError> {
        // (Checked by the encoder, the only maker of an Encoded, against this context.)
        let (tokens, req, constraint) = e.into_parts();
        let mut m = self.metrics.lock().unwrap_or_else(|p| p.into_inner());
        // Requests that will find a free slot at the next step do not wait.
        let free = self.active.iter().filter(|a| a.is_none()).count();
        if self.queue.len() >= self.max_queue + free {
            m.requests_rejected += 1;
            return Err(SubmitError::QueueFull { capacity: self.max_queue });
        }
        m.requests_total += 1;
        m.queue_length = self.queue.len() + 1;
        drop(m);
        let n = tokens.len();
        self.queue.push_back(Waiting { tokens, req, constraint });
        Ok(n)
    }

    /// Moves waiting requests into free slots: each into the free slot whose cache already
    /// holds the longest prefix of its prompt (a shared system prompt, an earlier turn of the
    /// conversation); when another slot, busy or not, holds more whole pages of it, the slot
    /// takes those pages (held by both, not copied). That prefix is kept and not evaluated
    /// again.
    fn admit(&mut self) {
        let common = |c: &[u32], p: &[u32]| c.iter().zip(p).take_while(|(a, b)| a == b).count();
        while let Some(front) = self.queue.front() {
            // One of its group still evaluates the same prompt: wait, then share its pages.
            let sibling_prefilling = front.req.group.is_some_and(|g| {
                self.active.iter().flatten().any(|a| a.group == Some(g) && a.prefilled < a.prompt.len())
            });
            if sibling_prefilling {
                break;
            }
            let best = (0..self.active.len())
                .filter(|&i| self.active[i].is_none())
                .max_by_key(|&i| (common(&self.cached[i], &front.tokens), std::cmp::Reverse(i)));
            let Some(i) = best else { break };
            let own = common(&self.cached[i], &front.tokens);
            let elsewhere = (0..self.active.len())
                .filter(|&j| j != i)
                .map(|j| (j, common(&self.cached[j], &front.tokens)))
                .max_by_key(|&(j, c)| (c, std::cmp::Reverse(j)));
            if let Some((j, c)) = elsewhere.filter(|&(_, c)| c / PAGE * PAGE > own) {
                let (src, dst) = two(&mut self.sessions, j, i);
                // The same cache: this cannot fail.
                let shared = dst.share_prefix(src, c).unwrap_or(0);
                self.cached[i] = self.cached[j][..shared].to_vec();
                self.metrics.lock().unwrap_or_else(|p| p.into_inner()).prompt_tokens_shared += shared as u64;
            }
            let w = self.queue.pop_front().expect("front exists");
            // At least the last prompt token is evaluated, for its logits.
            let wanted = common(&self.cached[i], &w.tokens).min(w.tokens.len() - 1);
            let kept = self.sessions[i].truncate(wanted);
            self.cached[i].truncate(kept);
            self.metrics.lock().unwrap_or_else(|p| p.into_inner()).prompt_tokens_reused += kept as u64;
            self.active[i] = Some(Active {
                sink: w.req.sink,
                sampler: Sampler::new(w.req.sampling).with_constraint(w.constraint),
                history: w.tokens.clone(),
                prompt: w.tokens,
                prefilled: kept,
                next: None,
                generated: 0,
                max_tokens: w.req.max_tokens,
                ignore_eos: w.req.ignore_eos,
                stream: TextStream::new(),
                stop: StopText::new(&w.req.stop),
                logprobs: w.req.logprobs,
                group: w.req.group,
                held_logprobs: std::collections::VecDeque::new(),
                drawn_bytes: 0,
                sent_bytes: 0,
            });
        }
    }

    /// One step: admit, then one forward pass over up to `chunk` prompt tokens (the next
    /// pieces of the unfinished prompts, several together when they are short) and one over
    /// the next token of every decoding slot. Two passes, not one: on a CPU the rows are
    /// compute-bound, and a new request's first token would otherwise also wait for every
    /// other slot's decode (time to first token with 7 streams busy: 2.18× its idle time
    /// in one pass, 1.5× in two; runtime/bench/serve_speed.sh). Returns whether any slot
    /// did work.
    pub fn step(&mut self) -> bool {
        self.admit();
        // Counted before any event of this step reaches a client.
        self.update_gauges();
        let mut worked = false;
        if let Err(e) = self.run_batch(true, &mut worked).and_then(|_| self.run_batch(false, &mut worked)) {
            // A device error: every active request fails, the slots are freed, and no cache
            // is trusted for reuse.
            for (c, s) in self.cached.iter_mut().zip(&mut self.sessions) {
                c.clear();
                s.reset();
            }
            let mut failed = 0;
            for slot in &mut self.active {
                if let Some(mut a) = slot.take() {
                    (a.sink)(GenEvent::Failed(e.to_string()));
                    failed += 1;
                }
            }
            self.metrics.lock().unwrap_or_else(|p| p.into_inner()).requests_failed += failed;
        }
        self.update_gauges();
        worked
    }

    /// Sets the /metrics gauges of the shared K/V cache: pages in use and all of them.
    fn update_page_gauges(&self) {
        let (used, total) = {
            let c = self.sessions[0].lock_cache();
            (c.pool.pages_in_use(), c.pool.n_pages())
        };
        let mut m = self.metrics.lock().unwrap_or_else(|p| p.into_inner());
        (m.kv_pages_used, m.kv_pages_total) = (used, total);
    }

    fn update_gauges(&self) {
        self.update_page_gauges();
        let mut m = self.metrics.lock().unwrap_or_else(|p| p.into_inner());
        m.queue_length = self.queue.len();
        m.active = self.active.iter().filter(|a| a.is_some()).count();
    }

    /// What each slot feeds a pass, in slot order: with `prompts`, the next piece of every
    /// unfinished prompt while the pass's budget of `chunk` tokens lasts (slots were filled
    /// in arrival order, so a lower slot is not always older; every prompt still advances
    /// once the ones before it finish); otherwise every decoding slot's next token.
    fn plan_batch(&self, prompts: bool) -> Vec<(usize, Vec<u32>)> {
        let mut budget = self.chunk;
        let mut rows = Vec::new();
        for (i, slot) in self.active.iter().enumerate() {
            let Some(a) = slot else { continue };
            match a.next {
                Some(tok) if !prompts => rows.push((i, vec![tok])),
                None if prompts && a.prefilled < a.prompt.len() && budget > 0 => {
                    let end = (a.prefilled + budget).min(a.prompt.len());
                    budget -= end - a.prefilled;
                    rows.push((i, a.prompt[a.prefilled..end].to_vec()));
                }
                _ => {}
            }
        }
        rows
    }

    /// One forward pass over [`Scheduler::plan_batch`]'s rows; samples where a prompt ended
    /// or a token was decoded.
    fn run_batch(&mut self, prompts: bool, worked: &mut bool) -> Result<(), RuntimeError> {
        let rows = self.plan_batch(prompts);
        if rows.is_empty() {
            return Ok(());
        }
        *worked = true;
        let t0 = Instant::now();
        let mut next = rows.iter().peekable();
        let mut batch = Batch::new();
        for (i, s) in self.sessions.iter_mut().enumerate() {
            if let Some((_, tokens)) = next.next_if(|(j, _)| *j == i) {
                batch.push(s, tokens, Logits::Last);
            }
        }
        // The grammars' masks for the tokens this pass's logits will draw are computed on a
        // helper thread while it runs (a mask takes ~0.1 ms; the pass, milliseconds).
        let (model, backend, context) = (&self.model, &mut self.backend, &mut self.context);
        let pending: Vec<&mut Sampler> =
            self.active.iter_mut().flatten().map(|a| &mut a.sampler).filter(|s| s.is_constrained()).collect();
        let logits = if pending.is_empty() {
            model.decode(backend, context, batch)?
        } else {
            std::thread::scope(|scope| {
                scope.spawn(move || pending.into_iter().for_each(Sampler::prepare));
                model.decode(backend, context, batch)
            })?
        };
        // The pages this pass took are counted before its tokens reach a client (a client
        // that reads /metrics after its first token sees its request's pages).
        self.update_page_gauges();
        let mut decoded = 0;
        for ((i, toks), mut l) in rows.into_iter().zip(logits) {
            self.cached[i].extend_from_slice(&toks);
            let a = self.active[i].as_mut().expect("planned slot");
            if a.next.is_some() {
                decoded += 1;
            } else {
                self.metrics.lock().unwrap_or_else(|p| p.into_inner()).prompt_tokens_total += toks.len() as u64;
                a.prefilled += toks.len();
                if a.prefilled < a.prompt.len() {
                    continue;
                }
            }
            // The model's own distribution, before the sampler changes the logits.
            let before = a.logprobs.map(|k| (Distribution::of(&l, k), l.clone()));
            let tok = a.sampler.sample(&mut l, &a.history);
            if let Some(e) = a.sampler.error() {
                let e = RuntimeError::Grammar(e.to_string());
                self.fail(i, &e);
                continue;
            }
            let logprob = before.map(|(dist, raw)| {
                let pieces = self.pieces.get_or_init(|| piece_table(&self.tokenizer, raw.len()));
                let piece = |id: u32| match pieces.get(id as usize) {
                    // A control token's text, without the marker that keeps grammars off it
                    // (a lone 0xFF is the byte token itself).
                    Some(p) if p.len() > 1 => p.strip_prefix(&[SPECIAL_MARKER]).unwrap_or(p).to_vec(),
                    Some(p) => p.clone(),
                    None => Vec::new(),
                };
                dist.entry(tok, raw.get(tok as usize).copied().unwrap_or(f32::NEG_INFINITY), &piece)
            });
            if let Err(e) = self.accept(i, tok, logprob) {
                // Its text could not be made (a token the tokenizer cannot decode): this
                // request fails, the others go on.
                self.fail(i, &e);
            }
        }
        if decoded > 0 {
            self.metrics.lock().unwrap_or_else(|p| p.into_inner()).decode_step(decoded, t0.elapsed().as_secs_f64());
        }
        Ok(())
    }

    /// Ends slot `i`'s request with `e` and frees its slot and pages.
    fn fail(&mut self, i: usize, e: &RuntimeError) {
        if let Some(mut a) = self.active[i].take() {
            (a.sink)(GenEvent::Failed(e.to_string()));
        }
        self.sessions[i].reset();
        self.cached[i].clear();
        self.metrics.lock().unwrap_or_else(|p| p.into_inner()).requests_failed += 1;
        self.update_gauges();
    }

    /// Takes sampled token `tok` of slot `i`: streams its text and finishes the request
    /// when it ends, otherwise schedules it to be fed.
    fn accept(&mut self, i: usize, tok: u32, logprob: Option<TokenLogprob>) -> Result<(), RuntimeError> {
        let n_past = self.sessions[i].n_past;
        let a = self.active[i].as_mut().expect("active slot");
        a.next = None;
        // (finish reason, whether a stop string ended it) or Continue / Gone.
        let outcome = if self.tokenizer.is_eog(tok) && !a.ignore_eos {
            Outcome::Finish(FinishReason::Stop, false)
        } else {
            a.generated += 1;
            a.history.push(tok);
            self.metrics.lock().unwrap_or_else(|p| p.into_inner()).generated_tokens_total += 1;
            let text = a.stream.push(&self.tokenizer, tok)?;
            let (out, stopped) = a.stop.push(&text);
            // (Counted in the text the token made, as the stop strings see it: a piece of a
            // character makes none until the character is whole.)
            a.drawn_bytes += text.len();
            if let Some(lp) = logprob {
                a.held_logprobs.push_back((lp, a.drawn_bytes));
            }
            a.sent_bytes += out.len();
            // The log probabilities of the tokens whose text goes out now, then the text.
            let mut heard = true;
            while heard && a.held_logprobs.front().is_some_and(|(_, end)| *end <= a.sent_bytes) {
                let (lp, _) = a.held_logprobs.pop_front().expect("a front");
                heard = (a.sink)(GenEvent::Logprob(lp));
            }
            if !heard || (!out.is_empty() && !(a.sink)(GenEvent::Text(out))) {
                Outcome::Gone
            } else if stopped {
                Outcome::Finish(FinishReason::Stop, true)
            } else if a.sampler.is_complete() {
                // The schema or grammar admits nothing more.
                Outcome::Finish(FinishReason::Stop, false)
            } else if a.max_tokens.is_some_and(|m| a.generated >= m) || n_past >= self.n_ctx {
                // (Feeding the token needs a free position.)
                Outcome::Finish(FinishReason::Length, false)
            } else {
                a.next = Some(tok);
                Outcome::Continue
            }
        };
        match outcome {
            Outcome::Continue => {}
            Outcome::Gone => {
                // Its pages go back at once (a finished request's stay for prefix reuse).
                self.active[i] = None;
                self.sessions[i].reset();
                self.cached[i].clear();
                self.update_gauges();
                self.metrics.lock().unwrap_or_else(|p| p.into_inner()).requests_cancelled += 1;
            }
            Outcome::Finish(finish, by_stop_string) => {
                let mut a = self.active[i].take().expect("active slot");
                // Text still held back (an incomplete character, a possible stop string's
                // start) goes out unless a stop string ended the reply.
                let rest = if by_stop_string {
                    String::new()
                } else {
                    let tail = a.stream.flush(&self.tokenizer)?;
                    let (out, stopped) = a.stop.push(&tail);
                    if stopped { out } else { out + &a.stop.flush() }
                };
                // The metrics are locked before the reply's end goes out, so that a client
                // that reads /metrics once its reply is complete sees it counted (sinks only
                // hand events to a channel and never take this lock).
                // Held log probabilities: their text goes out now, unless a stop string cut it.
                let mut heard = true;
                if !by_stop_string {
                    for (lp, _) in a.held_logprobs.drain(..) {
                        heard = heard && (a.sink)(GenEvent::Logprob(lp));
                    }
                }
                let mut m = self.metrics.lock().unwrap_or_else(|p| p.into_inner());
                let delivered = heard
                    && (rest.is_empty() || (a.sink)(GenEvent::Text(rest)))
                    && (a.sink)(GenEvent::Done {
                        finish,
                        prompt_tokens: a.prompt.len(),
                        completion_tokens: a.generated,
                    });
                if delivered {
                    m.requests_finished += 1;
                } else {
                    m.requests_cancelled += 1;
                }
                m.active = self.active.iter().filter(|a| a.is_some()).count();
            }
        }
        Ok(())
    }
}

/// Each id's bytes for log probabilities: what the token spells (the tokenizer's own table,
/// which grammars use too), control tokens as their text after [`SPECIAL_MARKER`]; each
/// piece's text where the decoder is neither byte-level nor byte-fallback.
fn piece_table(tok: &Tokenizer, n_vocab: usize) -> IdBytes {
    tok.id_bytes(n_vocab).unwrap_or_else(|_| {
        Arc::new((0..n_vocab as u32).map(|id| tok.id_to_token(id).unwrap_or_default().into_bytes()).collect())
    })
}
