//! Whole models on the GPU against the CPU backend: every committed fixture (DiffLlama with
//! GQA, tied DiffLlama with llama3 RoPE, Llama with GQA, Llama with DEX kept unfolded) at
//! F32, Q8_0 and Q4_K_M, in f32 and in f16 arithmetic, through prefill and token-by-token
//! decode; SmolLM2-135M over the 512 tokens of tests/smollm2/text.txt through
//! `duet perplexity --device gpu --save-logits`; and the pipeline/layout counters (nothing
//! created after the first token, one submission per token). Skips without an adapter.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use duet_convert::Preset;
use duet_quant::gguf::GgufFile;
use duet_runtime::backend::Backend;
use duet_runtime::cpu::CpuBackend;
use duet_runtime::gpu::{GpuBackend, GpuOptions, GpuTune, SUBMIT_EVERY};
use duet_runtime::kv_cache::CacheFormat;
use duet_runtime::logits_file::{LogitsFile, argmax, log_softmax};
use duet_runtime::model::{LogitGranularity, Logits, Model};

use common::{F32_BOUND, compare, convert, dequantized, fixture};
use duet_test_support::{asset, no_gpu};

fn gpu(test: &str, f16: bool) -> Option<GpuBackend> {
    match GpuBackend::new(&GpuOptions { f16: Some(f16), ..Default::default() }) {
        Ok(b) => Some(b),
        Err(e) if f16 => {
            // An adapter without SHADER_F16 runs the f32 kernels only.
            no_gpu(test, &format!("no adapter with SHADER_F16 ({e})"));
            None
        }
        Err(e) => {
            no_gpu(test, &format!("no usable GPU adapter ({e})"));
            None
        }
    }
}

/// Logits of every position: the first `split` tokens in one batch (prefill), the rest
/// one at a time (decode over the cache). An f32 cache, as the transformers comparison of
/// tests/model_logits.rs (the f16 cache is covered by the op tests and the SmolLM2 run).
fn logits<B: Backend>(b: &mut B, path: &Path, tokens: &[u32], split: usize) -> Vec<f32> {
    logits_with(b, path, tokens, split, CacheFormat::F32, CacheFormat::F32, None)
}

/// [`logits`] over a K cache of type `kt` and a V cache of type `vt`, the attention logits
/// quantized as `attn_logits` says.
fn logits_with<B: Backend>(
    b: &mut B,
    path: &Path,
    tokens: &[u32],
    split: usize,
    kt: CacheFormat,
    vt: CacheFormat,
    attn_logits: Option<(u32, LogitGranularity)>,
) -> Vec<f32> {
    let model = Model::load(b, Arc::new(GgufFile::open(path).unwrap())).unwrap();
    let mut s = model.new_session(b, 128, kt, vt).unwrap();
    let mut ctx = model.new_context(b, 64).unwrap();
    model.set_logit_quant(&mut s, attn_logits).unwrap();
    let mut out = model.decode_one(b, &mut ctx, &mut s, &tokens[..split], Logits::All).unwrap();
    for &t in &tokens[split..] {
        out.extend(model.decode_one(b, &mut ctx, &mut s, &[t], Logits::All).unwrap());
    }
    out
}

/// GPU vs CPU on every fixture (64 positions: 40 in one batch, then 24 decoded one by one).
///
/// Two references, because the CPU backend's own arithmetic on quantized weights rounds
/// the activations (two-level Q8 for its integer dot products) while the GPU multiplies the
/// dequantized weights by unrounded activations:
/// * exact: the CPU backend on the same weights dequantized to F32 (exact f32 arithmetic).
///   GPU f32: max |Δlogit| ≤ 1e-3. GPU f16 products: mean KL ≤ 1e-4, top-1 ≥ 0.95.
/// * the CPU backend on the quantized file itself (what `duet perplexity --kl-base`
///   compares): mean KL ≤ 5e-6 with f32 products, ≤ 5e-4 with f16 ones, top-1 ≥ 0.85 (these
///   random-weight models have nearly flat logits, so near-ties flip easily).
#[test]
fn fixtures_gpu_matches_cpu() {
    let test = "fixtures_gpu_matches_cpu";
    let Some(mut g32) = gpu(test, false) else { return };
    let mut g16 = gpu(test, true);
    eprintln!("{test}: {}", g32.describe());
    let mut failures = Vec::new();
    let cases = [
        ("diffllama-gqa", false),
        ("diffllama-tied-llama3", false),
        ("llama-gqa", false),
        ("llama-dex", true),
        ("diffllama-v2-gqa", false),
        ("diffllama-v2-mha-tied", false),
    ];
    for (name, keep_dex) in cases {
        let reference = LogitsFile::read(&fixture(name).join("reference.logits")).unwrap();
        let tokens = &reference.tokens;
        let v = reference.n_vocab;
        for preset in [Preset::F32, Preset::Q8_0, Preset::Q4KM] {
            let path = convert(name, preset, keep_dex);
            let split = 40;
            let cpu = logits(&mut CpuBackend::new(2), &path, tokens, split);
            let exact = if preset == Preset::F32 {
                cpu.clone()
            } else {
                let f = dequantized(&path);
                let l = logits(&mut CpuBackend::new(2), &f, tokens, split);
                let _ = std::fs::remove_file(&f);
                l
            };
            let mut runs = vec![("f32", logits(&mut g32, &path, tokens, split))];
            if let Some(g) = g16.as_mut() {
                runs.push(("f16", logits(g, &path, tokens, split)));
            }
            for (arith, got) in runs {
                let e = compare(&exact, &got, v);
                let c = compare(&cpu, &got, v);
                eprintln!(
                    "{name:<22} {:<7} {arith}: vs exact max|Δ| {:.2e} KL {:.2e} top-1 {:.3} | vs CPU backend KL {:.2e} top-1 {:.3}",
                    preset.name(),
                    e.max_abs,
                    e.mean_kl,
                    e.top1,
                    c.mean_kl,
                    c.top1
                );
                let exact_ok = if arith == "f32" { e.max_abs <= 1e-3 } else { e.mean_kl <= 1e-4 && e.top1 >= 0.95 };
                // Per arithmetic mode (the bound was 2e-3 for both, set for ggml's single Q8
                // activations on the CPU side; the default two-level ones put the f32 GPU at
                // 8.4e-8 and the f16 products at 5.3e-6, worst measured on lavapipe).
                let cpu_kl = if arith == "f32" { 5e-6 } else { 5e-4 };
                let cpu_ok = c.mean_kl <= cpu_kl && c.top1 >= 0.85;
                if !exact_ok || !cpu_ok {
                    failures.push(format!("{name} {} {arith}", preset.name()));
                }
            }
            // The F32 conversion on the GPU also matches transformers as the CPU does.
            if preset == Preset::F32 {
                let s = compare(&reference.logits, &logits(&mut g32, &path, tokens, split), v);
                if s.max_abs > F32_BOUND {
                    failures.push(format!("{name} F32 vs transformers: max |Δ| {}", s.max_abs));
                }
            }
            let _ = std::fs::remove_file(&path);
        }
    }
    assert!(failures.is_empty(), "outside the bounds: {failures:?}");
}

