//! `duet bench`: prompt-processing and decode speed, like llama-bench.
//!
//! ppN evaluates N tokens in one batch from an empty cache; tgN decodes N tokens one at a
//! time from an empty cache. Each test runs once to warm up, then -r times; the table shows
//! the median and the spread (min–max) of tokens per second; decode rows also show the rate
//! at which they stream weights (a decoded token reads every weight but the token-embedding
//! table once), to set beside the machine's memory read bandwidth (`--bandwidth`).

use std::time::Instant;

use anyhow::Result;
use duet_quant::gguf::GgufFile;
use duet_runtime::backend::Backend;
use duet_runtime::engine::Engine;
use duet_runtime::gpu::profile::KernelTime;
use duet_runtime::model::{Batch, Logits};

mod report;

use super::common::{ModelArgs, load_engine, with_engine};
use super::info::human_bytes;
use report::{Output, Report, Row};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt-processing test sizes (comma-separated; 0 skips)
    #[arg(short = 'p', long = "n-prompt", default_value = "128", value_delimiter = ',')]
    pub n_prompt: Vec<usize>,
    /// Decode test sizes (comma-separated; 0 skips)
    #[arg(short = 'n', long = "n-gen", default_value = "32", value_delimiter = ',')]
    pub n_gen: Vec<usize>,
    /// Timed repetitions of each test
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub reps: usize,
    /// Run each test after this many prompt tokens already in the cache (comma-separated)
    #[arg(short = 'd', long = "depth", default_value = "0", value_delimiter = ',')]
    pub depth: Vec<usize>,
    /// Output format: md (a table with aligned columns), csv, json or jsonl
    #[arg(short = 'o', long = "output", value_enum, default_value = "md")]
    pub output: Output,
    /// Decode this many sequences at once, as a server's running streams are: slots of one
    /// K/V cache, their matrix products batched (and, on the GPU with f16/f32 caches, their
    /// attention in one pass); the decode rows report the aggregate tokens/s of all of them
    #[arg(long = "parallel", visible_alias = "np", default_value_t = 1)]
    pub parallel: usize,
    /// Also measure this machine's memory read bandwidth (the -t threads streaming 1 GiB, best
    /// of 5), the ceiling of the decode rows' weight streaming rate
    #[arg(long)]
    pub bandwidth: bool,
    /// Time every GPU kernel (timestamp queries) and print, after the speed table, where each
    /// test's GPU time went: each kernel's calls and microseconds per token, its share and,
    /// for the matrix kernels, the rate at which they read their weights. Each submission is
    /// waited for, so the t/s of a profiled run are lower than without
    #[arg(long)]
    pub gpu_profile: bool,
    /// GPU dispatches recorded before they are submitted without waiting, so that the GPU
    /// starts a token while the rest is recorded (default 25; 0: one submission per
    /// forward pass). For measuring the host's share of a token
    #[arg(long, value_name = "N")]
    pub gpu_submit_every: Option<usize>,
    /// Instead of a model's speed, time the GPU's decode matvec variants (every workgroup
    /// shape, with and without subgroup sums and trusted modules) on a set of matrices and
    /// print which variant suits each weight type here (needs no -m; `--gpu-tune` settles
    /// the choice for a run)
    #[arg(long, value_enum, value_name = "SET")]
    pub gpu_kernels: Option<super::bench_kernels::KernelSet>,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

