//! Every K/V cache type end to end on the fixture models (CPU backend): what a cache holds
//! does not depend on how the tokens were batched, more bits lose less, a chat that reuses
//! a cached prefix gets the logits a fresh evaluation gets (per-channel caches keep only
//! whole quantized groups), and the command line names the valid types and says which it
//! used instead when a model's head size rules one out.

mod common;

use std::path::Path;
use std::sync::Arc;

use duet_convert::Preset;
use duet_quant::gguf::GgufFile;
use duet_runtime::cpu::{CpuBackend, Placement};
use duet_runtime::engine::{Engine, EngineOptions};
use duet_runtime::kv_cache::{CacheFormat, CacheLayout};
use duet_runtime::logits_file::{LogitsFile, kl_divergence};
use duet_runtime::model::{Logits, Model};

use common::{convert, fixture};

/// Logits of every position of `tokens` fed `batch` at a time over a cache of `k`/`v`, and
/// what the cache then holds in layer 0 (its K and V rows as attention reads them: the
/// later layers' inputs depend on the attention above them), and the K type used (a type
/// the model's heads cannot use resolves to another).
fn logits(
    path: &Path,
    tokens: &[u32],
    batch: usize,
    k: CacheFormat,
    v: CacheFormat,
) -> (Vec<f32>, Vec<Vec<f32>>, CacheFormat) {
    let file = Arc::new(GgufFile::open(path).unwrap());
    let mut b = CpuBackend::new(2);
    let model = Model::load(&mut b, file).unwrap();
    let mut spec = model.cache_spec(tokens.len(), k, v);
    spec.resolve();
    let mut s = model.new_session(&mut b, tokens.len(), spec.k_type, spec.v_type).unwrap();
    let mut ctx = model.new_context(&mut b, batch).unwrap();
    let mut out = Vec::new();
    for chunk in tokens.chunks(batch) {
        out.extend(model.decode_one(&mut b, &mut ctx, &mut s, chunk, Logits::All).unwrap());
    }
    let at = Placement::new(s.pages(), tokens.len());
    let cache = s.lock_cache();
    let held = [&cache.kv.k[0], &cache.kv.v[0]].iter().map(|rows| rows.dequantized(&at, spec.kv_dim)).collect();
    drop(cache);
    (out, held, spec.k_type)
}

fn mean_kl(a: &[f32], b: &[f32], n_vocab: usize) -> f64 {
    let n = a.len() / n_vocab;
    (0..n).map(|t| kl_divergence(&a[t * n_vocab..(t + 1) * n_vocab], &b[t * n_vocab..(t + 1) * n_vocab])).sum::<f64>()
        / n as f64
}

/// The 64-token reference prompt through every cache type (K and V alike), in one batch
/// and in batches of 7: the first layer's cache ends up holding the same values (each row,
/// or each group of 32 from its f16 values, is quantized the same whatever the batching); the
/// per-row types also give the same logits (a per-channel type's query reads its own
/// group from the f16 window only while the group is incomplete, so one batch, which
/// completes the groups first, sees more quantized keys); and within each family, more
/// bits, less divergence from the f32 cache.
#[test]
fn cache_types_are_batch_independent_and_ordered_by_bits() {
    for m in ["diffllama-gqa", "llama-gqa"] {
        let reference = LogitsFile::read(&fixture(m).join("reference.logits")).unwrap();
        let gguf = convert(m, Preset::F32, false);
        let tokens = &reference.tokens;
        let (exact, _, _) = logits(&gguf, tokens, 64, CacheFormat::F32, CacheFormat::F32);
        let mut kls = Vec::new();
        for &ty in CacheFormat::QUANTIZED {
            let (batched, held_batched, used) = logits(&gguf, tokens, 64, ty, ty);
            let (stepped, held_stepped, _) = logits(&gguf, tokens, 7, ty, ty);
            let held = held_batched.iter().flatten().zip(held_stepped.iter().flatten());
            let held_diff = held.fold(0f32, |a, (x, y)| a.max((x - y).abs()));
            // The stored rows come from activations whose batching changes f32 summation
            // order only.
            assert!(held_diff <= 1e-3, "{m} {ty}: cache contents differ by {held_diff}");
            if !matches!(ty.layout(), CacheLayout::Channel(_)) {
                let diff = batched.iter().zip(&stepped).fold(0f32, |a, (x, y)| a.max((x - y).abs()));
                assert!(diff <= 1e-4, "{m} {ty}: batches of 7 differ from one batch by {diff}");
            }
            let kl = mean_kl(&exact, &batched, reference.n_vocab);
            eprintln!("{m} {ty}: mean KL to the f32 cache {kl:.3e}");
            // A type resolved to one already measured (llama-gqa's heads cannot be rotated:
            // q*r are q8/q6/q4 there, q3r and q2r both q4) is not compared again.
            if !kls.iter().any(|&(_, t, _)| t == used) {
                kls.push((std::mem::discriminant(&used.layout()), used, kl));
            }
        }
        // QUANTIZED lists each family by falling bits.
        for w in kls.windows(2) {
            let ((fa, ta, ka), (fb, tb, kb)) = (w[0], w[1]);
            assert!(fa != fb || ka < kb, "{m}: KL {ta} {ka:.3e}, {tb} {kb:.3e}");
        }
        std::fs::remove_file(&gguf).unwrap();
    }
}