/// `f(name, F32 file, reference tokens, n_vocab)` for the DiffLlama, Llama and DIFF V2 GQA
/// fixtures, each converted to F32 for the call and removed after it.
fn on_f32_fixtures(mut f: impl FnMut(&str, &Path, &[u32], usize)) {
    for name in ["diffllama-gqa", "llama-gqa", "diffllama-v2-gqa"] {
        let reference = LogitsFile::read(&fixture(name).join("reference.logits")).unwrap();
        let path = convert(name, Preset::F32, false);
        f(name, &path, &reference.tokens, reference.n_vocab);
        let _ = std::fs::remove_file(&path);
    }
}

/// Quantized K/V caches of every family (absmax, rotated, per-channel) on the GPU (f32
/// arithmetic) against the CPU backend with the same cache types, on the F32 DiffLlama and
/// Llama fixtures. The backends quantize K/V rows the same way, but their K/V activations
/// differ in the last bits, which can move a value across a rounding boundary of the
/// cache's grid: mean KL ≤ 1e-5 and top-1 ≥ 0.95 rather than the f32 cache's max |Δlogit|
/// ≤ 1e-3 (the measured max |Δ| is printed). The rotated types need rows of whole blocks of
/// 64, which the Llama fixture (rows of 32) does not have: those pairs run on DiffLlama only.
#[test]
fn quantized_cache_gpu_matches_cpu() {
    use CacheFormat::*;
    let test = "quantized_cache_gpu_matches_cpu";
    let Some(mut g) = gpu(test, false) else { return };
    let mut failures = Vec::new();
    let mut runs = 0;
    on_f32_fixtures(|name, path, tokens, v| {
        let kv_dim =
            GgufFile::open(path).map(|f| duet_runtime::model::ModelConfig::from_gguf(&f).unwrap().kv_dim()).unwrap();
        let pairs = [
            (Q8, Q8),
            (Q6, Q6),
            (Q4, Q4),
            (Q8, F16),
            (F16, Q4),
            (Q8c, Q8r),
            (Q6c, Q6r),
            (Q4c, Q4r),
            (Q4c, F16),
            (F16, Q4r),
            (Q4r, Q6c),
            (Q3c, Q3r),
            (Q2c, Q2r),
            (Q3c, F16),
        ];
        for (kt, vt) in pairs {
            if !kv_dim.is_multiple_of(kt.row_multiple()) || !kv_dim.is_multiple_of(vt.row_multiple()) {
                continue;
            }
            runs += 1;
            let cpu = logits_with(&mut CpuBackend::new(2), path, tokens, 40, kt, vt, None);
            let got = logits_with(&mut g, path, tokens, 40, kt, vt, None);
            let c = compare(&cpu, &got, v);
            eprintln!(
                "{name:<14} K {kt} V {vt}: vs CPU backend max|Δ| {:.2e} KL {:.2e} top-1 {:.3}",
                c.max_abs, c.mean_kl, c.top1
            );
            if c.mean_kl > 1e-5 || c.top1 < 0.95 {
                failures.push(format!("{name} K {kt} V {vt}"));
            }
        }
    });
    assert!(failures.is_empty(), "outside the bounds: {failures:?}");
    assert_eq!(runs, 14 + 7 + 14, "pairs run on DiffLlama, Llama and DIFF V2");
}