pub fn run(args: Args) -> Result<()> {
    if args.parallel == 0 {
        anyhow::bail!("--parallel must be at least 1");
    }
    if args.reps == 0 {
        anyhow::bail!("-r/--repetitions must be at least 1 (each test runs once to warm up, then -r times)");
    }
    if let Some(set) = args.gpu_kernels {
        let adapter = match args.model.device {
            super::common::Device::Cpu => {
                anyhow::bail!("--gpu-kernels times GPU kernels: use it with --device gpu or auto")
            }
            super::common::Device::Auto => duet_runtime::gpu::AdapterChoice::Hardware,
            super::common::Device::Gpu => duet_runtime::gpu::AdapterChoice::Any,
        };
        return super::bench_kernels::run(adapter, set);
    }
    if args.model.model.is_empty() {
        anyhow::bail!("no model given: pass -m MODEL.gguf (repeat -m, or separate with commas, to compare several)");
    }
    if let Some(p) = args.model.model.iter().find(|p| !p.exists()) {
        anyhow::bail!("{}: no such model file", p.display());
    }
    let depth_max = args.depth.iter().copied().max().unwrap_or(0);
    let longest = args.n_prompt.iter().chain(&args.n_gen).max().copied().unwrap_or(0) + depth_max;
    let mut report = Report::new(args.output);
    for path in &args.model.model {
        for &threads in &args.model.threads {
            let mut model_args = args.model.clone();
            (model_args.model, model_args.threads) = (vec![path.clone()], vec![threads]);
            if model_args.ctx_size == 0 {
                model_args.ctx_size = longest.max(16);
            }
            model_args.batch_size = model_args.batch_size.max(args.n_prompt.iter().copied().max().unwrap_or(1));
            if args.gpu_profile {
                if model_args.device == super::common::Device::Cpu {
                    anyhow::bail!("--gpu-profile times GPU kernels: use it with --device gpu or auto");
                }
                model_args.gpu_profile = true;
            }
            if let Some(n) = args.gpu_submit_every {
                if model_args.device == super::common::Device::Cpu {
                    anyhow::bail!(
                        "--gpu-submit-every sets how the GPU backend submits: use it with --device gpu or auto"
                    );
                }
                model_args.gpu_submit_every = Some(if n == 0 { usize::MAX } else { n });
            }
            let mut engine = load_engine(&model_args, path, false)?;
            let threads = if threads == 0 { duet_runtime::cpu::default_threads() } else { threads };
            with_engine!(engine, e => bench(e, &args, path, threads, longest, &mut report))?;
        }
    }
    report.finish();
    if args.bandwidth {
        let threads = match args.model.threads() {
            0 => duet_runtime::cpu::default_threads(),
            t => t,
        };
        let pool = duet_runtime::cpu::pool::ThreadPool::new(threads);
        let rate = duet_runtime::cpu::bandwidth::read_bandwidth(&pool, 1 << 30, 5);
        report.note(String::new());
        report.note(format!(
            "memory read bandwidth: {:.1} GB/s ({threads} threads streaming 1 GiB, best of 5)",
            rate / 1e9
        ));
    }
    Ok(())
}

