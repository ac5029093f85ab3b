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

    /// The conversation as OpenAI chat messages: `{"messages": [{"role", "content"}, …]}`
    /// (what `duet chat`'s `/save` writes and `/load` reads).
    pub fn to_json(&self) -> serde_json::Value {
        let msgs: Vec<serde_json::Value> = self
            .messages("")
            .into_iter()
            .take(self.system.iter().count() + 2 * self.turns.len())
            .map(|m| serde_json::json!({"role": m.role, "content": m.content}))
            .collect();
        serde_json::json!({ "messages": msgs })
    }

    /// A conversation [`Conversation::to_json`] wrote: an optional system message first,
    /// then user and assistant messages in turn. Says which message is wrong otherwise.
    pub fn from_json(v: &serde_json::Value) -> Result<Conversation, String> {
        let msgs = v["messages"].as_array().ok_or("no \"messages\" array")?;
        let mut conv = Conversation::new(None);
        let mut user: Option<String> = None;
        for (i, m) in msgs.iter().enumerate() {
            let (Some(role), Some(content)) = (m["role"].as_str(), m["content"].as_str()) else {
                return Err(format!("message {i} needs a string \"role\" and \"content\""));
            };
            match (role, &user) {
                ("system", None) if i == 0 => conv.system = Some(content.to_string()),
                ("user", None) => user = Some(content.to_string()),
                ("assistant", Some(_)) => conv.turns.push((user.take().unwrap_or_default(), content.to_string())),
                _ => {
                    return Err(format!(
                        "message {i} has the role '{role}' where {} was expected",
                        if user.is_some() { "an assistant message" } else { "a user message" }
                    ));
                }
            }
        }
        if user.is_some() {
            return Err("the last user message has no reply".into());
        }
        Ok(conv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversations_round_trip_as_openai_messages() {
        let mut c = Conversation::new(Some("be brief".into()));
        c.turns.push(("hi".into(), "hello".into()));
        c.turns.push(("a\nb".into(), "c".into()));
        let v = c.to_json();
        assert_eq!(v["messages"].as_array().unwrap().len(), 5);
        assert_eq!(v["messages"][3]["content"], "a\nb");
        let back = Conversation::from_json(&v).unwrap();
        assert_eq!((back.system, back.turns), (c.system, c.turns));
        for (bad, why) in [
            (serde_json::json!({}), "no \"messages\""),
            (
                serde_json::json!({"messages": [{"role": "assistant", "content": "x"}]}),
                "message 0 has the role 'assistant'",
            ),
            (serde_json::json!({"messages": [{"role": "user", "content": "x"}]}), "no reply"),
            (serde_json::json!({"messages": [{"role": "user"}]}), "message 0 needs"),
        ] {
            let e = Conversation::from_json(&bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
