//! Where `duet chat` reads messages from: a line editor on a terminal (rustyline: editing,
//! history recalled with Up and saved in the user's data directory, multi-line messages), or
//! plain lines from a pipe (one message a line, as before).

use std::io::BufRead;
use std::path::PathBuf;

use anyhow::Result;
use rustyline::error::ReadlineError;
use rustyline::history::DefaultHistory;
use rustyline::{Config, Editor};

use super::commands::{Assembler, Line};

/// One read.
pub enum Read {
    Message(String),
    /// End of input (Ctrl-D, or the pipe closed).
    Eof,
    /// Ctrl-C at an empty prompt.
    Interrupted,
}

pub enum Input {
    Terminal {
        editor: Box<Editor<(), DefaultHistory>>,
        history: Option<PathBuf>,
        warned: bool,
        /// The last read ended with Ctrl-C (a second one in a row leaves).
        interrupted: bool,
    },
    Plain(Box<dyn BufRead>),
}

/// The history file: `$XDG_DATA_HOME/duet/chat_history.txt` (else `~/.local/share/…`;
/// `~/Library/Application Support/duet` on macOS, `%APPDATA%\duet` on Windows).
pub fn history_file() -> Option<PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    let dir = if cfg!(windows) {
        env("APPDATA")?
    } else if cfg!(target_os = "macos") {
        env("HOME")?.join("Library/Application Support")
    } else {
        env("XDG_DATA_HOME").or_else(|| env("HOME").map(|h| h.join(".local/share")))?
    };
    Some(dir.join("duet").join("chat_history.txt"))
}

impl Input {
    /// The line editor on a terminal, else plain lines from stdin.
    pub fn new(terminal: bool) -> Result<Input> {
        if !terminal {
            return Ok(Input::Plain(Box::new(std::io::stdin().lock())));
        }
        let config = Config::builder().max_history_size(1000)?.auto_add_history(false).build();
        let mut editor = Box::new(Editor::<(), DefaultHistory>::with_config(config)?);
        let history = history_file();
        if let Some(h) = &history
            && h.exists()
            && let Err(e) = editor.load_history(h)
        {
            eprintln!("warning: could not read the chat history {}: {e}", h.display());
        }
        Ok(Input::Terminal { editor, history, warned: false, interrupted: false })
    }

    pub fn read(&mut self) -> Result<Read> {
        match self {
            Input::Plain(r) => {
                let mut raw = Vec::new();
                if r.read_until(b'\n', &mut raw)? == 0 {
                    return Ok(Read::Eof);
                }
                // Bytes that are not UTF-8 (a terminal in another encoding, a pasted
                // binary) become U+FFFD: the message still goes through.
                let line = String::from_utf8_lossy(&raw);
                if let std::borrow::Cow::Owned(_) = line {
                    eprintln!(
                        "warning: that line was not valid UTF-8; the bytes that were not became U+FFFD (\u{fffd})"
                    );
                }
                Ok(Read::Message(line.trim_end_matches(['\n', '\r']).to_string()))
            }
            Input::Terminal { editor, history, warned, interrupted } => {
                let mut asm = Assembler::default();
                loop {
                    let prompt = if asm.pending() { "... " } else { "> " };
                    match editor.readline(prompt) {
                        Ok(line) => {
                            *interrupted = false;
                            if let Line::Done(msg) = asm.push(&line) {
                                if !msg.trim().is_empty() {
                                    remember(editor, history.as_ref(), warned, &msg);
                                }
                                return Ok(Read::Message(msg));
                            }
                        }
                        Err(ReadlineError::Interrupted) if asm.pending() => {
                            eprintln!("(message dropped)");
                            asm = Assembler::default();
                        }
                        // Ctrl-C clears the line, as in a shell (the editor cannot say whether
                        // it held text); a second one in a row leaves.
                        Err(ReadlineError::Interrupted) if !*interrupted => {
                            *interrupted = true;
                            eprintln!("(Ctrl-C again, /bye or Ctrl-D to leave)");
                        }
                        Err(ReadlineError::Interrupted) => return Ok(Read::Interrupted),
                        Err(ReadlineError::Eof) => return Ok(Read::Eof),
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
    }
}

/// Adds `msg` to the history and appends it to the history file (a failure is said once).
fn remember(editor: &mut Editor<(), DefaultHistory>, file: Option<&PathBuf>, warned: &mut bool, msg: &str) {
    let _ = editor.add_history_entry(msg);
    let Some(file) = file else { return };
    let saved = file
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .map_err(|e| e.to_string())
        .and_then(|_| editor.append_history(file).map_err(|e| e.to_string()));
    if let Err(e) = saved
        && !std::mem::replace(warned, true)
    {
        eprintln!("warning: could not save the chat history to {}: {e}", file.display());
    }
}
