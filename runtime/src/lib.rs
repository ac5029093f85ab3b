//! duet-runtime: runs llama and diffllama GGUF models.
//!
//! * [`model`]: the one forward pass, written against [`backend::Backend`].
//! * [`cpu`]: the CPU backend (reference and fallback).
//! * `gpu`: the GPU backend on wgpu (Vulkan, Metal, DX12), with the default feature `gpu`.
//! * [`kv_cache`], [`kv_pages`], [`logits_file`]: shared formats and the paged cache's
//!   bookkeeping.
//! * [`text`]: tokenizer, chat templates, streamed text; [`sampler`]; [`engine`]: one
//!   model with its tokenizer and a session, generating.
//! * [`observe`]: what a backend shows besides results (probes, kernel times).
//!
//! Everything above is the core. [`tools`] (serve, chat, calibration, attn-bench, insight)
//! sit on it; the core imports none of them.

pub mod backend;
pub mod cpu;
pub mod engine;
pub mod error;
pub mod gguf_names;
pub mod grammar;
#[cfg(feature = "gpu")]
pub mod gpu;
pub mod kv_cache;
pub mod kv_pages;
pub mod logits_file;
pub mod mem_budget;
pub mod memory;
pub mod model;
pub mod model_config;
pub mod observe;
pub mod ready;
pub mod sampler;
pub mod text;
pub mod tools;

pub use error::RuntimeError;

// The unit tests budget memory as the program does.
#[cfg(test)]
#[global_allocator]
static ALLOC: mem_budget::BudgetAlloc = mem_budget::BudgetAlloc;
