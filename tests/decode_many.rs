//! `Model::decode_many` (one decode step for several sequences, their matrix products
//! batched) and `Model::forward_many` (steps that mix pieces of prompts with decoding
//! sequences, as `duet serve` runs them) against each sequence decoded alone with
//! `Model::forward`, on the CPU and on the GPU: three sequences of different prompt lengths,
//! each with its own cache types and run settings (f16; 4-bit K per channel + rotated V with
//! 4-bit attention logits; 8-bit blocks), greedy-decoded for 12 steps; then the same three
//! as slots of one shared cache (f16, and 4-bit K per channel + rotated V), as a server runs
//! them, where the CPU attends to all of them in one pass (`Backend::attention_spans`),
//! each still with its own logit setting. The tokens must be the same; the logits may differ
//! only by the order in which batched products sum (bound below).

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
use duet_runtime::model::{LogitGranularity, Logits, Model, Session};

use common::convert;
use duet_test_support::no_gpu;

/// K cache, V cache, attention-logit quantization.
type Settings = (CacheFormat, CacheFormat, Option<(u32, LogitGranularity)>);
/// Each sequence's.
const SETTINGS: [Settings; 3] = [
    (CacheFormat::F16, CacheFormat::F16, None),
    (CacheFormat::Q4c, CacheFormat::Q4r, Some((4, LogitGranularity::Row))),
    (CacheFormat::Q8, CacheFormat::Q8, None),
];
const STEPS: usize = 12;
/// F32 weights; a batched product may add the same terms in another order (the CPU's packed
/// kernels for several rows, the GPU's matmul instead of its matvec), f32 rounding only.
const BOUND: f32 = 1e-3;

