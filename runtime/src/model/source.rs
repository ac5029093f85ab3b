//! Where a loading model's tensor bytes come from: a GGUF file at hand (a memory map, or a
//! copy in memory), or a stream read once from start to end — a browser's fetch, where the
//! file cannot be mapped and holding it whole would take as much memory again as the model
//! takes on the GPU. A stream keeps only the tensors it has read and the model has not yet
//! loaded; [`super::load`] asks for tensors in the file's order, so that is about one layer.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use duet_quant::gguf::{GgufFile, TensorInfo};

use crate::error::RuntimeError;

/// A loading model's tensor bytes ([`super::Model::load_from`]).
pub trait TensorSource {
    /// The file's header (and, for a file at hand, its data).
    fn file(&self) -> &Arc<GgufFile>;

    /// Waits until every one of `tensors` can be read by [`TensorSource::data`].
    fn fetch(&mut self, tensors: &[&TensorInfo]) -> impl Future<Output = Result<(), RuntimeError>>;

    /// A fetched tensor's bytes (aligned to 8 bytes at least).
    fn data(&self, t: &TensorInfo) -> Result<&[u8], RuntimeError>;

    /// Whether [`TensorSource::data`] lies inside `file().bytes()`, where a backend may keep
    /// referring to it instead of copying it.
    fn in_file(&self) -> bool;

    /// The model has loaded `t`: its bytes may go.
    fn release(&mut self, t: &TensorInfo);
}

/// A file at hand: every tensor is there already.
impl TensorSource for Arc<GgufFile> {
    fn file(&self) -> &Arc<GgufFile> {
        self
    }

    async fn fetch(&mut self, _: &[&TensorInfo]) -> Result<(), RuntimeError> {
        if self.has_data() {
            Ok(())
        } else {
            Err(RuntimeError::BadModel(format!("{}: only the file's header was read", self.label())))
        }
    }

    fn data(&self, t: &TensorInfo) -> Result<&[u8], RuntimeError> {
        Ok(self.tensor_data(t))
    }

    fn in_file(&self) -> bool {
        true
    }

    fn release(&mut self, _: &TensorInfo) {}
}

/// A byte stream read in order (in a browser, a fetch's body or a local file's).
pub trait ChunkReader {
    /// The stream's next bytes; `None` at its end.
    fn next_chunk(&mut self) -> impl Future<Output = Result<Option<Vec<u8>>, RuntimeError>>;
}

/// A GGUF file read from a stream once, in order: the header first, then each tensor's bytes
/// as they arrive, kept until the model has loaded the tensor.
pub struct Streamed<R> {
    file: Arc<GgufFile>,
    reader: R,
    /// The file offset of the next byte not yet filed into a tensor.
    pos: u64,
    /// Bytes read but not yet filed (from `pending_at` on; at most a chunk): a tensor is
    /// allocated only once it is asked for or lies before one that is.
    pending: Vec<u8>,
    pending_at: usize,
    /// Tensors read (whole, or the one being filled) and not yet released, by file offset.
    held: BTreeMap<u64, Bytes>,
    held_bytes: u64,
    peak_bytes: u64,
    /// The most bytes held when a fetch began: tensors read before the model asked for them.
    peak_ahead: u64,
}

/// A tensor's bytes, 8-byte aligned (the GGUF aligns data; what reads it may rely on that).
struct Bytes {
    words: Vec<u64>,
    len: usize,
}

impl Bytes {
    /// `len` zero bytes, or None where this machine cannot hold them.
    fn new(len: u64) -> Option<Bytes> {
        let len = usize::try_from(len).ok()?;
        let mut words = Vec::new();
        words.try_reserve_exact(len.div_ceil(8)).ok()?;
        words.resize(len.div_ceil(8), 0);
        Some(Bytes { words, len })
    }

    fn get(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }
}

/// The first header parse is tried at this many bytes (magic, version and counts: a stream
/// that is not GGUF is refused once it has this many), each next one at twice as many: a
/// header (its vocabulary) takes a few MiB, parsed about twenty times at most.
const FIRST_HEADER_TRY: usize = 24;

/// The longest header read from a stream (vocabularies of 256k tokens take ~10 MiB).
const MAX_HEADER: usize = 256 << 20;

impl<R: ChunkReader> Streamed<R> {
    /// Reads the header of the GGUF file of `size` bytes that `reader` streams, `label`
    /// naming it in errors. A stream that is not GGUF is refused from its first bytes.
    pub async fn open(mut reader: R, size: u64, label: &str) -> Result<Streamed<R>, RuntimeError> {
        let mut prefix = Vec::new();
        let mut next_try = FIRST_HEADER_TRY;
        let file = loop {
            let chunk = reader.next_chunk().await?;
            let ended = chunk.is_none();
            if let Some(c) = chunk {
                prefix.extend_from_slice(&c);
            }
            if ended && (prefix.len() as u64) < size {
                return Err(ended_early(label, prefix.len() as u64, size, None));
            }
            let past_cap = prefix.len() > MAX_HEADER;
            if ended || past_cap || prefix.len() >= next_try || prefix.len() as u64 == size {
                // None only while the prefix is shorter than the file.
                if let Some(f) = GgufFile::from_header(&prefix, size, label)? {
                    break f;
                }
                if past_cap {
                    return Err(RuntimeError::BadModel(format!(
                        "{label}: its header does not end within its first {} MiB, more than duet reads from a stream",
                        MAX_HEADER >> 20
                    )));
                }
                next_try = prefix.len().saturating_mul(2);
            }
        };
        // The header's bytes are skipped when filed; any data read with them is kept.
        Ok(Streamed {
            file: Arc::new(file),
            reader,
            pos: 0,
            pending: prefix,
            pending_at: 0,
            held: BTreeMap::new(),
            held_bytes: 0,
            peak_bytes: 0,
            peak_ahead: 0,
        })
    }

