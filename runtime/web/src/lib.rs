//! duet in a web browser: the runtime's GPU path on the page's WebGPU adapter (wgpu's
//! `webgpu` backend), built for wasm32-unknown-unknown and bound to JavaScript with
//! wasm-bindgen. `duet web` serves it with a chat page (runtime/web/page/).
//!
//! The page hands [`load`] a reader of a GGUF file's stream (a fetch's body, or a local
//! file's), which loads the model tensor by tensor as the bytes arrive, holding about one
//! layer of the file at a time (`duet_runtime::model::source::Streamed`); [`Duet::start`] evaluates
//! a prompt and [`Duet::next`] produces one token at a time (sampled as
//! [`Duet::set_sampling`] says; greedy at temperature 0), each awaiting its
//! logits' readback — in a browser a readback completes only once the page's event loop has
//! run, which is why the model's step is an async fn (`Model::decode_async`). Native builds
//! of this crate are empty.
#![cfg(all(target_arch = "wasm32", target_os = "unknown"))]

use std::cell::RefCell;

/// Counts the bytes a model's chat template holds while it renders, so that a template that
/// doubles a string stops the runtime at its budget (`mem_budget::run_with_budget`).
#[global_allocator]
static ALLOC: duet_runtime::mem_budget::BudgetAlloc = duet_runtime::mem_budget::BudgetAlloc;

use duet_runtime::RuntimeError;
use duet_runtime::backend::Backend;
use duet_runtime::engine::{Engine, EngineOptions, check_logits};
use duet_runtime::gpu::{GpuBackend, GpuOptions};
use duet_runtime::kv_cache::CacheFormat;
use duet_runtime::model::source::{ChunkReader, Streamed};
use duet_runtime::sampler::{Sampler, SamplerConfig, SamplingHints};
use duet_runtime::text::{Message, TextStream};
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = console, js_name = error)]
    fn console_error(s: &str);
}

/// A panic (a bug: bad input is an error, never a panic) is written to the console with its
/// message instead of wasm's bare "unreachable".
#[wasm_bindgen(start)]
fn start() {
    std::panic::set_hook(Box::new(|info| console_error(&format!("duet panicked: {info}"))));
}

/// A loaded model on the page's GPU, and the reply being generated.
#[wasm_bindgen]
pub struct Duet {
    engine: RefCell<Engine<GpuBackend>>,
    reply: RefCell<Reply>,
    /// How replies are sampled: llama.cpp's defaults with the model's recommendations
    /// (`general.sampling.*`), as `duet chat` starts; [`Duet::set_sampling`] changes it.
    sampling: RefCell<SamplerConfig>,
    adapter: String,
    notes: Vec<String>,
}

/// One reply's state between calls of [`Duet::next`].
#[derive(Default)]
struct Reply {
    sampler: Option<Sampler>,
    logits: Vec<f32>,
    history: Vec<u32>,
    generated: Vec<u32>,
    stream: TextStream,
    left: usize,
    done: bool,
}

fn js_err(e: impl std::fmt::Display) -> JsError {
    JsError::new(&e.to_string())
}

/// A call made while a reply's step holds the model (the page awaits each call in turn).
fn busy() -> JsError {
    js_err("a reply is being generated")
}

/// The page's reader of a file's bytes: `read()` resolves to the next chunk (a Uint8Array),
/// or to `undefined` at the end.
struct JsReader {
    read: js_sys::Function,
    label: String,
}

impl JsReader {
    fn err(&self, e: JsValue) -> RuntimeError {
        let why = e.as_string().or_else(|| e.dyn_ref::<js_sys::Error>().map(|e| String::from(e.message())));
        RuntimeError::BadModel(format!(
            "{}: reading it failed: {}",
            self.label,
            why.unwrap_or_else(|| format!("{e:?}"))
        ))
    }
}

impl ChunkReader for JsReader {
    async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, RuntimeError> {
        let promise = self.read.call0(&JsValue::NULL).map_err(|e| self.err(e))?;
        let v = JsFuture::from(js_sys::Promise::resolve(&promise)).await.map_err(|e| self.err(e))?;
        if v.is_undefined() || v.is_null() {
            return Ok(None);
        }
        let chunk =
            v.dyn_into::<js_sys::Uint8Array>().map_err(|_| self.err(JsValue::from_str("a chunk is not bytes")))?;
        Ok(Some(chunk.to_vec()))
    }
}

