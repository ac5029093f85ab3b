//! Structured output: a reply held to a JSON schema or a grammar by masking, before each
//! draw, every token that cannot continue a string the schema or grammar admits (llguidance,
//! the constrained-decoding library llama.cpp and mistral.rs use).
//!
//! * [`GrammarSpec`]: what a request asks for — any JSON object, a JSON schema, a Lark
//!   grammar or llama.cpp's GBNF ([`gbnf`] translates it to Lark).
//! * [`Grammars`]: one per tokenizer, it compiles specs into [`Constraint`]s; compiling is
//!   where every mistake is found (a schema that does not compile, a grammar that admits no
//!   string, one above [`MAX_GRAMMAR_BYTES`]), so callers compile before queueing work.
//! * [`Constraint`]: one generation's matcher; the [`crate::sampler::Sampler`] applies its
//!   mask and feeds it each token, and the caller computes the next mask beside the forward
//!   pass ([`crate::sampler::Sampler::prepare`]), so that constrained decoding costs little
//!   more than plain decoding.
//!
//! JSON is written compactly with `", "` and `": "` separators: flexible whitespace would let
//! a weak model spend its whole budget on spaces. A schema may override that with
//! llguidance's `x-guidance` options. `$ref`s must point inside the schema (nothing is
//! fetched).

pub mod constraint;
pub mod gbnf;
mod token_env;

use std::sync::{Arc, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};

pub use constraint::Constraint;

use crate::text::Tokenizer;

/// The largest schema (as JSON text) or grammar a request may give. llguidance's own limits
/// (grammar size, lexer states, fuel per step) bound the work of anything smaller.
pub const MAX_GRAMMAR_BYTES: usize = 64 * 1024;

/// What a reply must be.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object (OpenAI's `json_object` mode).
    JsonObject,
    /// JSON valid under this schema.
    JsonSchema(Value),
    /// A grammar in llguidance's Lark dialect.
    Lark(String),
    /// A grammar in llama.cpp's GBNF.
    Gbnf(String),
}

impl GrammarSpec {
    /// A grammar file's text: Lark when it starts with `%llguidance` (llama.cpp's marker for
    /// llguidance grammars) or `lark` is true, GBNF otherwise.
    pub fn grammar(text: String, lark: bool) -> GrammarSpec {
        if lark || text.trim_start().starts_with("%llguidance") {
            GrammarSpec::Lark(text)
        } else {
            GrammarSpec::Gbnf(text)
        }
    }

    /// Its size as text, for [`MAX_GRAMMAR_BYTES`].
    pub fn size(&self) -> usize {
        match self {
            GrammarSpec::JsonObject => 0,
            GrammarSpec::JsonSchema(v) => v.to_string().len(),
            GrammarSpec::Lark(t) | GrammarSpec::Gbnf(t) => t.len(),
        }
    }

    fn to_llguidance(&self) -> Result<TopLevelGrammar, String> {
        let compact = json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "});
        Ok(match self {
            GrammarSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(json!({"type": "object", "x-guidance": compact}))
            }
            GrammarSpec::JsonSchema(schema) => {
                let mut schema = schema.clone();
                match &mut schema {
                    Value::Object(o) => {
                        o.entry("x-guidance").or_insert(compact);
                    }
                    // `true` admits any JSON value; `false` none (refused when compiled).
                    Value::Bool(_) => {}
                    _ => return Err("a JSON schema must be an object or a boolean".into()),
                }
                TopLevelGrammar::from_json_schema(schema)
            }
            GrammarSpec::Lark(text) => {
                let text = text.trim_start().strip_prefix("%llguidance").unwrap_or(text);
                // llama.cpp's marker takes an options object after it: `%llguidance {}`.
                let text = text.trim_start().strip_prefix("{}").unwrap_or(text);
                TopLevelGrammar::from_lark(text.to_string())
            }
            GrammarSpec::Gbnf(text) => TopLevelGrammar::from_lark(gbnf::gbnf_to_lark(text)?),
        })
    }
}

