//! Flags shared by the commands that run a model, and model loading.

use duet_runtime::model::Arch;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use duet_runtime::RuntimeError;
use duet_runtime::backend::Backend;
use duet_runtime::cpu::{ActPrecision, CpuBackend};
use duet_runtime::engine::{Engine, EngineOptions};
use duet_runtime::gpu::{AdapterChoice, GpuBackend, GpuOptions, GpuTune};
use duet_runtime::kv_cache::CacheFormat;
use duet_runtime::model::LogitGranularity;
use duet_runtime::sampler::{SamplerConfig, SamplingHints};

#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// GGUF model file (llama, diffllama or diffllama_v2); `duet bench` compares several
    /// (repeat -m, or separate them with commas)
    #[arg(short = 'm', long = "model", value_delimiter = ',')]
    pub model: Vec<PathBuf>,
    /// CPU threads (0: all cores; at most 1024); `duet bench` takes a comma-separated list
    #[arg(short = 't', long, default_value = "0", value_delimiter = ',', value_parser = parse_threads)]
    pub threads: Vec<usize>,
    /// Context length in tokens (0: the model's training context, at most 4096)
    #[arg(short = 'c', long = "ctx-size", default_value_t = 0)]
    pub ctx_size: usize,
    /// Prompt tokens evaluated per batch
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    pub batch_size: usize,
    /// K cache type: f32, f16; q8c/q6c/q4c/q3c/q2c (each channel quantized over groups of
    /// 32 positions, the newest in f16: the most accurate for K); q8r/q6r/q4r/q3r/q2r (each
    /// head Hadamard-rotated, blocks of 64 along the row: the most accurate for V); q8/q6/q4
    /// (plain absmax blocks of 32). For 4 bits use `--ctk q4c --ctv q4r` (0.29 of f16's
    /// bytes at 4,096 positions); the 3- and 2-bit pairs cost more perplexity (README's K/V
    /// cache section)
    #[arg(long = "cache-type-k", visible_alias = "ctk", default_value = "f16", value_parser = parse_cache_type)]
    pub cache_type_k: CacheFormat,
    /// V cache type, the same choices as for K (the q*r types are the most accurate for V)
    #[arg(long = "cache-type-v", visible_alias = "ctv", default_value = "f16", value_parser = parse_cache_type)]
    pub cache_type_v: CacheFormat,
    /// CPU activation precision for the integer matmuls: q8x2 quantizes each activation to
    /// Q8 and then its rounding error on a grid 128 times finer (about 16-bit accurate; twice the multiply
    /// work in prompt processing, decode nearly unchanged); q8 is ggml's single Q8, exactly
    /// llama.cpp's arithmetic; auto is q8x2 where it costs nothing (batches of up to 4 tokens:
    /// decoding) and q8 for larger batches (prompts): ggml's prompt speed, but the prompt's K/V carry ggml's
    /// error into every later token (see the README's CPU arithmetic section)
    #[arg(long = "cpu-acts", value_enum, default_value_t = CpuActs::Q8x2)]
    pub cpu_acts: CpuActs,
    /// Quantize the attention logits (each DIFF softmax branch's) before the softmax, as the
    /// DIFF paper's §3.7: BITS (2 to 16) with an absmax from GRANULARITY — row (each query
    /// row, the default), head (per head over the rows of a batch), tensor (over a batch's
    /// whole logit tensor) or static (per head, from `duet convert --calibrate` statistics)
    #[arg(long = "attn-logits", value_name = "BITS[:GRANULARITY]", value_parser = parse_attn_logits)]
    pub attn_logits: Option<(u32, LogitGranularity)>,
    /// Where to run: auto (a hardware GPU if there is one, else the CPU), gpu (any Vulkan,
    /// Metal or DX12 adapter, software ones such as lavapipe included) or cpu
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    pub device: Device,
    /// llama.cpp's -ngl: 0 runs on the CPU, any other number on the GPU (duet runs every
    /// layer on one device: --device cpu or gpu say the same)
    #[arg(long = "n-gpu-layers", visible_alias = "ngl", value_name = "N")]
    pub n_gpu_layers: Option<u32>,
    #[arg(long = "gpu-tune", value_name = "KEY=VALUE,...", value_parser = parse_gpu_tune, help = GpuTune::HELP)]
    pub gpu_tune: Option<GpuTune>,
    /// Time every GPU kernel (set by `duet bench --gpu-profile`; not a flag of its own).
    #[arg(skip)]
    pub gpu_profile: bool,
    /// GPU dispatches per submission (set by `duet bench --gpu-submit-every`).
    #[arg(skip)]
    pub gpu_submit_every: Option<usize>,
}

