//! duet-runtime: runs llama and diffllama GGUF models.
//!
//! * [`model`]: the one forward pass, written against [`backend::Backend`].
//! * [`cpu`]: the CPU backend (reference and fallback).
//! * [`gpu`]: the GPU backend on wgpu (Vulkan, Metal, DX12).
//! * [`kv_cache`], [`kv_pages`], [`logits_file`]: shared formats and the paged cache's
//!   bookkeeping.

pub mod attn_bench;
pub mod backend;
pub mod calibrate;
pub mod chat;
pub mod cpu;
pub mod engine;
pub mod error;
pub mod gpu;
pub mod insight;
pub mod kv_cache;
pub mod kv_pages;
pub mod logits_file;
pub mod mem_budget;
pub mod memory;
pub mod model;
pub mod model_config;
pub mod observe;
pub mod sampler;
pub mod serve;
pub mod text;

pub use error::RuntimeError;

// The unit tests budget memory as the program does.
#[cfg(test)]
#[global_allocator]
static ALLOC: mem_budget::BudgetAlloc = mem_budget::BudgetAlloc;
