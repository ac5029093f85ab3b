//! `duet perplexity`: perplexity over a text file, like llama-perplexity, plus logit dumps
//! and KL divergence against a saved run (llama-perplexity's --kl-divergence).
//!
//! The text is tokenized (BOS first when the model wants one) and cut into chunks of
//! -c tokens; each chunk is evaluated from an empty cache and every position but the last
//! of a chunk predicts the next token. All predictions count, or with
//! --score-second-half only those of the second half of each chunk, as llama-perplexity
//! counts them (each prediction then has at least half a chunk of context).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Result, bail};
use duet_runtime::backend::Backend;
use duet_runtime::engine::Engine;
use duet_runtime::logits_file::{LogitsFile, argmax, kl_divergence, log_softmax};
use duet_runtime::model::Logits;

use super::common::{ModelArgs, load_engine, require_model, with_engine};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text file to evaluate (not needed with --kl-base, whose tokens are used)
    #[arg(short = 'f', long)]
    pub file: Option<PathBuf>,
    /// Evaluate at most this many tokens (0: all)
    #[arg(long, default_value_t = 0)]
    pub max_tokens: usize,
    /// Write every position's logits to FILE (duet's DLOG format, see README)
    #[arg(long, value_name = "FILE")]
    pub save_logits: Option<PathBuf>,
    /// Compare with logits saved by --save-logits (of any model or backend): evaluates the
    /// same tokens and reports mean KL divergence and top-1 agreement
    #[arg(long, value_name = "FILE")]
    pub kl_base: Option<PathBuf>,
    /// Score only the predictions of the second half of each chunk, as llama-perplexity
    /// does (each then sees at least half a chunk of context); by default every position
    /// but a chunk's last is scored
    #[arg(long)]
    pub score_second_half: bool,
    /// No loading message
    #[arg(short, long)]
    pub quiet: bool,
}

pub fn run(args: Args) -> Result<()> {
    let path = require_model(&args.model)?;
    if let Some(out) = &args.save_logits {
        // Before any work: never the model, the text or the base logits, never a device.
        let inputs: Vec<&std::path::Path> =
            [Some(path.as_path()), args.file.as_deref(), args.kl_base.as_deref()].into_iter().flatten().collect();
        duet_quant::output::check_target(out, &inputs).map_err(|e| anyhow::anyhow!("--save-logits: {e}"))?;
        super::common::remove_temp_files_on_signal();
    }
    let base = args.kl_base.as_ref().map(|p| LogitsFile::read(p)).transpose()?;
    let mut model_args = args.model.clone();
    if model_args.ctx_size == 0 {
        model_args.ctx_size = 512;
    }
    let mut engine = load_engine(&model_args, &path, args.quiet)?;
    with_engine!(engine, e => evaluate(e, &args, base.as_ref()))
}

fn evaluate<B: Backend>(engine: &mut Engine<B>, args: &Args, base: Option<&LogitsFile>) -> Result<()> {
    let mut tokens = match (base, &args.file) {
        (Some(b), None) => b.tokens.clone(),
        (_, Some(f)) => {
            // Only what --max-tokens can use (a token is rarely more than 64 bytes of text),
            // else the whole file up to the text limit.
            let text = if args.max_tokens > 0 {
                duet_quant::input::read_text_prefix(f, (args.max_tokens as u64 + 1) * 64)
            } else {
                duet_quant::input::read_text(f, duet_quant::input::MAX_TEXT_BYTES)
            }
            .map_err(|e| anyhow::anyhow!("{e}"))?;
            engine.tokenizer.encode(&text, engine.tokenizer.add_bos)?
        }
        (None, None) => bail!("nothing to evaluate: pass -f TEXT (or --kl-base FILE)"),
    };
    if let Some(b) = base {
        if b.tokens.len() > tokens.len() || tokens[..b.tokens.len()] != b.tokens[..] {
            bail!(
                "{}: its tokens are not the tokens of this text",
                args.kl_base.as_ref().map(|p| p.display().to_string()).unwrap_or_default()
            );
        }
        tokens.truncate(b.tokens.len());
        if b.n_vocab != engine.model.config.n_vocab {
            bail!("the saved logits have {} vocabulary entries, this model {}", b.n_vocab, engine.model.config.n_vocab);
        }
    }
    if args.max_tokens > 0 {
        tokens.truncate(args.max_tokens);
    }
    if tokens.len() < 2 {
        bail!("need at least 2 tokens to measure perplexity, got {}", tokens.len());
    }
    let n_ctx = engine.n_ctx();
    let n_vocab = engine.model.config.n_vocab;
    let t0 = Instant::now();
    let mut nll_sum = 0f64;
    let mut nll_sq = 0f64;
    let mut count = 0usize;
    let mut saved: Vec<f32> = Vec::new();
    let (mut kl_sum, mut agree, mut compared) = (0f64, 0usize, 0usize);
    let n_chunks = tokens.len().div_ceil(n_ctx);
    for (ci, chunk) in tokens.chunks(n_ctx).enumerate() {
        engine.reset();
        let logits = engine.eval(chunk, Logits::All)?;
        let start = ci * n_ctx;
        let first_scored = if args.score_second_half { chunk.len() / 2 } else { 0 };
        for t in 0..chunk.len() {
            let row = &logits[t * n_vocab..(t + 1) * n_vocab];
            if t >= first_scored && t + 1 < chunk.len() {
                let lp = log_softmax(row);
                let nll = -lp[chunk[t + 1] as usize];
                nll_sum += nll;
                nll_sq += nll * nll;
                count += 1;
            }
            if let Some(b) = base {
                let brow = b.row(start + t);
                kl_sum += kl_divergence(brow, row);
                agree += usize::from(argmax(brow) == argmax(row));
                compared += 1;
            }
        }
        if args.save_logits.is_some() {
            saved.extend_from_slice(&logits);
        }
        if !args.quiet {
            eprint!("[{}/{}] {:.4} ", ci + 1, n_chunks, (nll_sum / count.max(1) as f64).exp());
        }
    }
    if !args.quiet {
        eprintln!();
    }
    let mean = nll_sum / count as f64;
    let var = (nll_sq / count as f64 - mean * mean).max(0.0);
    // Uncertainty of the mean NLL, propagated to the perplexity (llama-perplexity prints the same).
    let ppl = mean.exp();
    let ppl_err = ppl * (var / count as f64).sqrt();
    println!(
        "PPL = {ppl:.4} +/- {ppl_err:.4} over {count} predictions ({} tokens, {} chunks of ≤{n_ctx}), {:.1} tok/s",
        tokens.len(),
        n_chunks,
        tokens.len() as f64 / t0.elapsed().as_secs_f64()
    );
    if let Some(p) = &args.save_logits {
        LogitsFile { tokens: tokens.clone(), n_vocab, logits: saved }.write(p)?;
        println!("saved {} × {n_vocab} logits to {}", tokens.len(), p.display());
    }
    if compared > 0 {
        println!(
            "KL divergence vs {}: mean {:.6} over {compared} positions; top-1 agreement {:.2}%",
            args.kl_base.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
            kl_sum / compared as f64,
            100.0 * agree as f64 / compared as f64
        );
    }
    Ok(())
}
