//! `Model::decode` of batches of several sequences against each sequence decoded alone (a
//! batch of one), on the CPU and on the GPU. Four sequences of different prompt lengths,
//! each with its own cache types and run settings (f16; 4-bit K per channel and rotated V
//! with 4-bit attention logits; 8-bit blocks; 6-bit K blocks and f32 V), greedy-decoded for
//! 12 steps: their prompts as one batch (through a context of 24 rows a step, so that it
//! runs as several steps, a prompt split across two), then one decoded token each per
//! batch; and batches that mix pieces of prompts with decoding sequences, as `duet serve`
//! runs them. Then the same four as slots of one shared cache (f16, and 4-bit K per channel
//! with rotated V), as a server runs them, attended in one `Backend::attention` call over
//! their spans, each still with its own logit setting. The tokens must be the same; the
//! logits may differ only by the order in which batched products sum (bound below).
//!
//! (The slots of one per-channel K cache take their prompts in one step: a group completed
//! inside a step is read quantized by that step's earlier rows, so such a cache's contents
//! depend on how a prompt is split.)

mod common;

use std::path::Path;
use std::sync::Arc;

use duet_convert::Preset;
use duet_quant::gguf::GgufFile;
use duet_runtime::backend::Backend;
use duet_runtime::cpu::CpuBackend;
use duet_runtime::gpu::{GpuBackend, GpuOptions};
use duet_runtime::kv_cache::CacheFormat;
use duet_runtime::logits_file::argmax;
use duet_runtime::model::{Batch, BatchContext, LogitGranularity, Logits, Model, Session};

use common::convert;
use duet_test_support::no_gpu;

/// K cache, V cache, attention-logit quantization.
type Settings = (CacheFormat, CacheFormat, Option<(u32, LogitGranularity)>);
/// Each sequence's.
const SETTINGS: [Settings; 4] = [
    (CacheFormat::F16, CacheFormat::F16, None),
    (CacheFormat::Q4c, CacheFormat::Q4r, Some((4, LogitGranularity::Row))),
    (CacheFormat::Q8, CacheFormat::Q8, None),
    (CacheFormat::Q6, CacheFormat::F32, None),
];
const STEPS: usize = 12;
/// F32 weights; a batched product may add the same terms in another order (the CPU's packed
/// kernels for several rows, the GPU's matmul instead of its matvec), f32 rounding only.
const BOUND: f32 = 1e-3;

fn prompts(n_vocab: u32) -> Vec<Vec<u32>> {
    [5usize, 17, 40, 9]
        .iter()
        .enumerate()
        .map(|(s, &len)| (0..len as u32).map(|i| (i * 31 + 7 * s as u32 + 3) % n_vocab).collect())
        .collect()
}

fn session<B: Backend>(b: &mut B, m: &Model<B>, i: usize) -> Session<B> {
    let (kt, vt, lq) = SETTINGS[i];
    session_of(b, m, kt, vt, lq)
}

fn session_of<B: Backend>(
    b: &mut B,
    m: &Model<B>,
    kt: CacheFormat,
    vt: CacheFormat,
    lq: Option<(u32, LogitGranularity)>,
) -> Session<B> {
    let (kt, vt) = resolved(m, kt, vt);
    let mut s = m.new_session(b, 128, kt, vt).unwrap();
    m.set_logit_quant(&mut s, lq).unwrap();
    s
}

/// The cache types a session of this model gets for (kt, vt): a format the model's head size
/// cannot use becomes the nearest one that it can.
fn resolved<B: Backend>(m: &Model<B>, kt: CacheFormat, vt: CacheFormat) -> (CacheFormat, CacheFormat) {
    let mut spec = m.cache_spec(128, kt, vt);
    spec.resolve();
    (spec.k_type, spec.v_type)
}

/// Where each sequence keeps its K/V: a cache of its own with its SETTINGS, or slots of one
/// cache of the given types (with SETTINGS' logit quantization; `Same`: none for any, so
/// that every sequence's attention is the same and the GPU too attends to all in one pass).
#[derive(Clone, Copy, Debug)]
enum Caches {
    Own,
    One(CacheFormat, CacheFormat),
    Same(CacheFormat, CacheFormat),
}

