//! Runtime errors, worded for users: they name the file or value and the problem.

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Gguf(#[from] duet_quant::gguf::GgufError),
    #[error("{0}")]
    BadModel(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    Usage(String),
    #[error("the context is full: {needed} tokens needed, the context holds {n_ctx} (raise --ctx-size)")]
    ContextFull { n_ctx: usize, needed: usize },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
    /// Structured output: a grammar that failed while a reply followed it.
    #[error("structured output: {0}")]
    Grammar(String),
    /// Not enough memory for what was asked (a context too large), found before allocating.
    #[error("{0}")]
    OutOfMemory(String),
    /// A GPU problem (no adapter, a missing limit or feature, device lost, out of memory).
    #[error("{0}")]
    Device(String),
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
}
