//! Chat templates: the model's `tokenizer.chat_template` (Hugging Face Jinja) rendered with
//! minijinja plus the Python string methods HF templates use, `raise_exception`, and
//! `strftime_now`.
//!
//! Files without a template get duet's fallback: ChatML when the vocabulary has
//! `<|im_start|>`/`<|im_end|>`, else plain `User:` / `Assistant:` lines.
//!
//! A template comes with the model file, so a rendering is bounded in steps
//! ([`TEMPLATE_FUEL`]), memory ([`TEMPLATE_MEMORY`], on a thread of its own:
//! [`crate::mem_budget`]), time ([`TEMPLATE_TIME`]) and output ([`TEMPLATE_MAX_OUTPUT`]); a
//! template that overran its memory or time is not run again.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use minijinja::{Environment, Error, ErrorKind, context};

use crate::error::RuntimeError;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub role: String,
    pub content: String,
    /// An assistant turn's tool calls, as Hugging Face templates read them:
    /// `[{"type": "function", "function": {"name", "arguments": {…}}}]` (rendered with
    /// `content` none when it is empty).
    pub tool_calls: Option<serde_json::Value>,
    /// A `tool` turn's answer to this call.
    pub tool_call_id: Option<String>,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Message {
        Message { role: role.to_string(), content: content.to_string(), tool_calls: None, tool_call_id: None }
    }
}

/// ChatML, used when a model has no template but knows the ChatML markers.
pub const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Plain text, for models with no template and no chat markers.
pub const PLAIN: &str = "{% for message in messages %}{% if message['role'] == 'system' %}{{ message['content'] + '\\n\\n' }}{% elif message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\\n' }}{% else %}{{ 'Assistant: ' + message['content'] + '\\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}";

pub struct ChatTemplate {
    env: Arc<Environment<'static>>,
    /// The template's text (what tool-call formats are told apart by).
    pub text: String,
    pub source: TemplateSource,
    bos: String,
    eos: String,
    /// Why the model's template cannot be used (it does not parse): only what renders a
    /// conversation fails with it, not the model's load (run, perplexity and bench need no
    /// template).
    pub broken: Option<String>,
    /// Why a rendering stopped for good (memory or time), once one has: later renderings
    /// fail with it at once (the stopped one's thread holds its memory).
    overran: Mutex<Option<String>>,
    limits: TemplateLimits,
}

/// What one rendering may spend. duet renders with [`TemplateLimits::default`] (the
/// `TEMPLATE_*` constants); smaller limits serve the fuzz target, which must not park
/// hundreds of 256 MiB threads (`runtime/fuzz/fuzz_targets/chat_template_budget.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TemplateLimits {
    /// Instructions ([`minijinja::Environment::set_fuel`]).
    pub fuel: u64,
    /// Bytes held at once, where [`crate::mem_budget::BudgetAlloc`] is installed.
    pub memory: usize,
    /// Wall-clock time.
    pub time: Duration,
    /// Bytes of rendered text: writing stops at the first byte past it.
    pub output: usize,
}