/// Quantized attention logits through whole models (DIFF and Llama, prefill then decode):
/// per tensor, head and row at 8, 6 and 4 bits, GPU against the CPU backend, over an f32
/// cache (static scales are covered op by op in runtime/tests/gpu_ops.rs: these fixtures
/// carry no calibration). Bounds as for the quantized caches (a logit on a rounding
/// boundary may fall either way), and the quantization must have changed the logits.
#[test]
fn quantized_logits_gpu_matches_cpu() {
    let test = "quantized_logits_gpu_matches_cpu";
    let Some(mut g) = gpu(test, false) else { return };
    let mut failures = Vec::new();
    on_f32_fixtures(|name, path, tokens, v| {
        let plain = logits(&mut CpuBackend::new(2), path, tokens, 40);
        for bits in [8, 6, 4] {
            for gran in [LogitGranularity::Tensor, LogitGranularity::Head, LogitGranularity::Row] {
                let setting = Some((bits, gran));
                let (f32c, cpu) = (CacheFormat::F32, &mut CpuBackend::new(2));
                let cpu = logits_with(cpu, path, tokens, 40, f32c, f32c, setting);
                let got = logits_with(&mut g, path, tokens, 40, f32c, f32c, setting);
                let c = compare(&cpu, &got, v);
                let effect = compare(&plain, &cpu, v);
                eprintln!(
                    "{name:<14} logits {bits}-bit per {}: vs CPU max|Δ| {:.2e} KL {:.2e} top-1 {:.3}; \
                     vs unquantized max|Δ| {:.2e}",
                    gran.name(),
                    c.max_abs,
                    c.mean_kl,
                    c.top1,
                    effect.max_abs
                );
                if c.mean_kl > 1e-5 || c.top1 < 0.95 || effect.max_abs < 1e-4 {
                    failures.push(format!("{name} {bits}-bit {}", gran.name()));
                }
            }
        }
    });
    assert!(failures.is_empty(), "outside the bounds: {failures:?}");
}

/// A token submitted in pieces (every 7 dispatches, so that the GPU starts while the host
/// records the rest) is computed exactly as in one submission: same logits, bit for bit;
/// one submission per 7 dispatches and one with the readback.
#[test]
fn submitting_in_pieces_changes_nothing() {
    let test = "submitting_in_pieces_changes_nothing";
    let path = convert("diffllama-gqa", Preset::Q4KM, false);
    let file = Arc::new(GgufFile::open(&path).unwrap());
    let tokens: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 200).collect();
    let mut runs = Vec::new();
    for every in [usize::MAX, 7] {
        let opts = GpuOptions { submit_every: Some(every), ..Default::default() };
        let mut b = match GpuBackend::new(&opts) {
            Ok(b) => b,
            Err(e) => return no_gpu(test, &format!("no usable GPU adapter ({e})")),
        };
        let model = Model::load(&mut b, Arc::clone(&file)).unwrap();
        let mut s = model.new_session(&mut b, 64, CacheFormat::F16, CacheFormat::F16).unwrap();
        let mut ctx = model.new_context(&mut b, 16).unwrap();
        let mut logits = model.decode_one(&mut b, &mut ctx, &mut s, &tokens[..9], Logits::Last).unwrap();
        for i in 9..tokens.len() {
            let (subs, dispatches) = (b.submissions(), b.dispatches());
            logits.extend(model.decode_one(&mut b, &mut ctx, &mut s, &tokens[i..i + 1], Logits::Last).unwrap());
            let d = b.dispatches() - dispatches;
            let want = if every == 7 { d / 7 + 1 } else { 1 };
            assert_eq!(b.submissions() - subs, want, "token {i}: {d} dispatches, submitted every {every}");
        }
        runs.push(logits);
    }
    assert_eq!(runs[0], runs[1], "logits with and without mid-token submissions");
    let _ = std::fs::remove_file(&path);
}

/// No pipeline or bind-group layout is created after the first token; a decode step is
/// submitted once at its end (with the logits' readback); decode steps create no bind groups
/// either.
#[test]
fn no_pipeline_or_layout_after_first_token() {
    let test = "no_pipeline_or_layout_after_first_token";
    let Some(mut b) = gpu(test, false) else { return };
    let path = convert("diffllama-gqa", Preset::Q4KM, false);
    let model = Model::load(&mut b, Arc::new(GgufFile::open(&path).unwrap())).unwrap();
    let mut s = model.new_session(&mut b, 128, CacheFormat::F16, CacheFormat::F32).unwrap();
    let mut ctx = model.new_context(&mut b, 32).unwrap();
    let n_vocab = model.config.n_vocab as u32;
    let tokens: Vec<u32> = (0..60).map(|i| (i * 37 + 5) % n_vocab).collect();
    model.decode_one(&mut b, &mut ctx, &mut s, &tokens[..9], Logits::Last).unwrap();
    let (pipelines, layouts) = (b.pipelines_created(), b.layouts_created());
    eprintln!("{test}: {pipelines} pipelines, {layouts} layouts after the first token");
    // Decode steps.
    model.decode_one(&mut b, &mut ctx, &mut s, &tokens[9..10], Logits::Last).unwrap();
    let (subs, groups) = (b.submissions(), b.bind_groups_created());
    let dispatches = b.dispatches();
    for i in 10..20 {
        model.decode_one(&mut b, &mut ctx, &mut s, &tokens[i..i + 1], Logits::Last).unwrap();
    }
    assert!(b.dispatches() - dispatches < 10 * SUBMIT_EVERY, "this model's tokens fit one submission");
    assert_eq!(b.submissions(), subs + 10, "one submission per decoded token");
    assert_eq!(b.bind_groups_created(), groups, "decode steps reuse their bind groups");
    // Another prefill (more tokens than one batch), all logits, a reset.
    model.decode_one(&mut b, &mut ctx, &mut s, &tokens[20..60], Logits::All).unwrap();
    s.reset();
    model.decode_one(&mut b, &mut ctx, &mut s, &tokens[..33], Logits::Last).unwrap();
    assert_eq!(b.pipelines_created(), pipelines, "a pipeline was created after the first token");
    assert_eq!(b.layouts_created(), layouts, "a layout was created after the first token");
    let _ = std::fs::remove_file(&path);
}

