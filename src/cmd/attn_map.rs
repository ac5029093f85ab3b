//! `duet attn-map`: heatmaps of the attention of selected layers and heads over a prompt.
//! The maps live in duet_runtime::tools::insight::attn_map; this parses flags and writes the files.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use duet_runtime::backend::Backend;
use duet_runtime::engine::Engine;
use duet_runtime::tools::insight::attn_map::{MapSet, attention_maps};

use super::common::{ModelArgs, file_name, load_engine, require_model, with_engine, write_atomic};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt whose attention to show
    #[arg(short = 'p', long)]
    pub prompt: Option<String>,
    /// Read the prompt from a file
    #[arg(short = 'f', long, conflicts_with = "prompt")]
    pub file: Option<PathBuf>,
    /// Layers to show, comma-separated, counting from 0 [default: all]
    #[arg(long, value_delimiter = ',')]
    pub layers: Option<Vec<usize>>,
    /// Heads to show, comma-separated, counting from 0; for DIFF models these are head
    /// pairs (pair j: query heads j and j + H/2), each shown as A1, A2 and A1 − λ·A2; for
    /// DIFF V2, pairs j of query heads 2j and 2j + 1, shown as A₂ⱼ, A₂ⱼ₊₁ and A₂ⱼ − λₜ·A₂ⱼ₊₁
    /// (a gate λₜ per query row) [default: all]
    #[arg(long, value_delimiter = ',')]
    pub heads: Option<Vec<usize>>,
    /// Output directory (created if missing): layerNN-headH.svg/.png (DIFF: -pairP),
    /// layerNN.npy (heads × maps × tokens × tokens, f32) and maps.json, their index
    #[arg(short = 'o', long = "output", default_value = "attn-map")]
    pub output: PathBuf,
    /// Also write report.html: every figure in one self-contained page
    #[arg(long)]
    pub html: bool,
    /// Do not add the BOS token even if the model asks for it
    #[arg(long)]
    pub no_bos: bool,
    /// No loading messages on stderr
    #[arg(short, long)]
    pub quiet: bool,
}

/// Maps past this many bytes in all are refused before any is computed.
const MAX_MAP_BYTES: u64 = 2 << 30;

pub fn run(args: Args) -> Result<()> {
    super::common::remove_temp_files_on_signal();
    let prompt = match (&args.prompt, &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => duet_quant::input::read_text(f, duet_quant::input::MAX_TEXT_BYTES)
            .with_context(|| format!("reading {}", f.display()))?,
        (None, None) => bail!("no prompt: pass -p TEXT or -f FILE"),
    };
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    let path = require_model(&args.model)?;
    let mut engine = load_engine(&args.model, &path, args.quiet)?;
    let set = with_engine!(engine, e => maps(e, &args, &path, &prompt))?;
    write_files(&set, &args.output, args.html)
}

fn maps<B: Backend>(engine: &mut Engine<B>, args: &Args, path: &Path, prompt: &str) -> Result<MapSet> {
    let tokens = engine.tokenizer.encode(prompt, engine.tokenizer.add_bos && !args.no_bos)?;
    let name = file_name(path);
    Ok(attention_maps(engine, &name, &tokens, args.layers.as_deref(), args.heads.as_deref(), MAX_MAP_BYTES)?)
}

fn write_files(set: &MapSet, dir: &Path, with_html: bool) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let files = set.files(with_html);
    for (name, bytes) in &files {
        write_atomic(&dir.join(name), bytes)?;
    }
    println!(
        "{} tokens, {} maps of {} ({} figures as SVG and PNG, raw maps in .npy indexed by maps.json{}) in {}",
        set.tokens.len(),
        set.heads.iter().map(|h| h.maps.len()).sum::<usize>(),
        set.model,
        set.heads.len(),
        if with_html { ", report.html" } else { "" },
        dir.display()
    );
    Ok(())
}
