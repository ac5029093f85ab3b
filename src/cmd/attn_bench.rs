//! `duet attn-bench`: accuracy of low-bit attention (logits, K, V) for one or more models
//! over a text. The measurement lives in duet_runtime::tools::attn_bench; this parses flags,
//! shows progress and writes the files.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use duet_runtime::model::LogitGranularity;
use duet_runtime::tools::attn_bench::{BenchOptions, BenchReport, CacheScheme, Target, bench_model, output};
use indicatif::{ProgressBar, ProgressStyle};

use super::common::{file_name, write_atomic};

#[derive(clap::Args)]
pub struct Args {
    /// A GGUF model to measure; repeat for several (e.g. a DIFF model and its Transformer twin)
    #[arg(short = 'm', long = "model", required = true)]
    pub models: Vec<PathBuf>,
    /// Text to evaluate (its first --windows × --tokens tokens)
    #[arg(short = 'f', long)]
    pub file: PathBuf,
    /// Tokens per window, the context each window runs in: one batch from an empty cache,
    /// cut from the text as `duet perplexity` cuts its chunks (keep it within the model's
    /// training context)
    #[arg(short = 'c', long = "ctx-size", visible_alias = "tokens", default_value_t = 512)]
    pub tokens: usize,
    /// Windows to evaluate and pool (fewer if the text runs out); every metric is taken
    /// over all their positions
    #[arg(short = 'w', long, default_value_t = 1)]
    pub windows: usize,
    /// Quantized bit widths (16, the baseline, always runs); comma-separated
    #[arg(long, value_delimiter = ',', default_value = "8,6,4")]
    pub bits: Vec<u32>,
    /// What to quantize: logits (before each softmax, both DIFF branches), k, v, kv (the
    /// caches); comma-separated
    #[arg(long, value_delimiter = ',', default_value = "logits,k,v,kv", value_parser = parse_target)]
    pub targets: Vec<Target>,
    /// Absmax granularity of logit quantization: tensor (a layer's whole logit tensor), head,
    /// row (each query row), static (per head, from the file's --calibrate statistics; skipped
    /// for files without them); comma-separated
    #[arg(long, value_delimiter = ',', default_value = "tensor,head,row,static", value_parser = parse_granularity)]
    pub granularity: Vec<LogitGranularity>,
    /// K/V cache formats of the k, v and kv runs, side by side: block32 (q8/q6/q4, absmax
    /// blocks of 32 along each row) and chan-rot (K per channel over groups of 32 positions,
    /// q8c … q2c; V Hadamard-rotated in blocks of 64, q8r … q2r; the only scheme at 3 and 2
    /// bits); comma-separated
    #[arg(long, value_delimiter = ',', default_value = "block32,chan-rot", value_parser = parse_scheme)]
    pub cache_formats: Vec<CacheScheme>,
    /// Write PREFIX.json, PREFIX.csv and PREFIX.svg
    #[arg(short = 'o', long = "output", default_value = "attn-bench")]
    pub output: PathBuf,
    /// Also write PREFIX.html: the tables and the plot in one self-contained page
    #[arg(long)]
    pub html: bool,
    /// A small run (at most 2 windows of 64 tokens, 8 and 4 bits, tensor/row/static logits)
    /// for CI and smoke tests
    #[arg(long)]
    pub quick: bool,
    /// CPU threads (0: all cores). attn-bench runs on the CPU backend, which implements
    /// every setting
    #[arg(short = 't', long, default_value_t = 0, value_parser = super::common::parse_threads)]
    pub threads: usize,
    /// No progress bar
    #[arg(short, long)]
    pub quiet: bool,
}

fn parse_target(s: &str) -> Result<Target, String> {
    Target::parse(s).ok_or_else(|| format!("unknown target '{s}' (logits, k, v or kv)"))
}

fn parse_scheme(s: &str) -> Result<CacheScheme, String> {
    CacheScheme::parse(s).ok_or_else(|| format!("unknown cache format '{s}' (block32 or chan-rot)"))
}

fn parse_granularity(s: &str) -> Result<LogitGranularity, String> {
    LogitGranularity::parse(s).ok_or_else(|| format!("unknown granularity '{s}' (tensor, head, row or static)"))
}

pub fn run(args: Args) -> Result<()> {
    super::common::remove_temp_files_on_signal();
    let mut opts = BenchOptions {
        n_tokens: args.tokens,
        windows: args.windows,
        bits: args.bits.clone(),
        targets: args.targets.clone(),
        granularities: args.granularity.clone(),
        cache_schemes: args.cache_formats.clone(),
        threads: args.threads,
    };
    if args.quick {
        opts.n_tokens = opts.n_tokens.min(64);
        opts.windows = opts.windows.min(2);
        opts.bits = vec![8, 4];
        opts.granularities = vec![LogitGranularity::Tensor, LogitGranularity::Row, LogitGranularity::Static];
    }
    if let Some(b) = opts.bits.iter().find(|&&b| !(2..=16).contains(&b)) {
        bail!("--bits {b}: bit widths run from 2 to 16");
    }
    if opts.n_tokens < 2 {
        bail!("--tokens must be at least 2");
    }
    if opts.windows == 0 {
        bail!("--windows must be at least 1");
    }
    let text = duet_quant::input::read_text(&args.file, duet_quant::input::MAX_TEXT_BYTES)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let bar = if args.quiet { ProgressBar::hidden() } else { ProgressBar::new(0) };
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {wide_msg} ETA {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let mut report = BenchReport { text: args.file.display().to_string(), n_tokens: 0, models: Vec::new() };
    for path in &args.models {
        bar.set_prefix(file_name(path));
        bar.set_position(0);
        let mut progress = |done: usize, total: usize, label: &str| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
            bar.set_message(label.to_string());
        };
        let m = bench_model(path, &text, &opts, &mut progress)
            .with_context(|| format!("benchmarking {}", path.display()))?;
        report.models.push(m);
    }
    bar.finish_and_clear();
    // Models with different tokenizers see different counts: the first model's is reported
    // at the top, each model's in its own table.
    report.n_tokens = report.models.first().map_or(0, |m| m.n_tokens);
    print!("{}", output::to_table(&report));
    let json = output::to_json_string(&report);
    let mut written = vec![
        write(&args.output, "json", &json)?,
        write(&args.output, "csv", &output::to_csv(&report))?,
        write(&args.output, "svg", &output::to_svg(&report))?,
    ];
    if args.html {
        let page = duet_runtime::tools::insight::html::render(&output::to_html_report(&report));
        written.push(write(&args.output, "html", &page)?);
    }
    println!("\nwrote {}", written.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "));
    Ok(())
}

/// Writes PREFIX.EXT (through a temporary file, so a failed write leaves no partial file).
fn write(prefix: &Path, ext: &str, contents: &str) -> Result<PathBuf> {
    let mut name = prefix.as_os_str().to_owned();
    name.push(format!(".{ext}"));
    let path = PathBuf::from(name);
    write_atomic(&path, contents.as_bytes())?;
    Ok(path)
}
