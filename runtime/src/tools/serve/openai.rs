//! The OpenAI API's JSON for `duet serve`: requests of `/v1/chat/completions` and
//! `/v1/completions` checked field by field (a wrong type is a 400 naming the field; a field
//! duet does not implement is a 400 naming it, never accepted and ignored: [`FIELDS`]), and
//! the error body; replies are [`crate::tools::serve::openai_reply`]'s. No HTTP here.

use serde_json::{Map, Value, json};

use crate::grammar::GrammarSpec;
use crate::sampler::SamplerConfig;
use crate::text::Message;
use crate::tools::serve::Prompt;
use crate::tools::serve::tool_calls::{ToolChoice, Tools, parse_tools, template_tool_calls};

/// `system_fingerprint` of every reply: the build that made it (its version and the
/// runtime's), so that clients can tell when replies to the same seed may differ.
pub const SYSTEM_FINGERPRINT: &str = concat!("duet-", env!("CARGO_PKG_VERSION"));

/// The most choices one request may ask for (`n`): each takes a slot.
pub const MAX_CHOICES: usize = 16;

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
    /// What the reply must be: `response_format`'s JSON object or schema, or llama-server's
    /// `json_schema` and `grammar` fields.
    pub grammar: Option<GrammarSpec>,
    /// Choices to generate (`n`), each with the seed after the previous one's.
    pub n: usize,
    /// Report each token's log probability and this many alternatives.
    pub logprobs: Option<usize>,
    /// `tools`, `tool_choice` and `parallel_tool_calls`.
    pub tools: Option<Tools>,
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

/// What duet does with a request field it knows.
#[derive(Clone, Copy)]
pub enum Field {
    /// Implemented: [`parse`] reads it.
    Used,
    /// Without effect on the reply by its definition: `model` (duet serves one model),
    /// `user` and `metadata` (the caller's labels for a provider's records).
    Inert,
    /// Not implemented: accepted only at values that ask for nothing more than duet does
    /// (the check, and those values in words for the error), refused otherwise.
    Only(fn(&Value) -> bool, &'static str),
}

fn is_null_or_one(v: &Value) -> bool {
    v.is_null() || v.as_u64() == Some(1)
}
fn is_null_or_false(v: &Value) -> bool {
    v.is_null() || v == &Value::Bool(false)
}
fn is_null_or_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::String(s) => s.is_empty(),
        _ => false,
    }
}
fn is_usage_option(v: &Value) -> bool {
    // The last chunk always carries the usage.
    v.is_null() || v.as_object().is_some_and(|o| o.iter().all(|(k, x)| k == "include_usage" && x.is_boolean()))
}

/// Every request field duet knows, for which endpoints (None: both), and what it does with
/// it; a field not listed here is refused with a 400 naming it.
pub const FIELDS: &[(&str, Option<Kind>, Field)] = &[
    ("messages", Some(Kind::Chat), Field::Used),
    ("prompt", Some(Kind::Completion), Field::Used),
    ("temperature", None, Field::Used),
    ("top_p", None, Field::Used),
    ("top_k", None, Field::Used),
    ("min_p", None, Field::Used),
    ("repeat_penalty", None, Field::Used),
    ("repeat_last_n", None, Field::Used),
    ("seed", None, Field::Used),
    ("max_tokens", None, Field::Used),
    ("max_completion_tokens", Some(Kind::Chat), Field::Used),
    ("stop", None, Field::Used),
    ("stream", None, Field::Used),
    ("stream_options", None, Field::Only(is_usage_option, "null or {\"include_usage\": true|false}")),
    ("ignore_eos", None, Field::Used),
    ("model", None, Field::Inert),
    ("user", None, Field::Inert),
    ("metadata", None, Field::Inert),
    ("n", None, Field::Used),
    ("best_of", Some(Kind::Completion), Field::Only(is_null_or_one, "1")),
    ("logprobs", None, Field::Used),
    ("top_logprobs", Some(Kind::Chat), Field::Used),
    ("response_format", None, Field::Used),
    ("json_schema", None, Field::Used),
    ("grammar", None, Field::Used),
    ("tools", Some(Kind::Chat), Field::Used),
    ("tool_choice", Some(Kind::Chat), Field::Used),
    ("parallel_tool_calls", Some(Kind::Chat), Field::Used),
    ("frequency_penalty", None, Field::Used),
    ("presence_penalty", None, Field::Used),
    ("logit_bias", None, Field::Only(is_null_or_empty, "an empty map")),
    ("echo", Some(Kind::Completion), Field::Only(is_null_or_false, "false")),
    ("suffix", Some(Kind::Completion), Field::Only(is_null_or_empty, "null or \"\"")),
    ("store", Some(Kind::Chat), Field::Only(is_null_or_false, "false")),
];

