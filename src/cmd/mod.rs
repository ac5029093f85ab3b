//! One module per subcommand.

pub mod attn_bench;
pub mod attn_map;
pub mod bench;
pub mod bench_kernels;
pub mod chat;
pub mod common;
pub mod convert;
pub mod environment;
pub mod info;
pub mod needle;
pub mod perplexity;
pub mod run;
pub mod serve;
pub mod web;
