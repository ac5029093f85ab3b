//! The serving engine (duet_runtime::tools::serve) without HTTP: requests through fewer slots than
//! requests give each the reply it gets alone, a client that goes away frees its slot at
//! once, the queue and the context limits refuse cleanly, stop strings end replies.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};

use duet_convert::Preset;
use duet_runtime::cpu::CpuBackend;
use duet_runtime::engine::{Engine, EngineOptions};
use duet_runtime::sampler::SamplerConfig;
use duet_runtime::tools::serve::scheduler::Scheduler;
use duet_runtime::tools::serve::{FinishReason, GenEvent, GenRequest, Prompt, SubmitError};

use common::convert;

fn scheduler(path: &Path, slots: usize, max_queue: usize) -> Scheduler<CpuBackend> {
    let opts = EngineOptions { n_ctx: 96, batch: 16, ..EngineOptions::default() };
    let engine = Engine::load(CpuBackend::new(2), path, &opts).unwrap();
    Scheduler::new(engine, slots, max_queue).unwrap()
}

type Events = Arc<Mutex<Vec<GenEvent>>>;

/// A greedy request whose events land in the returned list.
fn request(prompt: &str, max_tokens: usize, stop: &[&str]) -> (GenRequest, Events) {
    let events: Events = Arc::default();
    let sink_events = Arc::clone(&events);
    let req = GenRequest {
        prompt: Prompt::Text(prompt.into()),
        sampling: SamplerConfig::greedy(),
        max_tokens: Some(max_tokens),
        stop: stop.iter().map(|s| s.to_string()).collect(),
        ignore_eos: false,
        grammar: None,
        tools: None,
        logprobs: None,
        group: None,
        sink: Box::new(move |e| {
            sink_events.lock().unwrap().push(e);
            true
        }),
    };
    (req, events)
}

fn text(events: &Events) -> String {
    events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| if let GenEvent::Text(t) = e { Some(t.as_str()) } else { None })
        .collect()
}

fn done(events: &Events) -> Option<(FinishReason, usize, usize)> {
    events.lock().unwrap().iter().find_map(|e| match e {
        GenEvent::Done { finish, prompt_tokens, completion_tokens } => {
            Some((*finish, *prompt_tokens, *completion_tokens))
        }
        _ => None,
    })
}

fn run_to_idle<B: duet_runtime::backend::Backend>(s: &mut Scheduler<B>) {
    for _ in 0..10_000 {
        if s.idle() {
            return;
        }
        s.step();
    }
    panic!("the scheduler never became idle");
}

/// Submits a greedy request of 12 tokens per prompt, runs `s` until it is idle, and returns
/// each request's events.
fn submit_all<B: duet_runtime::backend::Backend>(s: &mut Scheduler<B>, prompts: &[&str]) -> Vec<Events> {
    let events = prompts
        .iter()
        .map(|p| {
            let (req, ev) = request(p, 12, &[]);
            s.submit(req).unwrap();
            ev
        })
        .collect();
    run_to_idle(s);
    events
}

/// A finished request's text and how it ended.
fn reply(ev: &Events) -> (String, (FinishReason, usize, usize)) {
    (text(ev), done(ev).expect("finished"))
}

const PROMPTS: [&str; 8] = [
    "Call me Ishmael.",
    "It was the best of times, it was the worst of times, it was the age of wisdom",
    "The",
    "In the beginning",
    "Whale",
    "A long prompt about the sea and the ships and the men who sail them across the water",
    "Q: what is two and two? A:",
    "zzz",
];