impl Caches {
    /// One session per sequence, each for running alone: always a cache of its own.
    fn alone<B: Backend>(self, b: &mut B, m: &Model<B>, i: usize) -> Session<B> {
        match self {
            Caches::Own => session(b, m, i),
            Caches::One(kt, vt) => session_of(b, m, kt, vt, SETTINGS[i].2),
            Caches::Same(kt, vt) => session_of(b, m, kt, vt, None),
        }
    }

    /// The sessions that run together.
    fn together<B: Backend>(self, b: &mut B, m: &Model<B>, n: usize) -> Vec<Session<B>> {
        match self {
            Caches::Own => (0..n).map(|i| session(b, m, i)).collect(),
            Caches::One(kt, vt) => {
                let (kt, vt) = resolved(m, kt, vt);
                let mut all = m.new_sessions(b, n, 128, kt, vt).unwrap();
                for (s, set) in all.iter_mut().zip(SETTINGS) {
                    m.set_logit_quant(s, set.2).unwrap();
                }
                all
            }
            Caches::Same(kt, vt) => {
                let (kt, vt) = resolved(m, kt, vt);
                m.new_sessions(b, n, 128, kt, vt).unwrap()
            }
        }
    }
}

/// Greedy continuations and their logits, each sequence alone.
fn alone<B: Backend>(b: &mut B, m: &Model<B>, prompts: &[Vec<u32>], caches: Caches) -> Vec<(Vec<u32>, Vec<Vec<f32>>)> {
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut s = caches.alone(b, m, i);
            let mut ctx = m.new_context(b, 64).unwrap();
            let mut logits = m.decode_one(b, &mut ctx, &mut s, p, Logits::Last).unwrap();
            let (mut toks, mut all) = (Vec::new(), Vec::new());
            for _ in 0..STEPS {
                let t = argmax(&logits) as u32;
                toks.push(t);
                logits = m.decode_one(b, &mut ctx, &mut s, &[t], Logits::Last).unwrap();
                all.push(logits.clone());
            }
            (toks, all)
        })
        .collect()
}

/// The same, the decode steps of all sequences together.
fn together<B: Backend>(
    b: &mut B,
    m: &Model<B>,
    prompts: &[Vec<u32>],
    caches: Caches,
) -> Vec<(Vec<u32>, Vec<Vec<f32>>)> {
    let mut sessions = caches.together(b, m, prompts.len());
    let split = !matches!(caches, Caches::One(CacheFormat::Q4c, _));
    let mut ctx = m.new_context(b, if split { 24 } else { 80 }).unwrap();
    let mut batch = Batch::new();
    for (s, p) in sessions.iter_mut().zip(prompts) {
        batch.push(s, p, Logits::Last);
    }
    let mut last = m.decode(b, &mut ctx, batch).unwrap();
    let mut out = vec![(Vec::new(), Vec::new()); prompts.len()];
    for _ in 0..STEPS {
        let toks: Vec<u32> = last.iter().map(|l| argmax(l) as u32).collect();
        last = m.decode(b, &mut ctx, one_token_each(&mut sessions, &toks)).unwrap();
        for (i, (t, l)) in toks.iter().zip(&last).enumerate() {
            out[i].0.push(*t);
            out[i].1.push(l.clone());
        }
    }
    out
}

/// A batch of `toks[i]` continuing `sessions[i]`, each wanting its logits.
fn one_token_each<'s, 't, B: Backend>(sessions: &'s mut [Session<B>], toks: &'t [u32]) -> Batch<'s, 't, B> {
    let mut batch = Batch::new();
    for (s, t) in sessions.iter_mut().zip(toks) {
        batch.push(s, std::slice::from_ref(t), Logits::Last);
    }
    batch
}

