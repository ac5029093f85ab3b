//! `Model::decode_many` (one decode step for several sequences, their matrix products
//! batched) against each sequence decoded alone with `Model::forward`, on the CPU and on the
//! GPU: three sequences of different prompt lengths, each with its own cache types and run
//! settings (f16; 4-bit K per channel + rotated V with 4-bit attention logits; 8-bit blocks),
//! greedy-decoded for 12 steps. The tokens must be the same; the logits may differ only by
//! the order in which batched products sum (bound below).

mod common;

use std::path::Path;
use std::sync::Arc;

use duet_convert::Preset;
use duet_quant::gguf::GgufFile;
use duet_runtime::backend::Backend;
use duet_runtime::cpu::CpuBackend;
use duet_runtime::gpu::{GpuBackend, GpuOptions};
use duet_runtime::kv_cache::CacheType;
use duet_runtime::logits_file::argmax;
use duet_runtime::model::{LogitGranularity, Logits, Model, Session};

use common::convert;
use duet_test_support::no_gpu;

/// K cache, V cache, attention-logit quantization.
type Settings = (CacheType, CacheType, Option<(u32, LogitGranularity)>);
/// Each sequence's.
const SETTINGS: [Settings; 3] = [
    (CacheType::F16, CacheType::F16, None),
    (CacheType::Q4c, CacheType::Q4r, Some((4, LogitGranularity::Row))),
    (CacheType::Q8, CacheType::Q8, None),
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
    // A format the model's head size cannot use becomes the nearest one that it can.
    let mut spec = m.cache_spec(128, kt, vt);
    spec.resolve();
    let mut s = m.new_session(b, 128, 64, spec.k_type, spec.v_type).unwrap();
    m.set_logit_quant(&mut s, lq).unwrap();
    s
}

/// Greedy continuations and their logits, each sequence alone.
fn alone<B: Backend>(b: &mut B, m: &Model<B>, prompts: &[Vec<u32>]) -> Vec<(Vec<u32>, Vec<Vec<f32>>)> {
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut s = session(b, m, i);
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
fn together<B: Backend>(b: &mut B, m: &Model<B>, prompts: &[Vec<u32>]) -> Vec<(Vec<u32>, Vec<Vec<f32>>)> {
    let mut sessions: Vec<Session<B>> = (0..prompts.len()).map(|i| session(b, m, i)).collect();
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

fn check<B: Backend>(b: &mut B, path: &Path, what: &str) {
    let m = Model::load(b, Arc::new(GgufFile::open(path).unwrap())).unwrap();
    let p = prompts(m.config.n_vocab as u32);
    let (a, t) = (alone(b, &m, &p), together(b, &m, &p));
    for (i, ((ta, la), (tt, lt))) in a.iter().zip(&t).enumerate() {
        assert_eq!(ta, tt, "{what}: sequence {i} ({:?}) decodes other tokens when batched", SETTINGS[i]);
        let worst = la.iter().flatten().zip(lt.iter().flatten()).fold(0f32, |w, (x, y)| w.max((x - y).abs()));
        eprintln!("{what}: sequence {i}: max |Δlogit| {worst:.2e}");
        assert!(worst <= BOUND, "{what}: sequence {i}: batched logits differ by {worst}");
    }
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
