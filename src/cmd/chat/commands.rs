//! What a line typed into `duet chat` means: a message, or a slash command. Pure, so that
//! every command's parsing is tested without a terminal.

/// A setting `/set` changes.
#[derive(Clone, Debug, PartialEq)]
pub enum Setting {
    Temperature(f32),
    TopP(f32),
    TopK(usize),
    Seed(u64),
    /// A new system prompt (empty: none).
    System(String),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Text for the model.
    Message(String),
    Help,
    /// `/bye`, `/exit`, `/quit`.
    Bye,
    /// `/clear`, `/reset`: forget the conversation.
    Clear,
    /// `/set` alone: show the settings.
    Show,
    Set(Setting),
    Save(String),
    Load(String),
    /// A slash command that does not parse; the message says why.
    Invalid(String),
}

/// The help text of `/help`.
pub const HELP: &str = "\
/help               this list
/bye, /exit         leave (also Ctrl-D)
/clear, /reset      forget the conversation
/set                show the sampling settings
/set temp T         temperature (0: greedy)
/set top-p P        keep the most likely tokens up to probability P, in (0, 1]
/set top-k K        keep the K most likely tokens (0: all)
/set seed N         restart the random stream at N
/set system TEXT    a new system prompt (/set system alone: none)
/save FILE          write the conversation to FILE (JSON, OpenAI messages)
/load FILE          continue a conversation /save wrote
Multi-line messages: a line of \"\"\" starts and ends one, or end a line with \\.
A message that starts with / is sent when written //… (the first / dropped).
Up and Down recall earlier messages; Ctrl-R searches them; Ctrl-C stops a reply (at the
prompt it clears the line; twice in a row leaves).";

fn number<T: std::str::FromStr>(what: &str, v: &str) -> Result<T, String> {
    v.trim().parse().map_err(|_| format!("/set {what} takes a number, got '{v}'"))
}

fn setting(rest: &str) -> Result<Option<Setting>, String> {
    let rest = rest.trim();
    if rest.is_empty() {
        return Ok(None);
    }
    let (key, value) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    let value = value.trim();
    if value.is_empty() && key != "system" {
        return Err(format!("/set {key} needs a value (/help lists the settings)"));
    }
    let s = match key {
        "temp" | "temperature" => {
            let t: f32 = number(key, value)?;
            if !(t >= 0.0 && t.is_finite()) {
                return Err(format!("/set temp takes 0 or more, got {t}"));
            }
            Setting::Temperature(t)
        }
        "top-p" | "top_p" => {
            let p: f32 = number(key, value)?;
            if !(p > 0.0 && p <= 1.0) {
                return Err(format!("/set top-p takes a number in (0, 1], got {p}"));
            }
            Setting::TopP(p)
        }
        "top-k" | "top_k" => Setting::TopK(number(key, value)?),
        "seed" => Setting::Seed(number(key, value)?),
        "system" => Setting::System(value.to_string()),
        other => return Err(format!("/set {other}: not a setting (temp, top-p, top-k, seed, system)")),
    };
    Ok(Some(s))
}

/// What `text` (a whole message, multi-line already joined) asks for.
pub fn parse(text: &str) -> Command {
    let t = text.trim();
    if let Some(escaped) = t.strip_prefix("//") {
        return Command::Message(format!("/{escaped}"));
    }
    let Some(cmd) = t.strip_prefix('/') else { return Command::Message(t.to_string()) };
    let (name, rest) = cmd.split_once(char::is_whitespace).unwrap_or((cmd, ""));
    let file = |verb: &str, f: fn(String) -> Command| {
        let f_name = rest.trim();
        if f_name.is_empty() { Command::Invalid(format!("/{verb} needs a file name")) } else { f(f_name.to_string()) }
    };
    match name {
        "help" | "?" => Command::Help,
        "bye" | "exit" | "quit" => Command::Bye,
        "clear" | "reset" => Command::Clear,
        "set" => match setting(rest) {
            Ok(None) => Command::Show,
            Ok(Some(s)) => Command::Set(s),
            Err(e) => Command::Invalid(e),
        },
        "save" => file("save", Command::Save),
        "load" => file("load", Command::Load),
        other => Command::Invalid(format!(
            "unknown command /{other} (not sent to the model; /help lists the commands, //{other} sends it as text)"
        )),
    }
}

