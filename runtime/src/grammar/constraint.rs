//! One generation's grammar state: the mask of tokens that may come next, and the tokens
//! that came.

use std::sync::Arc;

use llguidance::Matcher;
use toktrie::SimpleVob;

use crate::grammar::first_line;

/// A compiled grammar following one reply (made by [`crate::grammar::Grammars::compile`]).
pub struct Constraint {
    matcher: Matcher,
    /// The next token's mask, once computed (None after each commit).
    mask: Option<SimpleVob>,
    eog: Arc<[u32]>,
    n_vocab: usize,
}

impl Constraint {
    /// Checks that `matcher` admits some string and computes its first mask.
    pub(crate) fn new(matcher: Matcher, eog: Arc<[u32]>, n_vocab: usize) -> Result<Constraint, String> {
        let mut c = Constraint { matcher, mask: None, eog, n_vocab };
        if let Some(e) = c.matcher.get_error() {
            return Err(first_line(&e));
        }
        let first = c.prepare();
        let nothing = c.mask.as_ref().is_none_or(|m| m.is_zero());
        match first {
            Err(e) => Err(format!("the schema or grammar admits no string ({e})")),
            Ok(()) if nothing => Err("the schema or grammar admits no string".into()),
            Ok(()) => Ok(c),
        }
    }

    /// An independent copy in the same state (the parser and its lexer caches cloned): the
    /// choices of one request each follow their own copy of one compiled grammar.
    pub fn fork(&self) -> Constraint {
        Constraint {
            matcher: self.matcher.deep_clone(),
            mask: self.mask.clone(),
            eog: Arc::clone(&self.eog),
            n_vocab: self.n_vocab,
        }
    }

    /// Computes the next token's mask unless it is known: the slow part (tens to hundreds
    /// of microseconds), which callers run beside the forward pass.
    pub fn prepare(&mut self) -> Result<(), String> {
        if self.mask.is_none() && !self.matcher.is_stopped() {
            let mask = self.matcher.compute_mask_or_eos().map_err(|e| first_line(&e.to_string()))?;
            self.mask = Some(mask);
        }
        match self.matcher.get_error() {
            Some(e) => Err(first_line(&e)),
            None => Ok(()),
        }
    }

    /// Sets the logits of tokens the grammar does not allow next to −∞ (every
    /// end-of-generation id counts as the end the grammar allows where it may end). After
    /// the grammar has ended only end-of-generation ids remain.
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<(), String> {
        self.prepare()?;
        let n = logits.len().min(self.n_vocab);
        let ends: Vec<(usize, f32)> =
            self.eog.iter().filter_map(|&t| logits.get(t as usize).map(|&l| (t as usize, l))).collect();
        let may_end = match &self.mask {
            Some(mask) => {
                // 32 ids a mask word: whole words allowed or refused are the common case.
                let words = mask.as_slice();
                for (w, chunk) in logits[..n].chunks_mut(32).enumerate() {
                    match words.get(w).copied().unwrap_or(0) {
                        u32::MAX => {}
                        0 => chunk.fill(f32::NEG_INFINITY),
                        bits => {
                            for (b, l) in chunk.iter_mut().enumerate() {
                                if bits >> b & 1 == 0 {
                                    *l = f32::NEG_INFINITY;
                                }
                            }
                        }
                    }
                }
                self.eog.iter().any(|&t| mask.is_allowed(t))
            }
            // Stopped: nothing but an end.
            None => {
                logits[..n].fill(f32::NEG_INFINITY);
                true
            }
        };
        logits[n..].fill(f32::NEG_INFINITY);
        if may_end {
            for (t, l) in ends {
                logits[t] = l;
            }
        }
        Ok(())
    }

    /// Feeds the drawn token `tok` (an end-of-generation id ends the reply: nothing to feed).
    pub fn commit(&mut self, tok: u32) -> Result<(), String> {
        self.mask = None;
        if self.eog.contains(&tok) {
            return Ok(());
        }
        self.matcher.consume_token(tok).map_err(|e| first_line(&e.to_string()))
    }

    /// The grammar admits nothing more: the reply is complete.
    pub fn is_complete(&self) -> bool {
        self.matcher.is_stopped()
    }
}
