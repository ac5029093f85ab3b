//! The low-bit attention benchmark behind `duet attn-bench`: how much a model loses when its
//! attention runs in few bits — quantized attention logits (each DIFF branch) or a
//! quantized K and/or V cache — measured against its own 16-bit run over one text.
//!
//! The text is tokenized and cut into windows of `n_tokens` (as `duet perplexity` cuts its
//! chunks: BOS only at the start of the text), each evaluated in one batch from an empty
//! cache. Per model and window, one baseline pass (f16 cache, full-precision logits) records
//! the logits of every position, each layer's attention output (for DIFF also both
//! branches) and feeds the outlier table of the DIFF paper (Table 5); then every setting of
//! bits × target × granularity runs the same tokens and is compared with it. Pooled over
//! the windows: perplexity, mean KL divergence and top-1 agreement of the next-token
//! distributions, and per layer the relative error ‖o − o₁₆‖ / ‖o₁₆‖ of the attention output
//! (DIFF: also of A1·V, A2·V and A1·V − λ·A2·V; DIFF V2: of the pair's two query heads and
//! their combination o_2i − σ(λ)·o_2i+1), norms summed over all windows. Runs on the
//! CPU backend: the per-layer errors come from its activation probes (both backends run
//! every setting).

pub mod output;
pub mod plot;

use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::backend::{AttentionKind, Backend, Probe};
use crate::cpu::CpuBackend;
use crate::engine::{Engine, EngineOptions};
use crate::error::RuntimeError;
use crate::kv_cache::CacheFormat;
use crate::logits_file::{argmax, kl_divergence_log, log_softmax};
use crate::model::{Arch, LogitGranularity, Logits};
use crate::observe::Observer;
use crate::tools::calibrate::Calibrator;

/// What is quantized in a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// The attention logits before each softmax.
    Logits,
    /// The K cache.
    K,
    /// The V cache.
    V,
    /// Both caches.
    KV,
}

impl Target {
    pub const ALL: [Target; 4] = [Target::Logits, Target::K, Target::V, Target::KV];

    pub fn name(self) -> &'static str {
        match self {
            Target::Logits => "logits",
            Target::K => "k",
            Target::V => "v",
            Target::KV => "kv",
        }
    }

    pub fn parse(s: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.name() == s)
    }
}

/// How a cache run stores K and V.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CacheScheme {
    /// q8/q6/q4: absmax blocks of 32 along each row, K and V alike.
    Block32,
    /// q8c … q2c for K (per channel over groups of 32 positions), q8r … q2r for V (each
    /// head Hadamard-rotated, blocks of 64): the recommended pair.
    ChannelRotated,
}

impl CacheScheme {
    pub const ALL: [CacheScheme; 2] = [CacheScheme::Block32, CacheScheme::ChannelRotated];

    /// The option's name.
    pub fn name(self) -> &'static str {
        match self {
            CacheScheme::Block32 => "block32",
            CacheScheme::ChannelRotated => "chan-rot",
        }
    }

    pub fn parse(s: &str) -> Option<CacheScheme> {
        CacheScheme::ALL.into_iter().find(|c| c.name() == s)
    }

    /// The bit widths the scheme's formats come in (those [`CacheScheme::types`] knows).
    pub fn widths(self) -> Vec<u32> {
        (2..=8).rev().filter(|&b| self.types(Target::KV, b).is_some()).collect()
    }

    /// The (K, V) cache types of a run at `bits` that quantizes `target`; `None` for a width
    /// the scheme does not come in.
    pub fn types(self, target: Target, bits: u32) -> Option<(CacheFormat, CacheFormat)> {
        let (k, v) = match (self, bits) {
            (CacheScheme::Block32, 8) => (CacheFormat::Q8, CacheFormat::Q8),
            (CacheScheme::Block32, 6) => (CacheFormat::Q6, CacheFormat::Q6),
            (CacheScheme::Block32, 4) => (CacheFormat::Q4, CacheFormat::Q4),
            (CacheScheme::ChannelRotated, 8) => (CacheFormat::Q8c, CacheFormat::Q8r),
            (CacheScheme::ChannelRotated, 6) => (CacheFormat::Q6c, CacheFormat::Q6r),
            (CacheScheme::ChannelRotated, 4) => (CacheFormat::Q4c, CacheFormat::Q4r),
            (CacheScheme::ChannelRotated, 3) => (CacheFormat::Q3c, CacheFormat::Q3r),
            (CacheScheme::ChannelRotated, 2) => (CacheFormat::Q2c, CacheFormat::Q2r),
            _ => return None,
        };
        Some(match target {
            Target::K => (k, CacheFormat::F16),
            Target::V => (CacheFormat::F16, v),
            Target::KV => (k, v),
            Target::Logits => (CacheFormat::F16, CacheFormat::F16),
        })
    }

    /// What the results call a run of this scheme on `target`: "block32", or the formats'
    /// layouts ("chan32" for K, "rot64" for V, "chan32+rot64" for both).
    pub fn label(self, target: Target) -> &'static str {
        match (self, target) {
            (CacheScheme::Block32, _) => "block32",
            (CacheScheme::ChannelRotated, Target::K) => "chan32",
            (CacheScheme::ChannelRotated, Target::V) => "rot64",
            (CacheScheme::ChannelRotated, _) => "chan32+rot64",
        }
    }
}