#[test]
fn eight_requests_through_three_slots_each_get_their_reply_alone() {
    let path = convert("llama-gqa", Preset::F32, false);
    let mut one = scheduler(&path, 1, 8);
    let alone: Vec<_> = PROMPTS.iter().map(|p| reply(&submit_all(&mut one, &[p])[0])).collect();
    assert!(alone.iter().filter(|(t, _)| !t.is_empty()).count() >= 6, "replies to compare: {alone:?}");
    let mut s = scheduler(&path, 3, 8);
    let together = submit_all(&mut s, &PROMPTS);
    for (i, ev) in together.iter().enumerate() {
        // The CPU computes a batched row exactly as a single one (tests/batch_decode.rs), so
        // greedy replies are identical.
        assert_eq!(reply(ev), alone[i], "prompt {i}: {:?}", PROMPTS[i]);
    }
    let m = s.metrics().lock().unwrap().clone();
    assert_eq!((m.requests_total, m.requests_finished, m.active, m.queue_length), (8, 8, 0, 0));
    let generated: usize = alone.iter().map(|(_, d)| d.2).sum();
    assert_eq!(m.generated_tokens_total as usize, generated);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_client_that_goes_away_frees_its_slot() {
    let path = convert("llama-gqa", Preset::F32, false);
    let mut s = scheduler(&path, 1, 8);
    let texts = Arc::new(Mutex::new(0));
    let seen = Arc::clone(&texts);
    let (mut req, _) = request(PROMPTS[0], 50, &[]);
    // Takes one piece of text, then hangs up.
    req.sink = Box::new(move |e| {
        let mut n = seen.lock().unwrap();
        *n += usize::from(matches!(e, GenEvent::Text(_)));
        *n < 2
    });
    s.submit(req).unwrap();
    let (next, next_events) = request(PROMPTS[1], 3, &[]);
    s.submit(next).unwrap();
    run_to_idle(&mut s);
    assert_eq!(*texts.lock().unwrap(), 2, "no text after the client went away");
    let m = s.metrics().lock().unwrap().clone();
    assert_eq!((m.requests_cancelled, m.requests_finished, m.active), (1, 1, 0));
    assert!(done(&next_events).is_some(), "the waiting request got the freed slot");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn queue_and_context_limits_refuse_and_stop_strings_end_replies() {
    let path = convert("llama-gqa", Preset::F32, false);
    // One slot and a queue of two: three requests fit (one will take the free slot), a
    // fourth is refused.
    let mut s = scheduler(&path, 1, 2);
    for _ in 0..3 {
        s.submit(request("The", 4, &[]).0).unwrap();
    }
    assert_eq!(s.submit(request("The", 4, &[]).0), Err(SubmitError::QueueFull { capacity: 2 }));
    // After a step one runs and two wait: still full.
    s.step();
    assert_eq!(s.submit(request("The", 4, &[]).0), Err(SubmitError::QueueFull { capacity: 2 }));
    assert_eq!(s.metrics().lock().unwrap().requests_rejected, 2);
    let long = "word ".repeat(200);
    match s.submit(request(&long, 4, &[]).0) {
        Err(SubmitError::TooLong { prompt_tokens, n_ctx: 96 }) => assert!(prompt_tokens >= 96),
        other => panic!("expected TooLong, got {other:?}"),
    }
    run_to_idle(&mut s);
    // A stop string: the reply without it equals the unstopped reply cut where it begins.
    let (req, full) = request(PROMPTS[0], 20, &[]);
    s.submit(req).unwrap();
    run_to_idle(&mut s);
    let full = text(&full);
    let stop: String = full.chars().skip(3).take(2).collect();
    assert!(!stop.is_empty(), "a reply long enough to cut: {full:?}");
    let (req, cut) = request(PROMPTS[0], 20, &[&stop]);
    s.submit(req).unwrap();
    run_to_idle(&mut s);
    assert_eq!(text(&cut), full[..full.find(&stop).unwrap()]);
    assert_eq!(done(&cut).unwrap().0, FinishReason::Stop);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_shared_prompt_prefix_is_evaluated_once_and_changes_nothing() {
    use duet_runtime::kv_cache::CacheFormat;
    let path = convert("llama-gqa", Preset::F32, false);
    let system = "You are a helpful assistant who answers questions about ships, whales and the sea. ";
    let (a, b) = (format!("{system}Where is the whale?"), format!("{system}What is a ship?"));
    for (kt, vt) in [(CacheFormat::F16, CacheFormat::F16), (CacheFormat::Q4c, CacheFormat::Q4)] {
        let opts = EngineOptions { n_ctx: 256, batch: 16, k_type: kt, v_type: vt, attn_logits: None };
        let new = || Scheduler::new(Engine::load(CpuBackend::new(2), &path, &opts).unwrap(), 1, 8).unwrap();
        // b alone, from an empty cache.
        let mut fresh = new();
        let (req, alone) = request(&b, 10, &[]);
        let b_tokens = fresh.submit(req).unwrap();
        run_to_idle(&mut fresh);
        // a, then b in the same slot: b's shared prefix is already cached.
        let mut s = new();
        s.submit(request(&a, 10, &[]).0).unwrap();
        run_to_idle(&mut s);
        let before = s.metrics().lock().unwrap().clone();
        let (req, reused) = request(&b, 10, &[]);
        s.submit(req).unwrap();
        run_to_idle(&mut s);
        let after = s.metrics().lock().unwrap().clone();
        let kept = (after.prompt_tokens_reused - before.prompt_tokens_reused) as usize;
        let evaluated = (after.prompt_tokens_total - before.prompt_tokens_total) as usize;
        // The f16 cache keeps the whole common prefix; the per-channel K cache whole groups
        // of 32 of it. Either way only the rest is evaluated.
        assert!(kept >= 32, "{kt}/{vt}: kept only {kept} of the shared prefix");
        assert_eq!(kept + evaluated, b_tokens, "{kt}/{vt}");
        assert_eq!(text(&reused), text(&alone), "{kt}/{vt}: reusing the prefix changed the reply");
        assert_eq!(done(&reused), done(&alone));
    }
    std::fs::remove_file(&path).unwrap();
}

/// Two requests sharing a system prompt admitted together after a third left it cached in
/// one slot: the second slot takes the prefix's whole pages from the first (held by both,
/// not evaluated again), and both reply as from an empty cache. On the CPU and, where there
/// is an adapter, on the GPU.
/// `duet serve --device gpu`: four requests in four slots of one f16 cache run as batches
/// of four decoding sequences (the GPU's one-pass attention over their page tables,
/// tests/batch_decode.rs) and prompts' pieces together, and each gets the greedy reply it
/// gets alone.
#[test]
fn four_requests_decoded_together_on_the_gpu_each_get_their_reply_alone() {
    let test = "four_requests_decoded_together_on_the_gpu_each_get_their_reply_alone";
    let gpu = || {
        duet_runtime::gpu::GpuBackend::new(&duet_runtime::gpu::GpuOptions { f16: Some(false), ..Default::default() })
    };
    if let Err(e) = gpu() {
        return duet_test_support::no_gpu(test, &e.to_string());
    }
    let path = convert("diffllama-gqa", Preset::F32, false);
    let opts = EngineOptions { n_ctx: 96, batch: 16, ..EngineOptions::default() };
    let new = |slots| Scheduler::new(Engine::load(gpu().unwrap(), &path, &opts).unwrap(), slots, 8).unwrap();
    let prompts = &PROMPTS[..4];
    let alone: Vec<_> = prompts.iter().map(|p| reply(&submit_all(&mut new(1), &[p])[0])).collect();
    assert!(alone.iter().filter(|(t, _)| !t.is_empty()).count() >= 3, "replies to compare: {alone:?}");
    let together = submit_all(&mut new(4), prompts);
    for (i, ev) in together.iter().enumerate() {
        assert_eq!(reply(ev), alone[i], "GPU, prompt {i}: {:?}", prompts[i]);
    }
    std::fs::remove_file(&path).unwrap();
}

fn shared_prefix_check<B: duet_runtime::backend::Backend>(make: &dyn Fn() -> B, what: &str) {
    use duet_runtime::kv_cache::CacheFormat;
    let path = convert("llama-gqa", Preset::F32, false);
    let system = "You are a helpful assistant who answers questions about ships, whales and the sea. ";
    let prompts =
        [format!("{system}Hello."), format!("{system}Where is the whale?"), format!("{system}What is a ship?")];
    for (kt, vt) in [(CacheFormat::F16, CacheFormat::F16), (CacheFormat::Q4c, CacheFormat::Q4)] {
        let opts = EngineOptions { n_ctx: 256, batch: 16, k_type: kt, v_type: vt, attn_logits: None };
        let new = |slots| Scheduler::new(Engine::load(make(), &path, &opts).unwrap(), slots, 8).unwrap();
        let alone: Vec<String> = prompts[1..]
            .iter()
            .map(|p| {
                let mut s = new(1);
                let (req, ev) = request(p, 10, &[]);
                s.submit(req).unwrap();
                run_to_idle(&mut s);
                text(&ev)
            })
            .collect();
        let mut s = new(2);
        s.submit(request(&prompts[0], 4, &[]).0).unwrap();
        run_to_idle(&mut s);
        let evs: Vec<Events> = prompts[1..]
            .iter()
            .map(|p| {
                let (req, ev) = request(p, 10, &[]);
                s.submit(req).unwrap();
                ev
            })
            .collect();
        run_to_idle(&mut s);
        let m = s.metrics().lock().unwrap().clone();
        assert!(m.prompt_tokens_shared >= 32, "{what} {kt}/{vt}: shared {}", m.prompt_tokens_shared);
        for (ev, want) in evs.iter().zip(&alone) {
            assert_eq!(&text(ev), want, "{what} {kt}/{vt}: a shared prefix changed the reply");
        }
    }
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_prefix_cached_in_another_slot_is_shared_not_evaluated() {
    shared_prefix_check(&|| CpuBackend::new(2), "CPU");
    let gpu = || {
        duet_runtime::gpu::GpuBackend::new(&duet_runtime::gpu::GpuOptions { f16: Some(false), ..Default::default() })
    };
    match gpu() {
        Ok(_) => shared_prefix_check(&|| gpu().unwrap(), "GPU"),
        Err(e) => duet_test_support::no_gpu("a_prefix_cached_in_another_slot_is_shared_not_evaluated", &e.to_string()),
    }
}

/// Sizes are checked before any tokenizing: a prompt longer than the context could hold
/// (64 bytes a token), a stop string over 1 KiB, more than 4 stop strings; each is refused
/// with its limit named, and nothing is queued.
#[test]
fn prompts_and_stop_strings_past_their_limits_are_refused_before_tokenizing() {
    let path = convert("llama-gqa", Preset::F32, false);
    let mut s = scheduler(&path, 1, 2);
    let limit = 96 * duet_runtime::tools::serve::prompt::PROMPT_BYTES_PER_TOKEN;
    let huge = "x".repeat(limit + 1);
    let e = s.submit(request(&huge, 4, &[]).0).unwrap_err().to_string();
    assert!(e.contains(&format!("the prompt is {} bytes, more than a context of 96 tokens holds", limit + 1)), "{e}");
    let long_stop = "s".repeat(1025);
    let e = s.submit(request("The", 4, &[&long_stop]).0).unwrap_err().to_string();
    assert!(e.contains("a stop string of 1025 bytes; duet takes at most 1024"), "{e}");
    let e = s.submit(request("The", 4, &["a", "b", "c", "d", "e"]).0).unwrap_err().to_string();
    assert!(e.contains("5 stop strings; duet takes at most 4"), "{e}");
    // At the limits, accepted.
    let stop = "s".repeat(1024);
    s.submit(request("The", 4, &[&stop, "b", "c", "d"]).0).unwrap();
    assert_eq!(s.metrics().lock().unwrap().requests_total, 1, "only the last was queued");
    run_to_idle(&mut s);
    std::fs::remove_file(&path).unwrap();
}

/// A model file whose tokenizer knows an id past its embedding's rows (here an added token
/// "<|beyond|>" with id n_vocab): a prompt that uses it is refused at submission, and a
/// request already running finishes its reply (before, the step failed every stream).
#[test]
fn a_token_outside_the_vocabulary_fails_only_its_request() {
    use duet_quant::gguf::{GgufFile, Value};
    let path = convert("llama-gqa", Preset::F32, false);
    let f = GgufFile::open(&path).unwrap();
    let n_vocab = f.tensor("token_embd.weight").unwrap().dims()[1];
    let Some(Value::String(json)) =
        f.metadata().find(|(k, _)| *k == "tokenizer.huggingface.json").map(|(_, v)| v.clone())
    else {
        panic!("the fixture carries tokenizer.huggingface.json")
    };
    let mut tok: serde_json::Value = serde_json::from_str(&json).unwrap();
    tok["added_tokens"].as_array_mut().unwrap().push(serde_json::json!({
        "id": n_vocab, "content": "<|beyond|>", "single_word": false, "lstrip": false, "rstrip": false,
        "normalized": false, "special": false
    }));
    let crafted = std::env::temp_dir().join(format!("duet-beyond-vocab-{}.gguf", std::process::id()));
    common::with_metadata(&path, &crafted, &[("tokenizer.huggingface.json", Value::from(tok.to_string().as_str()))]);
    let mut s = scheduler(&crafted, 2, 2);
    let (good, events) = request(PROMPTS[1], 8, &[]);
    s.submit(good).unwrap();
    s.step();
    let e = s.submit(request("The <|beyond|> sea", 4, &[]).0).unwrap_err().to_string();
    assert!(e.contains(&format!("token id {n_vocab}, outside its vocabulary of {n_vocab}")), "{e}");
    run_to_idle(&mut s);
    assert_eq!(done(&events).map(|d| d.2), Some(8), "the running request's reply: {:?}", events.lock().unwrap());
    std::fs::remove_file(&crafted).unwrap();
    std::fs::remove_file(&path).unwrap();
}

/// The `n` choices of one API request (one group, one prompt) share the prompt's cache
/// pages: the first evaluates it, the others are admitted once it is in the cache and take
/// its whole pages, so the prompt is evaluated about once, not `n` times; each choice still
/// gets the reply it gets alone.
#[test]
fn choices_of_one_group_share_the_prompt_pages() {
    let path = convert("llama-gqa", Preset::F32, false);
    let prompt =
        "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness";
    let mut alone = scheduler(&path, 3, 8);
    let (req, want) = request(prompt, 6, &[]);
    alone.submit(req).unwrap();
    run_to_idle(&mut alone);
    let prompt_len = done(&want).unwrap().1;
    assert!(prompt_len > duet_runtime::kv_pages::PAGE + 1, "a prompt of {prompt_len} tokens fills a page");

    let mut s = scheduler(&path, 3, 8);
    let events: Vec<Events> = (0..3)
        .map(|_| {
            let (mut req, ev) = request(prompt, 6, &[]);
            req.group = Some(7);
            s.submit(req).unwrap();
            ev
        })
        .collect();
    run_to_idle(&mut s);
    for ev in &events {
        assert_eq!(text(ev), text(&want));
    }
    let m = s.metrics();
    let m = m.lock().unwrap();
    let whole = (prompt_len - 1) / duet_runtime::kv_pages::PAGE * duet_runtime::kv_pages::PAGE;
    assert_eq!(m.prompt_tokens_shared, 2 * whole as u64, "each later choice takes the whole pages");
    assert_eq!(m.prompt_tokens_total, (prompt_len + 2 * (prompt_len - whole)) as u64);
}

/// The choices of one group with a grammar compile it once: the later ones fork the first's
/// compiled grammar, and each follows its own copy (three greedy choices give the reply a
/// request alone gets, which a shared, advancing parser would not).
#[test]
fn choices_of_one_group_compile_their_grammar_once() {
    let path = duet_test_support::repo_root().join("models/duet-diff-ref.q8_0.gguf");
    let spec = duet_runtime::grammar::GrammarSpec::JsonObject;
    let mut alone = scheduler(&path, 3, 8);
    let (mut req, want) = request("JSON:", 24, &[]);
    req.grammar = Some(spec.clone());
    alone.submit(req).unwrap();
    run_to_idle(&mut alone);
    assert!(text(&want).starts_with('{'), "{}", text(&want));

    let mut s = scheduler(&path, 3, 8);
    let grammars = s.encoder().grammars().clone();
    let events: Vec<Events> = (0..3)
        .map(|_| {
            let (mut req, ev) = request("JSON:", 24, &[]);
            req.grammar = Some(spec.clone());
            req.group = Some(11);
            s.submit(req).unwrap();
            ev
        })
        .collect();
    assert_eq!(grammars.compiled(), 1, "three choices of one group");
    run_to_idle(&mut s);
    for ev in &events {
        assert_eq!(text(ev), text(&want));
    }
    let (mut req, _) = request("JSON:", 4, &[]);
    req.grammar = Some(spec);
    s.submit(req).unwrap();
    assert_eq!(grammars.compiled(), 2, "a request of no group compiles its own");
}

/// Embeddings: unit length, the same whether the text runs in one step or in chunks of the
/// context, the same on the GPU (lavapipe in CI) as on the CPU, and evaluated beside a
/// running request without changing its reply.
#[test]
fn embeddings_are_unit_mean_pooled_states_whatever_the_steps() {
    let path = convert("llama-gqa", Preset::F32, false);
    let input = "Call me Ishmael. Some years ago, never mind how long precisely, having little money";
    let mut s = scheduler(&path, 2, 8);
    let tokens = {
        let opts = EngineOptions { n_ctx: 96, batch: 16, ..EngineOptions::default() };
        let e = Engine::load(CpuBackend::new(2), &path, &opts).unwrap();
        e.tokenizer.encode(input, e.tokenizer.add_bos).unwrap()
    };
    assert!(tokens.len() > 16, "more tokens than a step of 16: {}", tokens.len());
    // A request in flight while embedding.
    let (req, alone) = request("The", 8, &[]);
    s.submit(req).unwrap();
    s.step();
    let chunked = s.embed(&tokens).unwrap();
    run_to_idle(&mut s);
    let norm: f32 = chunked.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "{norm}");
    let mut quiet = scheduler(&path, 1, 8);
    let (req, want) = request("The", 8, &[]);
    quiet.submit(req).unwrap();
    run_to_idle(&mut quiet);
    assert_eq!(text(&alone), text(&want), "the request's reply is untouched");
    // One step for the whole text.
    let opts = EngineOptions { n_ctx: 96, batch: 96, ..EngineOptions::default() };
    let mut whole = Scheduler::new(Engine::load(CpuBackend::new(2), &path, &opts).unwrap(), 1, 8).unwrap();
    let one = whole.embed(&tokens).unwrap();
    let diff = chunked.iter().zip(&one).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(diff <= 1e-6, "chunked vs one step (measured: 0): {diff}");
    match duet_runtime::gpu::GpuBackend::new(&duet_runtime::gpu::GpuOptions { f16: Some(false), ..Default::default() })
    {
        Ok(g) => {
            let mut gpu = Scheduler::new(Engine::load(g, &path, &opts).unwrap(), 1, 8).unwrap();
            let on_gpu = gpu.embed(&tokens).unwrap();
            let cos: f32 = on_gpu.iter().zip(&one).map(|(a, b)| a * b).sum();
            assert!(1.0 - cos < 1e-5, "GPU vs CPU cosine {cos}");
        }
        Err(e) => {
            duet_test_support::no_gpu("embeddings_are_unit_mean_pooled_states_whatever_the_steps", &e.to_string())
        }
    }
    assert!(s.embed(&[u32::MAX]).is_err());
}

/// Log probabilities go out with their token's text: a stop string's tokens (whose text is
/// never sent) are not reported, so the reported tokens spell the start of the reply.
#[test]
fn logprobs_stop_where_a_stop_string_cuts_the_text() {
    let path = convert("llama-gqa", Preset::F32, false);
    let mut s = scheduler(&path, 1, 8);
    let (req, alone) = request("The", 16, &[]);
    s.submit(req).unwrap();
    run_to_idle(&mut s);
    let full = text(&alone);
    // A stop string from the middle of the reply.
    let mid = full.char_indices().map(|(i, _)| i).find(|&i| i >= full.len() / 2).unwrap_or(0);
    let stop: String = full[mid..].chars().take(2).collect();
    assert!(!stop.is_empty() && full.len() > 4, "a reply to cut: {full:?}");
    let (mut req, events) = request("The", 16, &[&stop]);
    req.logprobs = Some(2);
    s.submit(req).unwrap();
    run_to_idle(&mut s);
    let sent = text(&events);
    assert!(full.starts_with(&sent) && !sent.contains(&stop), "{sent:?} of {full:?}");
    let spelled: Vec<u8> = events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| if let GenEvent::Logprob(lp) = e { Some(lp.token.clone()) } else { None })
        .flatten()
        .collect();
    let spelled = String::from_utf8_lossy(&spelled).into_owned();
    assert!(sent.starts_with(&spelled), "reported tokens {spelled:?} beyond the text {sent:?}");
    assert!(sent.len() - spelled.len() < 16, "at most the cut token's text unreported: {spelled:?} / {sent:?}");
}