impl ModelArgs {
    /// Makes `device` say what `--n-gpu-layers` asked for (an error where the two disagree).
    pub fn settle_device(&mut self) -> Result<()> {
        let wanted = match self.n_gpu_layers {
            None => return Ok(()),
            Some(0) => Device::Cpu,
            Some(_) => Device::Gpu,
        };
        match (self.device, wanted) {
            (Device::Auto, w) => self.device = w,
            (d, w) if d == w => {}
            (d, _) => anyhow::bail!(
                "--n-gpu-layers {} and --device {} disagree: -ngl 0 means the CPU, any other number the GPU",
                self.n_gpu_layers.unwrap_or(0),
                if d == Device::Cpu { "cpu" } else { "gpu" }
            ),
        }
        Ok(())
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuActs {
    Q8x2,
    Q8,
    Auto,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Auto,
    Gpu,
    Cpu,
}

/// A loaded model on whichever backend was chosen. [`with_engine!`] runs one generic body
/// on either, so no command logic is duplicated per backend. (One is created per command:
/// the size difference of the variants does not matter.)
#[allow(clippy::large_enum_variant)]
pub enum AnyEngine {
    Cpu(Engine<CpuBackend>),
    Gpu(Engine<GpuBackend>),
}

/// `with_engine!(any, e => body)`: `body` with `e` bound to the `&mut Engine<B>` inside.
macro_rules! with_engine {
    ($any:expr, $e:ident => $body:expr) => {
        match $any {
            $crate::cmd::common::AnyEngine::Cpu(ref mut $e) => $body,
            $crate::cmd::common::AnyEngine::Gpu(ref mut $e) => $body,
        }
    };
}
pub(crate) use with_engine;

fn parse_attn_logits(s: &str) -> Result<(u32, LogitGranularity), String> {
    let (bits, gran) = s.split_once(':').unwrap_or((s, "row"));
    let bits: u32 = bits.parse().map_err(|_| format!("'{bits}' is not a bit count (e.g. --attn-logits 4:row)"))?;
    if !(2..=16).contains(&bits) {
        return Err(format!("attention-logit bits must be 2 to 16, got {bits}"));
    }
    let gran = LogitGranularity::parse(gran)
        .ok_or_else(|| format!("unknown granularity '{gran}' (row, head, tensor or static)"))?;
    Ok((bits, gran))
}

/// Most threads a command starts: far more than any machine's cores, and few enough that
/// spawning them cannot fail on a sane system (`-t 100000` once panicked there).
pub const MAX_THREADS: usize = 1024;

/// A thread count: 0 (all cores) to [`MAX_THREADS`].
pub fn parse_threads(s: &str) -> Result<usize, String> {
    let n: usize = s.trim().parse().map_err(|_| format!("'{s}' is not a thread count"))?;
    if n > MAX_THREADS {
        return Err(format!("{n} threads is more than the {MAX_THREADS} duet starts at most (0: all cores)"));
    }
    Ok(n)
}

fn parse_gpu_tune(s: &str) -> Result<GpuTune, String> {
    GpuTune::parse(s)
}

fn parse_cache_type(s: &str) -> Result<CacheFormat, String> {
    CacheFormat::parse(s).ok_or_else(|| format!("unknown cache type '{s}' ({})", CacheFormat::NAMES))
}

/// A float flag in `lo..=hi` (`lo` excluded when `open_lo`), else an error naming the range.
fn ranged(s: &str, lo: f32, open_lo: bool, hi: f32) -> Result<f32, String> {
    let v: f32 = s.trim().parse().map_err(|_| format!("'{s}' is not a number"))?;
    let above = if open_lo { v > lo } else { v >= lo };
    if !(above && v <= hi) {
        let (l, h) = (if open_lo { "(" } else { "[" }, if hi.is_finite() { format!("{hi}]") } else { "∞)".into() });
        return Err(format!("{s} is out of range: the valid range is {l}{lo}, {h}"));
    }
    Ok(v)
}

#[derive(clap::Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Temperature, 0 or more (0: greedy) [default: the model's general.sampling.temp, else
    /// 0.8]
    #[arg(long = "temp", value_parser = |s: &str| ranged(s, 0.0, false, f32::MAX))]
    pub temperature: Option<f32>,
    /// Keep only the k most likely tokens (0: off) [default: the model's, else 40]
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability reaches p, in (0, 1] (1: off)
    /// [default: the model's, else 0.95]
    #[arg(long, value_parser = |s: &str| ranged(s, 0.0, true, 1.0))]
    pub top_p: Option<f32>,
    /// Drop tokens less likely than min-p × the most likely one, in [0, 1] (0: off)
    /// [default: the model's, else 0.05]
    #[arg(long, value_parser = |s: &str| ranged(s, 0.0, false, 1.0))]
    pub min_p: Option<f32>,
    /// Penalise tokens seen in the last --repeat-last-n tokens, more than 0 (1: off; below
    /// 1 favours them) [default: the model's general.sampling.penalty_repeat, else 1]
    #[arg(long, value_parser = |s: &str| ranged(s, 0.0, true, f32::MAX))]
    pub repeat_penalty: Option<f32>,
    /// How many recent tokens the repetition, frequency and presence penalties look at
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Subtract this × a token's count in the last --repeat-last-n tokens from its logit,
    /// in [-2, 2] (0: off)
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true, value_parser = |s: &str| ranged(s, -2.0, false, 2.0))]
    pub frequency_penalty: f32,
    /// Subtract this from the logit of every token in the last --repeat-last-n tokens, in
    /// [-2, 2] (0: off)
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true, value_parser = |s: &str| ranged(s, -2.0, false, 2.0))]
    pub presence_penalty: f32,
    /// Random seed (same seed, same output) [default: random]
    #[arg(short = 's', long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    /// The sampling of a run: each flag given, else the model's recommendation (`hints`,
    /// from its general.sampling.* keys), else llama.cpp's default.
    pub fn config(&self, hints: &SamplingHints) -> SamplerConfig {
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
        });
        // The flags given are hints too, laid over the model's.
        let flags = SamplingHints {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
        };
        SamplerConfig {
            repeat_last_n: self.repeat_last_n,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            seed,
            ..flags.apply(hints.apply(SamplerConfig::default()))
        }
    }
}

