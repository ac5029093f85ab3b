//! Writing: everything is validated before the first byte is written; tensor data is then
//! streamed into a temporary file beside the target (crate::output: a random name created
//! exclusively, removed on error, drop or signal), which replaces the target only once
//! complete and synced — and only if the target is absent or a regular file.
//!
//! Longer than most files (~630 lines): validation and writing share the one layout
//! computation (offsets, alignment, padding) that must agree byte for byte with the reader.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use super::error::{GgufError, GgufErrorKind, short};
use super::value::{Array, Value};
use super::{
    ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_VERSION, MAX_ARRAY_DEPTH, MAX_DIMS, MAX_NAME_LEN, align_up,
};
use crate::GgmlType;

/// Collects the header of a GGUF file: metadata in insertion order and tensor declarations
/// in the order their data will be written.
///
/// ```no_run
/// # use duet_quant::{GgmlType, gguf::GgufWriter};
/// # fn main() -> Result<(), duet_quant::gguf::GgufError> {
/// let mut w = GgufWriter::new("out.gguf");
/// w.add("general.architecture", "diffllama")?;
/// w.add("diffllama.block_count", 2u32)?;
/// w.add_tensor("output_norm.weight", &[64], GgmlType::F32)?;
/// let mut data = w.start()?;
/// data.write_tensor("output_norm.weight", &[0u8; 256])?;
/// data.finish()?;
/// # Ok(()) }
/// ```
pub struct GgufWriter {
    path: PathBuf,
    label: String,
    metadata: Vec<(String, Value)>,
    keys: HashSet<String>,
    tensors: Vec<TensorSpec>,
    names: HashSet<String>,
    alignment: u32,
}

/// A declared tensor: validated shape, byte size and its offset in the data section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    name: String,
    dims: [u64; MAX_DIMS],
    n_dims: u8,
    ty: GgmlType,
    n_bytes: u64,
    offset: u64,
}

impl TensorSpec {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Dimensions, `dims()[0]` the fastest-varying.
    pub fn dims(&self) -> &[u64] {
        self.dims.get(..usize::from(self.n_dims)).unwrap_or(&self.dims)
    }

    pub fn ggml_type(&self) -> GgmlType {
        self.ty
    }

    /// Bytes of data expected for this tensor (without padding).
    pub fn n_bytes(&self) -> u64 {
        self.n_bytes
    }

