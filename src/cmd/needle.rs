//! `duet needle`: key-information retrieval (the DIFF paper's Table 3) for one or more
//! models. The prompts and the metric live in duet_runtime::tools::insight::needle; this parses
//! flags, shows progress and writes the files.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use duet_runtime::backend::Backend;
use duet_runtime::engine::Engine;
use duet_runtime::kv_cache::CacheFormat;
use duet_runtime::tools::insight::html;
use duet_runtime::tools::insight::needle::{self, NeedleResult, NeedleText};
use duet_runtime::tools::insight::needle_output::{self, ModelNeedle, NeedleReport};
use indicatif::{ProgressBar, ProgressStyle};

use super::common::{CpuActs, Device, ModelArgs, file_name, load_engine, with_engine, write_atomic};

#[derive(clap::Args)]
pub struct Args {
    /// A GGUF model; repeat to compare several (e.g. a DIFF model and its Transformer twin)
    #[arg(short = 'm', long = "model", required = true)]
    pub models: Vec<PathBuf>,
    /// Needle depths, percent of the haystack, comma-separated
    #[arg(long, value_delimiter = ',', default_value = "0,25,50,75,100")]
    pub depths: Vec<f64>,
    /// Prompt length in tokens (haystack, needle, query and answer together); also each
    /// model's context
    #[arg(short = 'c', long = "ctx-size", visible_alias = "ctx", default_value_t = 512)]
    pub ctx: usize,
    /// Haystack text [default: the one shipped with duet, Benjamin Harrison's 1889 State of
    /// the Union address, which the reference models never saw]
    #[arg(short = 'f', long)]
    pub file: Option<PathBuf>,
    /// The sentence hidden in the haystack
    #[arg(long, default_value = needle::DEFAULT_NEEDLE)]
    pub needle: String,
    /// The text after the haystack that asks for the answer (continued by the model)
    #[arg(long, default_value = needle::DEFAULT_QUERY)]
    pub query: String,
    /// The answer the needle gives (with its leading space, as it follows the query)
    #[arg(long, default_value = needle::DEFAULT_ANSWER, allow_hyphen_values = true)]
    pub answer: String,
    /// Output directory (created if missing): needle.json, needle.csv, needle.svg
    #[arg(short = 'o', long = "output", default_value = "needle")]
    pub output: PathBuf,
    /// Also write report.html: the table and the plot in one self-contained page
    #[arg(long)]
    pub html: bool,
    /// CPU threads (0: all cores)
    #[arg(short = 't', long, default_value_t = 0, value_parser = super::common::parse_threads)]
    pub threads: usize,
    /// Where to run: auto, gpu or cpu (as on `duet run`)
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    pub device: Device,
    /// No progress bar or loading messages
    #[arg(short, long)]
    pub quiet: bool,
}

pub fn run(args: Args) -> Result<()> {
    super::common::remove_temp_files_on_signal();
    if let Some(d) = args.depths.iter().find(|d| !(0.0..=100.0).contains(*d)) {
        bail!("--depths {d}: depths are percentages from 0 to 100");
    }
    if args.ctx < 2 {
        bail!("--ctx must be at least 2 tokens");
    }
    if args.answer.trim().is_empty() {
        bail!("--answer must not be empty");
    }
    let (haystack, haystack_name) = match &args.file {
        Some(f) => {
            let text = duet_quant::input::read_text(f, duet_quant::input::MAX_TEXT_BYTES)
                .with_context(|| format!("reading {}", f.display()))?;
            (text, f.display().to_string())
        }
        None => (needle::DEFAULT_HAYSTACK.to_string(), "duet's haystack (State of the Union, 1889)".to_string()),
    };
    let text =
        NeedleText { haystack, needle: args.needle.clone(), query: args.query.clone(), answer: args.answer.clone() };
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new((args.models.len() * args.depths.len()) as u64)
    };
    bar.set_style(
        ProgressStyle::with_template("[{bar:30}] {pos}/{len} {wide_msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let mut report = NeedleReport {
        needle: args.needle.clone(),
        query: args.query.clone(),
        answer: args.answer.clone(),
        haystack: haystack_name,
        models: Vec::new(),
    };
    for path in &args.models {
        let margs = ModelArgs {
            model: vec![path.clone()],
            threads: vec![args.threads],
            ctx_size: args.ctx,
            batch_size: 512,
            cache_type_k: CacheFormat::F16,
            cache_type_v: CacheFormat::F16,
            cpu_acts: CpuActs::Q8x2,
            attn_logits: None,
            device: args.device,
            n_gpu_layers: None,
            gpu_profile: false,
            gpu_submit_every: None,
            gpu_tune: None,
        };
        let mut engine = load_engine(&margs, path, true)?;
        let name = file_name(path);
        let m = with_engine!(engine, e => measure(e, &text, &args.depths, &name, &bar))
            .with_context(|| format!("measuring {}", path.display()))?;
        report.models.push(m);
    }
    bar.finish_and_clear();
    print!("{}", needle_output::to_table(&report));
    let dir = &args.output;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let json = needle_output::to_json_string(&report);
    let mut files = vec![
        ("needle.json", json.into_bytes()),
        ("needle.csv", needle_output::to_csv(&report).into_bytes()),
        ("needle.svg", needle_output::to_svg(&report).into_bytes()),
    ];
    if args.html {
        files.push(("report.html", html::render(&needle_output::report(&report)).into_bytes()));
    }
    for (name, bytes) in &files {
        write_atomic(&dir.join(name), bytes)?;
    }
    println!("\nwrote {} in {}", files.iter().map(|f| f.0).collect::<Vec<_>>().join(", "), dir.display());
    Ok(())
}

fn measure<B: Backend>(
    engine: &mut Engine<B>,
    text: &NeedleText,
    depths: &[f64],
    name: &str,
    bar: &ProgressBar,
) -> Result<ModelNeedle> {
    let mut results: Vec<NeedleResult> = Vec::new();
    for &depth in depths {
        bar.set_message(format!("{name} at {depth}%"));
        let prompt = needle::build_prompt(&engine.tokenizer, text, depth, engine.n_ctx())?;
        results.push(needle::measure(engine, &prompt, &text.answer)?);
        bar.inc(1);
    }
    Ok(ModelNeedle {
        model: name.to_string(),
        arch: engine.model.config.arch.name().to_string(),
        n_ctx: engine.n_ctx(),
        results,
    })
}
