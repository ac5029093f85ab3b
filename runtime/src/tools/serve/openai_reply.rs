//! The OpenAI API's reply JSON for `duet serve`: whole responses of one or `n` choices, the
//! chunks of a streamed reply, and log probabilities in the chat (`logprobs.content`) and
//! the completions (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`) shapes. No
//! HTTP here.

use serde_json::{Map, Value, json};

use crate::tools::serve::openai::Kind;
use crate::tools::serve::tool_calls::Call;
use crate::tools::serve::{FinishReason, TokenLogprob};

/// Token counts of a finished request (all its choices).
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    pub prompt: usize,
    pub completion: usize,
}

fn usage(u: Usage) -> Value {
    json!({"prompt_tokens": u.prompt, "completion_tokens": u.completion, "total_tokens": u.prompt + u.completion})
}

/// One choice of a whole reply.
#[derive(Clone, Debug, Default)]
pub struct Choice {
    pub text: String,
    pub finish: Option<FinishReason>,
    /// Its tokens' log probabilities, when the request asked for them.
    pub logprobs: Option<Vec<TokenLogprob>>,
    /// The tool calls read from it (its text is then what is beside them, if anything).
    pub calls: Vec<Call>,
}

/// The API's `tool_calls` of `calls`, ids made from the response's id and the choice's
/// index; with `index` (streamed deltas) each carries its position.
fn tool_calls_json(calls: &[Call], id: &str, choice: usize, delta: bool) -> Value {
    calls
        .iter()
        .enumerate()
        .map(|(k, c)| {
            let mut v = json!({
                "id": format!("call_{}_{choice}_{k}", id.rsplit('-').next().unwrap_or(id)),
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            });
            if delta {
                v["index"] = json!(k);
            }
            v
        })
        .collect()
}

/// `tool_calls` for a reply of calls that ended by itself; a reply cut by the token limit
/// stays `length` (its whole calls are still given).
fn finish_str(finish: Option<FinishReason>, calls: &[Call]) -> Option<&'static str> {
    finish.map(|f| if calls.is_empty() || f != FinishReason::Stop { f.as_str() } else { "tool_calls" })
}