impl Default for TemplateLimits {
    fn default() -> TemplateLimits {
        TemplateLimits {
            fuel: TEMPLATE_FUEL,
            memory: TEMPLATE_MEMORY,
            time: TEMPLATE_TIME,
            output: TEMPLATE_MAX_OUTPUT,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TemplateSource {
    Model,
    FallbackChatml,
    FallbackPlain,
}

/// Instructions a template may run per rendering ([`minijinja::Environment::set_fuel`]).
pub const TEMPLATE_FUEL: u64 = 20_000_000;
/// Bytes a rendering may hold at once: real templates hold a few copies of the
/// conversation; a string doubled 64 times stops here (where the program installs
/// [`crate::mem_budget::BudgetAlloc`], as duet does).
pub const TEMPLATE_MEMORY: usize = 256 << 20;
/// Wall-clock time a rendering may take (the fuel usually ends a runaway one first).
pub const TEMPLATE_TIME: Duration = Duration::from_secs(30);
/// Bytes of rendered text: 4 MiB is about a million tokens, more than any context duet
/// runs, and tokenizing it takes about 120 bytes a byte.
pub const TEMPLATE_MAX_OUTPUT: usize = 4 << 20;

impl ChatTemplate {
    /// `template`: the model's, if any; `has_chatml`: whether the vocabulary has the ChatML
    /// markers (for the fallback).
    pub fn new(template: Option<&str>, has_chatml: bool, bos: &str, eos: &str) -> Result<ChatTemplate, RuntimeError> {
        ChatTemplate::with_limits(template, has_chatml, bos, eos, TemplateLimits::default())
    }

    /// [`ChatTemplate::new`] rendering within `limits`.
    pub fn with_limits(
        template: Option<&str>,
        has_chatml: bool,
        bos: &str,
        eos: &str,
        limits: TemplateLimits,
    ) -> Result<ChatTemplate, RuntimeError> {
        let (text, source) = match template {
            Some(t) => (t.to_string(), TemplateSource::Model),
            None if has_chatml => (CHATML.to_string(), TemplateSource::FallbackChatml),
            None => (PLAIN.to_string(), TemplateSource::FallbackPlain),
        };
        let mut env = Environment::new();
        // HF templates are written for Python Jinja: keep whitespace as written.
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| RuntimeError::Template(e.to_string()))?;
        env.set_syntax(syntax);
        // A template comes with the model file: one that loops for ever must end with an
        // error, not hang the program. Real chat templates take a few thousand steps per
        // conversation; this allows thousands of times that.
        env.set_fuel(Some(limits.fuel));
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |fmt: String| -> String { strftime_now(&fmt) });
        let broken = env.add_template_owned("chat", text.clone()).err().map(|e| describe(&e));
        Ok(ChatTemplate {
            env: Arc::new(env),
            text,
            source,
            bos: bos.to_string(),
            eos: eos.to_string(),
            broken,
            overran: Mutex::new(None),
            limits,
        })
    }

    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String, RuntimeError> {
        self.render_with_tools(messages, add_generation_prompt, None)
    }

    /// [`ChatTemplate::render`] with the template's `tools` variable set (the request's
    /// tools, `[{"type": "function", "function": {…}}]`).
    pub fn render_with_tools(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
    ) -> Result<String, RuntimeError> {
        if let Some(why) = &self.broken {
            return Err(RuntimeError::Template(format!("the model's chat template does not parse: {why}")));
        }
        let overran = || self.overran.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(why) = overran().as_ref() {
            return Err(RuntimeError::Template(why.clone()));
        }
        let msgs: Vec<minijinja::Value> = messages
            .iter()
            .map(|m| {
                let mut map = std::collections::BTreeMap::new();
                map.insert("role", minijinja::Value::from(m.role.clone()));
                let content = if m.content.is_empty() && m.tool_calls.is_some() {
                    minijinja::Value::from(())
                } else {
                    minijinja::Value::from(m.content.clone())
                };
                map.insert("content", content);
                if let Some(calls) = &m.tool_calls {
                    map.insert("tool_calls", jinja_value(calls));
                }
                if let Some(id) = &m.tool_call_id {
                    map.insert("tool_call_id", minijinja::Value::from(id.clone()));
                }
                minijinja::Value::from(map)
            })
            .collect();
        let tools = tools.map(jinja_value);
        let (env, bos, eos) = (Arc::clone(&self.env), self.bos.clone(), self.eos.clone());
        let limits = self.limits;
        let rendered = crate::mem_budget::run_with_budget(limits.memory, limits.time, move || {
            let tmpl = env.get_template("chat").map_err(|e| e.to_string())?;
            let ctx = context! {
                messages => msgs,
                add_generation_prompt => add_generation_prompt,
                bos_token => bos,
                eos_token => eos,
                tools => tools,
            };
            // Written through a capped buffer, so that a template writing without end stops
            // at the limit instead of first building all of its text.
            let mut out = CappedText { text: Vec::new(), limit: limits.output, over: false };
            if let Err(e) = tmpl.render_captured_to(ctx, &mut out) {
                if out.over {
                    return Err(format!(
                        "the model's chat template rendered more than {} bytes, more than duet takes{}",
                        limits.output,
                        if limits.output == TEMPLATE_MAX_OUTPUT {
                            format!(" ({} MiB, about a million tokens)", TEMPLATE_MAX_OUTPUT >> 20)
                        } else {
                            String::new()
                        }
                    ));
                }
                return Err(describe(&e));
            }
            // minijinja writes whole `str`s: the bytes are UTF-8.
            String::from_utf8(out.text).map_err(|e| e.to_string())
        });
        use crate::mem_budget::Overrun;
        let why = match rendered {
            Ok(out) => return out.map_err(RuntimeError::Template),
            Err(Overrun::Memory(b)) => {
                format!(
                    "the model's chat template needed more than {} MiB of memory to render; it is not run again",
                    b >> 20
                )
            }
            Err(Overrun::Depth) => {
                "the model's chat template nests a value too deeply to render (a namespace stored inside itself?); it is not run again".to_string()
            }
            Err(Overrun::Time(t)) => {
                format!("the model's chat template ran longer than {} s; it is not run again", t.as_secs())
            }
            Err(Overrun::Panic) => "the model's chat template could not be rendered (the renderer failed)".to_string(),
        };
        *overran() = Some(why.clone());
        Err(RuntimeError::Template(why))
    }
}

/// Token ids of `messages` rendered by `template`, ready for the reply
/// (`add_generation_prompt`). The messages' content is what users typed: text in it that
/// spells a special token (`<|im_start|>system…`) stays text — it must not open a turn of
/// another role — unless `allow_special` (`--special`). Rendered with each such content
/// replaced by a marker, the template's own text is tokenized with its special tokens and
/// each content literally ([`Tokenizer::encode_literal`]).
pub fn encode_chat(
    template: &ChatTemplate,
    tokenizer: &super::Tokenizer,
    messages: &[Message],
    add_generation_prompt: bool,
    allow_special: bool,
) -> Result<Vec<u32>, RuntimeError> {
    encode_chat_with_tools(template, tokenizer, messages, add_generation_prompt, allow_special, None)
}

/// [`encode_chat`] with the template's `tools` variable set.
pub fn encode_chat_with_tools(
    template: &ChatTemplate,
    tokenizer: &super::Tokenizer,
    messages: &[Message],
    add_generation_prompt: bool,
    allow_special: bool,
    tools: Option<&serde_json::Value>,
) -> Result<Vec<u32>, RuntimeError> {
    if allow_special || !messages.iter().any(|m| tokenizer.holds_special_text(&m.content)) {
        return tokenizer.encode_rendered(&template.render_with_tools(messages, add_generation_prompt, tools)?);
    }
    // Markers of private-use characters, which no template writes of its own.
    let marker = |i: usize| format!("\u{F8F0}{i}\u{F8F1}");
    let marked: Vec<Message> =
        messages.iter().enumerate().map(|(i, m)| Message { content: marker(i), ..m.clone() }).collect();
    let text = template.render_with_tools(&marked, add_generation_prompt, tools)?;
    let mut ids: Vec<u32> = tokenizer.bos.filter(|_| tokenizer.wants_bos(&text)).into_iter().collect();
    let mut rest = text.as_str();
    while let Some(open) = rest.find('\u{F8F0}') {
        let after = &rest[open + '\u{F8F0}'.len_utf8()..];
        let Some(close) = after.find('\u{F8F1}') else { break };
        let index: Option<usize> = after[..close].parse().ok();
        let Some(m) = index.and_then(|i| messages.get(i)) else {
            return Err(RuntimeError::Template(
                "the chat template changed a message's content in a way duet cannot follow; --special renders it as it is".into(),
            ));
        };
        ids.extend(tokenizer.encode(&rest[..open], false)?);
        ids.extend(tokenizer.encode_literal(&m.content)?);
        rest = &after[close + '\u{F8F1}'.len_utf8()..];
    }
    ids.extend(tokenizer.encode(rest, false)?);
    Ok(ids)
}

/// A JSON value as a template sees it (objects as maps sorted by key; serde_json's parser
/// already bounds the nesting).
fn jinja_value(v: &serde_json::Value) -> minijinja::Value {
    use serde_json::Value as J;
    match v {
        J::Null => minijinja::Value::from(()),
        J::Bool(b) => minijinja::Value::from(*b),
        J::Number(n) => match n.as_i64() {
            Some(i) => minijinja::Value::from(i),
            None => minijinja::Value::from(n.as_f64().unwrap_or(f64::NAN)),
        },
        J::String(s) => minijinja::Value::from(s.clone()),
        J::Array(a) => minijinja::Value::from(a.iter().map(jinja_value).collect::<Vec<_>>()),
        J::Object(o) => minijinja::Value::from(
            o.iter().map(|(k, v)| (k.clone(), jinja_value(v))).collect::<std::collections::BTreeMap<_, _>>(),
        ),
    }
}

/// The rendered text, refusing to grow past `limit` bytes.
struct CappedText {
    text: Vec<u8>,
    limit: usize,
    /// Whether a write was refused for the limit.
    over: bool,
}

impl std::io::Write for CappedText {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.text.len() + buf.len() > self.limit {
            self.over = true;
            return Err(std::io::Error::other("the chat template's output budget is spent"));
        }
        self.text.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(&format!(": {inner}"));
        src = inner.source();
    }
    s
}

