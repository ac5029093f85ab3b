//! The environment variables `duet` reads, listed in `duet --help`. The libraries read none:
//! what they set travels from here as options (kernel choices once per process, the K/V
//! jitter and f16 GPU arithmetic with each backend).

use std::sync::OnceLock;

use anyhow::{Context, Result, bail};
use duet_runtime::cpu::{KernelChoice, choose_kernels};

/// `duet --help`'s list.
pub const HELP: &str = "\
Environment:
  DUET_DEFAULT_MODEL=PATH  the model `duet chat` runs without -m
  DUET_FORCE_SCALAR=1      CPU dot products with the scalar reference kernels
  DUET_GEMM=off|NAME       CPU packed matmul kernels: off, a set (avx512vnni, avx2, portable;
                           its tuning variants are timed per weight type at load, same
                           results, `loaded … on` names any picked), or one variant for every
                           type, untimed (avx2/n4c1,1); unset: the fastest set, timed so
  DUET_ATTN_SIMD=avx2      CPU attention in 8 lanes even where AVX-512 is available
  DUET_KV_JITTER=REL       perturb every K/V value the CPU caches by a relative REL (a diagnostic)
  DUET_GPU_F16=0|1         f16 products in the GPU's matrix kernels (default: on hardware GPUs)";

/// What the environment asks of the backends.
#[derive(Debug, Default)]
pub struct Settings {
    pub kv_jitter: f32,
    pub gpu_f16: Option<bool>,
}

static SETTINGS: OnceLock<Settings> = OnceLock::new();

/// Reads the environment once, chooses the CPU kernels, and keeps the rest for
/// [`settings`]. An unusable value is an error naming the variable.
pub fn init() -> Result<()> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let flag = |name: &str| -> Result<Option<bool>> {
        match var(name).as_deref() {
            None => Ok(None),
            Some("0" | "off" | "false") => Ok(Some(false)),
            Some("1" | "on" | "true") => Ok(Some(true)),
            Some(v) => bail!("{name}={v}: expected 0 or 1"),
        }
    };
    let attention_avx2 = match var("DUET_ATTN_SIMD").as_deref() {
        None | Some("auto") => false,
        Some("avx2") => true,
        Some(v) => bail!("DUET_ATTN_SIMD={v}: expected avx2 (or auto)"),
    };
    let choice = KernelChoice {
        scalar_dots: flag("DUET_FORCE_SCALAR")?.unwrap_or(false),
        gemm: var("DUET_GEMM"),
        attention_avx2,
    };
    choose_kernels(&choice).context("the CPU kernels chosen by DUET_FORCE_SCALAR, DUET_GEMM or DUET_ATTN_SIMD")?;
    let kv_jitter = match var("DUET_KV_JITTER") {
        None => 0.0,
        Some(v) => match v.trim().parse::<f32>() {
            Ok(x) if x.is_finite() && (0.0..1.0).contains(&x) => x,
            _ => bail!("DUET_KV_JITTER={v}: expected a relative size in [0, 1), e.g. 1e-6"),
        },
    };
    let _ = SETTINGS.set(Settings { kv_jitter, gpu_f16: flag("DUET_GPU_F16")? });
    Ok(())
}

/// The environment's settings ([`init`]'s; the defaults before it ran).
pub fn settings() -> &'static Settings {
    SETTINGS.get_or_init(Settings::default)
}