#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Tokens per window (one batch each).
    pub n_tokens: usize,
    /// Windows evaluated (fewer when the text runs out).
    pub windows: usize,
    /// Quantized bit widths (16 is the baseline and always run; caches at 8, 6, 4, 3, 2).
    pub bits: Vec<u32>,
    pub targets: Vec<Target>,
    /// Logit granularities; `static` only for files with calibration.
    pub granularities: Vec<LogitGranularity>,
    /// Cache formats of the k, v and kv runs, side by side.
    pub cache_schemes: Vec<CacheScheme>,
    pub threads: usize,
}

/// One setting and what it measured.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// None: the 16-bit baseline.
    pub target: Option<Target>,
    pub bits: u32,
    /// For logit runs.
    pub granularity: Option<LogitGranularity>,
    /// For cache runs.
    pub cache_scheme: Option<CacheScheme>,
    pub ppl: f64,
    pub mean_kl: f64,
    pub top1: f64,
    /// Per layer: ‖o − o₁₆‖ / ‖o₁₆‖ of the attention output.
    pub layer_rel_err: Vec<f64>,
    /// DIFF only, per layer: of A1·V, A2·V and A1·V − λ·A2·V.
    pub branch1_rel_err: Option<Vec<f64>>,
    pub branch2_rel_err: Option<Vec<f64>>,
    pub diff_rel_err: Option<Vec<f64>>,
}

#[derive(Clone, Debug)]
pub struct ModelReport {
    pub path: String,
    pub arch: String,
    pub n_layers: usize,
    /// Tokens evaluated, all windows together.
    pub n_tokens: usize,
    /// Windows they were cut into.
    pub n_windows: usize,
    /// Table 5 of the DIFF paper over this text: [top-1, top-2, top-3, top-10, top-100,
    /// median] of |attention logit| and of |hidden state|.
    pub logits_top: [f32; 6],
    pub hidden_top: [f32; 6],
    pub runs: Vec<RunResult>,
    /// Settings not run, and why.
    pub skipped: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct BenchReport {
    pub text: String,
    pub n_tokens: usize,
    pub models: Vec<ModelReport>,
}

/// One quantization setting: what, at how many bits, and how (logit granularity or cache
/// scheme). The 16-bit baseline has no target.
#[derive(Clone, Copy)]
struct Setting {
    target: Option<Target>,
    bits: u32,
    granularity: Option<LogitGranularity>,
    cache_scheme: Option<CacheScheme>,
}

/// What one pass leaves behind: per layer, the attention output and (DIFF) the branches.
#[derive(Default)]
struct Capture {
    attn_out: Vec<Vec<f32>>,
    branches: Vec<Vec<f32>>,
    calibrator: Option<Calibrator>,
}

impl Observer for Capture {
    /// The attention output and branches; the rest only for the calibrator. A step whose Q,
    /// K or V nobody watches lets the backend rotate them as it stores them — which a K
    /// cache holding keys before RoPE (`q3c`, `q2c`) needs to be measured as it runs.
    fn wants(&self, probe: Probe, _layer: usize) -> bool {
        matches!(probe, Probe::AttnOut | Probe::AttnBranches) || self.calibrator.is_some()
    }