/// The model's recommended sampling (general.sampling.*); a file whose keys cannot be read
/// or are out of range gets a warning and none.
pub fn sampling_hints(path: &Path, quiet: bool) -> SamplingHints {
    let hints = duet_quant::gguf::GgufFile::open(path)
        .map_err(duet_runtime::RuntimeError::from)
        .and_then(|f| SamplingHints::from_gguf(&f));
    match hints {
        Ok(h) => {
            if h != SamplingHints::default() && !quiet {
                eprintln!("sampling defaults from the model (general.sampling.*): {}", describe_hints(&h));
            }
            h
        }
        Err(e) => {
            eprintln!("warning: {e}; the model's sampling recommendations are ignored");
            SamplingHints::default()
        }
    }
}

fn describe_hints(h: &SamplingHints) -> String {
    let mut parts = Vec::new();
    if let Some(t) = h.temperature {
        parts.push(format!("temp {t}"));
    }
    if let Some(k) = h.top_k {
        parts.push(format!("top-k {k}"));
    }
    if let Some(p) = h.top_p {
        parts.push(format!("top-p {p}"));
    }
    if let Some(p) = h.min_p {
        parts.push(format!("min-p {p}"));
    }
    if let Some(r) = h.repeat_penalty {
        parts.push(format!("repeat-penalty {r}"));
    }
    parts.join(", ")
}

