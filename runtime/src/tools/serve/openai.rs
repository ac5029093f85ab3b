//! The OpenAI API's JSON for `duet serve`: requests of `/v1/chat/completions` and
//! `/v1/completions` checked field by field (a wrong type is a 400 naming the field), and the
//! response, stream-chunk and error bodies. No HTTP here.

use serde_json::{Map, Value, json};

use crate::sampler::SamplerConfig;
use crate::tools::serve::{FinishReason, Prompt};
use crate::text::Message;

/// Which endpoint a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completion,
}

/// A checked request.
#[derive(Clone, Debug)]
pub struct ApiRequest {
    pub kind: Kind,
    pub prompt: Prompt,
    /// The defaults with the request's temperature and top_p.
    pub sampling: SamplerConfig,
    /// The request's seed, if it set one (the server picks one per request otherwise).
    pub seed: Option<u64>,
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub stream: bool,
    /// llama-server's extension: generate past end-of-generation tokens.
    pub ignore_eos: bool,
}

/// An error for the client: HTTP status, OpenAI error type, message.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub kind: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError { status: 400, kind: "invalid_request_error", message: message.into() }
    }

    pub fn body(&self) -> String {
        json!({"error": {"message": self.message, "type": self.kind, "param": null, "code": self.status}}).to_string()
    }
}

fn number(o: &Map<String, Value>, key: &str) -> Result<Option<f64>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(_) => Err(ApiError::bad_request(format!("'{key}' must be a number"))),
    }
}

fn integer(o: &Map<String, Value>, key: &str) -> Result<Option<u64>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) if n.is_u64() => Ok(n.as_u64()),
        Some(_) => Err(ApiError::bad_request(format!("'{key}' must be a non-negative integer"))),
    }
}

/// Parses the body of a request to `kind`'s endpoint; unset sampling fields come from
/// `defaults` (the server's flags).
pub fn parse(kind: Kind, body: &[u8], defaults: &SamplerConfig) -> Result<ApiRequest, ApiError> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(o) = v else { return Err(ApiError::bad_request("the body must be a JSON object")) };
    let prompt = match kind {
        Kind::Chat => {
            let Some(Value::Array(msgs)) = o.get("messages") else {
                return Err(ApiError::bad_request("'messages' must be an array of {role, content} objects"));
            };
            if msgs.is_empty() {
                return Err(ApiError::bad_request("'messages' must not be empty"));
            }
            let mut out = Vec::with_capacity(msgs.len());
            for (i, m) in msgs.iter().enumerate() {
                let role = m.get("role").and_then(Value::as_str);
                let content = match m.get("content") {
                    Some(Value::String(s)) => Some(s.clone()),
                    // The array form: concatenate its text parts.
                    Some(Value::Array(parts)) => parts
                        .iter()
                        .map(|p| p.get("text").and_then(Value::as_str))
                        .collect::<Option<Vec<_>>>()
                        .map(|v| v.concat()),
                    _ => None,
                };
                match (role, content) {
                    (Some(r), Some(c)) => out.push(Message::new(r, &c)),
                    _ => {
                        return Err(ApiError::bad_request(format!(
                            "'messages[{i}]' must have a string 'role' and a string (or text parts) 'content'"
                        )));
                    }
                }
            }
            Prompt::Chat(out)
        }
        Kind::Completion => match o.get("prompt") {
            Some(Value::String(s)) => Prompt::Text(s.clone()),
            Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
                Prompt::Text(a[0].as_str().unwrap_or("").into())
            }
            _ => return Err(ApiError::bad_request("'prompt' must be a string")),
        },
    };
    let mut sampling = defaults.clone();
    if let Some(t) = number(&o, "temperature")? {
        if !(0.0..=2.0).contains(&t) {
            return Err(ApiError::bad_request(format!("'temperature' must be between 0 and 2, got {t}")));
        }
        sampling.temperature = t as f32;
    }
    if let Some(p) = number(&o, "top_p")? {
        if !(p > 0.0 && p <= 1.0) {
            return Err(ApiError::bad_request(format!("'top_p' must be in (0, 1], got {p}")));
        }
        sampling.top_p = p as f32;
    }
    let seed = integer(&o, "seed")?;
    let max_tokens = match integer(&o, "max_completion_tokens")?.or(integer(&o, "max_tokens")?) {
        Some(0) => return Err(ApiError::bad_request("'max_tokens' must be at least 1")),
        m => m.map(|m| m as usize),
    };
    let stop = match o.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.len() <= 4 && a.iter().all(Value::is_string) => {
            a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect()
        }
        Some(_) => return Err(ApiError::bad_request("'stop' must be a string or an array of at most 4 strings")),
    };
    let stream = match o.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::bad_request("'stream' must be a boolean")),
    };
    let ignore_eos = match o.get("ignore_eos") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::bad_request("'ignore_eos' must be a boolean")),
    };
    Ok(ApiRequest { kind, prompt, sampling, seed, max_tokens, stop, stream, ignore_eos })
}

