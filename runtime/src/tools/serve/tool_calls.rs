//! Tool calls (the API's `tools`, `tool_choice`, `parallel_tool_calls`): the request's
//! tools checked, the conversation written the way the model's template expects, the reply
//! held to a call of one of the tools (llguidance: [`crate::grammar`]) and read back.
//!
//! [`Format`] tells template families apart by their text:
//! * `Hermes` — `<tool_call>{"name", "arguments"}</tool_call>` (Hermes, Qwen 2.5/3,
//!   SmolLM3): the template gets `tools` and the tool turns as they are;
//! * `Llama3` — a bare `{"name", "parameters"}` object (Llama 3.1+, `<|python_tag|>`);
//! * `Mistral` — `[TOOL_CALLS]` and a JSON array of `{"name", "arguments"}`;
//! * `Generic` — a template that knows nothing of tools (duet's bundled model, many small
//!   models), as llama-server does: the tools are described in the system turn, the reply
//!   is `<tool_call>{…}</tool_call>` or text, earlier calls are written as that text and tool
//!   results as user turns in `<tool_response>`.
//!
//! With `tool_choice` `auto` the reply is text or calls; `required` or a named function,
//! always calls; `none`, text (the tools are still shown to the template). A call's JSON
//! follows its function's `parameters` schema, compactly written.

use serde_json::{Map, Value, json};

use crate::grammar::GrammarSpec;
use crate::text::{ChatTemplate, Message};

/// Tools a request may give (OpenAI's limit).
pub const MAX_TOOLS: usize = 128;

#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    Auto,
    None,
    Required,
    Named(String),
}

/// A request's tools, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct Tools {
    /// As the template gets them: `[{"type": "function", "function": {name, description,
    /// parameters}}]`.
    pub list: Vec<Value>,
    pub choice: ToolChoice,
    /// Several calls in one reply.
    pub parallel: bool,
}

/// How a model family writes tool calls (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Hermes,
    Llama3,
    Mistral,
    Generic,
}

/// One call read from a reply.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub name: String,
    /// The arguments as JSON text (the API's `function.arguments`).
    pub arguments: String,
}

fn name_ok(n: &str) -> bool {
    (1..=64).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Checks the request's `tools`, `tool_choice` and `parallel_tool_calls`; None when there
/// are no tools.
pub fn parse_tools(
    tools: Option<&Value>,
    choice: Option<&Value>,
    parallel: Option<&Value>,
) -> Result<Option<Tools>, String> {
    let list = match tools {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a.clone(),
        Some(_) => return Err("'tools' must be an array of {\"type\": \"function\", \"function\": {…}}".into()),
    };
    if list.len() > MAX_TOOLS {
        return Err(format!("'tools' holds {} tools; duet takes at most {MAX_TOOLS}", list.len()));
    }
    let mut names: Vec<&str> = Vec::new();
    for (i, t) in list.iter().enumerate() {
        let f = &t["function"];
        if t["type"] != "function" || !f.is_object() {
            return Err(format!("'tools[{i}]' must be {{\"type\": \"function\", \"function\": {{…}}}}"));
        }
        if let Some(k) = t.as_object().into_iter().flat_map(|o| o.keys()).find(|k| *k != "type" && *k != "function") {
            return Err(format!("'tools[{i}].{k}' is not a field duet implements"));
        }
        let known = ["name", "description", "parameters", "strict"];
        if let Some(k) = f.as_object().into_iter().flat_map(|o| o.keys()).find(|k| !known.contains(&k.as_str())) {
            return Err(format!("'tools[{i}].function.{k}' is not a field duet implements"));
        }
        let name = f["name"]
            .as_str()
            .filter(|n| name_ok(n))
            .ok_or_else(|| format!("'tools[{i}].function.name' must be 1 to 64 letters, digits, '_' or '-'"))?;
        if names.contains(&name) {
            return Err(format!("'tools' names the function '{name}' twice"));
        }
        names.push(name);
        if !matches!(f.get("parameters"), None | Some(Value::Object(_))) {
            return Err(format!("'tools[{i}].function.parameters' must be a JSON schema object"));
        }
    }
    let choice = match choice {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) if s == "auto" => ToolChoice::Auto,
        Some(Value::String(s)) if s == "none" => ToolChoice::None,
        Some(Value::String(s)) if s == "required" => ToolChoice::Required,
        Some(v @ Value::Object(_)) if v["type"] == "function" && v["function"]["name"].is_string() => {
            let n = v["function"]["name"].as_str().unwrap_or_default();
            if !names.contains(&n) {
                return Err(format!("'tool_choice' names the function '{n}', which 'tools' does not have"));
            }
            ToolChoice::Named(n.to_string())
        }
        Some(v) => {
            return Err(format!(
                "'tool_choice' must be \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": …}}}}, got {v}"
            ));
        }
    };
    let parallel = match parallel {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err("'parallel_tool_calls' must be a boolean".into()),
    };
    if list.is_empty() {
        return match choice {
            ToolChoice::Auto | ToolChoice::None => Ok(None),
            _ => Err("'tool_choice' asks for a call but 'tools' is empty".into()),
        };
    }
    Ok(Some(Tools { list, choice, parallel }))
}

