//! The multi-sequence engine behind `duet serve`: requests queue, are admitted into a fixed
//! number of slots (each a [`crate::model::Session`], its positions in pages of one shared K/V cache), and run
//! together — every step is one batch ([`crate::model::Model::decode`]) over up to
//! a chunk of prompt tokens of newly admitted requests (pieces of several prompts when they
//! are short), then one over the next token of every decoding slot, so new requests join the
//! running batch and prompts interleave with decoding (continuous batching). Sampling, stop
//! strings and limits travel with each request.
//!
//! * [`scheduler`]: the slots, the queue and the step.
//! * [`handle`]: the engine thread and the handle other threads submit through.
//! * [`metrics`]: counters for Prometheus.
//! * [`openai`]: the OpenAI API's request JSON; [`openai_reply`]: its replies.
//! * [`logprobs`]: log probabilities of drawn tokens.
//! * [`prompt`]: a request's checks and its prompt's tokens, on the submitting thread.
//! * [`stop`]: stop strings over streamed text.
//! * [`tool_calls`]: tools in the prompt, calls in the reply.
//!
//! HTTP lives in the `duet serve` command; nothing here knows about it.

pub mod handle;
pub mod logprobs;
pub mod metrics;
pub mod openai;
pub mod openai_reply;
pub mod prompt;
pub mod scheduler;
pub mod stop;
pub mod tool_calls;

use crate::sampler::SamplerConfig;
use crate::text::Message;

/// What to complete.
#[derive(Clone, Debug)]
pub enum Prompt {
    /// Raw text (completions).
    Text(String),
    /// A conversation, rendered with the model's chat template and a generation prompt.
    Chat(Vec<Message>),
}

/// Why a generation ended, as the OpenAI API names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens`, or the context is full.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// A drawn token's log probability and the most likely alternatives (`logprobs`).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The token's bytes (a piece of a character when it splits one).
    pub token: Vec<u8>,
    pub logprob: f32,
    /// The most likely tokens at its place, most likely first.
    pub top: Vec<(Vec<u8>, f32)>,
}

/// What a request receives, in order: text pieces (each after the log probabilities of its
/// tokens, when asked for), then `Done` (or `Failed`).
#[derive(Clone, Debug, PartialEq)]
pub enum GenEvent {
    Text(String),
    /// The next drawn token's log probability, when the request asked for them.
    Logprob(TokenLogprob),
    Done {
        finish: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
    },
    Failed(String),
}

/// Receives a request's events; returns false once nobody listens (the client went away),
/// which cancels the request and frees its slot.
pub type Sink = Box<dyn FnMut(GenEvent) -> bool + Send>;

pub struct GenRequest {
    pub prompt: Prompt,
    pub sampling: SamplerConfig,
    /// Tokens to generate at most (None: until the end of generation or a full context).
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    /// Keep generating past end-of-generation tokens (llama-server's `ignore_eos`, for
    /// benchmarks and load tests that need replies of a fixed length).
    pub ignore_eos: bool,
    /// What the reply must be (a JSON schema, a grammar), compiled where the request is
    /// encoded.
    pub grammar: Option<crate::grammar::GrammarSpec>,
    /// Tools the model may call (the template is given them; unless `tool_choice` is
    /// `none`, the reply is held to text or calls).
    pub tools: Option<tool_calls::Tools>,
    /// Report each drawn token's log probability and this many alternatives (≤
    /// [`logprobs::MAX_TOP_LOGPROBS`]); None: none.
    pub logprobs: Option<usize>,
    /// Requests of one group (the `n` choices of one API request, the same prompt) are
    /// admitted one after another's prompt is in the cache, so that they share its pages
    /// instead of each evaluating it.
    pub group: Option<u64>,
    pub sink: Sink,
}

/// Why a request was not queued.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// The queue holds `capacity` waiting requests already.
    QueueFull { capacity: usize },
    /// The prompt leaves no room to generate in the context.
    TooLong { prompt_tokens: usize, n_ctx: usize },
    /// The prompt could not be rendered or tokenized.
    BadPrompt(String),
    /// The schema or grammar is too large, does not compile, or admits no string.
    BadGrammar(String),
    /// The engine stopped (it failed to load or hit a device error).
    Stopped(String),
}

impl std::fmt::Display for SubmitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SubmitError::QueueFull { capacity } => {
                write!(f, "the server is busy: {capacity} requests are already waiting (try again later)")
            }
            SubmitError::TooLong { prompt_tokens, n_ctx } => write!(
                f,
                "the prompt is {prompt_tokens} tokens but the context holds {n_ctx}, leaving no room for a reply"
            ),
            SubmitError::BadPrompt(m) => write!(f, "{m}"),
            SubmitError::BadGrammar(m) => write!(f, "response_format, json_schema or grammar: {m}"),
            SubmitError::Stopped(m) => write!(f, "the engine has stopped: {m}"),
        }
    }
}