    fn observe(&mut self, probe: Probe, layer: usize, pos0: usize, data: &[f32], rows: usize, cols: usize) {
        let slot = |v: &mut Vec<Vec<f32>>| {
            if v.len() <= layer {
                v.resize(layer + 1, Vec::new());
            }
            v[layer] = data.to_vec();
        };
        match probe {
            Probe::AttnOut => slot(&mut self.attn_out),
            Probe::AttnBranches => slot(&mut self.branches),
            _ => {}
        }
        if let Some(c) = self.calibrator.as_mut() {
            c.observe(probe, layer, pos0, data, rows, cols);
        }
    }
}

struct Pass {
    logits: Vec<f32>,
    capture: Capture,
}

/// `‖a − b‖²` and `‖b‖²`, summed into `acc` so that windows pool into one relative error.
fn add_sq_err(acc: &mut (f64, f64), a: &[f32], b: &[f32]) {
    for (&x, &y) in a.iter().zip(b) {
        acc.0 += (x as f64 - y as f64).powi(2);
        acc.1 += (y as f64).powi(2);
    }
}

/// `‖a − b‖ / ‖b‖` from [`add_sq_err`]'s sums (‖a − b‖ when ‖b‖ is 0).
fn rel_err((num, den): (f64, f64)) -> f64 {
    if den == 0.0 { num.sqrt() } else { (num / den).sqrt() }
}

/// One setting's sums over the windows.
#[derive(Clone)]
struct Pooled {
    nll: f64,
    predicted: usize,
    kl: f64,
    agree: usize,
    positions: usize,
    /// Per layer (‖o − o₁₆‖², ‖o₁₆‖²): the attention output, then DIFF's A1·V, A2·V and
    /// A1·V − λ·A2·V.
    layer: Vec<(f64, f64)>,
    branches: [Vec<(f64, f64)>; 3],
}

impl Pooled {
    fn new(n_layers: usize) -> Pooled {
        let zeros = vec![(0.0, 0.0); n_layers];
        Pooled {
            nll: 0.0,
            predicted: 0,
            kl: 0.0,
            agree: 0,
            positions: 0,
            layer: zeros.clone(),
            branches: [zeros.clone(), zeros.clone(), zeros],
        }
    }
}

/// How a layer's captured branches (Probe::AttnBranches) are laid out and combined.
#[derive(Clone, Copy)]
enum Branches {
    /// DIFF: `[A1·V | A2·V]` per head pair (4·hd), combined as A1·V − λ·A2·V.
    V1 { lambda: f32 },
    /// DIFF V2: `[o_2i | o_2i+1]` per pair (2·hd); the combination is the attention output.
    V2,
}

/// Splits captured branches into (first branch, second branch, their combination);
/// `attn_out` is the layer's attention output (V2's combination).
fn split_branches(b: &[f32], hd: usize, layout: Branches, attn_out: &[f32]) -> [Vec<f32>; 3] {
    let mut out = [Vec::new(), Vec::new(), Vec::new()];
    let width = match layout {
        Branches::V1 { .. } => 4 * hd,
        Branches::V2 => 2 * hd,
    };
    for pair in b.chunks_exact(width) {
        let (a1, a2) = pair.split_at(width / 2);
        out[0].extend_from_slice(a1);
        out[1].extend_from_slice(a2);
        if let Branches::V1 { lambda } = layout {
            out[2].extend(a1.iter().zip(a2).map(|(x, y)| x - lambda * y));
        }
    }
    if let Branches::V2 = layout {
        out[2] = attn_out.to_vec();
    }
    out
}

/// Benchmarks one model file over `text`; `progress(done, total, label)` after each pass.
pub fn bench_model(
    path: &Path,
    text: &str,
    opts: &BenchOptions,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<ModelReport, RuntimeError> {
    let mut e = Engine::load(
        CpuBackend::new(opts.threads),
        path,
        &EngineOptions { n_ctx: 16, batch: 16, ..EngineOptions::default() },
    )?;
    let tokens = e.tokenizer.encode(text, e.tokenizer.add_bos)?;
    if tokens.len() < 2 {
        return Err(RuntimeError::Usage(format!(
            "the text gives {} token(s); attn-bench needs at least 2",
            tokens.len()
        )));
    }
    let windows: Vec<&[u32]> =
        tokens.chunks(opts.n_tokens.max(2)).filter(|w| w.len() >= 2).take(opts.windows.max(1)).collect();
    let cfg = e.model.config.clone();
    let is_diff = cfg.arch != Arch::Llama;
    // Llama layers capture no branches; their entry is never read.
    let layouts: Vec<Branches> = e
        .model
        .layers
        .iter()
        .map(|l| match l.attention.kind {
            AttentionKind::Differential { lambda, .. } => Branches::V1 { lambda },
            AttentionKind::PairedHeads | AttentionKind::Standard => Branches::V2,
        })
        .collect();
    let calibrated = e.model.file.get("duet.calibration.logits.absmax").is_some();

    // The settings, baseline first.
    let mut settings = vec![Setting { target: None, bits: 16, granularity: None, cache_scheme: None }];
    let mut skipped = Vec::new();
    for &t in &opts.targets {
        for &bits in opts.bits.iter().filter(|&&b| b != 16) {
            if t == Target::Logits {
                for &g in &opts.granularities {
                    if g == LogitGranularity::Static && !calibrated {
                        let why = "static logit scales: the file has no calibration (duet convert --calibrate TEXT)";
                        if !skipped.iter().any(|s| s == why) {
                            skipped.push(why.to_string());
                        }
                        continue;
                    }
                    settings.push(Setting { target: Some(t), bits, granularity: Some(g), cache_scheme: None });
                }
            } else {
                for &scheme in &opts.cache_schemes {
                    let Some((kt, vt)) = scheme.types(t, bits) else {
                        let widths: Vec<String> = scheme.widths().iter().map(u32::to_string).collect();
                        skipped.push(format!(
                            "{} at {bits} bits: {} caches come in {} bits",
                            t.name(),
                            scheme.label(t),
                            widths.join(", ")
                        ));
                        continue;
                    };
                    if let Err(why) = e.model.cache_spec(16, kt, vt).check() {
                        let why = format!("{} caches ({}): {why}", scheme.label(t), t.name());
                        if !skipped.contains(&why) {
                            skipped.push(why);
                        }
                        continue;
                    }
                    settings.push(Setting { target: Some(t), bits, granularity: None, cache_scheme: Some(scheme) });
                }
            }
        }
    }

    let total = settings.len() * windows.len();
    let run = |e: &mut Engine<CpuBackend>,
               tokens: &[u32],
               s: Setting,
               calibrator: Option<Calibrator>|
     -> Result<Pass, RuntimeError> {
        let (kt, vt) = match (s.target, s.cache_scheme) {
            (Some(t), Some(c)) => c.types(t, s.bits).expect("a setting's width is one its scheme comes in"),
            _ => (CacheFormat::F16, CacheFormat::F16),
        };
        let lq = if s.target == Some(Target::Logits) { s.granularity.map(|g| (s.bits, g)) } else { None };
        let mut s = e.model.new_session(&mut e.backend, tokens.len(), kt, vt)?;
        let mut ctx = e.model.new_context(&mut e.backend, tokens.len())?;
        e.model.set_logit_quant(&mut s, lq)?;
        let capture = Arc::new(Mutex::new(Capture { calibrator, ..Capture::default() }));
        e.backend.set_observer(Some(Box::new(Arc::clone(&capture))));
        let logits = e.model.decode_one(&mut e.backend, &mut ctx, &mut s, tokens, Logits::All);
        e.backend.set_observer(None);
        let capture = std::mem::take(&mut *capture.lock().unwrap_or_else(|p| p.into_inner()));
        Ok(Pass { logits: logits?, capture })
    };

    let n_vocab = cfg.n_vocab;
    let mut pooled = vec![Pooled::new(cfg.n_layers); settings.len()];
    // The baseline passes of every window feed one calibrator: the outlier table.
    let mut calibrator = Some(Calibrator::new(&cfg));
    for (w, tokens) in windows.iter().enumerate() {
        let mut base = run(&mut e, tokens, settings[0], calibrator.take())?;
        calibrator = base.capture.calibrator.take();
        progress(w * settings.len() + 1, total, &format!("window {}/{}: 16-bit baseline", w + 1, windows.len()));
        let base_rows: Vec<&[f32]> = base.logits.chunks_exact(n_vocab).collect();
        let base_lsm: Vec<Vec<f64>> = base_rows.iter().map(|r| log_softmax(r)).collect();
        let base_split: Vec<[Vec<f32>; 3]> = base
            .capture
            .branches
            .iter()
            .enumerate()
            .map(|(l, b)| split_branches(b, cfg.head_dim, layouts[l], &base.capture.attn_out[l]))
            .collect();

        for (i, &setting) in settings.iter().enumerate() {
            let pass = if i == 0 { None } else { Some(run(&mut e, tokens, setting, None)?) };
            let p = pass.as_ref().unwrap_or(&base);
            let acc = &mut pooled[i];
            for (t, row) in p.logits.chunks_exact(n_vocab).enumerate() {
                // Each row's log-softmax once: the baseline's from base_lsm.
                let own;
                let lsm: &[f64] = if i == 0 {
                    &base_lsm[t]
                } else {
                    own = log_softmax(row);
                    acc.kl += kl_divergence_log(&base_lsm[t], &own);
                    &own
                };
                if t + 1 < tokens.len() {
                    acc.nll -= lsm[tokens[t + 1] as usize];
                    acc.predicted += 1;
                }
                acc.agree += usize::from(argmax(row) == argmax(base_rows[t]));
                acc.positions += 1;
            }
            for (l, (a, b)) in p.capture.attn_out.iter().zip(&base.capture.attn_out).enumerate() {
                add_sq_err(&mut acc.layer[l], a, b);
            }
            for (l, b) in p.capture.branches.iter().enumerate() {
                let s = split_branches(b, cfg.head_dim, layouts[l], &p.capture.attn_out[l]);
                for k in 0..3 {
                    add_sq_err(&mut acc.branches[k][l], &s[k], &base_split[l][k]);
                }
            }
            if i > 0 {
                let bits = setting.bits;
                let label = match (setting.target, setting.granularity, setting.cache_scheme) {
                    (Some(t), Some(g), _) => format!("{} {bits}-bit {}", t.name(), g.name()),
                    (Some(t), None, Some(c)) => format!("{} {bits}-bit {}", t.name(), c.label(t)),
                    _ => String::new(),
                };
                progress(w * settings.len() + i + 1, total, &format!("window {}/{}: {label}", w + 1, windows.len()));
            }
        }
    }
    let report = calibrator.expect("the baseline hands its calibrator back").report("attn-bench");
    let runs = settings
        .iter()
        .zip(pooled)
        .map(|(&Setting { target, bits, granularity, cache_scheme }, acc)| {
            let errs = |v: &[(f64, f64)]| v.iter().copied().map(rel_err).collect::<Vec<f64>>();
            let [b1, b2, bd] = &acc.branches;
            RunResult {
                target,
                bits,
                granularity,
                cache_scheme,
                ppl: (acc.nll / acc.predicted as f64).exp(),
                mean_kl: acc.kl / acc.positions as f64,
                top1: acc.agree as f64 / acc.positions as f64,
                layer_rel_err: errs(&acc.layer),
                branch1_rel_err: is_diff.then(|| errs(b1)),
                branch2_rel_err: is_diff.then(|| errs(b2)),
                diff_rel_err: is_diff.then(|| errs(bd)),
            }
        })
        .collect();
    Ok(ModelReport {
        path: path.display().to_string(),
        arch: cfg.arch.name().to_string(),
        n_layers: cfg.n_layers,
        n_tokens: windows.iter().map(|w| w.len()).sum(),
        n_windows: windows.len(),
        logits_top: report.logits_top,
        hidden_top: report.hidden_top,
        runs,
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_error_and_branch_split() {
        let err = |a: &[f32], b: &[f32]| {
            let mut acc = (0.0, 0.0);
            add_sq_err(&mut acc, a, b);
            rel_err(acc)
        };
        assert_eq!(err(&[3.0, 4.0], &[3.0, 4.0]), 0.0);
        assert!((err(&[3.0, 5.0], &[3.0, 4.0]) - 0.2).abs() < 1e-12);
        // Pooled over two windows: the norms add, not the ratios.
        let mut acc = (0.0, 0.0);
        add_sq_err(&mut acc, &[3.0, 5.0], &[3.0, 4.0]);
        add_sq_err(&mut acc, &[0.0], &[0.0]);
        add_sq_err(&mut acc, &[1.0], &[2.0]);
        assert!((rel_err(acc) - (2.0f64 / 29.0).sqrt()).abs() < 1e-12);
        // Two head pairs of hd = 1: [a1 a1' | a2 a2'].
        let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let s = split_branches(&x, 1, Branches::V1 { lambda: 0.5 }, &[]);
        assert_eq!(s[0], vec![1.0, 2.0, 5.0, 6.0]);
        assert_eq!(s[1], vec![3.0, 4.0, 7.0, 8.0]);
        assert_eq!(s[2], vec![-0.5, 0.0, 1.5, 2.0]);
        // DIFF V2, four pairs of hd = 1: [o_2i | o_2i+1]; the combination is the output.
        let s = split_branches(&x, 1, Branches::V2, &[9.0, 9.5, 10.0, 10.5]);
        assert_eq!(s[0], vec![1.0, 3.0, 5.0, 7.0]);
        assert_eq!(s[1], vec![2.0, 4.0, 6.0, 8.0]);
        assert_eq!(s[2], vec![9.0, 9.5, 10.0, 10.5]);
    }
}