/// `GpuOptions::profile` times every dispatch and changes nothing: the logits of a prefill
/// and 8 decoded tokens are bit-identical with and without it, every dispatch of a decoded
/// token is timed, and its matvecs read each matrix once.
#[test]
fn kernel_profile_times_every_dispatch() {
    let test = "kernel_profile_times_every_dispatch";
    let Some(mut plain) = gpu(test, false) else { return };
    let mut timed = match GpuBackend::new(&GpuOptions { f16: Some(false), profile: true, ..Default::default() }) {
        Ok(b) => b,
        Err(e) => {
            no_gpu(test, &format!("no adapter with timestamp queries inside passes ({e})"));
            return;
        }
    };
    let path = convert("llama-gqa", Preset::Q8_0, false);
    let tokens: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 200).collect();
    let want = logits_with(&mut plain, &path, &tokens, 16, CacheFormat::F16, CacheFormat::F16, None);
    let got = logits_with(&mut timed, &path, &tokens, 16, CacheFormat::F16, CacheFormat::F16, None);
    assert!(want == got, "profiling changed the logits");
    assert!(plain.take_kernel_times().is_none(), "an unprofiled backend has no kernel times");

    let model = Model::load(&mut timed, Arc::new(GgufFile::open(&path).unwrap())).unwrap();
    let mut s = model.new_session(&mut timed, 64, CacheFormat::F16, CacheFormat::F16).unwrap();
    let mut ctx = model.new_context(&mut timed, 16).unwrap();
    model.decode_one(&mut timed, &mut ctx, &mut s, &tokens[..16], Logits::Last).unwrap();
    timed.take_kernel_times();
    let dispatches = timed.dispatches();
    model.decode_one(&mut timed, &mut ctx, &mut s, &tokens[16..17], Logits::Last).unwrap();
    let times = timed.take_kernel_times().unwrap();
    eprintln!("{test}: {times:?}");
    let total: u64 = times.iter().filter(|t| !t.on_host).map(|t| t.calls).sum();
    assert_eq!(timed.dispatches() - dispatches, total as usize, "every dispatch timed: {times:?}");
    assert!(times.iter().all(|t| t.seconds >= 0.0) && times.iter().any(|t| t.seconds > 0.0), "{times:?}");
    // The matvecs read every matrix but the token embedding once (buffers padded to 4 bytes).
    let file = GgufFile::open(&path).unwrap();
    let matrices: Vec<u64> = file
        .tensors()
        .iter()
        .filter(|t| t.n_dims() == 2 && t.name() != "token_embd.weight")
        .map(|t| t.n_bytes())
        .collect();
    let want: u64 = matrices.iter().sum();
    let read: u64 = times.iter().filter(|t| t.kernel.starts_with("matvec-")).map(|t| t.weight_bytes).sum();
    assert_eq!(read, want, "matvecs read {read} bytes of {want}");
    assert!(times.iter().filter(|t| !t.kernel.starts_with("mat")).all(|t| t.weight_bytes == 0), "{times:?}");
    // The host's steps: every dispatch recorded, the token submitted and waited for.
    let host =
        |label: &str| times.iter().filter(|t| t.on_host && t.kernel.contains(label)).map(|t| t.calls).sum::<u64>();
    let kernel_calls: u64 = times.iter().filter(|t| !t.on_host).map(|t| t.calls).sum();
    assert_eq!(host("recording"), kernel_calls, "{times:?}");
    assert!(host("submitting") >= 1 && host("waiting") >= 1, "{times:?}");
    assert!(timed.take_kernel_times().unwrap().is_empty(), "take starts afresh");
    let _ = std::fs::remove_file(&path);
}

/// A decoded token's dispatches, per kernel, on a GPU backend opened with `tune` (profiled).
fn decode_calls(
    test: &str,
    fixture: &str,
    tune: GpuTune,
) -> Option<(Vec<duet_runtime::gpu::profile::KernelTime>, u64)> {
    let opts = GpuOptions { f16: Some(false), profile: true, tune, ..Default::default() };
    let mut b = match GpuBackend::new(&opts) {
        Ok(b) => b,
        Err(e) => {
            no_gpu(test, &format!("no adapter with timestamp queries inside passes ({e})"));
            return None;
        }
    };
    let path = convert(fixture, Preset::Q8_0, false);
    let model = Model::load(&mut b, Arc::new(GgufFile::open(&path).unwrap())).unwrap();
    let mut s = model.new_session(&mut b, 64, CacheFormat::F16, CacheFormat::F16).unwrap();
    let mut ctx = model.new_context(&mut b, 16).unwrap();
    let tokens: Vec<u32> = (0..17).map(|i| (i * 37 + 5) % 200).collect();
    model.decode_one(&mut b, &mut ctx, &mut s, &tokens[..16], Logits::Last).unwrap();
    b.take_kernel_times();
    model.decode_one(&mut b, &mut ctx, &mut s, &tokens[16..], Logits::Last).unwrap();
    let _ = std::fs::remove_file(&path);
    Some((b.take_kernel_times().unwrap(), model.config.n_layers as u64))
}