/// Compiles [`GrammarSpec`]s for one tokenizer; cheap to clone and share between threads.
/// The token trie is built at the first compile (~0.1 s for 50 000 tokens), so a server or
/// a run that never constrains a reply never pays for it.
#[derive(Clone)]
pub struct Grammars {
    tok: Arc<Tokenizer>,
    /// The model's logits: ids `0..n_vocab`.
    n_vocab: usize,
    compiler: Arc<OnceLock<Result<Compiler, String>>>,
    /// Grammars compiled so far (by every clone).
    compiled: Arc<std::sync::atomic::AtomicU64>,
    /// The last request group's grammar as compiled, untouched: the group's other choices
    /// (`n`) fork it instead of compiling it again ([`Grammars::compile_in_group`]).
    last_group: Arc<std::sync::Mutex<Option<(u64, Constraint)>>>,
}

/// What the first compile builds.
struct Compiler {
    factory: ParserFactory,
    /// End-of-generation ids: allowed where the grammar may end.
    eog: Arc<[u32]>,
}

impl Grammars {
    pub fn new(tok: Arc<Tokenizer>, n_vocab: usize) -> Grammars {
        Grammars {
            tok,
            n_vocab,
            compiler: Arc::new(OnceLock::new()),
            compiled: Arc::default(),
            last_group: Arc::default(),
        }
    }

    /// How many grammars this set (and its clones) compiled: the choices of one request
    /// compile theirs once (tests).
    pub fn compiled(&self) -> u64 {
        self.compiled.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    fn compiler(&self) -> Result<&Compiler, String> {
        let made = self.compiler.get_or_init(|| {
            let tok = &self.tok;
            let eog: Arc<[u32]> = tok.eog.iter().copied().filter(|&t| (t as usize) < self.n_vocab).collect();
            let Some(&eos) = eog.first() else {
                return Err("structured output needs a model with an end-of-generation token; this one has none".into());
            };
            let env = token_env::TokenEnv::shared(Arc::clone(tok), self.n_vocab, eos).map_err(|e| e.to_string())?;
            let mut factory = ParserFactory::new(
                &env,
                toktrie::InferenceCapabilities::default(),
                &llguidance::earley::SlicedBiasComputer::general_slices(),
            )
            .map_err(|e| format!("structured output: {e}"))?;
            factory.quiet();
            // Errors carry the reason only, not the parser's state and the whole grammar.
            factory.limits_mut().verbose_errors = false;
            Ok(Compiler { factory, eog })
        });
        made.as_ref().map_err(String::clone)
    }

    /// A fresh matcher of `spec`, or why `spec` cannot constrain a reply (too large, does not
    /// compile, admits no string).
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Constraint, String> {
        let size = spec.size();
        if size > MAX_GRAMMAR_BYTES {
            return Err(format!("the schema or grammar is {size} bytes; duet takes at most {MAX_GRAMMAR_BYTES} bytes"));
        }
        let grammar = spec.to_llguidance()?;
        let c = self.compiler()?;
        self.compiled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let parser = c.factory.create_parser(grammar).map_err(|e| first_line(&e.to_string()))?;
        Constraint::new(Matcher::new(Ok(parser)), Arc::clone(&c.eog), self.n_vocab)
    }

    /// [`Grammars::compile`] for a request of group `group` (the choices of one API request:
    /// the same spec): a fork of the group's compiled grammar when it was the last group
    /// compiled, else compiled now (outside the lock: it takes milliseconds) and kept.
    pub fn compile_in_group(&self, group: u64, spec: &GrammarSpec) -> Result<Constraint, String> {
        let lock = || self.last_group.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, c)) = lock().as_ref().filter(|(id, _)| *id == group) {
            return Ok(c.fork());
        }
        let c = self.compile(spec)?;
        *lock() = Some((group, c.fork()));
        Ok(c)
    }
}

/// llguidance's errors can carry the whole grammar after the reason: the reason is enough.
pub(crate) fn first_line(e: &str) -> String {
    let line = e.lines().next().unwrap_or(e);
    let mut s: String = line.chars().take(500).collect();
    if s.len() < line.len() {
        s.push('…');
    }
    s
}