/// Every batch holds what each unfinished sequence feeds next: the next piece of its prompt
/// (4, 7, 40 and 9 tokens at a time: the 40- and 9-token prompts in one piece beside the
/// others' pieces, the 17-token one in three) or, once its prompt is in, its next greedy
/// token, so that prompt pieces share steps with decoding sequences. (The 9-token prompt
/// goes in whole, as alone: on the GPU a 9-row product rounds V apart from 3-row ones by an
/// ulp, which a 4-bit rotated V cache can turn into a different level, 3e-2 in a logit.)
fn mixed<B: Backend>(b: &mut B, m: &Model<B>, prompts: &[Vec<u32>], caches: Caches) -> Vec<(Vec<u32>, Vec<Vec<f32>>)> {
    const PIECE: [usize; 4] = [4, 7, 40, 9];
    let n = prompts.len();
    let mut sessions = caches.together(b, m, n);
    let mut ctx: BatchContext<B> = m.new_context(b, PIECE.iter().sum()).unwrap();
    let (mut fed, mut next) = (vec![0usize; n], vec![0u32; n]);
    let mut out = vec![(Vec::new(), Vec::new()); n];
    while out.iter().any(|o| o.0.len() < STEPS) {
        let mut who = Vec::new();
        let mut chunks: Vec<Vec<u32>> = Vec::new();
        for i in 0..n {
            if fed[i] < prompts[i].len() {
                let end = (fed[i] + PIECE[i]).min(prompts[i].len());
                chunks.push(prompts[i][fed[i]..end].to_vec());
                fed[i] = end;
                who.push(i);
            } else if out[i].0.len() < STEPS {
                out[i].0.push(next[i]);
                chunks.push(vec![next[i]]);
                who.push(i);
            }
        }
        let mut batch = Batch::new();
        let fed_now = sessions.iter_mut().enumerate().filter(|(i, _)| who.contains(i));
        for ((_, s), chunk) in fed_now.zip(&chunks) {
            batch.push(s, chunk, Logits::Last);
        }
        let logits = m.decode(b, &mut ctx, batch).unwrap();
        for (&i, l) in who.iter().zip(logits) {
            next[i] = argmax(&l) as u32;
            // The logits after a prompt's last piece pick the first token; later ones are
            // those `alone` records after each fed token.
            if !out[i].0.is_empty() {
                out[i].1.push(l);
            }
        }
    }
    out
}

fn check<B: Backend>(b: &mut B, path: &Path, what: &str) {
    let m = Model::load(b, Arc::new(GgufFile::open(path).unwrap())).unwrap();
    let p = prompts(m.config.n_vocab as u32);
    let all = [
        Caches::Own,
        Caches::One(CacheFormat::F16, CacheFormat::F16),
        Caches::One(CacheFormat::Q4c, CacheFormat::Q4r),
        Caches::Same(CacheFormat::F16, CacheFormat::F16),
    ];
    for caches in all {
        let a = alone(b, &m, &p, caches);
        for (how, t) in [("one token each", together(b, &m, &p, caches)), ("mixed", mixed(b, &m, &p, caches))] {
            let how = format!("{how}, {caches:?} caches");
            for (i, ((ta, la), (tt, lt))) in a.iter().zip(&t).enumerate() {
                assert_eq!(ta, tt, "{what}, {how}: sequence {i} ({:?}) decodes other tokens when batched", SETTINGS[i]);
                assert_eq!(la.len(), lt.len(), "{what}, {how}: sequence {i}: logits of every step");
                let worst = la.iter().flatten().zip(lt.iter().flatten()).fold(0f32, |w, (x, y)| w.max((x - y).abs()));
                eprintln!("{what}, {how}: sequence {i}: max |Δlogit| {worst:.2e}");
                assert!(worst <= BOUND, "{what}, {how}: sequence {i}: batched logits differ by {worst}");
            }
        }
    }
}