/// The fused decode layer: seven dispatches for Llama and DiffLlama (the q/k/v matvec with
/// the attention norm folded in, RoPE with the K/V write, the attend and combine steps,
/// attn_output with the residual add, gate and up with the FFN norm and SwiGLU, ffn_down
/// with the residual add), eight for DIFF V2 (its λ, an F32 matrix beside quantized q/k/v,
/// has a normed matvec of its own; the pair combine rides in the combine step), plus the
/// embedding row and the output with the final norm per token (no copy of the last row:
/// decoding has one); unfused (`--gpu-tune fuse=off`), one kernel per
/// op: eighteen, and twenty for V2 (its λ matvec).
#[test]
fn fused_layers_dispatch_counts() {
    let test = "fused_layers_dispatch_counts";
    for (fixture, per_layer, unfused) in [("diffllama-gqa", 7, 18), ("diffllama-v2-gqa", 8, 20)] {
        let Some((times, layers)) = decode_calls(test, fixture, GpuTune::default()) else { return };
        eprintln!("{test}: {fixture}: {times:?}");
        let calls = |prefix: &str| times.iter().filter(|t| t.kernel.starts_with(prefix)).map(|t| t.calls).sum::<u64>();
        let total: u64 = times.iter().filter(|t| !t.on_host).map(|t| t.calls).sum();
        assert_eq!(total, per_layer * layers + 2, "{fixture}: {per_layer} dispatches a layer: {times:?}");
        assert_eq!(calls("copy_row") + calls("rms_norm"), 0, "norms folded into the products: {times:?}");
        assert_eq!(calls("rope_kv-"), layers, "{times:?}");
        assert_eq!(calls("matvec-Q8_0-norm-split-"), layers, "{times:?}");
        assert_eq!(calls("matvec-Q8_0-add-"), 2 * layers, "{times:?}");
        assert_eq!(calls("matvec-Q8_0-norm-swiglu-"), layers, "{times:?}");
        assert_eq!(calls("kv_write-") + calls("rope-") + calls("add") + calls("swiglu"), 0, "unfused ops: {times:?}");
        let Some((times, _)) = decode_calls(test, fixture, GpuTune { fuse: Some(false), ..Default::default() }) else {
            return;
        };
        let total: u64 = times.iter().filter(|t| !t.on_host).map(|t| t.calls).sum();
        assert_eq!(total, unfused * layers + 3, "{fixture} unfused: {times:?}");
    }
}

/// Parses "mean X over N positions; top-1 agreement Y%" from `duet perplexity --kl-base`.
fn parse_kl(out: &str) -> (f64, f64) {
    let line = out.lines().find(|l| l.starts_with("KL divergence")).unwrap_or_else(|| panic!("no KL line in:\n{out}"));
    let mean: f64 = line.split("mean ").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    let top1: f64 = line.split("agreement ").nth(1).unwrap().trim_end_matches('%').trim().parse().unwrap();
    (mean, top1 / 100.0)
}

/// Mean KL and top-1 agreement of `logits` against transformers' reference
/// (tests/smollm2/reference.topk, see make_reference.py): KL over the reference's top-k
/// tokens plus the rest lumped into one outcome, as tests/smollm2.rs computes it.
fn vs_transformers(logits: &LogitsFile) -> (f64, f64) {
    let b = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/smollm2/reference.topk")).unwrap();
    assert_eq!(&b[..4], b"DTOP");
    let u = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
    let f = |i: usize| f32::from_le_bytes(b[i..i + 4].try_into().unwrap());
    let (n, k) = (u(8) as usize, u(16) as usize);
    let tokens: Vec<u32> = (0..n).map(|i| u(20 + 4 * i)).collect();
    assert_eq!(logits.tokens, tokens, "the reference was made on the same 512 tokens");
    let mut pos = 20 + 4 * n;
    let (mut kl_sum, mut agree) = (0f64, 0usize);
    for t in 0..n {
        let lse = f(pos) as f64;
        pos += 4;
        let lq = log_softmax(logits.row(t));
        let (mut kl, mut p_top, mut q_top) = (0f64, 0f64, 0f64);
        for j in 0..k {
            let (id, logit) = (u(pos + 8 * j) as usize, f(pos + 8 * j + 4));
            let lp = logit as f64 - lse;
            kl += lp.exp() * (lp - lq[id]);
            p_top += lp.exp();
            q_top += lq[id].exp();
        }
        let (p_rest, q_rest) = ((1.0 - p_top).max(1e-12), (1.0 - q_top).max(1e-12));
        kl += p_rest * (p_rest / q_rest).ln();
        kl_sum += kl;
        agree += usize::from(argmax(logits.row(t)) as u32 == u(pos));
        pos += 8 * k;
    }
    (kl_sum / n as f64, agree as f64 / n as f64)
}