    /// Offset from the start of the data section under the current alignment.
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

impl GgufWriter {
    pub fn new(path: impl AsRef<Path>) -> GgufWriter {
        let path = path.as_ref().to_path_buf();
        GgufWriter {
            label: path.display().to_string(),
            path,
            metadata: Vec::new(),
            keys: HashSet::new(),
            tensors: Vec::new(),
            names: HashSet::new(),
            alignment: DEFAULT_ALIGNMENT,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn alignment(&self) -> u32 {
        self.alignment
    }

    fn err(&self, context: Option<String>, kind: GgufErrorKind) -> GgufError {
        GgufError::new(&self.label, context, kind)
    }

    /// Sets the data alignment (a power of two). A non-default alignment is recorded as a
    /// u32 `general.alignment` key, added at this point of the key order (or updated if
    /// already there); the default 32 adds no key, as llama.cpp and gguf-py expect.
    pub fn set_alignment(&mut self, alignment: u32) -> Result<(), GgufError> {
        if !alignment.is_power_of_two() {
            return Err(self.err(None, GgufErrorKind::BadAlignment { found: alignment.to_string() }));
        }
        self.relayout(alignment)?;
        if let Some(kv) = self.metadata.iter_mut().find(|kv| kv.0 == ALIGNMENT_KEY) {
            kv.1 = Value::U32(alignment);
        } else if alignment != DEFAULT_ALIGNMENT {
            self.keys.insert(ALIGNMENT_KEY.to_owned());
            self.metadata.push((ALIGNMENT_KEY.to_owned(), Value::U32(alignment)));
        }
        Ok(())
    }

    /// Adds a key-value pair. Keys must be non-empty and unique; adding `general.alignment`
    /// (which must be a u32 power of two) sets the alignment.
    pub fn add(&mut self, key: impl Into<String>, value: impl Into<Value>) -> Result<(), GgufError> {
        let key = key.into();
        let value = value.into();
        if key.is_empty() {
            return Err(self.err(None, GgufErrorKind::EmptyKey));
        }
        if self.keys.contains(&key) {
            return Err(self.err(None, GgufErrorKind::DuplicateKey { key: short(&key) }));
        }
        if let Value::Array(a) = &value
            && a.depth() > MAX_ARRAY_DEPTH
        {
            let ctx = Some(format!("key '{}'", short(&key)));
            return Err(self.err(ctx, GgufErrorKind::NestingTooDeep { max: MAX_ARRAY_DEPTH }));
        }
        if key == ALIGNMENT_KEY {
            match value {
                Value::U32(a) if a.is_power_of_two() => self.relayout(a)?,
                ref v => {
                    let found = format!("{} {}", v.type_description(), v.summary(3, 20));
                    return Err(self.err(None, GgufErrorKind::BadAlignment { found }));
                }
            }
        }
        self.keys.insert(key.clone());
        self.metadata.push((key, value));
        Ok(())
    }

    /// Key-value pairs in the order they will be written.
    pub fn metadata(&self) -> impl ExactSizeIterator<Item = (&str, &Value)> + '_ {
        self.metadata.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Declares a tensor. `dims[0]` is the fastest-varying axis (an HF `[out, in]` weight
    /// is `[in, out]` here) and must be a multiple of `ty`'s block size.
    pub fn add_tensor(&mut self, name: impl Into<String>, dims: &[u64], ty: GgmlType) -> Result<(), GgufError> {
        use GgufErrorKind::*;
        let name = name.into();
        if name.len() > MAX_NAME_LEN {
            return Err(self.err(None, NameTooLong { name: short(&name), len: name.len() }));
        }
        if self.names.contains(&name) {
            return Err(self.err(None, DuplicateTensor { name }));
        }
        let ctx = || Some(format!("tensor '{name}'"));
        let mut shape = [1u64; MAX_DIMS];
        match dims.len() {
            0 => return Err(self.err(ctx(), NoDims)),
            n if n > MAX_DIMS => return Err(self.err(ctx(), TooManyDims { n_dims: n as u64 })),
            _ => shape.iter_mut().zip(dims).for_each(|(s, d)| *s = *d),
        }
        let n_elements = shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n <= i64::MAX as u64 && shape.iter().all(|&d| d <= i64::MAX as u64))
            .ok_or_else(|| self.err(ctx(), Overflow { what: format!("element count of shape {dims:?}") }))?;
        let block_size = ty.block_size() as u64;
        if shape[0] % block_size != 0 {
            return Err(self.err(ctx(), ShapeNotBlockAligned { ty, dim0: shape[0], block_size }));
        }
        let n_bytes = ty.bytes_for(n_elements).ok_or_else(|| self.err(ctx(), Overflow { what: "byte size".into() }))?;
        let offset =
            self.data_end(self.alignment).ok_or_else(|| self.err(ctx(), Overflow { what: "data offset".into() }))?;
        self.names.insert(name.clone());
        let spec = TensorSpec { name, dims: shape, n_dims: dims.len() as u8, ty, n_bytes, offset };
        self.tensors.push(spec);
        Ok(())
    }

    pub fn tensors(&self) -> &[TensorSpec] {
        &self.tensors
    }

    /// Size of the file [`GgufWriter::start`] would produce: the header padded to the
    /// alignment plus every tensor's padded data (what `--dry-run` reports).
    pub fn file_size(&self) -> u64 {
        let mut header = Counting { inner: &mut io::sink(), n: 0 };
        // Writing into a sink cannot fail.
        let _ = encode_header(&mut header, &self.metadata, &self.tensors, self.alignment.into());
        header.n + self.data_end(self.alignment).unwrap_or(0)
    }

    /// End of the padded data of the tensors declared so far.
    fn data_end(&self, alignment: u32) -> Option<u64> {
        match self.tensors.last() {
            None => Some(0),
            Some(t) => t.offset.checked_add(align_up(t.n_bytes, alignment.into())?),
        }
    }

    /// Recomputes every offset for a new alignment; on overflow nothing changes.
    fn relayout(&mut self, alignment: u32) -> Result<(), GgufError> {
        let mut offsets = Vec::with_capacity(self.tensors.len());
        let mut next = 0u64;
        for t in &self.tensors {
            offsets.push(next);
            next =
                align_up(t.n_bytes, alignment.into()).and_then(|padded| next.checked_add(padded)).ok_or_else(|| {
                    self.err(None, GgufErrorKind::Overflow { what: format!("data offsets at alignment {alignment}") })
                })?;
        }
        for (t, off) in self.tensors.iter_mut().zip(offsets) {
            t.offset = off;
        }
        self.alignment = alignment;
        Ok(())
    }

    /// Creates the temporary file beside the target and writes the header; the returned
    /// writer takes the tensor data.
    pub fn start(self) -> Result<GgufDataWriter, GgufError> {
        // A device, FIFO, directory or link is never replaced (crate::output).
        crate::output::check_target(&self.path, &[])
            .map_err(|source| self.err(None, GgufErrorKind::Io { action: "cannot write".into(), source }))?;
        let (tmp, file) = crate::output::create_temp_beside(&self.path).map_err(|source| {
            self.err(None, GgufErrorKind::Io { action: "cannot create the temporary file".into(), source })
        })?;
        let mut w = GgufDataWriter {
            label: self.label,
            target: self.path,
            tmp,
            out: Some(BufWriter::with_capacity(1 << 20, file)),
            tensors: self.tensors,
            alignment: self.alignment.into(),
            next: 0,
            current: None,
            state: State::Open,
        };
        // On failure `w` is dropped here, which removes the temporary file.
        let r = w.write_header(&self.metadata);
        w.guard(r)?;
        Ok(w)
    }

    /// Writes the whole file, taking each declared tensor's bytes, in order, from `data`.
    pub fn write_tensors_from<I>(self, data: I) -> Result<(), GgufError>
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        let mut w = self.start()?;
        let declared = w.tensors.len();
        let mut data = data.into_iter();
        for i in 0..declared {
            match data.next() {
                Some(bytes) => w.write_next(bytes.as_ref())?,
                None => {
                    let e = w.misuse(format!("the data ran out after {i} of {declared} tensors"));
                    return Err(w.fail(e));
                }
            }
        }
        if data.next().is_some() {
            let e = w.misuse(format!("more data than the {declared} declared tensors"));
            return Err(w.fail(e));
        }
        w.finish()
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Open,
    Failed,
    Done,
}

/// Streams tensor data, one tensor at a time in declaration order, each in as many chunks
/// as convenient. Any error, and dropping it before [`GgufDataWriter::finish`], removes
/// the temporary file; the target is only ever replaced by a complete file.
pub struct GgufDataWriter {
    label: String,
    target: PathBuf,
    tmp: PathBuf,
    out: Option<BufWriter<File>>,
    tensors: Vec<TensorSpec>,
    alignment: u64,
    /// The tensor being written, or the next one to begin.
    next: usize,
    /// Bytes written so far of tensor `next`, once begun.
    current: Option<u64>,
    state: State,
}

impl GgufDataWriter {
    pub fn path(&self) -> &Path {
        &self.target
    }

    /// The temporary file being written.
    pub fn temp_path(&self) -> &Path {
        &self.tmp
    }

    pub fn tensors(&self) -> &[TensorSpec] {
        &self.tensors
    }

    /// The tensor being written or next to begin; `None` once all are written.
    pub fn next_tensor(&self) -> Option<&TensorSpec> {
        self.tensors.get(self.next)
    }

    pub fn begin_tensor(&mut self, name: &str) -> Result<(), GgufError> {
        let r = self.check_open().and_then(|()| {
            if let Some(t) = self.current.and(self.tensors.get(self.next)) {
                return Err(self.misuse(format!("begin_tensor('{}') while '{}' is still open", short(name), t.name)));
            }
            match self.tensors.get(self.next) {
                Some(t) if t.name == name => Ok(()),
                expected => Err(self.err(
                    None,
                    GgufErrorKind::OutOfOrder {
                        expected: expected.map_or_else(|| "no more tensors".to_owned(), |t| format!("'{}'", t.name)),
                        got: short(name),
                    },
                )),
            }
        });
        self.guard(r)?;
        self.current = Some(0);
        Ok(())
    }

    pub fn write_data(&mut self, chunk: &[u8]) -> Result<(), GgufError> {
        let r = self.write_data_inner(chunk);
        self.guard(r)
    }

    fn write_data_inner(&mut self, chunk: &[u8]) -> Result<(), GgufError> {
        self.check_open()?;
        let (Some(written), Some(t)) = (self.current, self.tensors.get(self.next)) else {
            return Err(self.misuse("write_data with no tensor begun".into()));
        };
        let total = written.checked_add(chunk.len() as u64).filter(|&n| n <= t.n_bytes);
        let Some(total) = total else {
            let got = written.saturating_add(chunk.len() as u64);
            let kind = GgufErrorKind::WrongDataSize { expected: t.n_bytes, got };
            return Err(self.err(Some(format!("tensor '{}'", t.name)), kind));
        };
        self.io("writing", |out| out.write_all(chunk))?;
        self.current = Some(total);
        Ok(())
    }

    /// Ends the current tensor, which must have received exactly its declared byte count,
    /// and pads it to the alignment.
    pub fn end_tensor(&mut self) -> Result<(), GgufError> {
        let r = self.end_tensor_inner();
        self.guard(r)
    }

    fn end_tensor_inner(&mut self) -> Result<(), GgufError> {
        self.check_open()?;
        let (Some(written), Some(t)) = (self.current, self.tensors.get(self.next)) else {
            return Err(self.misuse("end_tensor with no tensor begun".into()));
        };
        if written != t.n_bytes {
            let kind = GgufErrorKind::WrongDataSize { expected: t.n_bytes, got: written };
            return Err(self.err(Some(format!("tensor '{}'", t.name)), kind));
        }
        let pad = align_up(written, self.alignment).map_or(0, |p| p - written);
        self.io("writing", |out| write_zeros(out, pad))?;
        self.next += 1;
        self.current = None;
        Ok(())
    }

    /// `begin_tensor`, one `write_data`, `end_tensor`.
    pub fn write_tensor(&mut self, name: &str, data: &[u8]) -> Result<(), GgufError> {
        self.begin_tensor(name)?;
        self.write_data(data)?;
        self.end_tensor()
    }

    /// Writes the next declared tensor, whatever its name.
    pub fn write_next(&mut self, data: &[u8]) -> Result<(), GgufError> {
        let name = match self.next_tensor() {
            Some(t) => t.name.clone(),
            None => {
                let e = self.misuse("write_next after the last tensor".into());
                return Err(self.fail(e));
            }
        };
        self.write_tensor(&name, data)
    }

    /// Hands what has been written so far to the operating system (the file's page cache).
    pub fn flush(&mut self) -> Result<(), GgufError> {
        let r = self.check_open().and_then(|()| self.io("writing", |out| out.flush()));
        self.guard(r)
    }

    /// A second handle to the temporary file, for syncing it from another thread while
    /// this one writes: a long writer that syncs now and then, after [`GgufDataWriter::flush`],
    /// makes the disk write as the file grows, so that [`GgufDataWriter::finish`]'s sync
    /// waits only for the tail and the page cache never holds the whole file dirty.
    pub fn sync_handle(&mut self) -> Result<File, GgufError> {
        let r = match self.out.as_ref() {
            Some(out) => out.get_ref().try_clone().map_err(|e| self.io_err("cannot duplicate the handle of", e)),
            None => Err(self.misuse("output already closed".into())),
        };
        self.guard(r)
    }

    /// Checks that every tensor was written, then flushes, syncs and renames the temporary
    /// file over the target.
    pub fn finish(mut self) -> Result<(), GgufError> {
        let r = self.finish_inner();
        self.guard(r)
    }

    fn finish_inner(&mut self) -> Result<(), GgufError> {
        self.check_open()?;
        if let Some(t) = self.current.and(self.tensors.get(self.next)) {
            return Err(self.misuse(format!("finish while tensor '{}' is still open", t.name)));
        }
        if let Some(t) = self.tensors.get(self.next) {
            let msg = format!("finish after {} of {} tensors; '{}' has no data", self.next, self.tensors.len(), t.name);
            return Err(self.misuse(msg));
        }
        let out = self.out.take().ok_or_else(|| self.misuse("output already closed".into()))?;
        let file = out.into_inner().map_err(|e| self.io_err("writing", e.into_error()))?;
        file.sync_all().map_err(|e| self.io_err("syncing", e))?;
        drop(file);
        // Checked again: the target may have changed while the file was written.
        crate::output::check_target(&self.target, &[]).map_err(|source| {
            GgufError::new(&self.label, None, GgufErrorKind::Io { action: "cannot write".into(), source })
        })?;
        crate::output::rename_into_place(&self.tmp, &self.target).map_err(|source| {
            let action = format!("cannot rename {} to {}", self.tmp.display(), self.target.display());
            GgufError::new(&self.label, None, GgufErrorKind::Io { action, source })
        })?;
        self.state = State::Done;
        // Makes the rename itself durable; not every platform or filesystem can sync a
        // directory, and the data is already safe, so a failure here is not reported.
        if let Some(dir) = self.target.parent().filter(|d| !d.as_os_str().is_empty())
            && let Ok(d) = File::open(dir)
        {
            let _ = d.sync_all();
        }
        Ok(())
    }

    fn write_header(&mut self, metadata: &[(String, Value)]) -> Result<(), GgufError> {
        let tensors = std::mem::take(&mut self.tensors);
        let alignment = self.alignment;
        let r = self.io("writing", |out| encode_header(out, metadata, &tensors, alignment));
        self.tensors = tensors;
        r
    }

    fn err(&self, context: Option<String>, kind: GgufErrorKind) -> GgufError {
        GgufError::new(&self.label, context, kind)
    }

    fn misuse(&self, msg: String) -> GgufError {
        self.err(None, GgufErrorKind::Misuse(msg))
    }

    fn io_err(&self, what: &str, source: io::Error) -> GgufError {
        self.err(None, GgufErrorKind::Io { action: format!("{what} {}", self.tmp.display()), source })
    }

    fn io(&mut self, what: &str, f: impl FnOnce(&mut BufWriter<File>) -> io::Result<()>) -> Result<(), GgufError> {
        let r = match self.out.as_mut() {
            Some(out) => f(out),
            None => return Err(self.misuse("output already closed".into())),
        };
        r.map_err(|e| self.io_err(what, e))
    }

    fn check_open(&self) -> Result<(), GgufError> {
        match self.state {
            State::Open => Ok(()),
            State::Failed => Err(self.misuse("an earlier error abandoned this file".into())),
            State::Done => Err(self.misuse("the file is already finished".into())),
        }
    }

    /// Passes `r` through; on error abandons the file.
    fn guard<T>(&mut self, r: Result<T, GgufError>) -> Result<T, GgufError> {
        r.map_err(|e| self.fail(e))
    }

    fn fail(&mut self, e: GgufError) -> GgufError {
        if self.state == State::Open {
            self.state = State::Failed;
            self.discard();
        }
        e
    }

    fn discard(&mut self) {
        drop(self.out.take());
        crate::output::remove_temp(&self.tmp);
    }
}

impl Drop for GgufDataWriter {
    fn drop(&mut self) {
        if self.state == State::Open {
            self.discard();
        }
    }
}

/// Writes the header: magic through the zero padding that aligns the data section.
fn encode_header<W: Write>(
    out: &mut W,
    metadata: &[(String, Value)],
    tensors: &[TensorSpec],
    alignment: u64,
) -> io::Result<()> {
    let mut w = Counting { inner: out, n: 0 };
    w.write_all(GGUF_MAGIC)?;
    w.write_all(&GGUF_VERSION.to_le_bytes())?;
    w.write_all(&(tensors.len() as u64).to_le_bytes())?;
    w.write_all(&(metadata.len() as u64).to_le_bytes())?;
    for (key, value) in metadata {
        write_str(&mut w, key)?;
        w.write_all(&value.type_id().id().to_le_bytes())?;
        write_value(&mut w, value)?;
    }
    for t in tensors {
        write_str(&mut w, &t.name)?;
        w.write_all(&u32::from(t.n_dims).to_le_bytes())?;
        for d in t.dims() {
            w.write_all(&d.to_le_bytes())?;
        }
        w.write_all(&t.ty.id().to_le_bytes())?;
        w.write_all(&t.offset.to_le_bytes())?;
    }
    let end = w.n;
    let pad = align_up(end, alignment).map_or(0, |p| p - end);
    write_zeros(&mut w, pad)
}

struct Counting<'a, W: Write> {
    inner: &'a mut W,
    n: u64,
}

impl<W: Write> Write for Counting<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn write_zeros(w: &mut impl Write, mut n: u64) -> io::Result<()> {
    const ZEROS: [u8; 4096] = [0; 4096];
    while n > 0 {
        let k = n.min(ZEROS.len() as u64) as usize;
        w.write_all(ZEROS.get(..k).unwrap_or(&ZEROS))?;
        n -= k as u64;
    }
    Ok(())
}

fn write_str(w: &mut impl Write, s: &str) -> io::Result<()> {
    w.write_all(&(s.len() as u64).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

fn write_value(w: &mut impl Write, v: &Value) -> io::Result<()> {
    match v {
        Value::U8(x) => w.write_all(&[*x]),
        Value::I8(x) => w.write_all(&x.to_le_bytes()),
        Value::U16(x) => w.write_all(&x.to_le_bytes()),
        Value::I16(x) => w.write_all(&x.to_le_bytes()),
        Value::U32(x) => w.write_all(&x.to_le_bytes()),
        Value::I32(x) => w.write_all(&x.to_le_bytes()),
        Value::F32(x) => w.write_all(&x.to_le_bytes()),
        Value::Bool(x) => w.write_all(&[u8::from(*x)]),
        Value::String(s) => write_str(w, s),
        Value::Array(a) => write_array(w, a),
        Value::U64(x) => w.write_all(&x.to_le_bytes()),
        Value::I64(x) => w.write_all(&x.to_le_bytes()),
        Value::F64(x) => w.write_all(&x.to_le_bytes()),
    }
}

/// Element type, count, elements. Numeric arrays go out as their in-memory bytes, which
/// are little-endian (the crate refuses big-endian hosts).
fn write_array(w: &mut impl Write, a: &Array) -> io::Result<()> {
    w.write_all(&a.elem_type().id().to_le_bytes())?;
    w.write_all(&(a.len() as u64).to_le_bytes())?;
    match a {
        Array::U8(v) => w.write_all(v),
        Array::I8(v) => w.write_all(bytemuck::cast_slice(v)),
        Array::U16(v) => w.write_all(bytemuck::cast_slice(v)),
        Array::I16(v) => w.write_all(bytemuck::cast_slice(v)),
        Array::U32(v) => w.write_all(bytemuck::cast_slice(v)),
        Array::I32(v) => w.write_all(bytemuck::cast_slice(v)),
        Array::F32(v) => w.write_all(bytemuck::cast_slice(v)),
        Array::Bool(v) => v.iter().try_for_each(|&b| w.write_all(&[u8::from(b)])),
        Array::String(v) => v.iter().try_for_each(|s| write_str(w, s)),
        Array::Array(v) => v.iter().try_for_each(|inner| write_array(w, inner)),
        Array::U64(v) => w.write_all(bytemuck::cast_slice(v)),
        Array::I64(v) => w.write_all(bytemuck::cast_slice(v)),
        Array::F64(v) => w.write_all(bytemuck::cast_slice(v)),
    }
}