/// Loads the GGUF file of `size` bytes that `read` streams (named `name` in messages) onto
/// the page's WebGPU adapter, tensor by tensor as its bytes arrive, with a context of `n_ctx`
/// tokens (0: the model's training context, at most 4,096) and its K and V caches in the
/// formats named `cache_k` and `cache_v` (`duet run`'s `--ctk`/`--ctv` names: f16, q8c,
/// q4c, q4r, q3c, q3r, …). `max_binding` (0: the adapter's) caps the bytes bound at once, as
/// a smaller adapter would.
#[wasm_bindgen]
pub async fn load(
    read: js_sys::Function,
    size: f64,
    name: String,
    n_ctx: u32,
    cache_k: String,
    cache_v: String,
    max_binding: f64,
) -> Result<Duet, JsError> {
    let cache = |n: &str| {
        CacheFormat::parse(n).ok_or_else(|| js_err(format!("unknown K/V cache type '{n}': use {}", CacheFormat::NAMES)))
    };
    let (k_type, v_type) = (cache(&cache_k)?, cache(&cache_v)?);
    if !(size.is_finite() && size >= 0.0) {
        return Err(js_err(format!("{name}: its size ({size}) is not a byte count")));
    }
    let reader = JsReader { read, label: name.clone() };
    // The header first: a file that is not GGUF is refused before the GPU is set up.
    let mut src = Streamed::open(reader, size as u64, &name).await.map_err(js_err)?;
    let gpu = GpuOptions { max_binding: (max_binding > 0.0).then_some(max_binding as u64), ..GpuOptions::default() };
    let backend = GpuBackend::new_async(&gpu).await.map_err(js_err)?;
    let adapter = backend.describe();
    let opts = EngineOptions { n_ctx: n_ctx as usize, k_type, v_type, ..EngineOptions::default() };
    let engine = Engine::from_source(backend, &mut src, &opts).await.map_err(js_err)?;
    let notes = engine.notes.clone();
    let sampling = SamplingHints::from_gguf(&engine.model.file).map_err(js_err)?.apply(SamplerConfig::default());
    Ok(Duet {
        engine: RefCell::new(engine),
        reply: RefCell::default(),
        sampling: RefCell::new(sampling),
        adapter,
        notes,
    })
}

#[wasm_bindgen]
impl Duet {
    /// The adapter's name, backend and type.
    pub fn adapter(&self) -> String {
        self.adapter.clone()
    }

    /// What loading changed from the defaults, and why (one line each).
    pub fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }

    /// The next replies' sampling: `temperature` (0: greedy), `top_k` (0: off), `top_p` (1:
    /// off), `min_p` (0: off), and the random numbers' `seed`.
    pub fn set_sampling(&self, temperature: f32, top_k: u32, top_p: f32, min_p: f32, seed: u32) -> Result<(), JsError> {
        if !(temperature >= 0.0 && temperature.is_finite()) {
            return Err(js_err(format!("the temperature must be 0 (greedy) or more, not {temperature}")));
        }
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(js_err(format!("top-p must be above 0 and at most 1, not {top_p}")));
        }
        if !(0.0..=1.0).contains(&min_p) {
            return Err(js_err(format!("min-p must be between 0 and 1, not {min_p}")));
        }
        let mut s = self.sampling.try_borrow_mut().map_err(|_| busy())?;
        *s = SamplerConfig { temperature, top_k: top_k as usize, top_p, min_p, seed: seed.into(), ..*s };
        Ok(())
    }

    /// The sampling's temperature, top-k, top-p and min-p (the page shows the model's).
    pub fn sampling(&self) -> Result<Vec<f32>, JsError> {
        let s = self.sampling.try_borrow().map_err(|_| busy())?;
        Ok(vec![s.temperature, s.top_k as f32, s.top_p, s.min_p])
    }

    /// The context's length in tokens.
    pub fn n_ctx(&self) -> Result<usize, JsError> {
        Ok(self.engine.try_borrow().map_err(|_| busy())?.n_ctx())
    }

    /// Evaluates `prompt` (plain text, BOS first where the model's tokenizer asks for it)
    /// for a reply of at most `max_new` tokens; returns the prompt's token count. The cache
    /// keeps the longest prefix shared with the last prompt and reply.
    pub async fn start(&self, prompt: String, max_new: usize) -> Result<usize, JsError> {
        let mut engine = self.engine.try_borrow_mut().map_err(|_| busy())?;
        let tokens = engine.tokenizer.encode(&prompt, engine.tokenizer.add_bos).map_err(js_err)?;
        self.begin(&mut engine, tokens, max_new).await
    }

    /// The tokens of a conversation (`roles[i]` says `contents[i]`) rendered with the model's
    /// chat template and the assistant's turn opened, as `duet chat` renders them; then
    /// [`Duet::start_tokens`]. Synchronous, so that a template stopped at its memory budget
    /// (a trap of the runtime) is an exception of this call that the page catches.
    pub fn chat_tokens(&self, roles: Vec<String>, contents: Vec<String>) -> Result<Vec<u32>, JsError> {
        let engine = self.engine.try_borrow().map_err(|_| busy())?;
        if roles.len() != contents.len() {
            return Err(js_err("chat_tokens takes a role for each message"));
        }
        let messages: Vec<Message> = roles.iter().zip(&contents).map(|(r, c)| Message::new(r, c)).collect();
        let text = engine.template.render(&messages, true).map_err(js_err)?;
        engine.tokenizer.encode_rendered(&text).map_err(js_err)
    }

    /// [`Duet::start`] for tokens already made ([`Duet::chat_tokens`]).
    pub async fn start_tokens(&self, tokens: Vec<u32>, max_new: usize) -> Result<usize, JsError> {
        // (The model refuses an id outside its vocabulary.)
        let mut engine = self.engine.try_borrow_mut().map_err(|_| busy())?;
        self.begin(&mut engine, tokens, max_new).await
    }

    /// Whether the model's chat template parsed ([`Duet::chat_tokens`] needs it; a model
    /// without one gets ChatML or plain `User:`/`Assistant:` lines, as `duet chat` does).
    pub fn can_chat(&self) -> Result<bool, JsError> {
        Ok(self.engine.try_borrow().map_err(|_| busy())?.template.broken.is_none())
    }
}

