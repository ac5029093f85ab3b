//! `duet chat` on a pseudo-terminal, as a person types into it: `/help`, an unknown command
//! (an error, not sent), a reply, history recalled with the Up arrow, a multi-line message
//! (`"""` blocks and a trailing `\`), `/set`, `/save` (what was sent, checked in the file),
//! `/load`, `/bye`, the history kept in the user's data directory for the next session, and
//! Ctrl-C clearing a half-typed line.
#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::process::Command;

use rexpect::reader::Options;
use rexpect::session::{PtySession, spawn_with_options};
use serde_json::Value;

fn bundled() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/duet-diff-ref.q8_0.gguf")
}

/// A chat on the bundled model in its own home directory (history under `home/data/duet`).
fn chat(home: &Path) -> PtySession {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_duet"));
    cmd.args(["chat", "-m", bundled().to_str().unwrap(), "--device", "cpu", "-t", "2", "-n", "6", "--temp", "0"])
        .env("HOME", home)
        .env("XDG_DATA_HOME", home.join("data"))
        .env("TERM", "xterm")
        .current_dir(home);
    spawn_with_options(cmd, Options::new().timeout_ms(Some(60_000)).strip_ansi_escape_codes(true)).unwrap()
}

/// Types `keys` (written at once: `send` alone buffers them).
fn keys(p: &mut PtySession, keys: &str) {
    p.send(keys).unwrap();
    p.flush().unwrap();
}

/// Waits for the end of a reply: its speed line.
fn reply(p: &mut PtySession) {
    p.exp_string("tok/s]").unwrap();
}

fn saved(path: &Path) -> Vec<(String, String)> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["role"].as_str().unwrap().to_string(), m["content"].as_str().unwrap().to_string()))
        .collect()
}

#[test]
fn a_terminal_chat_with_history_multi_line_input_and_commands() {
    let home = std::env::temp_dir().join(format!("duet-chat-pty-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home).unwrap();
    let mut p = chat(&home);
    p.exp_string("/help lists the commands").unwrap();

    p.send_line("/help").unwrap();
    p.exp_string("/save FILE").unwrap();
    p.send_line("/frobnicate").unwrap();
    p.exp_string("unknown command /frobnicate (not sent to the model").unwrap();

    p.send_line("Hello there").unwrap();
    reply(&mut p);
    // Up recalls the last message; Enter sends it again.
    keys(&mut p, "\x1b[A");
    p.exp_string("Hello there").unwrap();
    keys(&mut p, "\r");
    reply(&mut p);

    p.send_line("\"\"\"").unwrap();
    p.exp_string("... ").unwrap();
    // (Each line after its prompt: the editor drops what is typed ahead of it.)
    p.send_line("line one").unwrap();
    p.exp_string("... ").unwrap();
    p.send_line("line two").unwrap();
    p.exp_string("... ").unwrap();
    p.send_line("\"\"\"").unwrap();
    reply(&mut p);
    p.send_line("first \\").unwrap();
    p.exp_string("... ").unwrap();
    p.send_line("second").unwrap();
    reply(&mut p);

    p.send_line("/set temp 0.5").unwrap();
    p.exp_string("(set)").unwrap();
    p.send_line("/set").unwrap();
    p.exp_string("temp 0.5").unwrap();
    p.send_line("/save talk.json").unwrap();
    p.exp_string("(saved 4 turns to talk.json)").unwrap();
    p.send_line("/save talk.json").unwrap();
    p.exp_string("exists").unwrap();
    let left: Vec<_> = std::fs::read_dir(&home)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| n.starts_with(".talk.json"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
    let users: Vec<String> =
        saved(&home.join("talk.json")).into_iter().filter(|(r, _)| r == "user").map(|(_, c)| c).collect();
    assert_eq!(users, ["Hello there", "Hello there", "line one\nline two", "first \nsecond"]);

    p.send_line("/clear").unwrap();
    p.exp_string("(conversation reset)").unwrap();
    p.send_line("/load talk.json").unwrap();
    p.exp_string("(loaded 4 turns from talk.json)").unwrap();
    p.send_line("/bye").unwrap();
    p.exp_eof().unwrap();
    let status = p.process_mut().wait().unwrap();
    assert!(matches!(status, rexpect::process::WaitStatus::Exited(_, 0)), "{status:?}");

    // The next session finds the history: Up shows the last message sent.
    let history = std::fs::read_to_string(home.join("data/duet/chat_history.txt")).unwrap();
    assert!(history.contains("Hello there") && history.contains("/bye"), "{history}");
    let mut p = chat(&home);
    p.exp_string("/help lists the commands").unwrap();
    // Ctrl-C on a half-typed line clears it and stays.
    keys(&mut p, "half typed");
    keys(&mut p, "\x03");
    p.exp_string("(Ctrl-C again, /bye or Ctrl-D to leave)").unwrap();
    keys(&mut p, "\x1b[A");
    p.exp_string("/bye").unwrap();
    keys(&mut p, "\r");
    p.exp_eof().unwrap();
    let _ = std::fs::remove_dir_all(&home);
}