fn bench<B: Backend>(
    engine: &mut Engine<B>,
    args: &Args,
    path: &std::path::Path,
    threads: usize,
    longest: usize,
    report: &mut Report,
) -> Result<()> {
    let file = GgufFile::open(path)?;
    let model_bytes: u64 = file.tensors().iter().map(|t| t.n_bytes()).sum();
    // Bytes a decoded token reads: every tensor but an untied token-embedding table (of which
    // it reads one row; tied, the table is also the output matrix and read whole).
    let tensor_bytes = |name: &str| file.tensor(name).map_or(0, |t| t.n_bytes());
    let untied_embd = if tensor_bytes("output.weight") > 0 { tensor_bytes("token_embd.weight") } else { 0 };
    let decode_bytes = (model_bytes - untied_embd) as f64;
    let params: u64 = file.tensors().iter().map(|t| t.n_elements()).sum();
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let device = duet_runtime::backend::Backend::describe(&engine.backend);
    let n_vocab = engine.model.config.n_vocab as u32;
    // Deterministic pseudo-random tokens (llama-bench uses random tokens too).
    let tokens: Vec<u32> = (0..longest as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 7) % n_vocab).collect();
    // The cache the session holds (a type the model cannot use was replaced, with a warning).
    let kv = engine.session.cache_spec.clone();
    let f16_kv = duet_runtime::kv_cache::KvCacheSpec {
        k_type: duet_runtime::kv_cache::CacheFormat::F16,
        v_type: duet_runtime::kv_cache::CacheFormat::F16,
        ..kv.clone()
    };
    let mut tests: Vec<(usize, bool)> = Vec::new();
    tests.extend(args.n_prompt.iter().filter(|&&n| n > 0).map(|&n| (n, true)));
    tests.extend(args.n_gen.iter().filter(|&&n| n > 0).map(|&n| (n, false)));
    let streams = if args.parallel > 1 { format!(" ×{}", args.parallel) } else { String::new() };
    // What the notes after the table name a test by: with several models or thread counts,
    // the model and the threads too.
    let several = args.model.model.len() > 1 || args.model.threads.len() > 1;
    let whose = if several { format!("{name} ({threads} threads) ") } else { String::new() };
    for &depth in &args.depth {
        for &(n, prompt) in &tests {
            let label = if prompt { format!("pp{n}") } else { format!("tg{n}{streams}") };
            let label = if depth > 0 { format!("{label} @ d{depth}") } else { label };
            let parallel = !prompt && args.parallel > 1;
            let mut profile = KernelTally::default();
            let mut counts = (0, 0);
            let mut rates = if parallel {
                decode_parallel(engine, args, depth, &tokens, n, &mut profile, &mut counts)?
            } else {
                timed_runs(engine, args, depth, &tokens, n, prompt, &mut profile, &mut counts)?
            };
            if counts.0 > 0 {
                // Per forward pass: a prompt's batch, or one decoded token.
                let passes = (args.reps * if prompt { 1 } else { n }) as f64;
                let layers = engine.model.config.n_layers;
                let (d, b) = (counts.0 as f64 / passes, counts.1 as f64 / passes);
                let per = if prompt {
                    "prompt batch".to_string()
                } else if parallel {
                    format!("step of {} streams", args.parallel)
                } else {
                    "decoded token".to_string()
                };
                report.after(format!(
                    "GPU work of {whose}{label}: {d:.0} dispatches per {per} over {layers} layers, {b:.0} of them after a barrier"
                ));
            }
            let (lo, hi) = rates.iter().fold((f64::MAX, 0f64), |(a, b), &r| (a.min(r), b.max(r)));
            let med = median(&mut rates);
            // With --parallel every stream has a cache of this size.
            let copies = if parallel { format!(" ×{}", args.parallel) } else { String::new() };
            report.row(Row {
                model: name.clone(),
                size: model_bytes,
                params,
                backend: device.clone(),
                threads,
                // Bits a value, everything included: f16's 16 times the ratio.
                kv: format!(
                    "{}/{} {} ctx, {}{copies} ({:.3}× f16, {:.2} bits a value)",
                    kv.k_type,
                    kv.v_type,
                    engine.n_ctx(),
                    human_bytes(kv.bytes() as u64),
                    kv.bytes() as f64 / f16_kv.bytes() as f64,
                    16.0 * kv.bytes() as f64 / f16_kv.bytes() as f64
                ),
                test: label.clone(),
                n_prompt: if prompt { n } else { 0 },
                n_gen: if prompt { 0 } else { n },
                depth,
                parallel: if prompt { 1 } else { args.parallel },
                tps: med,
                tps_min: lo,
                tps_max: hi,
                // A step of --parallel streams reads the weights once for all of them.
                weights_gbs: (!prompt).then(|| decode_bytes * med / args.parallel as f64 / 1e9),
            });
            if args.gpu_profile {
                // Per decoded token: with --parallel, each step decodes one for every stream.
                let tokens = args.reps * n * if parallel { args.parallel } else { 1 };
                report.after(profile.render(&format!("{whose}{label}"), tokens));
            }
        }
    }
    Ok(())
}

/// Tokens/s of one sequence: `n` prompt tokens in one batch (`prompt`) or `n` decoded one
/// at a time, after `depth` cached ones: one warm-up, then -r runs.
#[allow(clippy::too_many_arguments)]
fn timed_runs<B: Backend>(
    engine: &mut Engine<B>,
    args: &Args,
    depth: usize,
    tokens: &[u32],
    n: usize,
    prompt: bool,
    profile: &mut KernelTally,
    counts: &mut (usize, usize),
) -> Result<Vec<f64>> {
    let mut rates = Vec::with_capacity(args.reps);
    for rep in 0..=args.reps {
        engine.reset();
        if depth > 0 {
            engine.eval(&tokens[..depth], Logits::Last)?;
        }
        // Kernel times so far (the warm-up, the prompt before a decode at depth) are not the test's.
        engine.backend.take_kernel_times();
        let before = engine.backend.dispatch_counts();
        let t0 = Instant::now();
        if prompt {
            let batch = &tokens[depth..depth + n];
            engine.eval(batch, Logits::Last)?;
        } else {
            for &t in &tokens[depth..depth + n] {
                engine.eval(&[t], Logits::Last)?;
            }
        }
        let dt = t0.elapsed().as_secs_f64();
        if rep > 0 {
            rates.push(n as f64 / dt);
            profile.add(engine.backend.take_kernel_times().unwrap_or_default());
            if let (Some(a), Some(b)) = (before, engine.backend.dispatch_counts()) {
                counts.0 += b.0 - a.0;
                counts.1 += b.1 - a.1;
            }
        }
    }
    Ok(rates)
}

/// Kernel times summed over a test's timed runs (`--gpu-profile`).
#[derive(Default)]
struct KernelTally(Vec<KernelTime>);

