//! `duet convert`: HF checkpoint directory (or GGUF) → GGUF.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use duet_convert::{CalibrateOptions, Conversion, Options, Override, Preset, Progress};
use duet_quant::GgmlType;
use indicatif::{ProgressBar, ProgressStyle};

use super::info::human_bytes;

#[derive(clap::Args)]
pub struct Args {
    /// A Hugging Face model directory (config.json, *.safetensors, tokenizer files) or an
    /// existing .gguf to re-quantize
    pub input: PathBuf,
    /// Output GGUF path [default: <input name>-<type>.gguf beside the input]
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Output type: f32, f16, bf16, q8_0, q6_k, q5_k_m, q4_k_m, q4_k_s, q4_0 (the _m/_s
    /// presets mix types per tensor exactly as llama-quantize does)
    #[arg(long = "type", visible_alias = "outtype", default_value = "q8_0", value_parser = parse_preset)]
    pub preset: Preset,
    /// Override the type of tensors whose GGUF name matches REGEX, e.g.
    /// --tensor-type 'attn_v\.weight=q8_0' (may be repeated; the first match wins)
    #[arg(long = "tensor-type", value_name = "REGEX=TYPE", value_parser = Override::parse)]
    pub tensor_types: Vec<Override>,
    /// Importance matrix from llama.cpp's llama-imatrix (GGUF or legacy .dat): weights the
    /// K-quant and Q4/Q5 searches by each input column's mean squared activation
    #[arg(long, value_name = "FILE")]
    pub imatrix: Option<PathBuf>,
    /// Keep DEX matrices as separate tensors for duet's runtime instead of folding them
    /// into attn_output (the folded file is a plain Llama GGUF that llama.cpp can run)
    #[arg(long)]
    pub keep_dex: bool,
    /// Run the model over this text first (on the CPU): record per-layer/per-head activation
    /// statistics (absmax and 99.9th percentile of Q, K, V, attention logits and hidden
    /// states) and every linear layer's importance matrix, quantize K-quants with that matrix,
    /// store the statistics in the output, and print the outlier table
    #[arg(long, value_name = "TEXT", conflicts_with = "imatrix")]
    pub calibrate: Option<PathBuf>,
    /// Tokens per calibration chunk (each starts from an empty cache)
    #[arg(long, default_value_t = 512)]
    pub calibrate_ctx: usize,
    /// Calibrate on at most this many tokens of the text (0: all)
    #[arg(long, default_value_t = 0)]
    pub calibrate_tokens: usize,
    /// Print the plan (each tensor's type and size, and the file size) without writing
    #[arg(long)]
    pub dry_run: bool,
    /// Quantization threads (0: all cores; at most 1024)
    #[arg(short = 't', long, default_value_t = 0, value_parser = threads_not_type)]
    pub threads: usize,
    /// general.name to record [default: from config.json or the source GGUF]
    #[arg(long)]
    pub name: Option<String>,
    /// No progress bar
    #[arg(short, long)]
    pub quiet: bool,
}

/// `-t` is the thread count, as in every duet command; a type name there (what `-t` meant in
/// `convert` before) gets told where it goes.
fn threads_not_type(s: &str) -> Result<usize, String> {
    if Preset::parse(s).is_some() {
        return Err(format!(
            "-t is the number of threads (as in every duet command); give the output type as --type {s}"
        ));
    }
    super::common::parse_threads(s)
}

fn parse_preset(s: &str) -> Result<Preset, String> {
    Preset::parse(s).ok_or_else(|| {
        let names: Vec<&str> = Preset::ALL.iter().map(|p| p.name()).collect();
        format!("unknown type '{s}' (choose one of {})", names.join(", "))
    })
}

fn default_output(input: &std::path::Path, preset: Preset) -> PathBuf {
    let stem = input
        .file_stem()
        .or_else(|| input.file_name())
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    let dir = if input.is_dir() {
        input.parent().unwrap_or(input)
    } else {
        input.parent().unwrap_or(std::path::Path::new("."))
    };
    dir.join(format!("{stem}-{}.gguf", preset.name()))
}

pub fn run(args: Args) -> Result<()> {
    // Before anything is written (calibration's temporary model included).
    super::common::remove_temp_files_on_signal();
    let opts = Options {
        input: args.input.clone(),
        preset: args.preset,
        overrides: args.tensor_types.clone(),
        imatrix: args.imatrix.clone(),
        keep_dex: args.keep_dex,
        threads: args.threads,
        name: args.name.clone(),
    };
    let conv = match &args.calibrate {
        None => Conversion::prepare(&opts)?,
        Some(text) => {
            let cal = CalibrateOptions {
                text: text.clone(),
                ctx: args.calibrate_ctx,
                max_tokens: args.calibrate_tokens,
                threads: args.threads,
            };
            let bar = Bar::new(args.quiet);
            let (conv, report) = Conversion::prepare_calibrated(&opts, &cal, &bar)?;
            bar.bar.finish_and_clear();
            if !args.quiet {
                eprintln!("calibrated on {} tokens of {}; largest activations:", report.tokens, text.display());
                eprintln!("{}", report.outlier_table());
            }
            conv
        }
    };
    let output = args.output.clone().unwrap_or_else(|| default_output(&args.input, args.preset));
    if args.dry_run {
        print_plan(&conv)?;
        return Ok(());
    }
    if output.is_dir() {
        bail!("{} is a directory; give -o a file path", output.display());
    }
    let start = Instant::now();
    let progress = Bar::new(args.quiet);
    conv.write(&output, args.threads, &progress).with_context(|| format!("converting {}", args.input.display()))?;
    progress.bar.finish_and_clear();
    let size = std::fs::metadata(&output).map(|m| m.len()).unwrap_or(0);
    let secs = start.elapsed().as_secs_f64();
    if !args.quiet {
        eprintln!(
            "wrote {} ({}, {} {}, {} tensors) in {secs:.1} s",
            output.display(),
            human_bytes(size),
            conv.arch,
            args.preset.name(),
            conv.tensors().len()
        );
    }
    Ok(())
}

fn print_plan(conv: &Conversion) -> Result<()> {
    let name_w = conv.tensors().iter().map(|t| t.name.len()).max().unwrap_or(4);
    println!("{:<name_w$}  {:<6} {:<20} {:>12}", "tensor", "type", "shape", "bytes");
    let mut by_type: std::collections::BTreeMap<GgmlType, (usize, u64)> = Default::default();
    for t in conv.tensors() {
        println!(
            "{:<name_w$}  {:<6} {:<20} {:>12}",
            t.name,
            t.ty.name(),
            format!("{:?}", t.dims),
            human_bytes(t.n_bytes)
        );
        let e = by_type.entry(t.ty).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    for (ty, (n, bytes)) in by_type {
        println!("{:<7} {n:>4} tensors {:>12}", ty.name(), human_bytes(bytes));
    }
    for w in &conv.warnings {
        println!("warning: {w}");
    }
    let size = conv.file_size()?;
    println!("file size: {} ({size} bytes), {} tensors", human_bytes(size), conv.tensors().len());
    Ok(())
}

/// A progress bar over tensor bytes: current tensor, bytes done, rate and ETA.
struct Bar {
    bar: ProgressBar,
}

impl Bar {
    fn new(quiet: bool) -> Bar {
        let bar = if quiet { ProgressBar::hidden() } else { ProgressBar::new(0) };
        bar.set_style(
            ProgressStyle::with_template(
                "{wide_msg} {bytes:>10}/{total_bytes:<10} {binary_bytes_per_sec:>12} ETA {eta:>4} [{bar:30}]",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        Bar { bar }
    }
}

impl Progress for Bar {
    fn begin(&self, total_bytes: u64, _n: usize) {
        self.bar.set_length(total_bytes);
    }
    fn tensor(&self, name: &str, ty: GgmlType, _bytes: u64) {
        self.bar.set_message(format!("{name} → {ty}"));
    }
    fn advance(&self, bytes: u64) {
        self.bar.inc(bytes);
    }
    fn warn(&self, msg: &str) {
        self.bar.suspend(|| eprintln!("warning: {msg}"));
    }
}