/// The names of `tools`' functions.
pub fn names(tools: &Tools) -> Vec<&str> {
    tools.list.iter().filter_map(|t| t["function"]["name"].as_str()).collect()
}

/// An API message's `tool_calls` in the shape Hugging Face templates read: arguments as an
/// object, not the API's JSON text.
pub fn template_tool_calls(calls: &Value, at: usize) -> Result<Value, String> {
    let Value::Array(calls) = calls else { return Err(format!("'messages[{at}].tool_calls' must be an array")) };
    calls
        .iter()
        .enumerate()
        .map(|(j, c)| {
            let f = &c["function"];
            let name = f["name"]
                .as_str()
                .ok_or_else(|| format!("'messages[{at}].tool_calls[{j}].function.name' must be a string"))?;
            let args = match &f["arguments"] {
                Value::String(s) => serde_json::from_str::<Value>(s)
                    .map_err(|e| format!("'messages[{at}].tool_calls[{j}].function.arguments' is not JSON: {e}"))?,
                v @ Value::Object(_) => v.clone(),
                _ => return Err(format!("'messages[{at}].tool_calls[{j}].function.arguments' must be a JSON string")),
            };
            Ok(json!({"id": c["id"], "type": "function", "function": {"name": name, "arguments": args}}))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Value::Array)
}

impl Format {
    /// The family `template` writes tool calls in.
    pub fn of(template: &ChatTemplate) -> Format {
        let t = &template.text;
        if t.contains("<tool_call>") {
            Format::Hermes
        } else if t.contains("[TOOL_CALLS]") {
            Format::Mistral
        } else if t.contains("<|python_tag|>") || (t.contains("tools") && t.contains("ipython")) {
            Format::Llama3
        } else {
            Format::Generic
        }
    }

    /// Whether a reply that begins with `text` may still be a call (its text is held back
    /// until it cannot).
    pub fn could_be_call(self, text: &str) -> bool {
        let t = text.trim_start();
        let prefix = match self {
            Format::Hermes | Format::Generic => "<tool_call>",
            Format::Llama3 => "{",
            Format::Mistral => "[",
        };
        t.is_empty() || t.starts_with(prefix) || prefix.starts_with(t)
    }
}

/// What the template gets: for [`Format::Generic`], the tools described in the system turn,
/// earlier calls as `<tool_call>` text and tool results as user turns; otherwise the
/// messages as they are (the template reads `tools`).
pub fn prepare_messages(messages: Vec<Message>, tools: &Tools, format: Format) -> Vec<Message> {
    if format != Format::Generic {
        return messages;
    }
    let defs: Vec<String> = tools.list.iter().map(|t| t["function"].to_string()).collect();
    let how = match &tools.choice {
        ToolChoice::None => "Do not call a function now; answer in text.".to_string(),
        ToolChoice::Auto => "To call one, reply with only <tool_call>{\"name\": NAME, \"arguments\": {…}}</tool_call>; otherwise answer in text.".to_string(),
        ToolChoice::Required => "Reply with only <tool_call>{\"name\": NAME, \"arguments\": {…}}</tool_call>.".to_string(),
        ToolChoice::Named(n) => format!("Reply with only <tool_call>{{\"name\": \"{n}\", \"arguments\": {{…}}}}</tool_call>."),
    };
    let about = format!("You can call these functions:\n{}\n{how}", defs.join("\n"));
    let mut out = Vec::with_capacity(messages.len() + 1);
    let mut msgs = messages.into_iter().peekable();
    match msgs.next_if(|m| m.role == "system") {
        Some(s) => out.push(Message::new("system", &format!("{}\n\n{about}", s.content))),
        None => out.push(Message::new("system", &about)),
    }
    for m in msgs {
        if let Some(calls) = &m.tool_calls {
            let text: String = calls
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| {
                    format!(
                        "<tool_call>{}</tool_call>",
                        json!({"name": c["function"]["name"], "arguments": c["function"]["arguments"]})
                    )
                })
                .collect();
            out.push(Message::new("assistant", &format!("{}{text}", m.content)));
        } else if m.role == "tool" {
            out.push(Message::new("user", &format!("<tool_response>\n{}\n</tool_response>", m.content)));
        } else {
            out.push(m);
        }
    }
    out
}

