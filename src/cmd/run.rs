//! `duet run`: complete a prompt, streaming the text.

use std::io::Write;

use anyhow::{Context, Result, bail};
use duet_runtime::backend::Backend;
use duet_runtime::engine::Engine;
use duet_runtime::sampler::Sampler;

use super::common::{ModelArgs, SamplingArgs, load_engine, require_model, with_engine};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// The prompt text
    #[arg(short = 'p', long)]
    pub prompt: Option<String>,
    /// Read the prompt from a file
    #[arg(short = 'f', long, conflicts_with = "prompt")]
    pub file: Option<std::path::PathBuf>,
    /// Tokens to generate at most
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    pub n_predict: usize,
    /// Do not add the BOS token even if the model asks for it
    #[arg(long)]
    pub no_bos: bool,
    /// Do not print the prompt before the completion
    #[arg(long)]
    pub no_echo: bool,
    /// Print the prompt's tokens (id and text) before generating
    #[arg(long)]
    pub verbose_prompt: bool,
    /// No loading or timing messages on stderr
    #[arg(short, long)]
    pub quiet: bool,
}

pub fn run(args: Args) -> Result<()> {
    let prompt = match (&args.prompt, &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => duet_quant::input::read_text(f, duet_quant::input::MAX_TEXT_BYTES)
            .with_context(|| format!("reading the prompt file {}", f.display()))?,
        (None, None) => bail!("no prompt: pass -p TEXT or -f FILE"),
    };
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    let path = require_model(&args.model)?;
    let mut engine = load_engine(&args.model, &path, args.quiet)?;
    with_engine!(engine, e => complete(e, &args, &prompt))
}

fn complete<B: Backend>(engine: &mut Engine<B>, args: &Args, prompt: &str) -> Result<()> {
    let tokens = engine.tokenizer.encode(prompt, engine.tokenizer.add_bos && !args.no_bos)?;
    if tokens.len() >= engine.n_ctx() {
        bail!(
            "the prompt is {} tokens but the context holds {} (raise -c/--ctx-size, up to the model's {})",
            tokens.len(),
            engine.n_ctx(),
            engine.model.config.n_ctx_train
        );
    }
    if args.verbose_prompt {
        eprintln!("prompt: {} tokens", tokens.len());
        for &t in &tokens {
            eprintln!("{t:>8} -> {:?}", engine.tokenizer.id_to_token(t).unwrap_or_default());
        }
    }
    let budget = args.n_predict.min(engine.n_ctx() - tokens.len());
    let mut sampler = Sampler::new(args.sampling.config());
    let mut out = std::io::stdout().lock();
    if !args.no_echo {
        write!(out, "{prompt}")?;
        out.flush()?;
    }
    let (_, stats) = engine.generate(&tokens, budget, &mut sampler, &mut |text| {
        let _ = write!(out, "{text}");
        let _ = out.flush();
        true
    })?;
    writeln!(out)?;
    if !args.quiet {
        eprintln!(
            "prompt: {} tokens, {:.1} tok/s | generation: {} tokens, {:.1} tok/s ({:?})",
            stats.prompt_tokens,
            stats.prompt_tok_per_s(),
            stats.generated,
            stats.gen_tok_per_s(),
            stats.stop
        );
    }
    Ok(())
}