/// The date formats templates ask for (Llama 3's "%d %b %Y"), in UTC.
fn strftime_now(fmt: &str) -> String {
    let secs = web_time::SystemTime::now().duration_since(web_time::UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    fmt.replace("%d", &format!("{d:02}"))
        .replace("%b", MONTHS[(m - 1) as usize])
        .replace("%m", &format!("{m:02}"))
        .replace("%Y", &y.to_string())
}

/// Days since 1970-01-01 → (year, month, day) (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_hf_style_templates() {
        // SmolLM2's template: loop.first, indexing, conditionals.
        let t = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
        let ct = ChatTemplate::new(Some(t), true, "", "").unwrap();
        let out = ct.render(&[Message::new("user", "Hi")], true).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn tools_and_tool_calls_reach_the_template() {
        let t = "{% for t in tools or [] %}{{ t.function.name }};{% endfor %}{% for m in messages %}{{ m.role }}:{% if m.tool_calls %}{% for c in m.tool_calls %}{{ c.function.name }}({{ c.function.arguments | tojson }}){% endfor %}{{ m.content is none }}{% else %}{{ m.content }}{% endif %}{% if m.tool_call_id %}#{{ m.tool_call_id }}{% endif %}|{% endfor %}";
        let ct = ChatTemplate::new(Some(t), false, "", "").unwrap();
        let mut call = Message::new("assistant", "");
        call.tool_calls =
            Some(serde_json::json!([{"type": "function", "function": {"name": "f", "arguments": {"b": 2, "a": 1}}}]));
        let mut answer = Message::new("tool", "3");
        answer.tool_call_id = Some("c1".into());
        let tools = serde_json::json!([{"type": "function", "function": {"name": "f"}}]);
        let out = ct.render_with_tools(&[Message::new("user", "hi"), call, answer], false, Some(&tools)).unwrap();
        assert_eq!(out, "f;user:hi|assistant:f({\"a\": 1, \"b\": 2})True|tool:3#c1|");
        assert_eq!(ct.render(&[Message::new("user", "hi")], false).unwrap(), "user:hi|");
    }

    #[test]
    fn namespace_strip_and_raise_exception() {
        let t = "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% if m.role == 'bad' %}{{ raise_exception('no bad roles') }}{% endif %}[{{ m.content.strip() }}]{% endfor %}{{ ns.n }}";
        let ct = ChatTemplate::new(Some(t), false, "", "").unwrap();
        assert_eq!(
            ct.render(&[Message::new("user", "  a "), Message::new("assistant", "b")], false).unwrap(),
            "[a][b]2"
        );
        let e = ct.render(&[Message::new("bad", "x")], false).unwrap_err().to_string();
        assert!(e.contains("no bad roles"), "{e}");
    }

    #[test]
    fn fallbacks() {
        let chatml = ChatTemplate::new(None, true, "", "").unwrap();
        assert_eq!(chatml.source, TemplateSource::FallbackChatml);
        assert_eq!(
            chatml.render(&[Message::new("user", "x")], true).unwrap(),
            "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
        );
        let plain = ChatTemplate::new(None, false, "", "").unwrap();
        assert_eq!(plain.render(&[Message::new("user", "x")], true).unwrap(), "User: x\nAssistant:");
    }

    #[test]
    fn a_template_that_never_ends_is_an_error() {
        // Writes nothing, so that the fuel ends it (a loop that writes stops at the output
        // limit first: limits_given_to_a_template_bound_its_rendering).
        let t = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}";
        let ct = ChatTemplate::new(Some(t), false, "", "").unwrap();
        let e = ct.render(&[Message::new("user", "x")], true).unwrap_err().to_string();
        assert!(e.contains("fuel"), "{e}");
    }

    /// Templates that grow a value exponentially within their fuel (the issue-41 case: 2^64
    /// copies of "xx"; a list doubled; a macro doubling its argument as it recurses) stop
    /// at the memory budget with an error, and are not run again. Before the budget the
    /// first reached 10 GB in 30 s.
    #[test]
    fn a_template_that_grows_without_bound_stops_at_its_memory_budget() {
        assert!(crate::mem_budget::installed(), "the unit tests install the budgeting allocator");
        let templates = [
            "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
            "{% set ns = namespace(l=[1, 2]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}",
            "{% macro d(s, n) %}{% if n > 0 %}{{ d(s ~ s, n - 1) }}{% else %}{{ s|length }}{% endif %}{% endmacro %}{{ d('xx', 60) }}",
        ];
        for t in templates {
            let ct = ChatTemplate::new(Some(t), false, "", "").unwrap();
            let start = std::time::Instant::now();
            let e = ct.render(&[Message::new("user", "x")], true).unwrap_err().to_string();
            assert!(e.contains("more than 256 MiB of memory"), "{t}: {e}");
            assert!(start.elapsed() < TEMPLATE_TIME, "{t}: stopped by the memory budget, not the clock");
            let again = ct.render(&[Message::new("user", "x")], true).unwrap_err().to_string();
            assert_eq!(again, e, "a template that overran is not run again");
        }
    }

    /// A namespace stored inside itself (found by the chat_template_budget fuzz target) is
    /// formatted by a recursion without end: it stops at the depth budget with an error
    /// instead of overflowing the stack, which aborted the program.
    #[test]
    fn a_value_that_contains_itself_is_an_error_not_a_stack_overflow() {
        assert!(crate::mem_budget::installed(), "the unit tests install the budgeting allocator");
        let templates = [
            "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns,s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
            "{% set ns = namespace() %}{% set ns.me = [ns] %}{{ ns }}",
            "{% set a = namespace() %}{% set b = namespace(a=a) %}{% set a.b = b %}{{ a|tojson }}",
        ];
        for t in templates {
            let ct = ChatTemplate::new(Some(t), false, "", "").unwrap();
            let e = ct.render(&[Message::new("user", "x")], true).unwrap_err().to_string();
            assert!(e.contains("nests a value too deeply"), "{t}: {e}");
        }
    }

    /// Output past TEMPLATE_MAX_OUTPUT is refused (6 MB here, within fuel and memory).
    #[test]
    fn a_template_that_writes_too_much_is_refused() {
        let t = "{% for i in range(10000) %}{{ 'x' * 600 }}{% endfor %}";
        let ct = ChatTemplate::new(Some(t), false, "", "").unwrap();
        let e = ct.render(&[Message::new("user", "x")], true).unwrap_err().to_string();
        assert!(e.contains("rendered more than 4194304 bytes, more than duet takes (4 MiB"), "{e}");
        // Within the limit, the same loop renders.
        let t = "{% for i in range(1000) %}{{ 'x' * 600 }}{% endfor %}";
        let ct = ChatTemplate::new(Some(t), false, "", "").unwrap();
        assert_eq!(ct.render(&[Message::new("user", "x")], true).unwrap().len(), 600_000);
    }

    /// Smaller limits hold as the defaults do: writing stops at the first write past the
    /// output limit (the loop below would write 100 MB and stops within its first 4 KiB,
    /// long before the 1 MiB memory budget), and fuel and memory are per template.
    #[test]
    fn limits_given_to_a_template_bound_its_rendering() {
        let small = TemplateLimits { fuel: 100_000, memory: 1 << 20, time: Duration::from_secs(10), output: 4096 };
        let writer = "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}";
        let ct = ChatTemplate::with_limits(Some(writer), false, "", "", small).unwrap();
        let e = ct.render(&[Message::new("user", "x")], true).unwrap_err().to_string();
        assert_eq!(e, "chat template: the model's chat template rendered more than 4096 bytes, more than duet takes");
        let fits = "{% for i in range(4) %}{{ 'x' * 1024 }}{% endfor %}";
        let ct = ChatTemplate::with_limits(Some(fits), false, "", "", small).unwrap();
        assert_eq!(ct.render(&[Message::new("user", "x")], true).unwrap().len(), 4096);
        let looping = "{% for a in range(1000) %}{% for b in range(1000) %}{% endfor %}{% endfor %}";
        let e = ChatTemplate::with_limits(Some(looping), false, "", "", small).unwrap();
        let e = e.render(&[Message::new("user", "x")], true).unwrap_err().to_string();
        assert!(e.contains("fuel"), "{e}");
        let doubling =
            "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}";
        let e = ChatTemplate::with_limits(Some(doubling), false, "", "", small).unwrap();
        let e = e.render(&[Message::new("user", "x")], true).unwrap_err().to_string();
        assert!(e.contains("more than 1 MiB of memory"), "{e}");
    }

    #[test]
    fn a_template_that_does_not_parse_fails_only_when_rendered() {
        let ct = ChatTemplate::new(Some("{% for m in messages %}{{ m.content }"), false, "", "").unwrap();
        assert!(ct.broken.is_some());
        let e = ct.render(&[Message::new("user", "x")], true).unwrap_err().to_string();
        assert!(e.contains("chat template does not parse"), "{e}");
    }

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
    }
}
