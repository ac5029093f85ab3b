//! UTF-8-safe incremental detokenization for streaming output.
//!
//! A token may end in the middle of a multi-byte character (byte-level BPE splits emoji and
//! CJK into several tokens). Text is decoded over a small window of recent tokens and only
//! released once it no longer ends in an incomplete character, so the printed stream is
//! exactly the decoded text of all tokens.

use super::tokenizer::Tokenizer;
use crate::error::RuntimeError;

#[derive(Default)]
pub struct TextStream {
    tokens: Vec<u32>,
    /// Start of the window re-decoded for context (leading-space rules depend on it).
    prefix: usize,
    /// Tokens before this index have been emitted.
    read: usize,
}

impl TextStream {
    pub fn new() -> TextStream {
        TextStream::default()
    }

    /// Adds a token; returns the text it completes (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String, RuntimeError> {
        self.tokens.push(id);
        let prefix_text = tok.decode(&self.tokens[self.prefix..self.read], false)?;
        let new_text = tok.decode(&self.tokens[self.prefix..], false)?;
        if new_text.len() > prefix_text.len() && !new_text.ends_with('\u{FFFD}') {
            let delta = new_text.get(prefix_text.len()..).unwrap_or_default().to_string();
            self.prefix = self.read;
            self.read = self.tokens.len();
            Ok(delta)
        } else {
            Ok(String::new())
        }
    }

    /// Whatever is still held back (at the end of generation).
    pub fn flush(&mut self, tok: &Tokenizer) -> Result<String, RuntimeError> {
        let prefix_text = tok.decode(&self.tokens[self.prefix..self.read], false)?;
        let all = tok.decode(&self.tokens[self.prefix..], false)?;
        self.prefix = self.tokens.len();
        self.read = self.tokens.len();
        Ok(all.get(prefix_text.len()..).unwrap_or_default().to_string())
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }
}