fn prompts(n_vocab: u32) -> Vec<Vec<u32>> {
    [5usize, 17, 40]
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
    let mut s = m.new_session(b, 128, 64, kt, vt).unwrap();
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
                let mut all = m.new_sessions(b, n, 128, 64, kt, vt).unwrap();
                for (s, set) in all.iter_mut().zip(SETTINGS) {
                    m.set_logit_quant(s, set.2).unwrap();
                }
                all
            }
            Caches::Same(kt, vt) => {
                let (kt, vt) = resolved(m, kt, vt);
                m.new_sessions(b, n, 128, 64, kt, vt).unwrap()
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
            let mut logits = m.forward(b, &mut s, p, Logits::Last).unwrap();
            let (mut toks, mut all) = (Vec::new(), Vec::new());
            for _ in 0..STEPS {
                let t = argmax(&logits) as u32;
                toks.push(t);
                logits = m.forward(b, &mut s, &[t], Logits::Last).unwrap();
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
    let mut last: Vec<Vec<f32>> =
        sessions.iter_mut().zip(prompts).map(|(s, p)| m.forward(b, s, p, Logits::Last).unwrap()).collect();
    let mut batch = m.new_decode_batch(b, prompts.len());
    let mut out = vec![(Vec::new(), Vec::new()); prompts.len()];
    for _ in 0..STEPS {
        let toks: Vec<u32> = last.iter().map(|l| argmax(l) as u32).collect();
        let mut refs: Vec<&mut Session<B>> = sessions.iter_mut().collect();
        last = m.decode_many(b, &mut batch, &mut refs, &toks).unwrap();
        for (i, (t, l)) in toks.iter().zip(&last).enumerate() {
            out[i].0.push(*t);
            out[i].1.push(l.clone());
        }
    }
    out
}

/// Every step one forward_many over what each unfinished sequence feeds next: the next
/// piece of its prompt (4, 7 and 40 tokens at a time: the 40-token prompt goes in one piece
/// beside the others' pieces, the 17-token one in three) or, once its prompt is in, its
/// next greedy token, so that prompt pieces share steps with decoding sequences.
fn mixed<B: Backend>(b: &mut B, m: &Model<B>, prompts: &[Vec<u32>], caches: Caches) -> Vec<(Vec<u32>, Vec<Vec<f32>>)> {
    const PIECE: [usize; 3] = [4, 7, 40];
    let n = prompts.len();
    let mut sessions = caches.together(b, m, n);
    let mut batch = m.new_decode_batch(b, PIECE.iter().sum());
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
        let mut refs: Vec<&mut Session<B>> =
            sessions.iter_mut().enumerate().filter(|(i, _)| who.contains(i)).map(|(_, s)| s).collect();
        let views: Vec<&[u32]> = chunks.iter().map(Vec::as_slice).collect();
        let logits = m.forward_many(b, &mut batch, &mut refs, &views).unwrap();
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
        for (how, t) in [("decode_many", together(b, &m, &p, caches)), ("forward_many", mixed(b, &m, &p, caches))] {
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

/// Malformed steps are refused with a message, never a panic.
#[test]
fn forward_many_refuses_malformed_steps() {
    let path = convert("llama-gqa", Preset::F32, false);
    let b = &mut CpuBackend::new(2);
    let m = Model::load(b, Arc::new(GgufFile::open(&path).unwrap())).unwrap();
    let mut batch = m.new_decode_batch(b, 8);
    let (mut s0, mut s1) = (session(b, &m, 0), session(b, &m, 2));
    let cases: [(&[&[u32]], &str); 3] = [
        (&[&[1, 2], &[]], "none may be empty"),
        (&[&[1; 5], &[2; 5]], "a batch holds 1 to 8 tokens"),
        (&[&[1]], "1 chunks"),
    ];
    for (chunks, needle) in cases {
        let e = m.forward_many(b, &mut batch, &mut [&mut s0, &mut s1], chunks).unwrap_err().to_string();
        assert!(e.contains(needle), "{chunks:?}: {e}");
    }
    let mut wide = m.new_decode_batch(b, 100);
    let e = m.forward_many(b, &mut wide, &mut [&mut s0], &[&[1; 65]]).unwrap_err().to_string();
    assert!(e.contains("65 tokens for a session of batch 64"), "{e}");
    assert_eq!((s0.n_past, s1.n_past), (0, 0), "a refused step changes nothing");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn decode_many_matches_each_sequence_alone_on_the_cpu() {
    for fixture in ["diffllama-gqa", "llama-gqa", "diffllama-v2-gqa"] {
        let path = convert(fixture, Preset::F32, false);
        check(&mut CpuBackend::new(2), &path, &format!("{fixture} CPU"));
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn decode_many_matches_each_sequence_alone_on_the_gpu() {
    let mut gpu = match GpuBackend::new(&GpuOptions { f16: Some(false), ..Default::default() }) {
        Ok(g) => g,
        Err(e) => {
            return no_gpu(
                "decode_many_matches_each_sequence_alone_on_the_gpu",
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
/// them in one pass (attention_rows.rs), so that a decode step of three sequences records
/// one dispatch more than one of two (the copy of the third's last row for the logits),
/// where sequence by sequence each layer added seven (copies in and out, RoPE-and-write,
/// attend, combine).
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
        for n in [2usize, 3] {
            let mut sessions = m.new_sessions(b, n, 128, 64, CacheFormat::F16, CacheFormat::F16).unwrap();
            for (i, s) in sessions.iter_mut().enumerate() {
                m.forward(b, s, &[1, 2 + i as u32, 3], Logits::Last).unwrap();
            }
            let mut batch = m.new_decode_batch(b, n);
            let mut refs: Vec<&mut Session<GpuBackend>> = sessions.iter_mut().collect();
            let toks: Vec<u32> = (0..n as u32).map(|i| 5 + i).collect();
            // The first step sizes scratch buffers; the second is what every step records.
            m.decode_many(b, &mut batch, &mut refs, &toks).unwrap();
            let before = b.dispatches();
            m.decode_many(b, &mut batch, &mut refs, &toks).unwrap();
            step_dispatches.push(b.dispatches() - before);
        }
        assert_eq!(
            step_dispatches[1],
            step_dispatches[0] + 1,
            "{fixture}: dispatches of a decode step of 2 and of 3 slots: {step_dispatches:?}"
        );
        std::fs::remove_file(&path).unwrap();
    }
}
