//! Fixture helpers shared by the model-level tests (tests/model_logits.rs,
//! tests/gpu_model.rs): the committed fixtures, converted to temporary GGUFs.

use std::path::{Path, PathBuf};

use duet_convert::{Conversion, Options, Preset, Quiet};

/// A committed fixture checkpoint (tests/fixtures/models/NAME).
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models").join(name)
}

/// Converts a fixture to a temporary file of its own: tests run in parallel and each
/// removes its files, so every call gets a fresh name.
pub fn convert(name: &str, preset: Preset, keep_dex: bool) -> PathBuf {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = std::env::temp_dir().join(format!(
        "duet-{}-{}-{call}-{name}-{}-{keep_dex}.gguf",
        env!("CARGO_CRATE_NAME"),
        std::process::id(),
        preset.name()
    ));
    let opts =
        Options { input: fixture(name), preset, overrides: vec![], imatrix: None, keep_dex, threads: 2, name: None };
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
