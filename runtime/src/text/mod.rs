//! Text: tokenizers, chat templates and streaming detokenization.

pub mod chat_template;
pub mod stream;
pub mod token_bytes;
pub mod tokenizer;

pub use chat_template::{ChatTemplate, Message, TemplateLimits};
pub use stream::TextStream;
pub use tokenizer::{IdBytes, Tokenizer};