/// Refuses a field of `o` that `kind`'s endpoint does not implement, naming it.
fn check_fields(kind: Kind, o: &Map<String, Value>) -> Result<(), ApiError> {
    let endpoint = match kind {
        Kind::Chat => "/v1/chat/completions",
        Kind::Completion => "/v1/completions",
    };
    for (key, value) in o {
        let known = FIELDS.iter().find(|(name, k, _)| name == key && k.is_none_or(|k| k == kind));
        match known {
            None => {
                return Err(ApiError::bad_request(format!(
                    "'{key}' is not a field duet implements for {endpoint} (duet refuses what it would otherwise ignore; the README's serve section lists the fields)"
                )));
            }
            Some((_, _, Field::Only(accepts, allowed))) if !accepts(value) => {
                return Err(ApiError::bad_request(format!(
                    "'{key}' is not implemented by duet: it is accepted only as {allowed}, got {value}"
                )));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Parses the body of a request to `kind`'s endpoint; unset sampling fields come from
/// `defaults` (the server's flags).
pub fn parse(kind: Kind, body: &[u8], defaults: &SamplerConfig) -> Result<ApiRequest, ApiError> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(o) = v else { return Err(ApiError::bad_request("the body must be a JSON object")) };
    check_fields(kind, &o)?;
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
                out.push(message(i, m)?);
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
    if let Some(k) = integer(&o, "top_k")? {
        sampling.top_k = k.min(u32::MAX as u64) as usize;
    }
    if let Some(p) = number(&o, "min_p")? {
        if !(0.0..=1.0).contains(&p) {
            return Err(ApiError::bad_request(format!("'min_p' must be in [0, 1], got {p}")));
        }
        sampling.min_p = p as f32;
    }
    if let Some(r) = number(&o, "repeat_penalty")? {
        if !(r > 0.0 && r <= f32::MAX as f64) {
            return Err(ApiError::bad_request(format!("'repeat_penalty' must be more than 0, got {r}")));
        }
        sampling.repeat_penalty = r as f32;
    }
    for (key, slot) in
        [("frequency_penalty", &mut sampling.frequency_penalty), ("presence_penalty", &mut sampling.presence_penalty)]
    {
        if let Some(p) = number(&o, key)? {
            if !(-2.0..=2.0).contains(&p) {
                return Err(ApiError::bad_request(format!("'{key}' must be between -2 and 2, got {p}")));
            }
            *slot = p as f32;
        }
    }
    if let Some(n) = integer(&o, "repeat_last_n")? {
        sampling.repeat_last_n = n.min(u32::MAX as u64) as usize;
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
    let grammar = grammar(&o)?;
    let n = match integer(&o, "n")? {
        None => 1,
        Some(n) if (1..=MAX_CHOICES as u64).contains(&n) => n as usize,
        Some(n) => return Err(ApiError::bad_request(format!("'n' must be between 1 and {MAX_CHOICES}, got {n}"))),
    };
    let logprobs = logprobs(kind, &o)?;
    let tools = parse_tools(o.get("tools"), o.get("tool_choice"), o.get("parallel_tool_calls"))
        .map_err(ApiError::bad_request)?;
    if let Some(t) = &tools
        && t.choice != ToolChoice::None
        && grammar.is_some()
    {
        return Err(ApiError::bad_request(
            "give 'tools' or a response_format/json_schema/grammar, not both (or 'tool_choice': \"none\")",
        ));
    }
    Ok(ApiRequest { kind, prompt, sampling, seed, max_tokens, stop, stream, ignore_eos, grammar, n, logprobs, tools })
}

/// One chat message: `role` and `content` (a string, text parts, or null beside
/// `tool_calls`), an assistant's `tool_calls`, a tool's `tool_call_id`.
fn message(i: usize, m: &Value) -> Result<Message, ApiError> {
    let role = m.get("role").and_then(Value::as_str);
    let content = match m.get("content") {
        Some(Value::String(s)) => Some(s.clone()),
        // The array form: concatenate its text parts.
        Some(Value::Array(parts)) => {
            parts.iter().map(|p| p.get("text").and_then(Value::as_str)).collect::<Option<Vec<_>>>().map(|v| v.concat())
        }
        None | Some(Value::Null) if m.get("tool_calls").is_some_and(|t| !t.is_null()) => Some(String::new()),
        _ => None,
    };
    let (Some(role), Some(content)) = (role, content) else {
        return Err(ApiError::bad_request(format!(
            "'messages[{i}]' must have a string 'role' and a string (or text parts) 'content'"
        )));
    };
    let mut msg = Message::new(role, &content);
    match m.get("tool_calls") {
        None | Some(Value::Null) => {}
        Some(calls) if role == "assistant" => {
            msg.tool_calls = Some(template_tool_calls(calls, i).map_err(ApiError::bad_request)?);
        }
        Some(_) => {
            return Err(ApiError::bad_request(format!(
                "'messages[{i}].tool_calls': only assistant messages make calls"
            )));
        }
    }
    if role == "tool" {
        let id = m.get("tool_call_id").and_then(Value::as_str);
        let Some(id) = id else {
            return Err(ApiError::bad_request(format!(
                "'messages[{i}]' is a tool message without a string 'tool_call_id'"
            )));
        };
        msg.tool_call_id = Some(id.to_string());
    }
    Ok(msg)
}

/// Chat: `logprobs` true and `top_logprobs` 0 to 20; completions: `logprobs` 0 to 5 (the
/// alternatives to report).
fn logprobs(kind: Kind, o: &Map<String, Value>) -> Result<Option<usize>, ApiError> {
    use crate::tools::serve::logprobs::MAX_TOP_LOGPROBS;
    match kind {
        Kind::Chat => {
            let on = match o.get("logprobs") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err(ApiError::bad_request("'logprobs' must be a boolean")),
            };
            match integer(o, "top_logprobs")? {
                Some(k) if !on => Err(ApiError::bad_request(format!("'top_logprobs' ({k}) needs 'logprobs': true"))),
                Some(k) if k as usize > MAX_TOP_LOGPROBS => Err(ApiError::bad_request(format!(
                    "'top_logprobs' must be between 0 and {MAX_TOP_LOGPROBS}, got {k}"
                ))),
                k => Ok(on.then_some(k.unwrap_or(0) as usize)),
            }
        }
        Kind::Completion => match integer(o, "logprobs") {
            Ok(None) => Ok(None),
            Ok(Some(k)) if k <= 5 => Ok(Some(k as usize)),
            _ => Err(ApiError::bad_request("'logprobs' must be an integer between 0 and 5 (completions)")),
        },
    }
}

/// The reply's shape: OpenAI's `response_format` (`text`, `json_object`, `json_schema`
/// with `schema` and `strict`), llama-server's `json_schema` (a schema) and `grammar` (GBNF,
/// or llguidance's Lark after `%llguidance`); at most one of them. Sizes and compilation are
/// checked where the request is encoded ([`crate::grammar::Grammars::compile`]).
fn grammar(o: &Map<String, Value>) -> Result<Option<GrammarSpec>, ApiError> {
    let mut found: Vec<(&str, GrammarSpec)> = Vec::new();
    match o.get("response_format") {
        None | Some(Value::Null) => {}
        Some(Value::Object(f)) => match f.get("type").and_then(Value::as_str) {
            Some("text") if f.len() == 1 => {}
            Some("json_object") if f.len() == 1 => found.push(("response_format", GrammarSpec::JsonObject)),
            Some("json_schema") if f.len() == 2 => {
                let Some(Value::Object(js)) = f.get("json_schema") else {
                    return Err(ApiError::bad_request(
                        "'response_format.json_schema' must be an object with 'name' and 'schema'",
                    ));
                };
                for key in js.keys() {
                    if !["name", "schema", "strict", "description"].contains(&key.as_str()) {
                        return Err(ApiError::bad_request(format!(
                            "'response_format.json_schema.{key}' is not a field duet implements"
                        )));
                    }
                }
                if js.get("strict").is_some_and(|s| !s.is_boolean() && !s.is_null()) {
                    return Err(ApiError::bad_request("'response_format.json_schema.strict' must be a boolean"));
                }
                // Strict or not, the reply follows the schema exactly: every token is masked.
                let schema = match js.get("schema") {
                    Some(s @ (Value::Object(_) | Value::Bool(_))) => s.clone(),
                    None => json!({}),
                    Some(_) => {
                        return Err(ApiError::bad_request("'response_format.json_schema.schema' must be an object"));
                    }
                };
                found.push(("response_format", GrammarSpec::JsonSchema(schema)));
            }
            _ => {
                return Err(ApiError::bad_request(format!(
                    "'response_format' must be {{\"type\": \"text\"}}, {{\"type\": \"json_object\"}} or {{\"type\": \"json_schema\", \"json_schema\": {{…}}}}, got {}",
                    Value::Object(f.clone())
                )));
            }
        },
        Some(v) => return Err(ApiError::bad_request(format!("'response_format' must be an object, got {v}"))),
    }
    match o.get("json_schema") {
        None | Some(Value::Null) => {}
        Some(s @ (Value::Object(_) | Value::Bool(_))) => {
            found.push(("json_schema", GrammarSpec::JsonSchema(s.clone())))
        }
        Some(_) => return Err(ApiError::bad_request("'json_schema' must be a JSON schema object")),
    }
    match o.get("grammar") {
        None | Some(Value::Null) => {}
        Some(Value::String(g)) => found.push(("grammar", GrammarSpec::grammar(g.clone(), false))),
        Some(_) => return Err(ApiError::bad_request("'grammar' must be a string (GBNF, or Lark after %llguidance)")),
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|f| f.0).collect();
        return Err(ApiError::bad_request(format!(
            "give one of {} (the reply can follow one schema or grammar)",
            names.join(" and ")
        )));
    }
    Ok(found.pop().map(|f| f.1))
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
    fn fields_duet_does_not_implement_are_refused_by_name() {
        let d = SamplerConfig::default();
        let chat = |extra: &str| format!(r#"{{"messages":[{{"role":"user","content":"x"}}]{extra}}}"#);
        // Accepted: what asks for nothing more than duet does.
        for extra in [
            r#","model":"m","user":"u","n":1,"logprobs":false,"frequency_penalty":0"#,
            r#","presence_penalty":0.0,"logit_bias":{},"tools":[],"tool_choice":"none","store":false"#,
            r#","response_format":{"type":"text"},"stream_options":{"include_usage":true},"metadata":{"a":"b"}"#,
        ] {
            parse(Kind::Chat, chat(extra).as_bytes(), &d).unwrap_or_else(|e| panic!("{extra}: {}", e.message));
        }
        let ok =
            parse(Kind::Chat, chat(r#","top_k":5,"min_p":0.2,"repeat_penalty":1.3,"repeat_last_n":9"#).as_bytes(), &d)
                .unwrap();
        let s = &ok.sampling;
        assert_eq!((s.top_k, s.min_p, s.repeat_penalty, s.repeat_last_n), (5, 0.2, 1.3, 9));
        let ok = parse(Kind::Chat, chat(r#","frequency_penalty":0.5,"presence_penalty":-1"#).as_bytes(), &d).unwrap();
        assert_eq!((ok.sampling.frequency_penalty, ok.sampling.presence_penalty), (0.5, -1.0));
        // Refused, each naming its field.
        for (extra, field) in [
            (r#","n":0"#, "'n' must be between 1 and 16"),
            (r#","n":17"#, "'n' must be between 1 and 16"),
            (r#","logprobs":1"#, "'logprobs' must be a boolean"),
            (r#","top_logprobs":2"#, "'top_logprobs' (2) needs 'logprobs': true"),
            (r#","logprobs":true,"top_logprobs":21"#, "'top_logprobs' must be between 0 and 20"),
            (r#","response_format":{"type":"json"}"#, "'response_format'"),
            (
                r#","response_format":{"type":"json_schema","json_schema":{"schema":{},"x":1}}"#,
                "'response_format.json_schema.x'",
            ),
            (
                r#","response_format":{"type":"json_object"},"grammar":"root ::= \"a\"""#,
                "give one of response_format and grammar",
            ),
            (r#","json_schema":[]"#, "'json_schema' must be"),
            (r#","grammar":5"#, "'grammar' must be a string"),
            (r#","tools":[{"type":"function","function":{"name":"f","x":1}}]"#, "'tools[0].function.x'"),
            (r#","tool_choice":"required""#, "'tool_choice' asks for a call but 'tools' is empty"),
            (r#","frequency_penalty":2.5"#, "'frequency_penalty' must be between -2 and 2"),
            (r#","presence_penalty":"x""#, "'presence_penalty' must be a number"),
            (r#","logit_bias":{"5":100}"#, "'logit_bias'"),
            (r#","prompt":"x""#, "'prompt'"),
            (r#","echo":false"#, "'echo'"),
            (r#","min_p":2"#, "'min_p' must be in [0, 1]"),
            (r#","repeat_penalty":0"#, "'repeat_penalty' must be more than 0"),
            (r#","top_k":-1"#, "'top_k' must be a non-negative integer"),
        ] {
            let e = parse(Kind::Chat, chat(extra).as_bytes(), &d).unwrap_err();
            assert_eq!(e.status, 400);
            assert!(e.message.contains(field), "{extra}: {}", e.message);
        }
        let tool_turn = br#"{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c"}]}]}"#;
        let e = parse(Kind::Chat, tool_turn, &d).unwrap_err();
        assert!(e.message.contains("'messages[0].tool_calls[0].function.name'"), "{}", e.message);
        let round = br#"{"messages":[{"role":"user","content":"w?"},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","tool_call_id":"c","content":"3"}],"tools":[{"type":"function","function":{"name":"f"}}]}"#;
        let ok = parse(Kind::Chat, round, &d).unwrap();
        let Prompt::Chat(m) = ok.prompt else { panic!() };
        assert_eq!(m[1].tool_calls.as_ref().unwrap()[0]["function"]["arguments"]["a"], 1);
        assert_eq!(m[2].tool_call_id.as_deref(), Some("c"));
        assert!(ok.tools.is_some());
        let no_id = br#"{"messages":[{"role":"tool","content":"3"}]}"#;
        assert!(parse(Kind::Chat, no_id, &d).unwrap_err().message.contains("without a string 'tool_call_id'"));
        for (body, field) in [
            (&br#"{"prompt":"x","echo":true}"#[..], "'echo'"),
            (br#"{"prompt":"x","best_of":2}"#, "'best_of'"),
            (br#"{"prompt":"x","logprobs":6}"#, "'logprobs' must be an integer between 0 and 5"),
            (br#"{"prompt":"x","logprobs":true}"#, "'logprobs' must be an integer"),
            (br#"{"prompt":"x","messages":[]}"#, "'messages'"),
        ] {
            let e = parse(Kind::Completion, body, &d).unwrap_err();
            assert!(e.message.contains(field), "{}: {}", String::from_utf8_lossy(body), e.message);
        }
        parse(Kind::Completion, br#"{"prompt":"x","echo":false,"best_of":1,"logprobs":null,"suffix":""}"#, &d).unwrap();
        let c = parse(Kind::Completion, br#"{"prompt":"x","logprobs":3,"n":2}"#, &d).unwrap();
        assert_eq!((c.logprobs, c.n), (Some(3), 2));
        let c = parse(Kind::Chat, chat(r#","logprobs":true,"top_logprobs":4,"n":3"#).as_bytes(), &d).unwrap();
        assert_eq!((c.logprobs, c.n), (Some(4), 3));
        assert_eq!(parse(Kind::Chat, chat(r#","logprobs":true"#).as_bytes(), &d).unwrap().logprobs, Some(0));
    }

    #[test]
    fn response_formats_json_schemas_and_grammars_are_read() {
        let d = SamplerConfig::default();
        let chat = |extra: &str| format!(r#"{{"messages":[{{"role":"user","content":"x"}}]{extra}}}"#);
        let g = |extra: &str| parse(Kind::Chat, chat(extra).as_bytes(), &d).unwrap().grammar;
        assert_eq!(g(r#","response_format":{"type":"text"}"#), None);
        assert_eq!(g(r#","response_format":{"type":"json_object"}"#), Some(GrammarSpec::JsonObject));
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let strict = format!(
            r#","response_format":{{"type":"json_schema","json_schema":{{"name":"n","strict":true,"schema":{schema}}}}}"#
        );
        assert_eq!(g(&strict), Some(GrammarSpec::JsonSchema(schema.clone())));
        assert_eq!(g(&format!(r#","json_schema":{schema}"#)), Some(GrammarSpec::JsonSchema(schema)));
        assert_eq!(g(r#","grammar":"root ::= \"a\"""#), Some(GrammarSpec::Gbnf("root ::= \"a\"".into())));
        assert_eq!(
            g(r#","grammar":"%llguidance {}\nstart: \"a\"""#),
            Some(GrammarSpec::Lark("%llguidance {}\nstart: \"a\"".into()))
        );
        // Completions take them too.
        let c = parse(Kind::Completion, br#"{"prompt":"x","response_format":{"type":"json_object"}}"#, &d).unwrap();
        assert_eq!(c.grammar, Some(GrammarSpec::JsonObject));
    }
}