/// Malformed batches are refused with a message, never a panic, before anything runs.
#[test]
fn decode_refuses_malformed_batches() {
    let path = convert("llama-gqa", Preset::F32, false);
    let b = &mut CpuBackend::new(2);
    let m = Model::load(b, Arc::new(GgufFile::open(&path).unwrap())).unwrap();
    let mut ctx = m.new_context(b, 8).unwrap();
    let (mut s0, mut s1) = (session(b, &m, 0), session(b, &m, 2));
    let n_vocab = m.config.n_vocab as u32;
    let long = vec![1u32; 129];
    let cases: [(&[u32], &[u32], &str); 3] =
        [(&[1, 2], &[], "empty"), (&[1, 2], &[n_vocab], "outside the vocabulary"), (&[1], &long, "129")];
    for (t0, t1, needle) in cases {
        let mut batch = Batch::new();
        batch.push(&mut s0, t0, Logits::Last);
        batch.push(&mut s1, t1, Logits::All);
        let e = m.decode(b, &mut ctx, batch).unwrap_err().to_string();
        assert!(e.contains(needle), "{t0:?}, {t1:?}: {e}");
    }
    let e = m.decode(b, &mut ctx, Batch::new()).unwrap_err().to_string();
    assert!(e.contains("empty"), "{e}");
    assert_eq!((s0.n_past, s1.n_past), (0, 0), "a refused batch changes nothing");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn batch_of_four_matches_each_sequence_alone_on_the_cpu() {
    for fixture in ["diffllama-gqa", "llama-gqa", "diffllama-v2-gqa"] {
        let path = convert(fixture, Preset::F32, false);
        check(&mut CpuBackend::new(2), &path, &format!("{fixture} CPU"));
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn batch_of_four_matches_each_sequence_alone_on_the_gpu() {
    let mut gpu = match GpuBackend::new(&GpuOptions { f16: Some(false), ..Default::default() }) {
        Ok(g) => g,
        Err(e) => {
            return no_gpu(
                "batch_of_four_matches_each_sequence_alone_on_the_gpu",
                &format!("no usable GPU adapter ({e})"),
            );
        }
    };
    for fixture in ["diffllama-gqa", "llama-gqa", "diffllama-v2-gqa"] {
        let path = convert(fixture, Preset::F32, false);
        check(&mut gpu, &path, &format!("{fixture} GPU"));
        std::fs::remove_file(&path).unwrap();
    }
}

/// Slots of one plain cache with the same attention settings: the GPU attends to all of
/// them in one pass (attention_rows.rs), so that a decode step of four sequences records as
/// many dispatches as one of two (every row wants logits: nothing is gathered), where
/// sequence by sequence each layer added seven (copies in and out, RoPE-and-write, attend,
/// combine).
#[test]
fn gpu_decode_of_several_slots_attends_in_one_pass() {
    let mut gpu = match GpuBackend::new(&GpuOptions { f16: Some(false), ..Default::default() }) {
        Ok(g) => g,
        Err(e) => {
            return no_gpu("gpu_decode_of_several_slots_attends_in_one_pass", &format!("no usable GPU adapter ({e})"));
        }
    };
    let b = &mut gpu;
    for fixture in ["diffllama-gqa", "llama-gqa"] {
        let path = convert(fixture, Preset::F32, false);
        let m = Model::load(b, Arc::new(GgufFile::open(&path).unwrap())).unwrap();
        let mut step_dispatches = Vec::new();
        for n in [2usize, 4] {
            let mut sessions = m.new_sessions(b, n, 128, CacheFormat::F16, CacheFormat::F16).unwrap();
            let mut ctx = m.new_context(b, 8).unwrap();
            for (i, s) in sessions.iter_mut().enumerate() {
                m.decode_one(b, &mut ctx, s, &[1, 2 + i as u32, 3], Logits::Last).unwrap();
            }
            let toks: Vec<u32> = (0..n as u32).map(|i| 5 + i).collect();
            // The first step sizes scratch buffers; the second is what every step records.
            m.decode(b, &mut ctx, one_token_each(&mut sessions, &toks)).unwrap();
            let before = b.dispatches();
            m.decode(b, &mut ctx, one_token_each(&mut sessions, &toks)).unwrap();
            step_dispatches.push(b.dispatches() - before);
        }
        assert_eq!(
            step_dispatches[1], step_dispatches[0],
            "{fixture}: dispatches of a decode step of 2 and of 4 slots: {step_dispatches:?}"
        );
        std::fs::remove_file(&path).unwrap();
    }
}
