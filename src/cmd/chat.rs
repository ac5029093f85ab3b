//! `duet chat`: an interactive chat in the terminal.
//!
//! Streams replies, keeps the conversation within the context window (dropping the oldest
//! turns with a notice), `/reset` and `/exit` commands, Ctrl-C stops the current reply (and
//! exits when pressed at the prompt). With stdin not a terminal, each input line is one
//! user message and the program ends at end of input.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Result;
use duet_runtime::backend::Backend;
use duet_runtime::tools::chat::Conversation;
use duet_runtime::engine::{Engine, StopReason};
use duet_runtime::sampler::Sampler;

use super::common::{ModelArgs, SamplingArgs, load_engine, with_engine};

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
    let path = match &args.model.model {
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
    let mut sampler = Sampler::new(args.sampling.config());
    let mut conv = Conversation::new(args.system.clone());
    conv.allow_special = args.special;
    conv.check_system_fits(engine, args.n_predict)?;
    let interactive = std::io::stdin().is_terminal();

    // A failure to install the handler only means Ctrl-C keeps its default meaning.
    let _ = ctrlc::set_handler(|| {
        if GENERATING.load(Ordering::SeqCst) {
            STOP.store(true, Ordering::SeqCst);
        } else {
            eprintln!();
            std::process::exit(130);
        }
    });
    if interactive && !args.quiet {
        eprintln!("type a message; /reset forgets the conversation, /exit quits, Ctrl-C stops a reply");
    }
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let mut out = std::io::stdout();
    let mut raw = Vec::new();
    loop {
        if interactive {
            print!("> ");
            out.flush()?;
        }
        raw.clear();
        if input.read_until(b'\n', &mut raw)? == 0 {
            break;
        }
        // Bytes that are not UTF-8 (a terminal in another encoding, a pasted binary) become
        // U+FFFD: the message still goes through and the conversation goes on.
        let line = String::from_utf8_lossy(&raw);
        if let std::borrow::Cow::Owned(_) = line {
            eprintln!("warning: that line was not valid UTF-8; the bytes that were not became U+FFFD (\u{fffd})");
        }
        let msg = line.trim();
        match msg {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                conv.reset();
                engine.reset();
                eprintln!("(conversation reset)");
                continue;
            }
            _ => {}
        }
        STOP.store(false, Ordering::SeqCst);
        GENERATING.store(true, Ordering::SeqCst);
        let result = conv.turn(engine, msg, args.n_predict, &mut sampler, &mut |text| {
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