    /// The most tensor bytes held at once so far.
    pub fn peak_bytes(&self) -> u64 {
        self.peak_bytes
    }

    /// The most bytes held when a fetch began so far: tensors read before the model asked
    /// for them (loading in the file's order, at most the rest of one part: a layer).
    pub fn peak_ahead_bytes(&self) -> u64 {
        self.peak_ahead
    }

    /// Files `chunk`, the stream's bytes from `pos`, into the tensors it overlaps.
    fn take(&mut self, mut chunk: &[u8]) -> Result<(), RuntimeError> {
        let file = Arc::clone(&self.file);
        let tensors = file.tensors();
        // Tensors lie in header order, each after the one before (the GGUF offset rule).
        let mut i = tensors.partition_point(|t| t.file_offset() + t.n_bytes() <= self.pos);
        while !chunk.is_empty() {
            let Some(t) = tensors.get(i) else {
                // Past the last tensor: padding, or bytes the header does not describe.
                self.pos += chunk.len() as u64;
                return Ok(());
            };
            let (start, end) = (t.file_offset(), t.file_offset() + t.n_bytes());
            if start == end {
                i += 1;
                continue;
            }
            if self.pos < start {
                // (At most the chunk's length: a usize.)
                let skip = (start - self.pos).min(chunk.len() as u64) as usize;
                self.pos += skip as u64;
                chunk = &chunk[skip..];
                continue;
            }
            if !self.held.contains_key(&start) {
                let bytes = Bytes::new(t.n_bytes()).ok_or_else(|| {
                    RuntimeError::OutOfMemory(format!(
                        "{}: tensor '{}' ({} bytes) does not fit this machine's memory",
                        file.label(),
                        t.name(),
                        t.n_bytes()
                    ))
                })?;
                self.held.insert(start, bytes);
                self.held_bytes += t.n_bytes();
                self.peak_bytes = self.peak_bytes.max(self.held_bytes);
            }
            let buf = self.held.get_mut(&start).expect("just inserted");
            // Both below the tensor's length, which fits a usize (its buffer exists).
            let n = (end - self.pos).min(chunk.len() as u64) as usize;
            let at = (self.pos - start) as usize;
            bytemuck::cast_slice_mut::<u64, u8>(&mut buf.words)[at..at + n].copy_from_slice(&chunk[..n]);
            self.pos += n as u64;
            chunk = &chunk[n..];
            i += 1;
        }
        Ok(())
    }
}

fn ended_early(label: &str, at: u64, size: u64, tensor: Option<&str>) -> RuntimeError {
    let inside = tensor.map_or(", inside its header".to_owned(), |t| format!(", before the end of tensor '{t}'"));
    RuntimeError::BadModel(format!("{label}: the file ended after {at} of its {size} bytes{inside}"))
}

impl<R: ChunkReader> TensorSource for Streamed<R> {
    fn file(&self) -> &Arc<GgufFile> {
        &self.file
    }

    async fn fetch(&mut self, tensors: &[&TensorInfo]) -> Result<(), RuntimeError> {
        self.peak_ahead = self.peak_ahead.max(self.held_bytes);
        for t in tensors {
            let end = t.file_offset() + t.n_bytes();
            if t.n_bytes() > 0 && self.pos >= end && !self.held.contains_key(&t.file_offset()) {
                return Err(RuntimeError::BadModel(format!(
                    "{}: tensor '{}' was asked for after it was loaded",
                    self.file.label(),
                    t.name()
                )));
            }
            while self.pos < end {
                if self.pending_at == self.pending.len() {
                    match self.reader.next_chunk().await? {
                        Some(chunk) => (self.pending, self.pending_at) = (chunk, 0),
                        None => {
                            return Err(ended_early(
                                self.file.label(),
                                self.pos,
                                self.file.file_size(),
                                Some(t.name()),
                            ));
                        }
                    }
                }
                // Filed up to `t`'s end only: the rest waits for a later fetch.
                let n = (end - self.pos).min((self.pending.len() - self.pending_at) as u64) as usize;
                let pending = std::mem::take(&mut self.pending);
                let filed = self.take(&pending[self.pending_at..self.pending_at + n]);
                (self.pending, self.pending_at) = (pending, self.pending_at + n);
                filed?;
            }
        }
        Ok(())
    }

    fn data(&self, t: &TensorInfo) -> Result<&[u8], RuntimeError> {
        if t.n_bytes() == 0 {
            return Ok(&[]);
        }
        self.held
            .get(&t.file_offset())
            .filter(|_| self.pos >= t.file_offset() + t.n_bytes())
            .map(Bytes::get)
            .ok_or_else(|| {
                RuntimeError::BadModel(format!("{}: tensor '{}' has not been read", self.file.label(), t.name()))
            })
    }

    fn in_file(&self) -> bool {
        false
    }

    fn release(&mut self, t: &TensorInfo) {
        // (A tensor of no bytes shares its offset with the next one, and holds nothing.)
        if t.n_bytes() == 0 {
            return;
        }
        if let Some(b) = self.held.remove(&t.file_offset()) {
            self.held_bytes -= b.len as u64;
        }
    }
}
