//! The paged K/V cache shared by sessions (`Model::new_sessions`), on the CPU and on the GPU,
//! for every cache type: a session whose prefix pages another session holds
//! (`Session::share_prefix`) and a session whose pages are scattered over the cache (pages
//! freed by an ended session, taken in between by others) give the logits of a session with
//! a cache of its own, fed the same batches; pages go back when sessions truncate or end,
//! and freed pages are taken again.

mod common;

use std::path::Path;
use std::sync::Arc;

use duet_convert::Preset;
use duet_quant::gguf::GgufFile;
use duet_runtime::backend::Backend;
use duet_runtime::cpu::CpuBackend;
use duet_runtime::gpu::{GpuBackend, GpuOptions};
use duet_runtime::kv_cache::CacheFormat;
use duet_runtime::model::{Logits, Model, Session};

use common::convert;
use duet_test_support::no_gpu;

const N_CTX: usize = 128;
const BATCH: usize = 64;

/// Token `i` of prompt `seed` (prompts with equal seeds below `from` agree there).
fn prompt(n_vocab: u32, len: usize, seed: u32, from: usize) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 31 + if i as usize >= from { seed * 7 } else { 0 } + 3) % n_vocab).collect()
}

/// Logits of every position of `batches` fed in turn.
fn feed<B: Backend>(b: &mut B, m: &Model<B>, s: &mut Session<B>, batches: &[&[u32]]) -> Vec<f32> {
    let mut ctx = m.new_context(b, BATCH).unwrap();
    batches.iter().flat_map(|t| m.decode_one(b, &mut ctx, s, t, Logits::All).unwrap()).collect()
}

fn pages_in_use<B: Backend>(s: &Session<B>) -> usize {
    s.lock_cache().pool.pages_in_use()
}

/// Equal up to f32 noise: the same batches see the same arithmetic, only where the rows sit
/// in the cache differs, so the results should agree to the last bit; 1e-6 relative allows
/// for a backend that sums a different number of cache runs.
fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{what} [{i}]: {a} vs {b}");
    }
}

fn check<B: Backend>(b: &mut B, path: &Path, what: &str) {
    let m = Model::load(b, Arc::new(GgufFile::open(path).unwrap())).unwrap();
    let n_vocab = m.config.n_vocab as u32;
    // p and q agree on their first 70 tokens.
    let (p, q) = (prompt(n_vocab, 70, 1, 70), prompt(n_vocab, 90, 2, 70));
    for ty in CacheFormat::ALL {
        let mut spec = m.cache_spec(N_CTX, ty, ty);
        spec.resolve();
        let (kt, vt) = (spec.k_type, spec.v_type);
        let what = format!("{what} {kt}/{vt}");
        // Cold runs, each in a cache of its own.
        let cold = |b: &mut B, batches: &[&[u32]]| {
            let mut s = m.new_session(b, N_CTX, kt, vt).unwrap();
            feed(b, &m, &mut s, batches)
        };
        let cold_q = cold(b, &[&q[..64], &q[64..]]);
        let cold_r = cold(b, &[&p[..20], &p[20..50]]);
        let cold_c = cold(b, &[&q[..40]]);

        let mut s = m.new_sessions(b, 3, N_CTX, kt, vt).unwrap();
        let (first, rest) = s.split_at_mut(1);
        let (a, bb) = (&mut first[0], &mut rest[0]);
        // a: p, in batches of 64 and 6: pages 0, 1, 2.
        feed(b, &m, a, &[&p[..64], &p[64..]]);
        assert_eq!(a.pages().pages, [0, 1, 2], "{what}");
        assert_eq!(pages_in_use(a), 3);
        // bb takes a's two full pages of the common prefix (70 → 64 positions) and evaluates
        // the rest of q: what a cold run of q in the same batches gives.
        assert_eq!(bb.share_prefix(a, 70).unwrap(), 64, "{what}");
        assert_eq!(bb.pages().pages, [0, 1]);
        // The first page's sink (a per-channel cache's f16 position 0) goes with it.
        assert_eq!(bb.pages().sink, a.pages().sink, "{what}: the shared first page's sink");
        assert_eq!(pages_in_use(a), 3, "{what}: shared pages are held once");
        let shared = feed(b, &m, bb, &[&q[64..]]);
        assert_close(&shared, &cold_q[64 * n_vocab as usize..], &format!("{what}: shared prefix"));
        assert_eq!(bb.pages().pages, [0, 1, 3], "{what}");
        // Truncating bb into a shared page leaves that page whole to a: bb keeps 32
        // positions (a per-channel cache would too: its group 1 is quantized).
        assert_eq!(bb.truncate(40), 32, "{what}");
        assert_eq!(pages_in_use(a), 3, "{what}: bb's page 3 went back, a still holds 1");
        drop(s.remove(1));
        assert_eq!(pages_in_use(&s[0]), 3, "{what}: bb's end leaves a's pages");
        // a ends: every page goes back, and another sequence gets them again.
        drop(s.remove(0));
        let mut c = s.remove(0);
        assert_eq!(pages_in_use(&c), 0, "{what}: every page back");
        let reused = feed(b, &m, &mut c, &[&q[..40]]);
        assert_eq!(c.pages().pages, [0, 1], "{what}: freed pages are taken again");
        // Its first page's sink was a's: rewritten before it is read.
        assert_close(&reused, &cold_c, &format!("{what}: reused pages and sink"));
        assert_eq!(c.truncate(0), 0);
        assert_eq!(pages_in_use(&c), 0, "{what}");
        drop(c);
        // In a cache of two sequences, y's pages come out interleaved with x's.
        let mut more = m.new_sessions(b, 2, N_CTX, kt, vt).unwrap();
        let (x, y) = more.split_at_mut(1);
        let (x, y) = (&mut x[0], &mut y[0]);
        feed(b, &m, x, &[&q[..10]]);
        let got = feed(b, &m, y, &[&p[..20]]);
        feed(b, &m, x, &[&q[10..40]]);
        let got2 = feed(b, &m, y, &[&p[20..50]]);
        assert_eq!(y.pages().pages, [1, 3], "{what}: pages out of order");
        assert_ne!(x.pages().sink, y.pages().sink, "{what}: a sink each");
        let scattered: Vec<f32> = got.into_iter().chain(got2).collect();
        assert_close(&scattered, &cold_r, &format!("{what}: scattered pages"));
    }
}

#[test]
fn paged_cache_shares_prefixes_and_reuses_pages_cpu() {
    let path = convert("llama-gqa", Preset::F32, false);
    check(&mut CpuBackend::new(2), &path, "CPU");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn paged_cache_shares_prefixes_and_reuses_pages_gpu() {
    let mut b = match GpuBackend::new(&GpuOptions { f16: Some(false), ..Default::default() }) {
        Ok(b) => b,
        Err(e) => return no_gpu("paged_cache_shares_prefixes_and_reuses_pages_gpu", &e.to_string()),
    };
    let path = convert("llama-gqa", Preset::F32, false);
    check(&mut b, &path, "GPU");
    std::fs::remove_file(&path).unwrap();
}
