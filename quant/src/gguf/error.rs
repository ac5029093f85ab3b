//! The one error type of the GGUF reader and writer.

use std::fmt;

use crate::GgmlType;

/// A GGUF failure: which file, where in it (a key or a tensor, when known) and what.
///
/// `Display` reads `model.gguf: tensor 'blk.0.attn_q.weight': data (offset 4096 + 1048576
/// bytes) ends past the end of the file (1000000 bytes)`. Match on [`GgufError::kind`] to
/// tell failures apart.
#[derive(Debug)]
pub struct GgufError {
    file: String,
    context: Option<String>,
    kind: GgufErrorKind,
}

impl GgufError {
    pub(crate) fn new(file: impl Into<String>, context: Option<String>, kind: GgufErrorKind) -> Self {
        GgufError { file: file.into(), context, kind }
    }

    /// The path (or a label such as `<memory>`) of the file concerned.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// The key or tensor the failure concerns, as printed (e.g. `tensor 'output.weight'`).
    pub fn context(&self) -> Option<&str> {
        self.context.as_deref()
    }

    pub fn kind(&self) -> &GgufErrorKind {
        &self.kind
    }

    pub fn into_kind(self) -> GgufErrorKind {
        self.kind
    }
}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.context {
            Some(ctx) => write!(f, "{}: {}: {}", self.file, ctx, self.kind),
            None => write!(f, "{}: {}", self.file, self.kind),
        }
    }
}

impl std::error::Error for GgufError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.kind)
    }
}

/// What went wrong. Offsets and sizes are in bytes from the start of the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufErrorKind {
    #[error("{action}: {source}")]
    Io {
        action: String,
        #[source]
        source: std::io::Error,
    },

    #[error("truncated: {what} ({needed} bytes at offset {offset}) runs past the end of the file ({file_size} bytes)")]
    Truncated { what: &'static str, offset: u64, needed: u64, file_size: u64 },

    #[error("the stream holds more than the {announced} bytes announced for it")]
    LongerThanAnnounced { announced: u64 },

    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\"")]
    BadMagic { found: [u8; 4] },

    #[error("unsupported GGUF version {version} (this reader handles versions 2 and 3)")]
    UnsupportedVersion { version: u32 },

    #[error("{what} count {count} at offset {offset} cannot fit in the {remaining} bytes left in the file")]
    CountTooLarge { what: &'static str, count: u64, offset: u64, remaining: u64 },

    #[error("{what} at offset {offset} is not valid UTF-8")]
    BadUtf8 { what: &'static str, offset: u64 },

    #[error("unknown metadata value type id {id}")]
    UnknownValueType { id: u32 },

    #[error("unknown ggml type id {id}")]
    UnknownType { id: u32 },

    #[error("general.alignment must be a u32 power of two, found {found}")]
    BadAlignment { found: String },

    #[error(
        "data offset {offset} should be {expected} (each tensor must follow the previous one, padded to the alignment)"
    )]
    BadOffset { offset: u64, expected: u64 },

    #[error("data (offset {start} + {len} bytes) ends past the end of the file ({file_size} bytes)")]
    DataOutOfBounds { start: u64, len: u64, file_size: u64 },

    #[error("duplicate key '{key}'")]
    DuplicateKey { key: String },

    #[error("duplicate tensor name '{name}'")]
    DuplicateTensor { name: String },

    #[error("empty key (llama.cpp refuses them)")]
    EmptyKey,

    #[error("name '{name}' is {len} bytes long; tensor names must be shorter than 64 bytes")]
    NameTooLong { name: String, len: usize },

    #[error("{n_dims} dimensions; GGUF tensors have at most 4")]
    TooManyDims { n_dims: u64 },

    #[error("no dimensions; give at least one (use [1] for a scalar)")]
    NoDims,

    #[error("dims[0] = {dim0} is not a multiple of the {ty} block size {block_size}")]
    ShapeNotBlockAligned { ty: GgmlType, dim0: u64, block_size: u64 },

    #[error("arithmetic overflow: {what}")]
    Overflow { what: String },

    #[error("bool value {value} is neither 0 nor 1")]
    BadBool { value: u8 },

    #[error("arrays nested more than {max} deep")]
    NestingTooDeep { max: usize },

    #[error("key '{key}' is {found}, expected {expected}")]
    WrongValueType { key: String, expected: &'static str, found: String },

    #[error("key '{key}' is missing")]
    MissingKey { key: String },

    #[error("expected {expected} bytes of tensor data, got {got}")]
    WrongDataSize { expected: u64, got: u64 },

    #[error("tensor data out of order: expected {expected}, got '{got}'")]
    OutOfOrder { expected: String, got: String },

    #[error("writer misuse: {0}")]
    Misuse(String),
}

/// Shortens a name taken from a file for use in a message: a hostile file may hold a
/// megabyte-long key, and the message should still fit on a screen.
pub(crate) fn short(s: &str) -> String {
    const MAX: usize = 80;
    if s.len() <= MAX {
        return s.to_owned();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", s.get(..end).unwrap_or(""), s.len())
}