/// Token counts of a finished request.
#[derive(Clone, Copy, Debug)]
pub struct Usage {
    pub prompt: usize,
    pub completion: usize,
}

fn usage(u: Usage) -> Value {
    json!({"prompt_tokens": u.prompt, "completion_tokens": u.completion, "total_tokens": u.prompt + u.completion})
}

/// The whole reply of a non-streamed request.
pub fn response(kind: Kind, id: &str, model: &str, created: u64, text: &str, finish: FinishReason, u: Usage) -> Value {
    match kind {
        Kind::Chat => json!({
            "id": id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish.as_str()}],
            "usage": usage(u),
        }),
        Kind::Completion => json!({
            "id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish.as_str()}],
            "usage": usage(u),
        }),
    }
}

/// One server-sent-event chunk of a streamed reply: `text` (chat: the first chunk also
/// carries the role), or the last one with the finish reason and the usage.
pub fn chunk(
    kind: Kind,
    id: &str,
    model: &str,
    created: u64,
    text: Option<&str>,
    first: bool,
    end: Option<(FinishReason, Usage)>,
) -> Value {
    let finish = end.map(|(f, _)| f.as_str());
    let mut v = match kind {
        Kind::Chat => {
            let mut delta = Map::new();
            if first {
                delta.insert("role".into(), "assistant".into());
            }
            if let Some(t) = text {
                delta.insert("content".into(), t.into());
            }
            json!({
                "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            })
        }
        Kind::Completion => json!({
            "id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish}],
        }),
    };
    if let Some((_, u)) = end {
        v["usage"] = usage(u);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_requests_are_checked_field_by_field() {
        let d = SamplerConfig::default();
        let ok = parse(
            Kind::Chat,
            br#"{"model":"x","messages":[{"role":"user","content":"hi"}],"temperature":0,"max_tokens":5,"stop":["\n"],"stream":true,"seed":7}"#,
            &d,
        )
        .unwrap();
        assert!(ok.stream && ok.max_tokens == Some(5) && ok.stop == ["\n"] && ok.seed == Some(7));
        assert_eq!(ok.sampling.temperature, 0.0);
        for (body, needle) in [
            (&b"{"[..], "not valid JSON"),
            (b"[]", "JSON object"),
            (br#"{"messages":"hi"}"#, "'messages' must be an array"),
            (br#"{"messages":[{"role":"user"}]}"#, "messages[0]"),
            (br#"{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}"#, "'temperature' must be a number"),
            (br#"{"messages":[{"role":"user","content":"x"}],"top_p":0}"#, "'top_p' must be in (0, 1]"),
            (
                br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":-1}"#,
                "'max_tokens' must be a non-negative integer",
            ),
            (br#"{"messages":[{"role":"user","content":"x"}],"stop":[1]}"#, "'stop' must be"),
            (br#"{"messages":[{"role":"user","content":"x"}],"stream":"yes"}"#, "'stream' must be a boolean"),
        ] {
            let e = parse(Kind::Chat, body, &d).unwrap_err();
            assert_eq!(e.status, 400);
            assert!(e.message.contains(needle), "{}: {}", String::from_utf8_lossy(body), e.message);
            let b: Value = serde_json::from_str(&e.body()).unwrap();
            assert_eq!(b["error"]["type"], "invalid_request_error");
        }
    }

    #[test]
    fn responses_and_chunks_have_the_openai_shape() {
        let u = Usage { prompt: 3, completion: 2 };
        let r = response(Kind::Chat, "c1", "m", 1, "hi", FinishReason::Stop, u);
        assert_eq!(r["choices"][0]["message"]["content"], "hi");
        assert_eq!(r["usage"]["total_tokens"], 5);
        let c = chunk(Kind::Chat, "c1", "m", 1, Some("h"), true, None);
        assert_eq!(c["choices"][0]["delta"]["role"], "assistant");
        assert!(c["choices"][0]["finish_reason"].is_null());
        let end = chunk(Kind::Completion, "c1", "m", 1, None, false, Some((FinishReason::Length, u)));
        assert_eq!(end["choices"][0]["finish_reason"], "length");
        assert_eq!(end["usage"]["completion_tokens"], 2);
    }
}
