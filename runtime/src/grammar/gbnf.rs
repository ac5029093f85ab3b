//! llama.cpp's GBNF grammars, translated to the Lark dialect llguidance compiles.
//!
//! GBNF: `name ::= alternatives`, one rule per line (a rule continues past a line end only
//! inside parentheses, after `|` or before a line that starts with `|`), `root` the start;
//! strings `"…"` and character classes `[…]` / `[^…]` with `\x` `\u` `\U` `\t` `\n` `\r`
//! escapes, `.` for any character, `( )`, `|`, `* + ?` and `{m}` `{m,}` `{m,n}` `{,n}`, `#`
//! comments.
//!
//! Every rule becomes one Lark line. Names are mangled into Lark's lower-case rule names
//! (`g` first; `_` → `__`; an upper-case letter → `_` and the letter), strings are written as
//! JSON strings and character classes as regexes whose every character is a `\x{…}` escape,
//! so nothing in a GBNF text can mean something else in Lark.

use std::collections::HashSet;
use std::fmt::Write;

fn mangle(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    out.push('g');
    for c in name.chars() {
        match c {
            '_' => out.push_str("__"),
            'A'..='Z' => {
                out.push('_');
                out.push(c.to_ascii_lowercase());
            }
            _ => out.push(c),
        }
    }
    out
}

/// Parentheses nested deeper than this are refused (llguidance's Lark parser stops at 30,
/// and the translator recurses once a level).
const MAX_NESTING: usize = 30;

struct Parser<'a> {
    src: &'a [u8],
    text: &'a str,
    pos: usize,
    /// Parentheses open at `pos`.
    depth: usize,
    /// Rule names referenced, to check they are defined.
    used: Vec<(String, usize)>,
}

type Res<T> = Result<T, String>;

/// When a part of a rule can match a finite string, given which rules can: what shows a
/// grammar that admits no string (`root ::= "a" root`) before llguidance is handed it.
enum Ends {
    Always,
    Rule(String),
    All(Vec<Ends>),
    Any(Vec<Ends>),
}

impl Ends {
    fn holds(&self, ending: &HashSet<&str>) -> bool {
        match self {
            Ends::Always => true,
            Ends::Rule(r) => ending.contains(r.as_str()),
            Ends::All(v) => v.iter().all(|e| e.holds(ending)),
            Ends::Any(v) => v.iter().any(|e| e.holds(ending)),
        }
    }
}

impl<'a> Parser<'a> {
    fn line(&self, at: usize) -> usize {
        self.src[..at.min(self.src.len())].iter().filter(|&&b| b == b'\n').count() + 1
    }

    fn fail<T>(&self, what: &str) -> Res<T> {
        Err(format!("GBNF line {}: {what}", self.line(self.pos)))
    }

    fn peek(&self) -> Option<u8> {
        self.src.get(self.pos).copied()
    }

