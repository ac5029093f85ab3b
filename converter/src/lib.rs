//! duet-convert: Hugging Face DiffLlama / Llama / DEX checkpoints (and existing GGUFs) to
//! GGUF at 4, 6 and 8 bits, bit-exact with llama.cpp's quantizers.
//!
//! [`convert::Conversion::prepare`] reads and checks everything and plans each tensor's
//! type; [`convert::Conversion::write`] streams the tensors into the output file.

pub mod calibrate;
pub mod convert;
pub mod error;
pub mod hf_config;
pub mod imatrix;
pub mod mapping;
mod pipeline;
pub mod quant_plan;
mod quantize_rows;
pub mod safetensors;
pub mod sampling;
pub mod tokenizer;

pub use calibrate::CalibrateOptions;
pub use convert::{Conversion, Options, Progress, Quiet};
pub use error::ConvertError;
pub use quant_plan::{Override, Preset};