/// SmolLM2-135M (Q4_1, llama.cpp's file) over the 512 tokens of tests/smollm2/text.txt,
/// through the CLI: `duet perplexity --device cpu --save-logits`, then
/// `duet perplexity --device gpu --save-logits --kl-base` (default arithmetic: f32 on a
/// software adapter, f16 products on hardware with SHADER_F16).
///
/// Asserted: the GPU against transformers' float32 reference, and the GPU against the CPU
/// backend (default two-level Q8 activations), each top-1 ≥ 99% and mean KL ≤ 0.005.
#[test]
fn smollm2_gpu_matches_cpu() {
    let test = "smollm2_gpu_matches_cpu";
    let Some(model) = asset(test, "DUET_SMOLLM2", "SmolLM2-135M-Instruct.Q4_1.gguf") else { return };
    if let Err(e) = GpuBackend::new(&GpuOptions::default()) {
        no_gpu(test, &format!("no usable GPU adapter ({e})"));
        return;
    }
    let text = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/smollm2/text.txt");
    let reference = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/smollm2/reference.topk");
    assert!(text.exists() && reference.exists(), "the committed tests/smollm2/text.txt and reference.topk");
    let dir = std::env::temp_dir().join(format!("duet-gpu-smollm2-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cpu_logits, gpu_logits) = (dir.join("cpu.dlog"), dir.join("gpu.dlog"));
    let perplexity = |device: &str, extra: &[&Path]| -> String {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_duet"));
        cmd.arg("perplexity").arg("-m").arg(&model).arg("-f").arg(&text);
        cmd.args(["-c", "512", "-b", "512", "--max-tokens", "512", "-q", "--device", device]);
        cmd.arg("--save-logits").arg(extra[0]);
        if let Some(base) = extra.get(1) {
            cmd.arg("--kl-base").arg(base);
        }
        let t0 = std::time::Instant::now();
        let out = cmd.output().unwrap();
        let (so, se) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "duet perplexity --device {device} failed:\n{so}\n{se}");
        eprintln!("--device {device} ({:.1} s): {}", t0.elapsed().as_secs_f64(), so.trim());
        so.into_owned()
    };
    perplexity("cpu", &[&cpu_logits]);
    let out = perplexity("gpu", &[&gpu_logits, &cpu_logits]);
    let (kl, top1) = parse_kl(&out);
    let (gpu, cpu) = (LogitsFile::read(&gpu_logits).unwrap(), LogitsFile::read(&cpu_logits).unwrap());
    assert_eq!(gpu.tokens.len(), 512);
    let (g_kl, g_top1) = vs_transformers(&gpu);
    let (c_kl, c_top1) = vs_transformers(&cpu);
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("{test}: over 512 tokens, GPU vs CPU backend: mean KL {kl:.6}, top-1 {:.2}%", 100.0 * top1);
    eprintln!("{test}: GPU vs transformers: mean KL {g_kl:.6}, top-1 {:.2}%", 100.0 * g_top1);
    eprintln!("{test}: CPU vs transformers: mean KL {c_kl:.6}, top-1 {:.2}%", 100.0 * c_top1);
    assert!(g_top1 >= 0.99, "GPU vs transformers: top-1 agreement {g_top1} < 0.99");
    assert!(g_kl <= 0.005, "GPU vs transformers: mean KL {g_kl} > 0.005");
    // The issue's bound. It holds because the CPU backend's two-level activations put it
    // within ~1e-4 KL of transformers (with ggml's single Q8 it is ~0.013 away, and so is
    // the GPU from it).
    assert!(top1 >= 0.99, "GPU vs CPU: top-1 agreement {top1} < 0.99");
    assert!(kl <= 0.005, "GPU vs CPU: mean KL {kl} > 0.005");
}

/// `--device gpu|cpu|auto` on the CLI: the adapter is named at start, `bench` and `run`
/// work on the GPU, and `auto` without a hardware GPU says it runs on the CPU.
#[test]
fn cli_device_flag_run_and_bench() {
    let test = "cli_device_flag_run_and_bench";
    let gpu_backend = match GpuBackend::new(&GpuOptions::default()) {
        Ok(b) => b,
        Err(e) => {
            no_gpu(test, &format!("no usable GPU adapter ({e})"));
            return;
        }
    };
    let hardware = !matches!(gpu_backend.adapter_info().device_type, duet_runtime::gpu::DeviceType::Cpu);
    drop(gpu_backend);
    let path = convert("diffllama-gqa", Preset::Q8_0, false);
    let duet = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_duet"))
            .arg(args[0])
            .arg("-m")
            .arg(&path)
            .args(&args[1..])
            .output()
            .unwrap();
        let (so, se) =
            (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
        assert!(out.status.success(), "duet {args:?} failed:\n{so}\n{se}");
        (so, se)
    };
    let (_, se) = duet(&["run", "-p", "hello", "-n", "4", "--temp", "0", "--device", "gpu"]);
    assert!(se.contains("GPU adapter: ") && se.contains("backend ") && se.contains("type "), "{se}");
    let (so, _) = duet(&["bench", "-p", "16", "-n", "4", "-r", "1", "--device", "gpu"]);
    // (The table pads its cells to align the columns.)
    let has_test = |t: &str| so.lines().any(|l| l.split('|').any(|c| c.trim() == t));
    assert!(has_test("pp16") && has_test("tg4") && so.contains("GPU "), "{so}");
    eprintln!("{so}");
    let (so, _) = duet(&["bench", "-p", "16", "-n", "4", "-r", "1", "--device", "gpu", "--gpu-profile"]);
    assert!(so.contains("GPU time of pp16: ") && so.contains("GPU time of tg4: "), "{so}");
    // The prompt's product: the tiled matmul, or on cooperative matrices where the adapter has them.
    let prompt_product = so.contains("| matmul-Q8_0") || so.contains("| matmul_coop");
    assert!(prompt_product && so.contains("| matvec-Q8_0") && so.contains("| attention-"), "{so}");
    let (_, se) = duet(&["run", "-p", "hello", "-n", "2", "--temp", "0"]);
    if hardware {
        assert!(se.contains("GPU adapter: "), "{se}");
    } else {
        assert!(se.contains("running on the CPU"), "{se}");
    }
    let (_, se) = duet(&["run", "-p", "hello", "-n", "2", "--temp", "0", "--device", "cpu"]);
    assert!(!se.contains("GPU adapter"), "{se}");
    // Kernel choices: taken, shown in the backend's description, refused with the reason.
    let (so, _) = duet(&[
        "bench",
        "-p",
        "0",
        "-n",
        "2",
        "-r",
        "1",
        "--device",
        "gpu",
        "--gpu-tune",
        "matvec=64x1,subgroups=off,fuse=off",
    ]);
    assert!(so.contains("matvec 64x1 with workgroup-memory sums (no subgroups)") && so.contains("unfused"), "{so}");
    assert!(so.contains("GPU work of tg2: 39 dispatches per decoded token over 2 layers"), "18 a layer: {so}");
    let refused = |args: &[&str], why: &str| {
        let out =
            Command::new(env!("CARGO_BIN_EXE_duet")).arg("bench").arg("-m").arg(&path).args(args).output().unwrap();
        let se = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && se.contains(why) && !se.contains("panicked"), "{args:?}: {se}");
    };
    refused(&["--device", "gpu", "--gpu-tune", "matvec=100x2"], "'100x2' is not a matvec shape");
    refused(&["--device", "gpu", "--gpu-tune", "speed=max"], "unknown --gpu-tune key 'speed'");
    refused(&["--device", "cpu", "--gpu-tune", "fuse=off"], "--gpu-tune chooses GPU kernels");
    let _ = std::fs::remove_file(&path);
}

