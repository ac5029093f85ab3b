//! `duet chat`: an interactive chat in the terminal.
//!
//! Streams replies, keeps the conversation within the context window (dropping the oldest
//! turns with a notice). On a terminal, a line editor ([`editor`]: history kept in the
//! user's data directory, multi-line messages) and slash commands ([`commands`]: `/help`,
//! `/bye`, `/clear`, `/set`, `/save`, `/load`; an unknown one is an error, never sent);
//! Ctrl-C stops the current reply (and leaves when pressed at the prompt). With stdin not a
//! terminal, each input line is one user message and the program ends at end of input.

mod commands;
mod editor;

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use duet_runtime::backend::Backend;
use duet_runtime::engine::{Engine, StopReason};
use duet_runtime::sampler::Sampler;
use duet_runtime::tools::chat::Conversation;

use super::common::{ModelArgs, SamplingArgs, load_engine, with_engine};
use commands::{Command, HELP, Setting};
use editor::{Input, Read};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// System prompt
    #[arg(long)]
    pub system: Option<String>,
    /// Longest reply in tokens
    #[arg(short = 'n', long = "n-predict", default_value_t = 512)]
    pub n_predict: usize,
    /// No loading message or per-reply speed
    #[arg(short, long)]
    pub quiet: bool,
    /// Let special-token text typed in a message (`<|im_start|>`…) become those tokens; by
    /// default it stays text
    #[arg(long)]
    pub special: bool,
}

/// Set while a reply is being generated; Ctrl-C then only stops the reply.
static GENERATING: AtomicBool = AtomicBool::new(false);
static STOP: AtomicBool = AtomicBool::new(false);

/// The bundled default models, best first, with how `duet chat` names them: the trained
/// DIFF reference model (models/README.md).
pub const BUNDLED: [(&str, &str); 1] = [(
    "duet-diff-ref.q8_0.gguf",
    "duet's bundled DIFF reference model (10M parameters, trained on old speeches, Moby-Dick and fortunes; not instruction-tuned)",
)];

