//! `duet info`: what gguf-dump shows, laid out for people.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Result;
use duet_quant::GgmlType;
use duet_quant::gguf::{GgufFile, Value};

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF file to describe
    pub file: PathBuf,
    /// Show at most this many elements of each metadata array
    #[arg(long, default_value_t = 8)]
    pub array_items: usize,
    /// Show at most this many characters of each string (0: no limit)
    #[arg(long, default_value_t = 120)]
    pub string_chars: usize,
    /// Do not list tensors one by one (only the totals per type)
    #[arg(long)]
    pub no_tensors: bool,
}

pub fn run(args: Args) -> Result<()> {
    let file = GgufFile::open(&args.file)?;
    print!("{}", render(&file, &args));
    if let Some(report) = duet_runtime::tools::calibrate::CalibrationReport::from_gguf(&file)? {
        print!("{}", render_calibration(&report));
    }
    Ok(())
}

/// The calibration statistics `duet convert --calibrate` stored: the outlier table and,
/// per layer, the largest absmax and 99.9th percentile over heads.
fn render_calibration(r: &duet_runtime::tools::calibrate::CalibrationReport) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(o, "\ncalibration ({} tokens of {}):", r.tokens, r.source);
    for line in r.outlier_table().lines() {
        let _ = writeln!(o, "  {line}");
    }
    let per_layer =
        |v: &[f32], heads: usize, l: usize| v[l * heads..(l + 1) * heads].iter().fold(0f32, |m, &x| m.max(x));
    let _ = writeln!(
        o,
        "\n  | layer | Q absmax | K absmax | V absmax | logits absmax | logits p99.9 | hidden absmax | hidden p99.9 |"
    );
    let _ = writeln!(o, "  |---|---|---|---|---|---|---|---|");
    for l in 0..r.n_layers {
        let _ = writeln!(
            o,
            "  | {l} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            per_layer(&r.q.0, r.n_heads, l),
            per_layer(&r.k.0, r.n_kv_heads, l),
            per_layer(&r.v.0, r.n_kv_heads, l),
            per_layer(&r.logits.0, r.n_heads, l),
            per_layer(&r.logits.1, r.n_heads, l),
            r.hidden.0[l],
            r.hidden.1[l]
        );
    }
    let _ = writeln!(o, "  importance matrices for {} weights", r.imatrix.len());
    o
}

pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{n} B") } else { format!("{v:.2} {}", UNITS[u]) }
}

fn human_count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.2}M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1}K", n as f64 / 1e3),
        n => n.to_string(),
    }
}

fn render(file: &GgufFile, args: &Args) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let max_chars = if args.string_chars == 0 { usize::MAX } else { args.string_chars };
    let _ = writeln!(
        o,
        "{}: GGUF v{}, {}, {} metadata keys, {} tensors, alignment {}, data at byte {}",
        args.file.display(),
        file.version(),
        human_bytes(file.file_size()),
        file.metadata().len(),
        file.tensors().len(),
        file.alignment(),
        file.data_offset()
    );
    let _ = writeln!(o, "\nmetadata:");
    let key_w = file.metadata().map(|(k, _)| k.len()).max().unwrap_or(0).min(48);
    for (key, value) in file.metadata() {
        let ty = value.type_description();
        let shown = match (key, value) {
            // The whole tokenizer.json is one long string: its length says more.
            (_, Value::String(s)) if s.len() > max_chars => {
                format!("{} ({} chars)", value.summary(args.array_items, max_chars), s.chars().count())
            }
            ("general.file_type", Value::U32(ft)) => format!("{ft} ({})", file_type_name(*ft)),
            _ => value.summary(args.array_items, max_chars).to_string(),
        };
        let _ = writeln!(o, "  {key:<key_w$}  {ty:<14} {shown}");
    }

    let tensors = file.tensors();
    if !args.no_tensors && !tensors.is_empty() {
        let name_w = tensors.iter().map(|t| t.name().len()).max().unwrap_or(4).max(4);
        let _ = writeln!(o, "\ntensors:");
        let _ = writeln!(o, "  {:>4}  {:<name_w$}  {:<7} {:<22} {:>12}", "#", "name", "type", "shape", "bytes");
        for (i, t) in tensors.iter().enumerate() {
            let shape = format!("{:?}", t.dims());
            let _ = writeln!(
                o,
                "  {i:>4}  {:<name_w$}  {:<7} {shape:<22} {:>12}",
                t.name(),
                t.ggml_type().name(),
                human_bytes(t.n_bytes())
            );
        }
    }

    let mut by_type: BTreeMap<GgmlType, (usize, u64, u64)> = BTreeMap::new();
    for t in tensors {
        let e = by_type.entry(t.ggml_type()).or_default();
        e.0 += 1;
        e.1 += t.n_elements();
        e.2 += t.n_bytes();
    }
    let (n_params, n_bytes): (u64, u64) = by_type.values().fold((0, 0), |a, e| (a.0 + e.1, a.1 + e.2));
    let _ = writeln!(o, "\ntotals by type:");
    for (ty, (count, elems, bytes)) in &by_type {
        let bpw = if *elems > 0 { *bytes as f64 * 8.0 / *elems as f64 } else { 0.0 };
        let _ = writeln!(
            o,
            "  {:<7} {count:>4} tensors  {:>9} params  {:>11}  {bpw:5.2} bits/weight",
            ty.name(),
            human_count(*elems),
            human_bytes(*bytes)
        );
    }
    let bpw = if n_params > 0 { n_bytes as f64 * 8.0 / n_params as f64 } else { 0.0 };
    let _ = writeln!(
        o,
        "  total   {:>4} tensors  {:>9} params  {:>11}  {bpw:5.2} bits/weight",
        tensors.len(),
        human_count(n_params),
        human_bytes(n_bytes)
    );
    o
}

/// llama.cpp's names for `general.file_type`.
fn file_type_name(ft: u32) -> &'static str {
    match ft {
        0 => "all F32",
        1 => "mostly F16",
        2 => "mostly Q4_0",
        3 => "mostly Q4_1",
        7 => "mostly Q8_0",
        8 => "mostly Q5_0",
        9 => "mostly Q5_1",
        10 => "mostly Q2_K",
        11 => "mostly Q3_K_S",
        12 => "mostly Q3_K_M",
        13 => "mostly Q3_K_L",
        14 => "mostly Q4_K_S",
        15 => "mostly Q4_K_M",
        16 => "mostly Q5_K_S",
        17 => "mostly Q5_K_M",
        18 => "mostly Q6_K",
        32 => "mostly BF16",
        _ => "other",
    }
}
