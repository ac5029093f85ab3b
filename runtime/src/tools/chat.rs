//! A multi-turn conversation kept within the context window: each turn renders the whole
//! history with the chat template (the engine reuses the cached prefix), and the oldest
//! turns are dropped when the history no longer fits.

use crate::backend::Backend;
use crate::engine::{Engine, GenStats};
use crate::error::RuntimeError;
use crate::sampler::Sampler;
use crate::text::Message;
use crate::text::chat_template::encode_chat;

#[derive(Clone, Debug, Default)]
pub struct Conversation {
    pub system: Option<String>,
    /// (user, assistant) pairs, oldest first.
    pub turns: Vec<(String, String)>,
    /// Special-token text in messages becomes those tokens (`--special`); by default it
    /// stays text ([`encode_chat`]).
    pub allow_special: bool,
}

/// The outcome of one turn.
pub struct Reply {
    pub text: String,
    pub stats: GenStats,
    /// Oldest turns dropped to make room before this reply.
    pub dropped_turns: usize,
}

impl Conversation {
    pub fn new(system: Option<String>) -> Conversation {
        Conversation { system, turns: Vec::new(), allow_special: false }
    }

    fn messages(&self, user: &str) -> Vec<Message> {
        let mut m = Vec::with_capacity(2 * self.turns.len() + 2);
        if let Some(s) = &self.system {
            m.push(Message::new("system", s));
        }
        for (u, a) in &self.turns {
            m.push(Message::new("user", u));
            m.push(Message::new("assistant", a));
        }
        m.push(Message::new("user", user));
        m
    }

    /// Tokens of the whole conversation plus `user`, ready for the assistant's reply,
    /// dropping the oldest turns until `reserve` tokens remain free for the reply.
    pub fn prompt<B: Backend>(
        &mut self,
        engine: &Engine<B>,
        user: &str,
        reserve: usize,
    ) -> Result<(Vec<u32>, usize), RuntimeError> {
        let mut dropped = 0;
        loop {
            let msgs = self.messages(user);
            let tokens = encode_chat(&engine.template, &engine.tokenizer, &msgs, true, self.allow_special)?;
            if tokens.len() + reserve <= engine.n_ctx() {
                return Ok((tokens, dropped));
            }
            if self.turns.is_empty() {
                return Err(RuntimeError::ContextFull { n_ctx: engine.n_ctx(), needed: tokens.len() + reserve });
            }
            self.turns.remove(0);
            dropped += 1;
        }
    }

    /// Checks, before the first message, that the system prompt leaves room in the context
    /// for a message and a reply (`max_new` tokens, as [`Conversation::turn`] reserves): a
    /// system prompt longer than the context made every message fail.
    pub fn check_system_fits<B: Backend>(&self, engine: &Engine<B>, max_new: usize) -> Result<(), RuntimeError> {
        if self.system.is_none() {
            return Ok(());
        }
        let reserve = max_new.min(engine.n_ctx() / 4).max(1);
        let tokens =
            encode_chat(&engine.template, &engine.tokenizer, &self.messages(""), true, self.allow_special)?.len();
        if tokens + reserve > engine.n_ctx() {
            return Err(RuntimeError::Usage(format!(
                "the system prompt takes {tokens} tokens; with {reserve} kept for a reply the context of {} has no room for a message (shorten --system or raise --ctx-size)",
                engine.n_ctx()
            )));
        }
        Ok(())
    }

    /// Runs one turn: the assistant's reply to `user`, streamed through `on_text`.
    pub fn turn<B: Backend>(
        &mut self,
        engine: &mut Engine<B>,
        user: &str,
        max_new: usize,
        sampler: &mut Sampler,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Reply, RuntimeError> {
        // Keep room for a useful reply: up to a quarter of the context.
        let reserve = max_new.min(engine.n_ctx() / 4).max(1);
        let (tokens, dropped_turns) = self.prompt(engine, user, reserve)?;
        let budget = max_new.min(engine.n_ctx() - tokens.len());
        let (out, stats) = engine.generate(&tokens, budget, sampler, on_text)?;
        let text = engine.tokenizer.decode(&out, false)?;
        self.turns.push((user.to_string(), text.trim().to_string()));
        Ok(Reply { text, stats, dropped_turns })
    }

    pub fn reset(&mut self) {
        self.turns.clear();
    }
}