impl Duet {
    /// Evaluates a reply's prompt (keeping the cached prefix); its token count.
    async fn begin(&self, engine: &mut Engine<GpuBackend>, tokens: Vec<u32>, max_new: usize) -> Result<usize, JsError> {
        // A reply needs a position after the prompt.
        if tokens.len() >= engine.n_ctx() {
            return Err(js_err(format!(
                "the prompt is {} tokens, and the context holds {}: shorten it (or start a new conversation)",
                tokens.len(),
                engine.n_ctx()
            )));
        }
        let (logits, _) = engine.prefill_async(&tokens).await.map_err(js_err)?;
        let n = tokens.len();
        let sampler = Sampler::new(self.sampling.try_borrow().map_err(|_| busy())?.clone());
        *self.reply.borrow_mut() =
            Reply { sampler: Some(sampler), logits, history: tokens, left: max_new, ..Reply::default() };
        Ok(n)
    }
}

#[wasm_bindgen]
impl Duet {
    /// The next piece of the reply's text (possibly empty while a character is incomplete),
    /// or `undefined` once the reply has ended: an end-of-generation token, `max_new` tokens,
    /// or a full context.
    pub async fn next(&self) -> Result<Option<String>, JsError> {
        let mut engine = self.engine.try_borrow_mut().map_err(|_| busy())?;
        let mut reply = self.reply.try_borrow_mut().map_err(|_| busy())?;
        let r = &mut *reply;
        if r.done {
            return Ok(None);
        }
        if r.left == 0 || engine.session.n_past >= engine.n_ctx() {
            r.done = true;
            return r.stream.flush(&engine.tokenizer).map(Some).map_err(js_err);
        }
        check_logits(&r.logits, r.generated.len()).map_err(js_err)?;
        let tok = match &mut r.sampler {
            Some(sampler) => sampler.sample(&mut r.logits, &r.history),
            None => return Err(js_err("no reply was started")),
        };
        r.left -= 1;
        if engine.tokenizer.is_eog(tok) {
            r.done = true;
            return r.stream.flush(&engine.tokenizer).map(Some).map_err(js_err);
        }
        r.generated.push(tok);
        r.history.push(tok);
        let text = r.stream.push(&engine.tokenizer, tok).map_err(js_err)?;
        if r.left > 0 && engine.session.n_past < engine.n_ctx() {
            match engine.step_async(tok).await {
                Ok(l) => r.logits = l,
                Err(e) => {
                    // The logits are those of the token before: the reply cannot go on.
                    r.done = true;
                    return Err(js_err(e));
                }
            }
        }
        Ok(Some(text))
    }

    /// The reply's token ids so far.
    pub fn tokens(&self) -> Result<Vec<u32>, JsError> {
        Ok(self.reply.try_borrow().map_err(|_| busy())?.generated.clone())
    }
}
