//! `duet run`: complete a prompt, streaming the text.

use std::io::Write;

use anyhow::{Context, Result, bail};
use duet_runtime::backend::Backend;
use duet_runtime::engine::Engine;
use duet_runtime::grammar::{GrammarSpec, Grammars};
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
    /// Hold the output to the JSON schema in FILE (structured output; compact JSON)
    #[arg(long, value_name = "FILE", conflicts_with = "grammar")]
    pub json_schema: Option<std::path::PathBuf>,
    /// Hold the output to the grammar in FILE: llama.cpp's GBNF, or llguidance's Lark when
    /// the file ends in .lark or starts with %llguidance
    #[arg(long, value_name = "FILE")]
    pub grammar: Option<std::path::PathBuf>,
    /// No loading or timing messages on stderr
    #[arg(short, long)]
    pub quiet: bool,
}

/// The --json-schema or --grammar file, read and checked for size (compiled once the model,
/// whose tokenizer it needs, is loaded).
fn read_grammar(args: &Args) -> Result<Option<GrammarSpec>> {
    let max = duet_runtime::grammar::MAX_GRAMMAR_BYTES;
    let read = |f: &std::path::Path| {
        duet_quant::input::read_text(f, max as u64).with_context(|| format!("reading {}", f.display()))
    };
    if let Some(f) = &args.json_schema {
        let text = read(f)?;
        let schema: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{}: the JSON schema is not valid JSON", f.display()))?;
        return Ok(Some(GrammarSpec::JsonSchema(schema)));
    }
    if let Some(f) = &args.grammar {
        let lark = f.extension().is_some_and(|e| e.eq_ignore_ascii_case("lark"));
        let spec = GrammarSpec::grammar(read(f)?, lark);
        // GBNF's own mistakes show before the model loads.
        if let GrammarSpec::Gbnf(text) = &spec {
            duet_runtime::grammar::gbnf::gbnf_to_lark(text).map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?;
        }
        return Ok(Some(spec));
    }
    Ok(None)
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
    let grammar = read_grammar(&args)?;
    let path = require_model(&args.model)?;
    let mut engine = load_engine(&args.model, &path, args.quiet)?;
    with_engine!(engine, e => complete(e, &args, &prompt, grammar.as_ref()))
}

fn complete<B: Backend>(
    engine: &mut Engine<B>,
    args: &Args,
    prompt: &str,
    grammar: Option<&GrammarSpec>,
) -> Result<()> {
    let constraint = match grammar {
        Some(g) => {
            let grammars = Grammars::new(std::sync::Arc::new(engine.tokenizer.clone()), engine.model.config.n_vocab);
            let file = args.json_schema.as_ref().or(args.grammar.as_ref()).map(|f| f.display().to_string());
            Some(grammars.compile(g).map_err(|e| anyhow::anyhow!("{}: {e}", file.unwrap_or_default()))?)
        }
        None => None,
    };
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
    let hints = super::common::sampling_hints(&args.model.model[0], args.quiet);
    let mut sampler = Sampler::new(args.sampling.config(&hints)).with_constraint(constraint);
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
        let first = stats.first_token_time.map_or("-".to_string(), |t| format!("{:.0} ms", t.as_secs_f64() * 1e3));
        eprintln!(
            "prompt: {} tokens, {:.1} tok/s | generation: {} tokens, {:.1} tok/s | first token {first}, total {:.2} s | stopped: {}",
            stats.prompt_tokens,
            stats.prompt_tok_per_s(),
            stats.generated,
            stats.gen_tok_per_s(),
            (stats.prompt_time + stats.gen_time).as_secs_f64(),
            stats.stop.describe()
        );
    }
    Ok(())
}
