//! Helpers shared by the model-level tests (tests/model_logits.rs, tests/gpu_model.rs,
//! tests/reference_models.rs): checkpoints converted to temporary GGUFs, and the logit
//! comparison they all report.

// Each test binary includes this module and uses a different part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use duet_convert::{Conversion, Options, Preset, Quiet};
use duet_quant::gguf::GgufFile;
use duet_runtime::cpu::CpuBackend;
use duet_runtime::kv_cache::CacheFormat;
use duet_runtime::logits_file::{argmax, kl_divergence};
use duet_runtime::model::{Logits, Model};

/// Runs the `duet` binary with `args`.
pub fn duet(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_duet")).args(args).output().unwrap()
}

/// The stdout of a run that must succeed (its stderr in the panic otherwise).
pub fn ok(o: &std::process::Output) -> String {
    assert!(o.status.success(), "duet failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A temporary directory of this test binary, removed on drop.
pub struct TempDir(pub PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh directory named after this test binary, the process and `name`.
pub fn temp_dir(name: &str) -> TempDir {
    let d = std::env::temp_dir().join(format!("duet-{}-{}-{name}", env!("CARGO_CRATE_NAME"), std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    TempDir(d)
}

/// A committed fixture checkpoint (tests/fixtures/models/NAME).
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models").join(name)
}

/// Converts a fixture to a temporary file of its own: tests run in parallel and each
/// removes its files, so every call gets a fresh name.
pub fn convert(name: &str, preset: Preset, keep_dex: bool) -> PathBuf {
    convert_dir(&fixture(name), preset, keep_dex)
}

/// [`convert`] for any HF checkpoint directory.
pub fn convert_dir(dir: &Path, preset: Preset, keep_dex: bool) -> PathBuf {
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = std::env::temp_dir().join(format!(
        "duet-{}-{}-{call}-{name}-{}-{keep_dex}.gguf",
        env!("CARGO_CRATE_NAME"),
        std::process::id(),
        preset.name()
    ));
    let opts = Options {
        input: dir.to_path_buf(),
        preset,
        overrides: vec![],
        imatrix: None,
        keep_dex,
        threads: 2,
        name: None,
    };
    Conversion::prepare(&opts).unwrap().write(&out, 2, &Quiet).unwrap();
    out
}

/// The same GGUF with every tensor dequantized exactly to F32 (beside it, `.f32.gguf`;
/// DEX tensors, if any, stay unfolded as they are in `q`): the exact-arithmetic reference
/// for a quantized file.
pub fn dequantized(q: &Path) -> PathBuf {
    let f = q.with_extension("f32.gguf");
    let opts = Options {
        input: q.to_path_buf(),
        preset: Preset::F32,
        overrides: vec![],
        imatrix: None,
        keep_dex: true,
        threads: 2,
        name: None,
    };
    Conversion::prepare(&opts).unwrap().write(&f, 2, &Quiet).unwrap();
    f
}

/// What a converted checkpoint meets against transformers' float32 reference, for the
/// fixtures (tests/model_logits.rs, tests/gpu_model.rs) and the bundled reference models
/// (tests/reference_models.rs) alike: an F32 conversion within this of every logit…
pub const F32_BOUND: f32 = 1e-3;
/// …and a Q8_0 conversion within this mean KL divergence and at least this top-1 agreement.
pub const Q8_KL_BOUND: f64 = 5e-3;
pub const Q8_TOP1_BOUND: f64 = 0.9;

/// The CPU backend's logits of every position for `tokens` (`[n_tokens][n_vocab]`), fed
/// `batch` tokens at a time over an f32 K/V cache (transformers' reference keeps K and V
/// in float32; the f16 cache's rounding is tested separately).
pub fn cpu_logits(path: &Path, tokens: &[u32], batch: usize) -> Vec<f32> {
    cpu_logits_with(path, tokens, batch, duet_runtime::cpu::ActPrecision::default())
}

/// [`cpu_logits`] with the quantized products' activations in `acts`.
pub fn cpu_logits_with(path: &Path, tokens: &[u32], batch: usize, acts: duet_runtime::cpu::ActPrecision) -> Vec<f32> {
    let mut b = CpuBackend::new(2);
    b.set_act_precision(acts);
    logits_on(b, path, tokens, batch)
}

/// [`cpu_logits`] with every weight type multiplied by the packed kernel candidate `gemm`
/// (`CpuBackend::pin_gemm`).
#[allow(dead_code)]
pub fn cpu_logits_pinned(path: &Path, tokens: &[u32], batch: usize, gemm: &str) -> Vec<f32> {
    let mut b = CpuBackend::new(2);
    b.pin_gemm(gemm).unwrap();
    logits_on(b, path, tokens, batch)
}

fn logits_on(mut b: CpuBackend, path: &Path, tokens: &[u32], batch: usize) -> Vec<f32> {
    let file = std::sync::Arc::new(GgufFile::open(path).unwrap());
    let model = Model::load(&mut b, file).unwrap();
    let mut s = model.new_session(&mut b, tokens.len().max(1), CacheFormat::F32, CacheFormat::F32).unwrap();
    let mut ctx = model.new_context(&mut b, batch).unwrap();
    let mut out = Vec::new();
    for chunk in tokens.chunks(batch) {
        out.extend(model.decode_one(&mut b, &mut ctx, &mut s, chunk, Logits::All).unwrap());
    }
    out
}

/// How far `got` is from `reference`, both `[n_tokens][n_vocab]` logits.
pub struct Stats {
    pub max_abs: f32,
    pub mean_kl: f64,
    pub top1: f64,
}

pub fn compare(reference: &[f32], got: &[f32], n_vocab: usize) -> Stats {
    assert_eq!(reference.len(), got.len());
    let n = reference.len() / n_vocab;
    let (mut max_abs, mut kl, mut agree) = (0f32, 0f64, 0usize);
    for t in 0..n {
        let (r, g) = (&reference[t * n_vocab..(t + 1) * n_vocab], &got[t * n_vocab..(t + 1) * n_vocab]);
        for (&a, &b) in r.iter().zip(g) {
            assert!(b.is_finite(), "non-finite logit at position {t}");
            max_abs = max_abs.max((a - b).abs());
        }
        kl += kl_divergence(r, g);
        agree += usize::from(argmax(r) == argmax(g));
    }
    Stats { max_abs, mean_kl: kl / n as f64, top1: agree as f64 / n as f64 }
}

/// A copy of the GGUF `src` at `dst` with the metadata `changes` (key, value) in place of
/// the file's own values.
pub fn with_metadata(src: &Path, dst: &Path, changes: &[(&str, duet_quant::gguf::Value)]) {
    rewrite_gguf(src, dst, changes, None);
}

/// [`with_metadata`], and tensor `data.0`'s bytes replaced by `data.1`.
pub fn rewrite_gguf(src: &Path, dst: &Path, changes: &[(&str, duet_quant::gguf::Value)], data: Option<(&str, &[u8])>) {
    let f = duet_quant::gguf::GgufFile::open(src).unwrap();
    let mut w = duet_quant::gguf::GgufWriter::new(dst);
    for (k, v) in f.metadata() {
        let v = changes.iter().find(|(ck, _)| *ck == k).map_or_else(|| v.clone(), |(_, cv)| cv.clone());
        w.add(k, v).unwrap();
    }
    for t in f.tensors() {
        w.add_tensor(t.name(), t.dims(), t.ggml_type()).unwrap();
    }
    let mut d = w.start().unwrap();
    for t in f.tensors() {
        let bytes = match data {
            Some((name, b)) if name == t.name() => b,
            _ => f.tensor_data(t),
        };
        d.write_tensor(t.name(), bytes).unwrap();
    }
    d.finish().unwrap();
}