/// How a typed line continues a message being written.
#[derive(Debug, PartialEq)]
pub enum Line {
    /// The message is complete.
    Done(String),
    /// More lines follow; the prompt should show it.
    More,
}

/// Joins typed lines into messages: `"""` on a line of its own opens and closes a block, a
/// line ending in `\` continues on the next.
#[derive(Default)]
pub struct Assembler {
    lines: Vec<String>,
    /// Inside a `"""` block.
    block: bool,
}

impl Assembler {
    pub fn push(&mut self, line: &str) -> Line {
        if self.block {
            if let Some(last) = line.trim_end().strip_suffix("\"\"\"") {
                if !last.is_empty() {
                    self.lines.push(last.to_string());
                }
                self.block = false;
                return Line::Done(std::mem::take(&mut self.lines).join("\n"));
            }
            self.lines.push(line.to_string());
            return Line::More;
        }
        if let Some(first) = line.trim_start().strip_prefix("\"\"\"") {
            // `"""text"""` on one line is a message too.
            if let Some(whole) = first.trim_end().strip_suffix("\"\"\"") {
                return Line::Done(whole.to_string());
            }
            self.block = true;
            if !first.is_empty() {
                self.lines.push(first.to_string());
            }
            return Line::More;
        }
        if let Some(head) = line.strip_suffix('\\') {
            self.lines.push(head.to_string());
            return Line::More;
        }
        self.lines.push(line.to_string());
        Line::Done(std::mem::take(&mut self.lines).join("\n"))
    }

    /// Whether a message is half written.
    pub fn pending(&self) -> bool {
        self.block || !self.lines.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse_and_mistakes_say_why() {
        assert_eq!(parse("hello"), Command::Message("hello".into()));
        assert_eq!(parse("//etc/hosts is a file"), Command::Message("/etc/hosts is a file".into()));
        assert_eq!(parse(" /help "), Command::Help);
        for bye in ["/bye", "/exit", "/quit"] {
            assert_eq!(parse(bye), Command::Bye);
        }
        assert_eq!(parse("/clear"), Command::Clear);
        assert_eq!(parse("/set"), Command::Show);
        assert_eq!(parse("/set temp 0"), Command::Set(Setting::Temperature(0.0)));
        assert_eq!(parse("/set top-p 0.5"), Command::Set(Setting::TopP(0.5)));
        assert_eq!(parse("/set top-k 7"), Command::Set(Setting::TopK(7)));
        assert_eq!(parse("/set seed 42"), Command::Set(Setting::Seed(42)));
        assert_eq!(parse("/set system You are terse."), Command::Set(Setting::System("You are terse.".into())));
        assert_eq!(parse("/set system"), Command::Set(Setting::System(String::new())));
        assert_eq!(parse("/save chat.json"), Command::Save("chat.json".into()));
        assert_eq!(parse("/load a b.json"), Command::Load("a b.json".into()));
        for (bad, why) in [
            ("/frobnicate", "unknown command /frobnicate"),
            ("/set temp hot", "takes a number"),
            ("/set temp -1", "0 or more"),
            ("/set top-p 2", "(0, 1]"),
            ("/set colour red", "not a setting"),
            ("/set seed", "needs a value"),
            ("/save", "needs a file name"),
        ] {
            match parse(bad) {
                Command::Invalid(m) => assert!(m.contains(why), "{bad}: {m}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn lines_join_into_messages() {
        let mut a = Assembler::default();
        assert_eq!(a.push("one line"), Line::Done("one line".into()));
        assert_eq!(a.push("first \\"), Line::More);
        assert!(a.pending());
        assert_eq!(a.push("second"), Line::Done("first \nsecond".into()));
        assert_eq!(a.push("\"\"\""), Line::More);
        assert_eq!(a.push("a"), Line::More);
        assert_eq!(a.push(""), Line::More);
        assert_eq!(a.push("b \\"), Line::More);
        assert_eq!(a.push("\"\"\""), Line::Done("a\n\nb \\".into()));
        assert_eq!(a.push("\"\"\"start"), Line::More);
        assert_eq!(a.push("end\"\"\""), Line::Done("start\nend".into()));
        assert_eq!(a.push("\"\"\"whole\"\"\""), Line::Done("whole".into()));
        assert!(!a.pending());
    }
}