/// The grammar of the reply: calls (or, with `auto`, text that does not start one); None
/// for `tool_choice: none`. `marker` is the id of Mistral's `[TOOL_CALLS]` control token
/// (a grammar names a control token by its id; without one the array stands alone).
pub fn grammar(tools: &Tools, format: Format, marker: Option<u32>) -> Option<GrammarSpec> {
    let compact = json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "});
    let allowed: Vec<&Value> = match &tools.choice {
        ToolChoice::None => return None,
        ToolChoice::Named(n) => tools.list.iter().filter(|t| t["function"]["name"] == n.as_str()).collect(),
        _ => tools.list.iter().collect(),
    };
    let args_key = if format == Format::Llama3 { "parameters" } else { "arguments" };
    let one_of: Vec<Value> = allowed
        .iter()
        .map(|t| {
            let f = &t["function"];
            let params = f.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object"}));
            let mut props = Map::new();
            props.insert("name".into(), json!({"const": f["name"]}));
            props.insert(args_key.into(), params);
            json!({"type": "object", "properties": props, "required": ["name", args_key], "additionalProperties": false})
        })
        .collect();
    let mut call = json!({"anyOf": one_of});
    call["x-guidance"] = compact.clone();
    let repeat = if tools.parallel { "+" } else { "" };
    let (calls, text) = match format {
        Format::Hermes | Format::Generic => (
            format!(
                "calls: call{repeat}\ncall: \"<tool_call>\" NL? %json {call} NL? \"</tool_call>\" NL?\nNL: \"\\n\""
            ),
            r#"TEXT: /(?s:.+)/ & ~/(?s:\s*<tool_call>.*)/"#,
        ),
        Format::Llama3 => {
            (format!("calls: call{repeat}\ncall: %json {call} \";\"?"), r#"TEXT: /(?s:.+)/ & ~/(?s:\s*\{.*)/"#)
        }
        Format::Mistral => {
            let mut array = json!({"type": "array", "items": {"anyOf": call["anyOf"]}, "minItems": 1});
            if !tools.parallel {
                array["maxItems"] = json!(1);
            }
            array["x-guidance"] = compact;
            let marker = marker.map_or(String::new(), |id| format!("<[{id}]> "));
            (format!("calls: {marker}%json {array}"), r#"TEXT: /(?s:.+)/ & ~/(?s:\s*\[.*)/"#)
        }
    };
    let start = if tools.choice == ToolChoice::Auto { "start: TEXT | calls" } else { "start: calls" };
    Some(GrammarSpec::Lark(format!("{start}\n{calls}\n{text}\n")))
}

/// The calls a reply starts with, and the text after them (None: no text); None when the
/// reply does not start with a call or names a function `names` does not have (then it is
/// text, as the grammar's text branch let it be).
pub fn parse_reply(text: &str, format: Format, names: &[&str]) -> Option<(Option<String>, Vec<Call>)> {
    let call = |v: &Value, args: &str| -> Option<Call> {
        let name = v["name"].as_str().filter(|n| names.contains(n))?.to_string();
        let a = v.get(args).or_else(|| v.get("arguments")).or_else(|| v.get("parameters"))?;
        Some(Call { name, arguments: a.to_string() })
    };
    let t = text.trim();
    let (calls, rest): (Vec<Call>, &str) = match format {
        Format::Hermes | Format::Generic => {
            let mut calls = Vec::new();
            let mut s = t;
            while let Some(after) = s.trim_start().strip_prefix("<tool_call>") {
                // A call the token limit cut off is dropped; the whole ones before it stay.
                let Some(close) = after.find("</tool_call>") else {
                    s = "";
                    break;
                };
                let v: Value = serde_json::from_str(after[..close].trim()).ok()?;
                calls.push(call(&v, "arguments")?);
                s = &after[close + "</tool_call>".len()..];
            }
            (calls, s)
        }
        Format::Llama3 => {
            let mut rest = t.strip_prefix("<|python_tag|>").unwrap_or(t);
            if !rest.starts_with('{') {
                return None;
            }
            let mut calls = Vec::new();
            // Objects, each optionally followed by `;`.
            loop {
                rest = rest.trim_start_matches(|c: char| c == ';' || c.is_whitespace());
                if !rest.starts_with('{') {
                    break;
                }
                let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
                let v = values.next()?.ok()?;
                calls.push(call(&v, "parameters")?);
                rest = &rest[values.byte_offset()..];
            }
            (calls, rest)
        }
        Format::Mistral => {
            let body = t.strip_prefix("[TOOL_CALLS]").unwrap_or(t).trim_start();
            if !body.starts_with('[') {
                return None;
            }
            let mut values = serde_json::Deserializer::from_str(body).into_iter::<Value>();
            let v = values.next()?.ok()?;
            let calls = v.as_array()?.iter().map(|c| call(c, "arguments")).collect::<Option<Vec<_>>>()?;
            (calls, &body[values.byte_offset()..])
        }
    };
    if calls.is_empty() {
        return None;
    }
    let rest = rest.trim();
    Some(((!rest.is_empty()).then(|| rest.to_string()), calls))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
    }

    #[test]
    fn tools_and_choices_are_checked() {
        let t = parse_tools(Some(&weather()), Some(&json!("required")), None).unwrap().unwrap();
        assert_eq!((t.choice, t.parallel, t.list.len()), (ToolChoice::Required, true, 1));
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        assert_eq!(
            parse_tools(Some(&weather()), Some(&named), Some(&json!(false))).unwrap().unwrap().choice,
            ToolChoice::Named("get_weather".into())
        );
        assert_eq!(parse_tools(Some(&json!([])), Some(&json!("auto")), None).unwrap(), None);
        for (tools, choice, why) in [
            (json!({}), json!(null), "must be an array"),
            (json!([{"type": "function", "function": {"name": "a b"}}]), json!(null), "function.name"),
            (json!([{"type": "function", "function": {"name": "f", "x": 1}}]), json!(null), "'tools[0].function.x'"),
            (
                json!([{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]),
                json!(null),
                "twice",
            ),
            (weather(), json!({"type": "function", "function": {"name": "nope"}}), "does not have"),
            (weather(), json!("always"), "'tool_choice' must be"),
            (json!([]), json!("required"), "'tools' is empty"),
        ] {
            let e = parse_tools(Some(&tools), Some(&choice), None).unwrap_err();
            assert!(e.contains(why), "{tools} {choice}: {e}");
        }
    }

    #[test]
    fn replies_are_read_in_each_format() {
        let names = ["f", "g"];
        let (text, calls) = parse_reply(
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>",
            Format::Hermes,
            &names,
        )
        .unwrap();
        assert_eq!((text, calls), (None, vec![Call { name: "f".into(), arguments: "{\"a\":1}".into() }]));
        let (_, calls) = parse_reply("<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>", Format::Generic, &names).unwrap();
        assert_eq!(calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["f", "g"]);
        assert_eq!(parse_reply("plain text", Format::Hermes, &names), None);
        // Only at the start, and only the declared functions.
        assert_eq!(
            parse_reply("I'd use <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>", Format::Hermes, &names),
            None
        );
        assert_eq!(
            parse_reply("<tool_call>{\"name\": \"nope\", \"arguments\": {}}</tool_call>", Format::Hermes, &names),
            None
        );
        let cut = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"g\", \"argu";
        assert_eq!(parse_reply(cut, Format::Hermes, &names).unwrap().1.len(), 1, "the cut call is dropped");
        let llama =
            "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"x\": \"y;\"}}; {\"name\": \"g\", \"parameters\": {}};";
        let (_, calls) = parse_reply(llama, Format::Llama3, &names).unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].arguments, "{\"x\":\"y;\"}");
        let (_, calls) =
            parse_reply("[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}]", Format::Mistral, &names).unwrap();
        assert_eq!(calls[0].name, "f");
        assert!(Format::Hermes.could_be_call(" <tool_") && !Format::Hermes.could_be_call("Sure"));
    }

    #[test]
    fn generic_templates_get_the_tools_in_the_system_turn() {
        let tools = parse_tools(Some(&weather()), None, None).unwrap().unwrap();
        let mut asked = Message::new("assistant", "");
        asked.tool_calls = Some(template_tool_calls(&json!([{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]), 1).unwrap());
        let mut answer = Message::new("tool", "12 C");
        answer.tool_call_id = Some("c1".into());
        let out =
            prepare_messages(vec![Message::new("user", "Weather in Oslo?"), asked, answer], &tools, Format::Generic);
        assert_eq!(out[0].role, "system");
        assert!(
            out[0].content.contains("\"get_weather\"") && out[0].content.contains("<tool_call>"),
            "{}",
            out[0].content
        );
        assert_eq!(
            out[2].content,
            "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}</tool_call>"
        );
        assert_eq!(
            (out[3].role.as_str(), out[3].content.as_str()),
            ("user", "<tool_response>\n12 C\n</tool_response>")
        );
        assert!(grammar(&Tools { choice: ToolChoice::None, ..tools.clone() }, Format::Generic, None).is_none());
        // Every family's grammar is valid Lark (compiled with a real tokenizer in
        // tests/structured_output.rs); Mistral's names its marker by id.
        let GrammarSpec::Lark(m) = grammar(&tools, Format::Mistral, Some(5)).unwrap() else { panic!() };
        assert!(m.contains("calls: <[5]> %json"), "{m}");
    }
}
