//! A request's checks and its prompt's tokens, made on the submitting thread (an HTTP
//! handler's), not the engine's: rendering a chat template and tokenizing cost ~120 bytes
//! of work a prompt byte (a 1.9 MB prompt took 1.4 s), and on the engine thread every
//! other stream waited for it. Sizes are checked before any of that work: the prompt's
//! bytes against what the context can hold, the stop strings' number and length (each is
//! matched against every streamed piece of text), and the tokens against the model's
//! vocabulary (a file whose tokenizer knows more ids than its embedding has rows would
//! otherwise fail the whole engine step, every stream in it).

use std::sync::Arc;

use crate::grammar::{Constraint, Grammars};
use crate::text::{ChatTemplate, Tokenizer};
use crate::tools::serve::tool_calls::{self, Format};
use crate::tools::serve::{GenRequest, Prompt, SubmitError};

/// Bytes of prompt text a context position may stand for. Real text runs 3 to 5 bytes a
/// token; long tokens (runs of spaces in code vocabularies) reach a few dozen bytes; so a
/// prompt longer than this for the context would not fit once tokenized.
pub const PROMPT_BYTES_PER_TOKEN: usize = 64;
/// Stop strings a request may give (as OpenAI's API).
pub const MAX_STOP_STRINGS: usize = 4;
/// Bytes of one stop string.
pub const MAX_STOP_BYTES: usize = 1024;

/// A request whose prompt is tokens, checked: only [`PromptEncoder::encode`] makes one, so
/// the engine thread queues it without checking again.
pub struct Encoded {
    tokens: Vec<u32>,
    req: GenRequest,
    /// The request's grammar, compiled.
    constraint: Option<Constraint>,
}

impl Encoded {
    /// The prompt's tokens, the request and its compiled grammar.
    pub fn into_parts(self) -> (Vec<u32>, GenRequest, Option<Constraint>) {
        (self.tokens, self.req, self.constraint)
    }
}

/// Turns requests into tokens on any thread; cheap to clone.
#[derive(Clone)]
pub struct PromptEncoder {
    tokenizer: Arc<Tokenizer>,
    template: Arc<ChatTemplate>,
    /// Special-token text in chat messages becomes those tokens (`--special`).
    allow_special: bool,
    n_ctx: usize,
    n_vocab: usize,
    grammars: Grammars,
}

impl PromptEncoder {
    pub fn new(
        tokenizer: Arc<Tokenizer>,
        template: Arc<ChatTemplate>,
        allow_special: bool,
        n_ctx: usize,
        grammars: Grammars,
    ) -> PromptEncoder {
        let n_vocab = grammars.n_vocab();
        PromptEncoder { tokenizer, template, allow_special, n_ctx, n_vocab, grammars }
    }

    /// How the model's template writes tool calls.
    pub fn tool_format(&self) -> Format {
        Format::of(&self.template)
    }

    /// The grammar compiler of this model's requests.
    pub fn grammars(&self) -> &Grammars {
        &self.grammars
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// Rows of the model's token embedding: the ids it can evaluate (the tokenizer may
    /// know more).
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// The most prompt bytes this context takes.
    pub fn max_prompt_bytes(&self) -> usize {
        self.n_ctx.saturating_mul(PROMPT_BYTES_PER_TOKEN)
    }

    /// Checks `req` and tokenizes its prompt: not empty, shorter than the context, every id
    /// inside the vocabulary; compiles its grammar (see [`Grammars::compile`]).
    pub fn encode(&self, req: GenRequest) -> Result<Encoded, SubmitError> {
        if req.stop.len() > MAX_STOP_STRINGS {
            return Err(SubmitError::BadPrompt(format!(
                "{} stop strings; duet takes at most {MAX_STOP_STRINGS}",
                req.stop.len()
            )));
        }
        if let Some(s) = req.stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
            return Err(SubmitError::BadPrompt(format!(
                "a stop string of {} bytes; duet takes at most {MAX_STOP_BYTES} bytes each",
                s.len()
            )));
        }
        let max = self.max_prompt_bytes();
        let too_long = |what: &str, bytes: usize| {
            SubmitError::BadPrompt(format!(
                "{what} is {bytes} bytes, more than a context of {} tokens holds (duet takes at most {max} bytes, \
                 {PROMPT_BYTES_PER_TOKEN} a token)",
                self.n_ctx
            ))
        };
        let tokens = match &req.prompt {
            Prompt::Text(t) => {
                if t.len() > max {
                    return Err(too_long("the prompt", t.len()));
                }
                self.tokenizer.encode_rendered(t)
            }
            Prompt::Chat(messages) => {
                let bytes: usize = messages.iter().map(|m| m.content.len() + m.role.len()).sum();
                if bytes > max {
                    return Err(too_long("the conversation", bytes));
                }
                match &req.tools {
                    None => crate::text::chat_template::encode_chat(
                        &self.template,
                        &self.tokenizer,
                        messages,
                        true,
                        self.allow_special,
                    ),
                    Some(tools) => {
                        // The tools and earlier calls reach the template as they are: text in
                        // them that spells a control token would become it (unless --special).
                        let calls = messages.iter().filter_map(|m| m.tool_calls.as_ref());
                        let spelled = std::iter::once(serde_json::Value::Array(tools.list.clone()).to_string())
                            .chain(calls.map(|c| c.to_string()))
                            .any(|t| self.tokenizer.holds_special_text(&t));
                        if spelled && !self.allow_special {
                            return Err(SubmitError::BadPrompt(
                                "the tools or tool calls hold the text of a control token (<|im_start|>…), which \
                                 would become that token; duet serve --special lets it"
                                    .into(),
                            ));
                        }
                        let format = self.tool_format();
                        let messages = tool_calls::prepare_messages(messages.clone(), tools, format);
                        let list = serde_json::Value::Array(tools.list.clone());
                        let native = (format != Format::Generic).then_some(&list);
                        crate::text::chat_template::encode_chat_with_tools(
                            &self.template,
                            &self.tokenizer,
                            &messages,
                            true,
                            self.allow_special,
                            native,
                        )
                    }
                }
            }
        }
        .map_err(|e| SubmitError::BadPrompt(e.to_string()))?;
        if tokens.is_empty() {
            return Err(SubmitError::BadPrompt("the prompt is empty".into()));
        }
        if tokens.len() >= self.n_ctx {
            return Err(SubmitError::TooLong { prompt_tokens: tokens.len(), n_ctx: self.n_ctx });
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.n_vocab) {
            return Err(SubmitError::BadPrompt(format!(
                "the model's tokenizer made token id {bad}, outside its vocabulary of {} (the model file is \
                 inconsistent)",
                self.n_vocab
            )));
        }
        // Last: a grammar compiles in milliseconds, after the cheaper checks. Tools bring
        // their own (calls of them, or text).
        let marker = self.tokenizer.token_to_id("[TOOL_CALLS]");
        let tool_grammar = req.tools.as_ref().and_then(|t| tool_calls::grammar(t, self.tool_format(), marker));
        let grammar = req.grammar.as_ref().or(tool_grammar.as_ref());
        let constraint = match (grammar, req.group) {
            (None, _) => None,
            (Some(g), None) => Some(self.grammars.compile(g)),
            (Some(g), Some(group)) => Some(self.grammars.compile_in_group(group, g)),
        };
        let constraint = constraint.transpose().map_err(SubmitError::BadGrammar)?;
        Ok(Encoded { tokens, req, constraint })
    }
}
