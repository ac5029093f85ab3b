//! The tools built on the runtime's core: each uses the model, the backends and the text
//! pipeline, and nothing in the core uses them (`tests/layout.rs` checks that the core names
//! no tool).
//!
//! * [`serve`]: the multi-sequence engine behind `duet serve` (no HTTP: that is the CLI's).
//! * [`chat`]: a multi-turn conversation within the context window (`duet chat`).
//! * [`embed`]: text embeddings (`/v1/embeddings`).
//! * [`calibrate`]: activation statistics for the converter's `--calibrate`.
//! * [`attn_bench`]: the accuracy of low-bit attention (`duet attn-bench`).
//! * [`insight`]: attention maps and the needle test (`duet attn-map`, `duet needle`).

pub mod attn_bench;
pub mod calibrate;
pub mod chat;
pub mod embed;
pub mod insight;
pub mod serve;
