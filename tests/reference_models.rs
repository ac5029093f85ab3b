//! The bundled reference models (models/, see models/README.md) against transformers.
//!
//! `models/reference_logits.py` wrote `models/{llama,diff,diffv2}-ref/reference.logits`:
//! transformers' logits (DIFF V2: `models/diff_v2.py`), float32 arithmetic on the stored bf16
//! weights, at every position of 64 held-out tokens. Here each checkpoint is converted by the
//! converter (F32, which holds bf16 exactly, and Q8_0) and run by the CPU backend, and the
//! committed chat model `models/duet-diff-ref.q8_0.gguf` is run as it is. The bounds are the
//! fixtures' of tests/model_logits.rs (the constants in tests/common): F32 within 1e-3 of
//! every logit; Q8_0 mean KL ≤ 5e-3 and top-1 agreement ≥ 90%.
//!
//! `DUET_REF_MODELS=DIR` checks another export (e.g. `OUT=DIR models/make_models.sh --preset
//! tiny`) instead of models/.

mod common;

use std::path::{Path, PathBuf};

use duet_convert::Preset;
use duet_runtime::logits_file::LogitsFile;
use duet_test_support::{missing_asset, repo_root};

use common::{F32_BOUND, Q8_KL_BOUND, Q8_TOP1_BOUND, Stats, compare, convert_dir, cpu_logits};

fn models_dir() -> PathBuf {
    std::env::var_os("DUET_REF_MODELS").map(PathBuf::from).unwrap_or_else(|| repo_root().join("models"))
}

/// The exported checkpoint `name` and its reference logits, or `None` after recording a skip.
fn reference(test: &str, name: &str) -> Option<(PathBuf, LogitsFile)> {
    let dir = models_dir().join(name);
    let logits = dir.join("reference.logits");
    if !dir.join("config.json").exists() || !logits.exists() {
        missing_asset(
            test,
            &format!("{} has no exported checkpoint with reference.logits (models/make_models.sh)", dir.display()),
        );
        return None;
    }
    let reference = LogitsFile::read(&logits).unwrap_or_else(|e| panic!("{}: {e}", logits.display()));
    Some((dir, reference))
}

fn measure(what: &str, gguf: &Path, reference: &LogitsFile) -> Stats {
    let got = cpu_logits(gguf, &reference.tokens, 64);
    let s = compare(&reference.logits, &got, reference.n_vocab);
    eprintln!("{what}: max|Δ| {:.2e}, mean KL {:.2e}, top-1 {:.3}", s.max_abs, s.mean_kl, s.top1);
    s
}

fn q8_within_bounds(what: &str, s: &Stats) {
    assert!(s.mean_kl <= Q8_KL_BOUND && s.top1 >= Q8_TOP1_BOUND, "{what}: mean KL {} top-1 {}", s.mean_kl, s.top1);
}

#[test]
fn conversions_match_transformers() {
    for name in ["llama-ref", "diff-ref", "diffv2-ref"] {
        let Some((dir, reference)) = reference("conversions_match_transformers", name) else { continue };
        let f32 = convert_dir(&dir, Preset::F32, false);
        let s = measure(&format!("{name} F32"), &f32, &reference);
        std::fs::remove_file(&f32).unwrap();
        assert!(s.max_abs <= F32_BOUND, "{name} F32: max |Δ| {} > {F32_BOUND}", s.max_abs);

        let q8 = convert_dir(&dir, Preset::Q8_0, false);
        let s = measure(&format!("{name} Q8_0"), &q8, &reference);
        std::fs::remove_file(&q8).unwrap();
        q8_within_bounds(&format!("{name} Q8_0"), &s);
    }
}

#[test]
fn bundled_chat_model_matches_transformers() {
    let test = "bundled_chat_model_matches_transformers";
    let Some((_, reference)) = reference(test, "diff-ref") else { return };
    let gguf = models_dir().join("duet-diff-ref.q8_0.gguf");
    if !gguf.exists() {
        missing_asset(test, &format!("{} not built (models/make_models.sh)", gguf.display()));
        return;
    }
    let s = measure("duet-diff-ref.q8_0.gguf", &gguf, &reference);
    q8_within_bounds("duet-diff-ref.q8_0.gguf", &s);
}
