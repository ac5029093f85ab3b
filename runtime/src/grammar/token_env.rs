//! The tokenizer as llguidance sees it: the byte string of every id in a token trie, and
//! tokenization of bytes (for the tokens a grammar forces).

use std::sync::Arc;

use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::error::RuntimeError;
use crate::text::Tokenizer;

pub struct TokenEnv {
    tok: Arc<Tokenizer>,
    trie: TokTrie,
}

impl TokenEnv {
    /// The environment of ids `0..n_vocab` of `tok`, `eos` the id a finished grammar allows.
    pub fn shared(tok: Arc<Tokenizer>, n_vocab: usize, eos: u32) -> Result<TokEnv, RuntimeError> {
        let words = tok.id_bytes(n_vocab)?;
        let info = TokRxInfo {
            vocab_size: n_vocab as u32,
            tok_eos: eos,
            tok_bos: tok.bos,
            tok_pad: None,
            tok_unk: None,
            tok_end_of_turn: None,
        };
        let trie = TokTrie::from(&info, &words);
        Ok(Arc::new(TokenEnv { tok, trie }))
    }
}

impl TokenizerEnv for TokenEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // Text the model's way; bytes that are not UTF-8, greedily by the trie.
        let n = self.trie.vocab_size();
        let ids = std::str::from_utf8(s).ok().and_then(|t| self.tok.encode_literal(t).ok());
        match ids.filter(|ids| ids.iter().all(|&i| (i as usize) < n)) {
            Some(ids) => ids,
            None => self.trie.greedy_tokenize(s),
        }
    }
}
