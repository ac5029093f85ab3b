//! Conversion errors. Every message names the file (or tensor) and the problem in words a
//! user can act on.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: {msg}", path.display())]
    Missing { path: PathBuf, msg: String },
    #[error("{}: {msg}", path.display())]
    Corrupt { path: PathBuf, msg: String },
    #[error("{}: {msg}", path.display())]
    Config { path: PathBuf, msg: String },
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    Shape(String),
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Gguf(#[from] duet_quant::gguf::GgufError),
    #[error("quantizing '{tensor}': {source}")]
    Quant { tensor: String, source: duet_quant::QuantError },
}

impl ConvertError {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        ConvertError::Io { path: path.to_path_buf(), source }
    }
    pub fn missing(path: &Path, msg: impl Into<String>) -> Self {
        ConvertError::Missing { path: path.to_path_buf(), msg: msg.into() }
    }
    pub fn corrupt(path: &Path, msg: impl Into<String>) -> Self {
        ConvertError::Corrupt { path: path.to_path_buf(), msg: msg.into() }
    }
    pub fn config(path: &Path, msg: impl Into<String>) -> Self {
        ConvertError::Config { path: path.to_path_buf(), msg: msg.into() }
    }
    pub fn unsupported(msg: impl Into<String>) -> Self {
        ConvertError::Unsupported(msg.into())
    }
    pub fn shape(msg: impl Into<String>) -> Self {
        ConvertError::Shape(msg.into())
    }
}