/// A conversation that goes back into a quantized group: the engine keeps only the whole
/// groups before it, evaluates the rest again, and ends with the logits a fresh engine
/// computes for the same tokens.
#[test]
fn prefix_reuse_into_a_quantized_group_matches_a_fresh_evaluation() {
    let reference = LogitsFile::read(&fixture("diffllama-gqa").join("reference.logits")).unwrap();
    let gguf = convert("diffllama-gqa", Preset::F32, false);
    let opts =
        EngineOptions { n_ctx: 128, batch: 16, k_type: CacheFormat::Q4c, v_type: CacheFormat::Q4r, attn_logits: None };
    let first: Vec<u32> = reference.tokens[..64].to_vec();
    // The same first 40 tokens, then different ones: position 40 lies in the second group
    // of 32, which the first prompt completed and quantized.
    let mut second: Vec<u32> = reference.tokens[..40].to_vec();
    second.extend(reference.tokens[50..64].iter().rev());

    let mut reused = Engine::load(CpuBackend::new(2), &gguf, &opts).unwrap();
    assert!(reused.notes.is_empty(), "{:?}", reused.notes);
    reused.prefill(&first).unwrap();
    let (got, kept) = reused.prefill(&second).unwrap();
    assert_eq!(kept, 32, "kept the first whole group only");

    let mut fresh = Engine::load(CpuBackend::new(2), &gguf, &opts).unwrap();
    let (want, _) = fresh.prefill(&second).unwrap();
    let diff = got.iter().zip(&want).fold(0f32, |a, (x, y)| a.max((x - y).abs()));
    assert!(diff <= 1e-5, "reused prefix differs from a fresh evaluation by {diff}");

    // Within the f16 window (positions 32..54 now) the cut is exact: 45 of the 54.
    let third: Vec<u32> = second[..45].iter().chain(&reference.tokens[..3]).copied().collect();
    let (_, kept) = reused.prefill(&third).unwrap();
    assert_eq!(kept, 45);
    std::fs::remove_file(&gguf).unwrap();
}

fn duet(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_duet")).args(args).output().unwrap()
}

#[test]
fn unknown_cache_types_are_refused_with_the_valid_names() {
    let out = duet(&["run", "-m", "missing.gguf", "-p", "x", "--cache-type-k", "q5"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown cache type 'q5'"), "{err}");
    for name in ["f16", "q8", "q4r", "q4c", "q6c"] {
        assert!(err.contains(name), "{name} missing from: {err}");
    }
}

/// llama-gqa has heads of 16 (K/V rows of 32 values): q4r's blocks of 64 do not fit, so it
/// runs q4 and says so; q4c fits.
#[test]
fn a_type_the_head_size_rules_out_falls_back_and_says_so() {
    let gguf = convert("llama-gqa", Preset::F32, false);
    let p = gguf.to_str().unwrap();
    let out = duet(&[
        "run",
        "-m",
        p,
        "--device",
        "cpu",
        "-p",
        "Hello",
        "-n",
        "2",
        "--temp",
        "0",
        "--cache-type-k",
        "q4c",
        "--cache-type-v",
        "q4r",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("warning: a q4r V cache stores rows in blocks of 64 values, but this model's K/V rows have 32: using q4 instead"),
        "{err}"
    );
    assert!(!err.contains("q4c K cache"), "{err}");
    std::fs::remove_file(&gguf).unwrap();
}