/// Loads the model on the device `args.device` asks for, printing what was loaded (and on
/// what) to stderr. `auto` takes a hardware GPU if one is usable, else the CPU, and a model
/// the GPU cannot hold (out of memory, an unsupported type or shape) falls back to the CPU
/// with a notice; `gpu` means the GPU or an error.
pub fn load_engine(args: &ModelArgs, path: &Path, quiet: bool) -> Result<AnyEngine> {
    args.single()?;
    if !path.exists() {
        anyhow::bail!("{}: no such model file", path.display());
    }
    let opts = EngineOptions {
        n_ctx: args.ctx_size,
        batch: args.batch_size.max(1),
        k_type: args.cache_type_k,
        v_type: args.cache_type_v,
        attn_logits: args.attn_logits,
    };
    if args.gpu_tune.is_some() && args.device == Device::Cpu {
        anyhow::bail!("--gpu-tune chooses GPU kernels: use it with --device gpu or auto");
    }
    let t0 = Instant::now();
    let adapter = match args.device {
        Device::Cpu => None,
        Device::Auto => Some(AdapterChoice::Hardware),
        Device::Gpu => Some(AdapterChoice::Any),
    };
    if let Some(adapter) = adapter {
        match GpuBackend::new(&GpuOptions {
            adapter,
            profile: args.gpu_profile,
            submit_every: args.gpu_submit_every,
            tune: args.gpu_tune.unwrap_or_default(),
            f16: super::environment::settings().gpu_f16,
            ..Default::default()
        }) {
            Ok(gpu) => {
                let info = gpu.adapter_info();
                if !quiet {
                    eprintln!(
                        "GPU adapter: {} (backend {:?}, type {:?}){}",
                        info.name,
                        info.backend,
                        info.device_type,
                        if info.device_type == duet_runtime::gpu::DeviceType::Cpu {
                            " — a software adapter: expect it to be slower than --device cpu"
                        } else {
                            ""
                        }
                    );
                }
                match Engine::load(gpu, path, &opts) {
                    Ok(engine) => {
                        report_attn_logits(args, quiet);
                        let engine = AnyEngine::Gpu(engine);
                        report(&engine, path, t0, quiet);
                        return Ok(engine);
                    }
                    Err(e @ (RuntimeError::Device(_) | RuntimeError::Unsupported(_)))
                        if args.device == Device::Auto =>
                    {
                        eprintln!("warning: the GPU cannot run this model ({e}); falling back to the CPU");
                    }
                    Err(e) => {
                        let on = if args.device == Device::Gpu { " on the GPU (--device gpu)" } else { "" };
                        return Err(anyhow::Error::new(e).context(format!("loading {}{on}", path.display())));
                    }
                }
            }
            Err(e) if args.device == Device::Gpu => {
                return Err(anyhow::Error::new(e).context("--device gpu"));
            }
            Err(e) => {
                if !quiet {
                    eprintln!("no hardware GPU to use ({e}); running on the CPU");
                }
            }
        }
    }
    let mut backend = CpuBackend::new(args.threads());
    backend.set_kv_jitter(super::environment::settings().kv_jitter);
    backend.set_act_precision(match args.cpu_acts {
        CpuActs::Auto => ActPrecision::Auto,
        CpuActs::Q8x2 => ActPrecision::Q8x2,
        CpuActs::Q8 => ActPrecision::Q8,
    });
    let engine = Engine::load(backend, path, &opts).with_context(|| format!("loading {}", path.display()))?;
    report_attn_logits(args, quiet);
    let engine = AnyEngine::Cpu(engine);
    report(&engine, path, t0, quiet);
    Ok(engine)
}

/// Says on stderr (unless `quiet`) how --attn-logits quantizes, which Engine::load applied.
fn report_attn_logits(args: &ModelArgs, quiet: bool) {
    if let (Some((bits, gran)), false) = (args.attn_logits, quiet) {
        let source = match gran {
            LogitGranularity::Static => "static per-head absmax from calibration".to_string(),
            g => format!("absmax per {}", g.name()),
        };
        eprintln!("attention logits quantized to {bits} bits, {source}");
    }
}