impl KernelTally {
    fn add(&mut self, times: Vec<KernelTime>) {
        for t in times {
            match self.0.iter_mut().find(|s| s.kernel == t.kernel) {
                Some(s) => {
                    s.calls += t.calls;
                    s.seconds += t.seconds;
                    s.weight_bytes += t.weight_bytes;
                }
                None => self.0.push(t),
            }
        }
    }

    /// The table of where the GPU time of `label`'s `tokens` tokens (all timed runs) went,
    /// then the host's steps.
    fn render(&mut self, label: &str, tokens: usize) -> String {
        use std::fmt::Write;
        let mut o = String::new();
        let total: f64 = self.0.iter().filter(|t| !t.on_host).map(|t| t.seconds).sum();
        if total <= 0.0 || tokens == 0 {
            return format!("GPU time of {label}: no kernel was timed");
        }
        self.0.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        let per = tokens as f64;
        let _ = writeln!(o, "GPU time of {label}: {:.1} µs per token over all kernels\n", total * 1e6 / per);
        let _ = writeln!(o, "| kernel | calls per token | µs per token | share | weights read, GB/s |");
        let _ = writeln!(o, "|---|---|---|---|---|");
        for t in self.0.iter().filter(|t| !t.on_host) {
            let rate = if t.weight_bytes > 0 && t.seconds > 0.0 {
                format!("{:.1}", t.weight_bytes as f64 / t.seconds / 1e9)
            } else {
                "—".into()
            };
            let _ = writeln!(
                o,
                "| {} | {:.2} | {:.2} | {:.1}% | {rate} |",
                t.kernel,
                t.calls as f64 / per,
                t.seconds * 1e6 / per,
                100.0 * t.seconds / total
            );
        }
        let _ = writeln!(o, "\nHost time of {label} (the wait includes the GPU's time and the timestamps' cost):\n");
        let _ = writeln!(o, "| host step | times per token | µs per token |");
        let _ = write!(o, "|---|---|---|");
        for t in self.0.iter().filter(|t| t.on_host) {
            let _ = write!(o, "\n| {} | {:.2} | {:.2} |", t.kernel, t.calls as f64 / per, t.seconds * 1e6 / per);
        }
        o
    }
}

/// Aggregate decode tokens/s of `args.parallel` sequences decoding `n` tokens each together
/// (one [`Model::decode`](duet_runtime::model::Model::decode) batch a step, as `duet serve` runs its slots), after `depth` prompt tokens each: one warm-up, then -r runs;
/// kernel times and dispatch counts as [`timed_runs`]'.
fn decode_parallel<B: Backend>(
    engine: &mut Engine<B>,
    args: &Args,
    depth: usize,
    tokens: &[u32],
    n: usize,
    profile: &mut KernelTally,
    counts: &mut (usize, usize),
) -> Result<Vec<f64>> {
    let spec = engine.session.cache_spec.clone();
    let (m, b) = (&engine.model, &mut engine.backend);
    // Slots of one cache, as `duet serve` makes them.
    let mut sessions = m.new_sessions(b, args.parallel, engine.session.n_ctx, spec.k_type, spec.v_type)?;
    // Every stream's token in one step, however small -b is.
    let mut own = (args.parallel > engine.context.cap()).then(|| m.new_context(b, args.parallel)).transpose()?;
    let ctx = match own.as_mut() {
        Some(c) => c,
        None => &mut engine.context,
    };
    let mut rates = Vec::with_capacity(args.reps);
    for rep in 0..=args.reps {
        for s in &mut sessions {
            s.reset();
            if depth > 0 {
                m.decode(b, ctx, Batch::one(s, &tokens[..depth], Logits::Last))?;
            }
        }
        b.take_kernel_times();
        let before = b.dispatch_counts();
        let t0 = Instant::now();
        for i in 0..n {
            // Each stream its own token: sequences differ, as a server's do.
            let step: Vec<u32> = (0..args.parallel).map(|j| tokens[(depth + i + j) % tokens.len()]).collect();
            let mut batch = Batch::new();
            for (s, t) in sessions.iter_mut().zip(&step) {
                batch.push(s, std::slice::from_ref(t), Logits::Last);
            }
            m.decode(b, ctx, batch)?;
        }
        let dt = t0.elapsed().as_secs_f64();
        if rep > 0 {
            rates.push((n * args.parallel) as f64 / dt);
            profile.add(b.take_kernel_times().unwrap_or_default());
            if let (Some(x), Some(y)) = (before, b.dispatch_counts()) {
                counts.0 += y.0 - x.0;
                counts.1 += y.1 - x.1;
            }
        }
    }
    Ok(rates)
}
