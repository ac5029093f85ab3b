//! The engine thread: it owns the backend, the model and the slots, runs steps while there
//! is work and sleeps on its command channel when there is none. Other threads (HTTP
//! handlers) submit through a [`Handle`].

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::backend::Backend;
use crate::tools::serve::metrics::Metrics;
use crate::tools::serve::prompt::Encoded;
use crate::tools::serve::prompt::PromptEncoder;
use crate::tools::serve::scheduler::Scheduler;
use crate::tools::serve::{GenRequest, SubmitError};

/// What the engine thread runs: a [`Scheduler`] of any backend.
pub trait Engine {
    fn encoder(&self) -> PromptEncoder;
    fn submit_encoded(&mut self, e: Encoded) -> Result<usize, SubmitError>;
    fn step(&mut self) -> bool;
    fn idle(&self) -> bool;
    fn metrics(&self) -> Arc<Mutex<Metrics>>;
    fn n_ctx(&self) -> usize;
    /// The embedding of `tokens` ([`crate::tools::embed`]), between steps.
    fn embed(&mut self, tokens: &[u32]) -> Result<Vec<f32>, String>;
}

impl<B: Backend> Engine for Scheduler<B> {
    fn encoder(&self) -> PromptEncoder {
        Scheduler::encoder(self)
    }
    fn submit_encoded(&mut self, e: Encoded) -> Result<usize, SubmitError> {
        Scheduler::submit_encoded(self, e)
    }
    fn step(&mut self) -> bool {
        Scheduler::step(self)
    }
    fn idle(&self) -> bool {
        Scheduler::idle(self)
    }
    fn metrics(&self) -> Arc<Mutex<Metrics>> {
        Scheduler::metrics(self)
    }
    fn n_ctx(&self) -> usize {
        Scheduler::n_ctx(self)
    }
    fn embed(&mut self, tokens: &[u32]) -> Result<Vec<f32>, String> {
        Scheduler::embed(self, tokens).map_err(|e| e.to_string())
    }
}

enum Command {
    // (Boxed: a request with its compiled grammar is kilobytes.)
    Submit(Box<Encoded>, mpsc::SyncSender<Result<usize, SubmitError>>),
    Embed(Vec<u32>, mpsc::SyncSender<Result<Vec<f32>, String>>),
    Stop,
}

/// Submits to the engine thread; cheap to share between threads.
pub struct Handle {
    tx: mpsc::Sender<Command>,
    metrics: Arc<Mutex<Metrics>>,
    encoder: PromptEncoder,
    n_ctx: usize,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Handle {
    /// Starts the engine thread, where `make` loads the model (so that the backend never
    /// crosses threads), and waits until it is loaded: a load error comes back here.
    pub fn start<F>(make: F) -> Result<Handle, String>
    where
        F: FnOnce() -> Result<Box<dyn Engine>, String> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel::<Command>();
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("duet-engine".into())
            .spawn(move || {
                let mut engine = match make() {
                    Ok(e) => e,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok((engine.metrics(), engine.encoder(), engine.n_ctx())));
                run(engine.as_mut(), &rx);
            })
            .map_err(|e| format!("cannot start the engine thread: {e}"))?;
        match ready_rx.recv() {
            Ok(Ok((metrics, encoder, n_ctx))) => {
                Ok(Handle { tx, metrics, encoder, n_ctx, thread: Mutex::new(Some(thread)) })
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err("the engine thread ended while loading the model".into()),
        }
    }

    /// Checks and tokenizes `req` on this thread (the engine thread only queues it, so a
    /// large or bad prompt delays no other stream), then queues it (its events go to its
    /// sink); returns its prompt length in tokens.
    pub fn submit(&self, req: GenRequest) -> Result<usize, SubmitError> {
        let e = self.encoder.encode(req)?;
        let (reply_tx, reply_rx) = mpsc::sync_channel(1);
        self.tx
            .send(Command::Submit(Box::new(e), reply_tx))
            .map_err(|_| SubmitError::Stopped("the engine thread is gone".into()))?;
        reply_rx.recv().unwrap_or_else(|_| Err(SubmitError::Stopped("the engine thread is gone".into())))
    }

    /// The embedding of `text` (see [`crate::tools::embed`]), tokenized here the model's way
    /// (BOS where the model wants it), then as [`Handle::embed_tokens`].
    pub fn embed(&self, text: &str) -> Result<(Vec<f32>, usize), SubmitError> {
        let tok = self.encoder.tokenizer();
        let tokens = tok.encode(text, tok.add_bos).map_err(|e| SubmitError::BadPrompt(e.to_string()))?;
        self.embed_tokens(tokens)
    }

    /// The embedding of `tokens` as given (nothing added: a client that sends token ids has
    /// tokenized already), checked here (not empty, within the context, every id in the
    /// vocabulary), evaluated on the engine thread between two steps; also the token count.
    pub fn embed_tokens(&self, tokens: Vec<u32>) -> Result<(Vec<f32>, usize), SubmitError> {
        if tokens.is_empty() {
            return Err(SubmitError::BadPrompt("an input to embed is empty".into()));
        }
        let vocab = self.encoder.n_vocab();
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(SubmitError::BadPrompt(format!("token id {t} is outside the model's vocabulary of {vocab}")));
        }
        if tokens.len() > self.n_ctx {
            return Err(SubmitError::TooLong { prompt_tokens: tokens.len(), n_ctx: self.n_ctx });
        }
        let n = tokens.len();
        let (reply_tx, reply_rx) = mpsc::sync_channel(1);
        self.tx
            .send(Command::Embed(tokens, reply_tx))
            .map_err(|_| SubmitError::Stopped("the engine thread is gone".into()))?;
        match reply_rx.recv() {
            Ok(Ok(v)) => Ok((v, n)),
            Ok(Err(e)) => Err(SubmitError::Stopped(e)),
            Err(_) => Err(SubmitError::Stopped("the engine thread is gone".into())),
        }
    }

    pub fn metrics(&self) -> Metrics {
        self.metrics.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// How the model's template writes tool calls (to read them from replies).
    pub fn tool_format(&self) -> crate::tools::serve::tool_calls::Format {
        self.encoder.tool_format()
    }

    /// Rows of the model's token embedding: the ids it can evaluate.
    pub fn n_vocab(&self) -> usize {
        self.encoder.n_vocab()
    }

    /// The model's tokenizer (for /tokenize and /detokenize).
    pub fn tokenizer(&self) -> &Arc<crate::text::Tokenizer> {
        self.encoder.tokenizer()
    }

    /// Stops the engine thread (requests in flight end without a reply) and waits for it.
    pub fn stop(&self) {
        let _ = self.tx.send(Command::Stop);
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
    }
}

/// Handles commands and steps until told to stop (or every handle is gone and the work is
/// done). Sleeps on the channel when idle.
fn run(engine: &mut dyn Engine, rx: &mpsc::Receiver<Command>) {
    loop {
        let first = if engine.idle() {
            match rx.recv() {
                Ok(c) => Some(c),
                Err(_) => return,
            }
        } else {
            None
        };
        for cmd in first.into_iter().chain(std::iter::from_fn(|| rx.try_recv().ok())) {
            match cmd {
                Command::Submit(e, reply) => {
                    let _ = reply.send(engine.submit_encoded(*e));
                }
                Command::Embed(tokens, reply) => {
                    let _ = reply.send(engine.embed(&tokens));
                }
                Command::Stop => return,
            }
        }
        if !engine.idle() {
            engine.step();
        }
    }
}