fn report(engine: &AnyEngine, path: &Path, t0: Instant, quiet: bool) {
    let notes = match engine {
        AnyEngine::Cpu(e) => &e.notes,
        AnyEngine::Gpu(e) => &e.notes,
    };
    for n in notes {
        eprintln!("warning: {n}");
    }
    if quiet {
        return;
    }
    let (c, n_ctx, source, device) = match engine {
        AnyEngine::Cpu(e) => (&e.model.config, e.n_ctx(), &e.tokenizer.source, e.backend.describe()),
        AnyEngine::Gpu(e) => (&e.model.config, e.n_ctx(), &e.tokenizer.source, e.backend.describe()),
    };
    // DIFF models pair their query heads (V1: i and i + H/2, V2: 2i and 2i + 1).
    let pairs = match c.arch {
        Arch::Llama => String::new(),
        Arch::DiffLlama | Arch::DiffLlamaV2 => format!(" in {} pairs", c.n_heads / 2),
    };
    eprintln!(
        "loaded {} ({}, {} layers, {} query heads{pairs} / {} KV heads, vocab {}) in {:.2} s on {device}; context {} tokens, tokenizer from {}",
        path.display(),
        c.arch.name(),
        c.n_layers,
        c.n_heads,
        c.n_kv_heads,
        c.n_vocab,
        t0.elapsed().as_secs_f64(),
        n_ctx,
        source
    );
}

/// The model a command should use: -m, or (for chat) the bundled default.
pub fn require_model(args: &ModelArgs) -> Result<PathBuf> {
    args.single()?;
    args.model.first().cloned().ok_or_else(|| anyhow::anyhow!("no model given: pass -m MODEL.gguf"))
}

impl ModelArgs {
    /// CPU threads (the first of -t's list; `duet bench` runs each).
    pub fn threads(&self) -> usize {
        self.threads.first().copied().unwrap_or(0)
    }

    /// Refuses several -m or -t values outside `duet bench`, which is the one command that
    /// runs each of them.
    pub fn single(&self) -> Result<()> {
        if self.model.len() > 1 {
            anyhow::bail!("this command takes one model; -m names {} (duet bench compares several)", self.model.len());
        }
        if self.threads.len() > 1 {
            anyhow::bail!(
                "this command takes one thread count; -t lists {} (duet bench runs each)",
                self.threads.len()
            );
        }
        Ok(())
    }
}

/// Whether `host` (a --host value) is a loopback address.
pub fn is_loopback(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h.eq_ignore_ascii_case("localhost") || h.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The Host header's name, lower case, without a port (`[::1]:8080` → `[::1]`).
pub fn host_name(value: &str) -> String {
    let v = value.trim().to_ascii_lowercase();
    if v.starts_with('[') {
        return v.split_once(']').map_or(v.clone(), |(a, _)| format!("{a}]"));
    }
    v.rsplit_once(':').filter(|(_, p)| p.chars().all(|c| c.is_ascii_digit())).map_or(v.clone(), |(h, _)| h.to_string())
}

/// The file name of `p` (the whole path when it has none), as tables and reports name models.
pub fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(|| p.display().to_string(), |f| f.to_string_lossy().into_owned())
}

/// On SIGINT, SIGTERM or SIGHUP, removes the temporary files of the outputs being written
/// (duet_quant::output: a conversion's half-written GGUF, calibration's temporary model, a
/// report or saved logits) and exits with 130, so that an interrupted command leaves
/// nothing behind. Commands that write files call it first.
pub fn remove_temp_files_on_signal() {
    // Failing to install the handler (one is installed already) only means the signal keeps
    // its default meaning.
    let _ = ctrlc::set_handler(|| {
        duet_quant::output::remove_pending_before_exit();
        eprintln!("\ninterrupted: the files being written were removed");
        std::process::exit(130);
    });
}

/// Writes `path` through duet_quant::output (a temporary file beside it under a random name,
/// renamed into place when complete), so a failed write leaves neither a partial file nor a
/// changed old one, and a device, FIFO, directory or link is never replaced.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<()> {
    duet_quant::output::write_file(path, contents).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_beat_the_models_hints_which_beat_llama_cpps_defaults() {
        let hints =
            SamplingHints { temperature: Some(0.3), top_k: Some(7), min_p: Some(0.0), ..SamplingHints::default() };
        let args = SamplingArgs {
            temperature: None,
            top_k: Some(3),
            top_p: None,
            min_p: None,
            repeat_penalty: None,
            repeat_last_n: 64,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: Some(1),
        };
        let c = args.config(&hints);
        let d = SamplerConfig::default();
        assert_eq!(
            (c.temperature, c.top_k, c.top_p, c.min_p, c.repeat_penalty),
            (0.3, 3, d.top_p, 0.0, d.repeat_penalty)
        );
        let plain = args.config(&SamplingHints::default());
        assert_eq!((plain.temperature, plain.min_p), (d.temperature, d.min_p));
    }
}