    /// Skips spaces and comments, and line ends too when `newlines`.
    fn space(&mut self, newlines: bool) {
        while let Some(b) = self.peek() {
            match b {
                b' ' | b'\t' => self.pos += 1,
                b'\r' | b'\n' if newlines => self.pos += 1,
                b'#' => {
                    while self.peek().is_some_and(|b| b != b'\n') {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Res<String> {
        let start = self.pos;
        while self.peek().is_some_and(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            self.pos += 1;
        }
        if start == self.pos {
            return self.fail("expected a rule name");
        }
        Ok(self.text[start..self.pos].to_string())
    }

    fn number(&mut self) -> Res<u32> {
        let start = self.pos;
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.pos += 1;
        }
        self.text[start..self.pos].parse().or_else(|_| self.fail("expected a repetition count"))
    }

    /// One character of a string or class, escapes decoded.
    fn char(&mut self) -> Res<char> {
        let rest = &self.text[self.pos..];
        let mut it = rest.chars();
        let c = it.next().ok_or_else(|| format!("GBNF line {}: unterminated string or class", self.line(self.pos)))?;
        if c != '\\' {
            self.pos += c.len_utf8();
            return Ok(c);
        }
        let e = it.next().ok_or_else(|| format!("GBNF line {}: a '\\' at the end", self.line(self.pos)))?;
        self.pos += 2;
        let hex = |p: &mut Self, n: usize| -> Res<char> {
            let digits = p.text.get(p.pos..p.pos + n).filter(|d| d.bytes().all(|b| b.is_ascii_hexdigit()));
            let Some(d) = digits else { return p.fail("a bad hex escape") };
            p.pos += n;
            u32::from_str_radix(d, 16)
                .ok()
                .and_then(char::from_u32)
                .map_or_else(|| p.fail("an escape outside Unicode"), Ok)
        };
        match e {
            'x' => hex(self, 2),
            'u' => hex(self, 4),
            'U' => hex(self, 8),
            't' => Ok('\t'),
            'n' => Ok('\n'),
            'r' => Ok('\r'),
            '\\' | '"' | '[' | ']' | '-' | '^' | '/' => Ok(e),
            other => self.fail(&format!("unknown escape '\\{other}'")),
        }
    }

    fn alternates(&mut self, nested: bool, out: &mut String) -> Res<Ends> {
        let mut any = vec![self.sequence(nested, out)?];
        loop {
            // A line that starts with `|` continues the rule (llama.cpp wants the `|` at the
            // end of the line before; both read the same).
            let at = self.pos;
            self.space(true);
            if self.peek() != Some(b'|') {
                self.pos = at;
                break;
            }
            self.pos += 1;
            self.space(true);
            out.push_str(" | ");
            any.push(self.sequence(nested, out)?);
        }
        Ok(Ends::Any(any))
    }

    fn sequence(&mut self, nested: bool, out: &mut String) -> Res<Ends> {
        let mut items = Vec::new();
        let mut all = Vec::new();
        loop {
            let mut ends = Ends::Always;
            let atom = match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    let mut s = String::new();
                    while self.peek() != Some(b'"') {
                        s.push(self.char()?);
                    }
                    self.pos += 1;
                    if s.is_empty() { None } else { Some(serde_json::to_string(&s).expect("a string serializes")) }
                }
                Some(b'[') => {
                    self.pos += 1;
                    let mut class = String::from("/[");
                    if self.peek() == Some(b'^') {
                        self.pos += 1;
                        class.push('^');
                    }
                    let mut any = false;
                    while self.peek() != Some(b']') {
                        let lo = self.char()?;
                        let _ = write!(class, "\\x{{{:X}}}", lo as u32);
                        if self.peek() == Some(b'-') && self.src.get(self.pos + 1) != Some(&b']') {
                            self.pos += 1;
                            let hi = self.char()?;
                            if hi < lo {
                                return self.fail(&format!("the class range {lo:?}-{hi:?} runs backwards"));
                            }
                            let _ = write!(class, "-\\x{{{:X}}}", hi as u32);
                        }
                        any = true;
                    }
                    self.pos += 1;
                    if !any {
                        return self.fail("an empty character class");
                    }
                    class.push_str("]/");
                    Some(class)
                }
                Some(b'.') => {
                    self.pos += 1;
                    Some("/(?s:.)/".to_string())
                }
                Some(b'(') => {
                    if self.depth >= MAX_NESTING {
                        return self.fail(&format!("parentheses nested deeper than {MAX_NESTING}"));
                    }
                    self.pos += 1;
                    self.depth += 1;
                    self.space(true);
                    let mut inner = String::from("(");
                    ends = self.alternates(true, &mut inner)?;
                    if self.peek() != Some(b')') {
                        return self.fail("expected ')'");
                    }
                    self.pos += 1;
                    self.depth -= 1;
                    inner.push(')');
                    Some(inner)
                }
                Some(b) if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' => {
                    let at = self.pos;
                    let n = self.name()?;
                    let m = mangle(&n);
                    self.used.push((n.clone(), at));
                    ends = Ends::Rule(n);
                    Some(m)
                }
                _ => break,
            };
            self.space(nested);
            // A postfix operator or a count applies to this atom.
            let mut atom = atom;
            match self.peek() {
                Some(op @ (b'*' | b'+' | b'?')) => {
                    self.pos += 1;
                    if let Some(a) = &mut atom {
                        a.push(op as char);
                    }
                    if op != b'+' {
                        ends = Ends::Always;
                    }
                    self.space(nested);
                }
                Some(b'{') => {
                    self.pos += 1;
                    self.space(false);
                    let lo = if self.peek() == Some(b',') { 0 } else { self.number()? };
                    self.space(false);
                    let hi = if self.peek() == Some(b',') {
                        self.pos += 1;
                        self.space(false);
                        if self.peek() == Some(b'}') { None } else { Some(self.number()?) }
                    } else {
                        Some(lo)
                    };
                    self.space(false);
                    if self.peek() != Some(b'}') {
                        return self.fail("expected '}' after a repetition count");
                    }
                    self.pos += 1;
                    if hi.is_some_and(|h| h < lo) {
                        return self.fail("a repetition {m,n} with n < m");
                    }
                    if lo == 0 {
                        ends = Ends::Always;
                    }
                    atom = match (atom, hi) {
                        (_, Some(0)) | (None, _) => None,
                        (Some(a), Some(h)) => Some(format!("{a}{{{lo},{h}}}")),
                        (Some(a), None) => Some(format!("{a}{{{lo},}}")),
                    };
                    self.space(nested);
                }
                _ => {}
            }
            items.extend(atom);
            all.push(ends);
        }
        if items.is_empty() {
            // An empty alternative: the empty string.
            out.push_str("\"\"");
        } else {
            out.push_str(&items.join(" "));
        }
        Ok(Ends::All(all))
    }
}

/// The Lark text of GBNF grammar `src` (its `root` the start), or what is wrong with it.
pub fn gbnf_to_lark(src: &str) -> Result<String, String> {
    let mut p = Parser { src: src.as_bytes(), text: src, pos: 0, depth: 0, used: Vec::new() };
    let mut defined: Vec<String> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    let mut rule_ends: Vec<Ends> = Vec::new();
    let mut out = String::new();
    p.space(true);
    while p.peek().is_some() {
        let name = p.name()?;
        p.space(false);
        if !p.text[p.pos..].starts_with("::=") {
            return p.fail(&format!("expected '::=' after '{name}'"));
        }
        p.pos += 3;
        p.space(true);
        if !seen.insert(name.clone()) {
            return p.fail(&format!("rule '{name}' is defined twice"));
        }
        let _ = write!(out, "{}: ", mangle(&name));
        rule_ends.push(p.alternates(false, &mut out)?);
        out.push('\n');
        match p.peek() {
            None | Some(b'\n' | b'\r') => {}
            Some(_) => return p.fail("expected the end of the line"),
        }
        defined.push(name);
        p.space(true);
    }
    if !seen.contains("root") {
        return Err("the GBNF grammar has no 'root' rule".into());
    }
    if let Some((n, at)) = p.used.iter().find(|(n, _)| !seen.contains(n)) {
        return Err(format!("GBNF line {}: rule '{n}' is used but never defined", p.line(*at)));
    }
    // The rules that can end, to a fixed point; passes alternate direction, so that a chain
    // of rules resolves in a pass or two whichever way it is written.
    let mut ending: HashSet<&str> = HashSet::new();
    for pass in 0.. {
        let before = ending.len();
        let mut order: Vec<usize> = (0..defined.len()).collect();
        if pass % 2 == 1 {
            order.reverse();
        }
        for i in order {
            if !ending.contains(defined[i].as_str()) && rule_ends[i].holds(&ending) {
                ending.insert(defined[i].as_str());
            }
        }
        if ending.len() == before {
            break;
        }
    }
    if !ending.contains("root") {
        return Err(
            "the GBNF grammar admits no string: every way through 'root' needs itself again, without end".into()
        );
    }
    Ok(format!("start: {}\n{out}", mangle("root")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_become_one_lark_line_each() {
        let g = "root ::= \"yes\" | \"no\" # answer\n  | num\nnum ::= [0-9]{1,3} (\n \",\" Num-b )*\nNum-b ::= [^\\x00\\]]+ .?\n";
        let lark = gbnf_to_lark(g).unwrap();
        assert_eq!(
            lark,
            "start: groot\ngroot: \"yes\" | \"no\" | gnum\ngnum: /[\\x{30}-\\x{39}]/{1,3} (\",\" g_num-b)*\ng_num-b: /[^\\x{0}\\x{5D}]/+ /(?s:.)/?\n"
        );
    }

    #[test]
    fn a_long_chain_of_rules_resolves_quickly() {
        // 6,000 rules, each ending only through the next, written root first.
        let mut g = String::from("root ::= r0\n");
        for i in 0..6000 {
            g.push_str(&format!("r{i} ::= r{}\n", i + 1));
        }
        g.push_str("r6000 ::= \"x\"\n");
        // (Each pass of the fixed point walks the rules in turn; passes alternate direction,
        // so this takes two, not 6,000.)
        assert!(gbnf_to_lark(&g).unwrap().contains("gr5999: gr6000"));
        let deep = format!("root ::= {}\"a\"{}", "(".repeat(31), ")".repeat(31));
        assert!(gbnf_to_lark(&deep).unwrap_err().contains("nested deeper than 30"));
        let ok = format!("root ::= {}\"a\"{}", "(".repeat(30), ")".repeat(30));
        gbnf_to_lark(&ok).unwrap();
    }

    #[test]
    fn recursion_with_a_way_out_is_fine() {
        for g in ["root ::= \"a\" root | \"b\"", "root ::= (\"a\" root)?", "root ::= x\nx ::= \"(\" x{0,1} \")\""] {
            gbnf_to_lark(g).unwrap_or_else(|e| panic!("{g:?}: {e}"));
        }
    }

    #[test]
    fn mistakes_are_named_with_their_line() {
        for (g, needle) in [
            ("root ::= x", "rule 'x' is used but never defined"),
            ("start ::= \"a\"", "no 'root' rule"),
            ("root = \"a\"", "expected '::='"),
            ("root ::= \"a\nb\" ::=", "line 2"),
            ("root ::= [z-a]", "runs backwards"),
            ("root ::= \"a\"{3,1}", "n < m"),
            ("root ::= \"\\q\"", "unknown escape"),
            ("root ::= \"a\"\nroot ::= \"b\"", "defined twice"),
            ("root ::= (\"a\"", "expected ')'"),
            ("root ::= []", "empty character class"),
            ("root ::= \"a\" root", "admits no string"),
            ("root ::= x | \"(\" root \")\"\nx ::= \"[\" x", "admits no string"),
        ] {
            let e = gbnf_to_lark(g).unwrap_err();
            assert!(e.contains(needle), "{g:?}: {e}");
        }
    }
}