/// The bundled model to use and its description (`DUET_DEFAULT_MODEL` overrides).
pub fn bundled_model() -> Option<(PathBuf, &'static str)> {
    if let Some(p) = std::env::var_os("DUET_DEFAULT_MODEL") {
        return Some((PathBuf::from(p), "the model in DUET_DEFAULT_MODEL"));
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models");
    BUNDLED.iter().map(|(f, what)| (dir.join(f), *what)).find(|(p, _)| p.exists())
}

pub fn run(args: Args) -> Result<()> {
    args.model.single()?;
    let path = match args.model.model.first() {
        Some(p) => p.clone(),
        None => {
            let Some((p, what)) = bundled_model() else {
                anyhow::bail!(
                    "no -m given and no bundled model in models/ ({}; regenerate with models/make_models.sh, or pass -m MODEL.gguf)",
                    BUNDLED.map(|b| b.0).join(", ")
                );
            };
            if !p.exists() {
                anyhow::bail!("no -m given and DUET_DEFAULT_MODEL names {}, which does not exist", p.display());
            }
            eprintln!("no -m given: using {what}, {} (see models/README.md)", p.display());
            p
        }
    };
    let mut engine = load_engine(&args.model, &path, args.quiet)?;
    with_engine!(engine, e => chat(e, &args))
}

fn chat<B: Backend>(engine: &mut Engine<B>, args: &Args) -> Result<()> {
    let path = args.model.model.first().cloned().or_else(|| bundled_model().map(|b| b.0)).unwrap_or_default();
    let mut sampler = Sampler::new(args.sampling.config(&super::common::sampling_hints(&path, args.quiet)));
    let mut conv = Conversation::new(args.system.clone());
    conv.allow_special = args.special;
    conv.check_system_fits(engine, args.n_predict)?;
    let interactive = std::io::stdin().is_terminal();

    // A failure to install the handler only means Ctrl-C keeps its default meaning. (At the
    // line editor's prompt the terminal is raw: Ctrl-C reaches the editor, not this.)
    let _ = ctrlc::set_handler(|| {
        if GENERATING.load(Ordering::SeqCst) {
            STOP.store(true, Ordering::SeqCst);
        } else {
            // A /save being written leaves no temporary file.
            duet_quant::output::remove_pending_before_exit();
            eprintln!();
            std::process::exit(130);
        }
    });
    if interactive && !args.quiet {
        eprintln!("type a message; /help lists the commands, /bye quits, Ctrl-C stops a reply");
    }
    let mut input = Input::new(interactive)?;
    loop {
        let text = match input.read()? {
            Read::Message(t) => t,
            Read::Eof => break,
            Read::Interrupted => {
                eprintln!("(leaving)");
                break;
            }
        };
        // Piped input is one message a line, commands included (as before).
        let msg = match commands::parse(&text) {
            Command::Message(m) if m.is_empty() => continue,
            Command::Message(m) => m,
            Command::Help => {
                println!("{HELP}");
                continue;
            }
            Command::Bye => break,
            Command::Clear => {
                conv.reset();
                engine.reset();
                eprintln!("(conversation reset)");
                continue;
            }
            Command::Show => {
                let c = &sampler.cfg;
                println!(
                    "temp {} | top-p {} | top-k {} | seed {} | system {}",
                    c.temperature,
                    c.top_p,
                    c.top_k,
                    c.seed,
                    conv.system.as_deref().map_or("(none)".to_string(), |s| format!("{s:?}"))
                );
                continue;
            }
            Command::Set(s) => {
                apply(&mut sampler, &mut conv, s);
                continue;
            }
            Command::Save(f) => {
                match save(&conv, Path::new(&f)) {
                    Ok(()) => eprintln!("(saved {} turns to {f})", conv.turns.len()),
                    Err(e) => eprintln!("error: {e:#}"),
                }
                continue;
            }
            Command::Load(f) => {
                match load(Path::new(&f)) {
                    Ok(mut loaded) => {
                        loaded.allow_special = conv.allow_special;
                        conv = loaded;
                        engine.reset();
                        eprintln!("(loaded {} turns from {f})", conv.turns.len());
                    }
                    Err(e) => eprintln!("error: {e:#}"),
                }
                continue;
            }
            Command::Invalid(why) => {
                eprintln!("error: {why}");
                continue;
            }
        };
        STOP.store(false, Ordering::SeqCst);
        GENERATING.store(true, Ordering::SeqCst);
        let result = conv.turn(engine, &msg, args.n_predict, &mut sampler, &mut |text| {
            print!("{text}");
            let _ = std::io::stdout().flush();
            !STOP.load(Ordering::SeqCst)
        });
        GENERATING.store(false, Ordering::SeqCst);
        println!();
        match result {
            Ok(reply) => {
                if reply.dropped_turns > 0 {
                    eprintln!(
                        "(dropped the {} oldest turn(s) to fit the {}-token context)",
                        reply.dropped_turns,
                        engine.n_ctx()
                    );
                }
                if reply.stats.stop == StopReason::Interrupted {
                    eprintln!("(stopped)");
                }
                if !args.quiet {
                    eprintln!(
                        "[{} tokens, {:.1} tok/s; prompt {} tokens, {:.1} tok/s]",
                        reply.stats.generated,
                        reply.stats.gen_tok_per_s(),
                        reply.stats.prompt_tokens - reply.stats.reused_tokens,
                        reply.stats.prompt_tok_per_s()
                    );
                }
            }
            Err(duet_runtime::RuntimeError::ContextFull { n_ctx, needed }) => {
                eprintln!(
                    "(that message needs {needed} tokens with room for a reply, but the context holds {n_ctx}; try a shorter one or a larger -c)"
                );
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// `/set`: the sampler's settings or the system prompt, from the next message on.
fn apply(sampler: &mut Sampler, conv: &mut Conversation, s: Setting) {
    let mut cfg = sampler.cfg.clone();
    match s {
        Setting::Temperature(t) => cfg.temperature = t,
        Setting::TopP(p) => cfg.top_p = p,
        Setting::TopK(k) => cfg.top_k = k,
        Setting::Seed(n) => cfg.seed = n,
        Setting::System(text) => {
            conv.system = (!text.is_empty()).then_some(text);
            eprintln!("(system prompt {})", if conv.system.is_some() { "set" } else { "removed" });
            return;
        }
    }
    // A new sampler: a new seed restarts the random stream.
    *sampler = Sampler::new(cfg);
    eprintln!("(set)");
}

/// The largest conversation `/load` reads.
const MAX_CONVERSATION_BYTES: u64 = 64 << 20;

/// `/save`: the conversation as JSON, written whole (duet_quant::output's temporary file,
/// removed on error and on a signal) and never over an existing file.
fn save(conv: &Conversation, path: &Path) -> Result<()> {
    use std::io::Write;
    if path.exists() {
        anyhow::bail!("{} exists; /save writes a new file (pick another name or remove it)", path.display());
    }
    let text = serde_json::to_string_pretty(&conv.to_json())? + "\n";
    let mut f = duet_quant::output::AtomicFile::create(path)?;
    f.file().write_all(text.as_bytes()).with_context(|| format!("writing {}", f.temp_path().display()))?;
    f.commit_new().with_context(|| format!("writing {}", path.display()))
}

/// `/load`: a conversation `/save` wrote.
fn load(path: &Path) -> Result<Conversation> {
    let text = duet_quant::input::read_text(path, MAX_CONVERSATION_BYTES)
        .with_context(|| format!("reading {}", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
    Conversation::from_json(&v).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}