fn text_of(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Chat's `logprobs`: `{"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}`.
fn chat_logprobs(lps: &[TokenLogprob]) -> Value {
    let entry = |token: &[u8], logprob: f32| json!({"token": text_of(token), "logprob": logprob, "bytes": token});
    let content: Vec<Value> = lps
        .iter()
        .map(|lp| {
            let mut e = entry(&lp.token, lp.logprob);
            e["top_logprobs"] = lp.top.iter().map(|(t, l)| entry(t, *l)).collect();
            e
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// Completions' `logprobs`, `start` bytes into the reply's text.
fn completion_logprobs(lps: &[TokenLogprob], start: usize) -> Value {
    let mut offset = start;
    let mut offsets = Vec::with_capacity(lps.len());
    for lp in lps {
        offsets.push(offset);
        offset += lp.token.len();
    }
    let top: Vec<Value> = lps
        .iter()
        .map(|lp| Value::Object(lp.top.iter().map(|(t, l)| (text_of(t), json!(l))).collect::<Map<String, Value>>()))
        .collect();
    json!({
        "tokens": lps.iter().map(|lp| text_of(&lp.token)).collect::<Vec<_>>(),
        "token_logprobs": lps.iter().map(|lp| lp.logprob).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": offsets,
    })
}

fn logprobs_json(kind: Kind, lps: Option<&[TokenLogprob]>, start: usize) -> Value {
    match (kind, lps) {
        (_, None) => Value::Null,
        (Kind::Chat, Some(l)) => chat_logprobs(l),
        (Kind::Completion, Some(l)) => completion_logprobs(l, start),
    }
}

/// The whole reply of a non-streamed request.
pub fn response(kind: Kind, id: &str, model: &str, created: u64, choices: &[Choice], u: Usage) -> Value {
    let finish = |c: &Choice| finish_str(c.finish, &c.calls);
    let choices: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| match kind {
            Kind::Chat => {
                let mut message = json!({"role": "assistant", "content": c.text});
                if !c.calls.is_empty() {
                    if c.text.is_empty() {
                        message["content"] = Value::Null;
                    }
                    message["tool_calls"] = tool_calls_json(&c.calls, id, i, false);
                }
                json!({
                    "index": i, "message": message,
                    "logprobs": logprobs_json(kind, c.logprobs.as_deref(), 0), "finish_reason": finish(c),
                })
            }
            Kind::Completion => json!({
                "index": i, "text": c.text,
                "logprobs": logprobs_json(kind, c.logprobs.as_deref(), 0), "finish_reason": finish(c),
            }),
        })
        .collect();
    let object = if kind == Kind::Chat { "chat.completion" } else { "text_completion" };
    json!({
        "id": id, "object": object, "created": created, "model": model,
        "system_fingerprint": crate::tools::serve::openai::SYSTEM_FINGERPRINT,
        "choices": choices, "usage": usage(u),
    })
}

/// One piece of a streamed reply.
#[derive(Clone, Copy, Debug, Default)]
pub struct Piece<'a> {
    /// Which choice.
    pub index: usize,
    pub text: Option<&'a str>,
    /// Chat: the choice's first chunk also carries the role.
    pub first: bool,
    pub logprobs: Option<&'a [TokenLogprob]>,
    /// Completions: bytes of this choice's text before this piece (for `text_offset`).
    pub offset: usize,
    pub finish: Option<FinishReason>,
    /// Chat: the choice's tool calls, whole, in one delta.
    pub calls: &'a [Call],
    /// The whole request's usage, on its last chunk.
    pub usage: Option<Usage>,
}

/// One server-sent-event chunk of a streamed reply.
pub fn chunk(kind: Kind, id: &str, model: &str, created: u64, p: Piece) -> Value {
    let finish = finish_str(p.finish, p.calls);
    let lp = logprobs_json(kind, p.logprobs, p.offset);
    let mut v = match kind {
        Kind::Chat => {
            let mut delta = Map::new();
            if p.first {
                delta.insert("role".into(), "assistant".into());
            }
            if let Some(t) = p.text {
                delta.insert("content".into(), t.into());
            }
            if !p.calls.is_empty() {
                delta.insert("tool_calls".into(), tool_calls_json(p.calls, id, p.index, true));
            }
            json!({
                "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": p.index, "delta": delta, "logprobs": lp, "finish_reason": finish}],
            })
        }
        Kind::Completion => json!({
            "id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": p.index, "text": p.text.unwrap_or(""), "logprobs": lp, "finish_reason": finish}],
        }),
    };
    v["system_fingerprint"] = crate::tools::serve::openai::SYSTEM_FINGERPRINT.into();
    if let Some(u) = p.usage {
        v["usage"] = usage(u);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lp(t: &str, l: f32) -> TokenLogprob {
        TokenLogprob {
            token: t.as_bytes().to_vec(),
            logprob: l,
            top: vec![(t.as_bytes().to_vec(), l), (b"x".to_vec(), -3.0)],
        }
    }

    #[test]
    fn responses_and_chunks_have_the_openai_shape() {
        let u = Usage { prompt: 3, completion: 2 };
        let c = [Choice { text: "hi".into(), finish: Some(FinishReason::Stop), ..Choice::default() }];
        let r = response(Kind::Chat, "c1", "m", 1, &c, u);
        assert_eq!(r["choices"][0]["message"]["content"], "hi");
        assert!(r["choices"][0]["logprobs"].is_null());
        assert_eq!(r["usage"]["total_tokens"], 5);
        assert!(r["system_fingerprint"].is_string());
        let c = chunk(Kind::Chat, "c1", "m", 1, Piece { text: Some("h"), first: true, ..Piece::default() });
        assert_eq!(c["choices"][0]["delta"]["role"], "assistant");
        assert!(c["choices"][0]["finish_reason"].is_null());
        let end = Piece { index: 2, finish: Some(FinishReason::Length), usage: Some(u), ..Piece::default() };
        let end = chunk(Kind::Completion, "c1", "m", 1, end);
        assert_eq!(
            (end["choices"][0]["finish_reason"].as_str(), end["choices"][0]["index"].as_u64()),
            (Some("length"), Some(2))
        );
        assert_eq!(end["usage"]["completion_tokens"], 2);
    }

    #[test]
    fn tool_calls_whole_and_streamed() {
        let calls = vec![Call { name: "f".into(), arguments: "{\"a\":1}".into() }];
        let c = [Choice { finish: Some(FinishReason::Stop), calls: calls.clone(), ..Choice::default() }];
        let r = response(Kind::Chat, "chatcmpl-x7", "m", 1, &c, Usage::default());
        let m = &r["choices"][0];
        assert_eq!(m["finish_reason"], "tool_calls");
        assert!(m["message"]["content"].is_null());
        assert_eq!(m["message"]["tool_calls"][0]["function"]["arguments"], "{\"a\":1}");
        assert_eq!(m["message"]["tool_calls"][0]["id"], "call_x7_0_0");
        let p = Piece { calls: &calls, finish: Some(FinishReason::Stop), ..Piece::default() };
        let d = chunk(Kind::Chat, "chatcmpl-x7", "m", 1, p);
        assert_eq!(d["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
        assert_eq!(d["choices"][0]["finish_reason"], "tool_calls");
    }

    #[test]
    fn log_probabilities_in_both_shapes() {
        let lps = [lp("He", -0.5), lp("llo", -1.0)];
        let c = [Choice {
            text: "Hello".into(),
            finish: Some(FinishReason::Stop),
            logprobs: Some(lps.to_vec()),
            calls: vec![],
        }];
        let chat = response(Kind::Chat, "c", "m", 1, &c, Usage::default());
        let content = &chat["choices"][0]["logprobs"]["content"];
        assert_eq!(content[1]["token"], "llo");
        assert_eq!(content[1]["bytes"], json!([108, 108, 111]));
        assert_eq!(content[0]["top_logprobs"][1]["logprob"], -3.0);
        let done = response(Kind::Completion, "c", "m", 1, &c, Usage::default());
        let l = &done["choices"][0]["logprobs"];
        assert_eq!(l["tokens"], json!(["He", "llo"]));
        assert_eq!(l["text_offset"], json!([0, 2]));
        assert_eq!(l["top_logprobs"][0]["x"], -3.0);
        let piece = Piece { text: Some("llo"), logprobs: Some(&lps[1..]), offset: 2, ..Piece::default() };
        assert_eq!(chunk(Kind::Completion, "c", "m", 1, piece)["choices"][0]["logprobs"]["text_offset"], json!([2]));
    }
}
