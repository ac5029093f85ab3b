//! Flags shared by the commands that run a model, and model loading.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use duet_runtime::cpu::CpuBackend;
use duet_runtime::engine::{Engine, EngineOptions};
use duet_runtime::kv_cache::CacheType;
use duet_runtime::sampler::SamplerConfig;

#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// GGUF model file (llama or diffllama)
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// CPU threads (0: all cores)
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    /// Context length in tokens (0: the model's training context, at most 4096)
    #[arg(short = 'c', long = "ctx-size", default_value_t = 0)]
    pub ctx_size: usize,
    /// Prompt tokens evaluated per batch
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    pub batch_size: usize,
    /// K cache element type: f32 or f16
    #[arg(long = "cache-type-k", default_value = "f16", value_parser = parse_cache_type)]
    pub cache_type_k: CacheType,
    /// V cache element type: f32 or f16
    #[arg(long = "cache-type-v", default_value = "f16", value_parser = parse_cache_type)]
    pub cache_type_v: CacheType,
}

fn parse_cache_type(s: &str) -> Result<CacheType, String> {
    CacheType::parse(s).ok_or_else(|| format!("unknown cache type '{s}' (f32 or f16)"))
}

#[derive(clap::Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Temperature (0: greedy)
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temperature: f32,
    /// Keep only the k most likely tokens (0: off)
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches p (1: off)
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than min-p × the most likely one (0: off)
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalise tokens seen in the last --repeat-last-n tokens (1: off)
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// How many recent tokens the repetition penalty looks at
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Random seed (same seed, same output) [default: random]
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    pub fn config(&self) -> SamplerConfig {
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
        });
        SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            seed,
        }
    }
}

/// Loads the model, printing what was loaded (and on what) to stderr.
pub fn load_engine(args: &ModelArgs, path: &Path, quiet: bool) -> Result<Engine<CpuBackend>> {
    if !path.exists() {
        anyhow::bail!("{}: no such model file", path.display());
    }
    let t0 = Instant::now();
    let backend = CpuBackend::new(args.threads);
    let device = duet_runtime::backend::Backend::describe(&backend);
    let opts = EngineOptions {
        n_ctx: args.ctx_size,
        batch: args.batch_size.max(1),
        k_type: args.cache_type_k,
        v_type: args.cache_type_v,
    };
    let engine = Engine::load(backend, path, &opts).with_context(|| format!("loading {}", path.display()))?;
    if !quiet {
        let c = &engine.model.config;
        eprintln!(
            "loaded {} ({:?}, {} layers, {} heads / {} KV heads, vocab {}) in {:.2} s on {device}; context {} tokens, tokenizer from {}",
            path.display(),
            c.arch,
            c.n_layers,
            c.n_heads,
            c.n_kv_heads,
            c.n_vocab,
            t0.elapsed().as_secs_f64(),
            engine.n_ctx(),
            engine.tokenizer.source
        );
    }
    Ok(engine)
}

/// The model a command should use: -m, or (for chat) the bundled default.
pub fn require_model(args: &ModelArgs) -> Result<PathBuf> {
    args.model.clone().ok_or_else(|| anyhow::anyhow!("no model given: pass -m MODEL.gguf"))
}