/// `duet bench --gpu-kernels test` times every matvec variant (12 shapes with subgroup sums,
/// trusted, and without subgroups) on two small matrices and names the best per type.
#[test]
fn cli_kernel_sweep() {
    let test = "cli_kernel_sweep";
    if let Err(e) = GpuBackend::new(&GpuOptions::default()) {
        no_gpu(test, &format!("no usable GPU adapter ({e})"));
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_duet"))
        .args(["bench", "--device", "gpu", "--gpu-kernels", "test"])
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{so}\n{}", String::from_utf8_lossy(&out.stderr));
    let rows = |suffix: &str| {
        so.lines().filter(|l| l.starts_with("| ") && l.split(" |").next().is_some_and(|v| v.ends_with(suffix))).count()
    };
    let with_sub = GpuBackend::new(&GpuOptions {
        tune: GpuTune { subgroups: Some(true), ..Default::default() },
        ..Default::default()
    })
    .is_ok();
    assert_eq!(rows("-nosub"), 12, "{so}");
    assert_eq!(rows(" trusted"), if with_sub { 12 } else { 0 }, "{so}");
    assert!(so.contains("| Q4_0 | small | ") && so.contains("| Q6_K | small | "), "{so}");
    // Every timing a positive number of microseconds.
    let variant_rows: Vec<&str> = so
        .lines()
        .filter(|l| l.split('|').nth(1).is_some_and(|v| v.trim().starts_with(|c: char| c.is_ascii_digit())))
        .collect();
    assert_eq!(variant_rows.len(), if with_sub { 36 } else { 12 }, "{so}");
    for l in variant_rows {
        for cell in l.split('|').skip(2).filter(|c| !c.trim().is_empty()) {
            let us: f64 = cell.trim().split(' ').next().unwrap().parse().unwrap_or(-1.0);
            assert!(us > 0.0, "{l}");
        }
    }
}

/// A small buffer limit (GpuOptions::max_binding, 16 KiB here) makes a batch's logits too
/// big for one tensor: decode splits the batch into steps whose logits fit and gives the same logits as
/// an unlimited run, and a session whose activations cannot fit is refused with advice
/// instead of a panic.
#[test]
fn batches_shrink_to_the_buffer_limit() {
    let test = "batches_shrink_to_the_buffer_limit";
    let Some(mut free) = gpu(test, false) else { return };
    let mut capped =
        GpuBackend::new(&GpuOptions { f16: Some(false), max_binding: Some(16 << 10), ..Default::default() })
            .expect("the adapter just opened");
    let path = convert("diffllama-gqa", Preset::Q8_0, false);
    let file = Arc::new(GgufFile::open(&path).unwrap());
    let tokens: Vec<u32> = (0..40).map(|i| (i * 37 + 5) % 320).collect();
    let run = |b: &mut GpuBackend, max_batch: usize| {
        let model = Model::load(b, Arc::clone(&file)).unwrap();
        let mut s = model.new_session(b, 64, CacheFormat::F32, CacheFormat::F32)?;
        let mut ctx = model.new_context(b, max_batch)?;
        model.decode_one(b, &mut ctx, &mut s, &tokens, Logits::All)
    };
    let want = run(&mut free, 16).unwrap();
    // 16 rows of 256-wide activations fit in 16 KiB; 16 rows of 320 logits (20 KiB) do not.
    let got = run(&mut capped, 16).unwrap();
    assert_eq!(got.len(), want.len());
    let diff = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(diff <= 1e-5, "logits of shrunk batches differ by {diff}");
    assert!(free.largest_tensor_bytes() > 16 << 10, "the unlimited run should use 16-row logits");
    assert!(
        capped.largest_tensor_bytes() <= 16 << 10,
        "a tensor of {} bytes exceeds the cap",
        capped.largest_tensor_bytes()
    );
    let err = run(&mut capped, 64).unwrap_err().to_string();
    assert!(err.contains("lower --batch-size to 16"), "{err}");
    let _ = std::fs::remove_file(&path);
}

/// ggml's test-backend-ops, for duet: every kind of GPU kernel (one per parameter struct,
/// `duet_shaders::PARAMS_STRUCTS`) runs here in a model pass compared with the CPU backend,
/// so a new kernel cannot ship with only naga's validation. The passes: DiffLlama over f16
/// and over per-channel K / rotated V caches with 6-bit logits per head, Llama with DEX kept
/// (over f16, and over 2-bit K stored before RoPE),
/// DIFF V2 (40 tokens of prefill, then decode). Bounds as the quantized caches'.
#[test]
fn every_kernel_kind_runs_against_the_cpu() {
    use CacheFormat::*;
    let test = "every_kernel_kind_runs_against_the_cpu";
    let Some(mut g) = gpu(test, false) else { return };
    let mut failures = Vec::new();
    let runs: [(&str, bool, CacheFormat, CacheFormat, Option<(u32, LogitGranularity)>); 5] = [
        ("diffllama-gqa", false, F16, F16, None),
        ("diffllama-gqa", false, Q4c, Q4r, Some((6, LogitGranularity::Head))),
        ("llama-dex", true, Q8, F16, None),
        ("llama-dex", true, Q2c, F16, None),
        ("diffllama-v2-gqa", false, F16, Q8, Some((8, LogitGranularity::Row))),
    ];
    for (name, keep_dex, kt, vt, attn) in runs {
        let reference = LogitsFile::read(&fixture(name).join("reference.logits")).unwrap();
        let (tokens, v) = (&reference.tokens, reference.n_vocab);
        let path = convert(name, Preset::F32, keep_dex);
        let cpu = logits_with(&mut CpuBackend::new(2), &path, tokens, 40, kt, vt, attn);
        let got = logits_with(&mut g, &path, tokens, 40, kt, vt, attn);
        let c = compare(&cpu, &got, v);
        eprintln!("{name:<18} K {kt} V {vt} logits {attn:?}: vs CPU KL {:.2e} top-1 {:.3}", c.mean_kl, c.top1);
        if c.mean_kl > 1e-5 || c.top1 < 0.95 {
            failures.push(format!("{name} K {kt} V {vt}"));
        }
        let _ = std::fs::remove_file(&path);
    }
    // DIFF V2 with its branches observed (each pair combined by its own kernel rather than
    // inside attention), and only the last position's logits (the last row copied out).
    let reference = LogitsFile::read(&fixture("diffllama-v2-gqa").join("reference.logits")).unwrap();
    let path = convert("diffllama-v2-gqa", Preset::F32, false);
    let cpu = last_logits_observing_branches(&mut CpuBackend::new(2), &path, &reference.tokens[..40]);
    let got = last_logits_observing_branches(&mut g, &path, &reference.tokens[..40]);
    let c = compare(&cpu, &got, reference.n_vocab);
    eprintln!("diffllama-v2-gqa   branches observed, last logits: vs CPU KL {:.2e} top-1 {:.3}", c.mean_kl, c.top1);
    if c.mean_kl > 1e-5 || c.top1 < 0.95 {
        failures.push("diffllama-v2-gqa, branches observed".into());
    }
    let _ = std::fs::remove_file(&path);
    assert!(failures.is_empty(), "outside the bounds: {failures:?}");
    let run = g.kernel_kinds_run();
    let missing: Vec<&str> = duet_shaders::PARAMS_STRUCTS.iter().copied().filter(|k| !run.contains(k)).collect();
    assert!(missing.is_empty(), "kernels no comparison with the CPU ran: {missing:?}");
}

/// The last position's logits of `tokens` in one batch, with an observer that wants every
/// layer's DIFF V2 branches (so that the model combines the pairs after attention).
fn last_logits_observing_branches<B: Backend>(b: &mut B, path: &Path, tokens: &[u32]) -> Vec<f32> {
    struct Branches;
    impl duet_runtime::observe::Observer for Branches {
        fn wants(&self, probe: duet_runtime::observe::Probe, _layer: usize) -> bool {
            probe == duet_runtime::observe::Probe::AttnBranches
        }
        fn observe(&mut self, _: duet_runtime::observe::Probe, _: usize, _: usize, _: &[f32], _: usize, _: usize) {}
    }
    let model = Model::load(b, Arc::new(GgufFile::open(path).unwrap())).unwrap();
    let mut s = model.new_session(b, 128, CacheFormat::F16, CacheFormat::F16).unwrap();
    let mut ctx = model.new_context(b, 64).unwrap();
    b.set_observer(Some(Box::new(Branches)));
    let out = model.decode_one(b, &mut ctx, &mut s, tokens, Logits::Last).unwrap();
    b.set_observer(None);
    out
}
