//! Reading: a fully checked parse of the header, then zero-copy views of the tensor data.
//!
//! Longer than most files (~680 lines) on purpose: the parse is one pass of one cursor over
//! the header, each count and offset checked against the bytes left before it is used; split
//! across files, the cursor and those limits would have to travel between them.

use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use super::error::{GgufError, GgufErrorKind, short};
use super::value::{Array, StringArray, Value, ValueType};
use super::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_DIMS, MAX_NAME_LEN, align_up};
use crate::GgmlType;

/// Fewest bytes a key-value pair can take: empty key length, type, a u8 value.
const MIN_KV_BYTES: usize = 8 + 4 + 1;
/// Fewest bytes a tensor info can take: empty name length, n_dims = 0, type, offset.
const MIN_TENSOR_INFO_BYTES: usize = 8 + 4 + 4 + 8;

/// A parsed GGUF file (v3; v2 has the same layout and is accepted too).
///
/// Every count, length, offset and size in the header is checked against the file before it
/// is used, so a hostile file yields a [`GgufError`], never a panic, and parsing never
/// reserves memory for more elements than the remaining bytes could encode. Metadata is
/// decoded into owned [`Value`]s; tensor data is borrowed from the map.
pub struct GgufFile {
    label: String,
    storage: Storage,
    /// The file's length: `storage`'s, or with the header read alone
    /// ([`GgufFile::from_header`]) the length of the file it came from.
    size: u64,
    /// Whether `storage` holds the whole file (false: the header read alone).
    has_data: bool,
    version: u32,
    alignment: u32,
    data_offset: u64,
    metadata: Vec<Entry>,
    /// Indices into `metadata`, sorted by key, for lookups.
    key_order: Vec<usize>,
    tensors: Vec<TensorInfo>,
    /// Indices into `tensors`, sorted by name.
    name_order: Vec<usize>,
}

/// One tensor's header entry, with its byte size and position already validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    name: String,
    dims: [u64; MAX_DIMS],
    n_dims: u8,
    ty: GgmlType,
    offset: u64,
    n_bytes: u64,
    n_elements: u64,
    /// Absolute position of the data in the file; `start + n_bytes <= file size` (a u64:
    /// a header read alone may describe a file larger than this machine's address space).
    start: u64,
}

impl TensorInfo {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Dimensions with `dims()[0]` the fastest-varying (ggml order). Empty for a 0-d tensor.
    pub fn dims(&self) -> &[u64] {
        self.dims.get(..usize::from(self.n_dims)).unwrap_or(&self.dims)
    }

    pub fn n_dims(&self) -> usize {
        usize::from(self.n_dims)
    }

    pub fn ggml_type(&self) -> GgmlType {
        self.ty
    }

    /// Offset of the data from the start of the data section, as stored in the file.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Offset of the data from the start of the file.
    pub fn file_offset(&self) -> u64 {
        self.start
    }

    pub fn n_bytes(&self) -> u64 {
        self.n_bytes
    }

    pub fn n_elements(&self) -> u64 {
        self.n_elements
    }
}

enum Storage {
    Mmap(Mmap),
    Owned { chunks: Vec<Chunk>, len: usize },
}

/// In-memory copies are kept 64-byte aligned so that tensor data, which the file aligns
/// relative to its start, is as aligned in memory as it is in a page-aligned map.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
struct Chunk([u8; 64]);

impl Storage {
    fn copy_of(bytes: &[u8]) -> Storage {
        let mut chunks = vec![Chunk([0; 64]); bytes.len().div_ceil(64)];
        let all: &mut [u8] = bytemuck::cast_slice_mut(&mut chunks);
        if let Some(dst) = all.get_mut(..bytes.len()) {
            dst.copy_from_slice(bytes);
        }
        Storage::Owned { chunks, len: bytes.len() }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Owned { chunks, len } => {
                let all: &[u8] = bytemuck::cast_slice(chunks);
                all.get(..*len).unwrap_or(all)
            }
        }
    }
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("file", &self.label)
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish_non_exhaustive()
    }
}

impl GgufFile {
    /// Memory-maps and parses `path`.
    ///
    /// The map is read-only, but like every memory map it assumes nobody truncates or
    /// rewrites the file while it is open.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let label = path.display().to_string();
        let io =
            |action: &str, source| GgufError::new(&label, None, GgufErrorKind::Io { action: action.into(), source });
        // A FIFO would block the open, a device never end: regular files only.
        crate::input::check_regular(path).map_err(|e| io("cannot open", e))?;
        let file = File::open(path).map_err(|e| io("cannot open", e))?;
        let len = file.metadata().map_err(|e| io("cannot stat", e))?.len();
        let storage = if len == 0 {
            // Nothing to map; the parse reports the file as truncated.
            Storage::copy_of(&[])
        } else {
            // SAFETY: the map is read-only and private to this value; the documented
            // assumption is that the file is not modified while mapped.
            Storage::Mmap(unsafe { Mmap::map(&file) }.map_err(|e| io("cannot memory-map", e))?)
        };
        Self::parse(label, storage)
    }

    /// Parses a GGUF image held in memory (copied into an aligned buffer).
    pub fn from_bytes(bytes: impl AsRef<[u8]>) -> Result<GgufFile, GgufError> {
        Self::from_bytes_named(bytes, "<memory>")
    }

    /// As [`GgufFile::from_bytes`], naming the buffer `label` in errors.
    pub fn from_bytes_named(bytes: impl AsRef<[u8]>, label: impl Into<String>) -> Result<GgufFile, GgufError> {
        Self::parse(label.into(), Storage::copy_of(bytes.as_ref()))
    }

    /// Parses the header of a GGUF file of `file_size` bytes from its first bytes, `prefix`,
    /// for a file read as a stream (a browser's fetch): `Ok(None)` while `prefix` is too
    /// short to hold the whole header (read more and call again). The result keeps no tensor
    /// data ([`GgufFile::has_data`] is false; tensor `t`'s bytes are the stream's from
    /// `t.file_offset()`), and every check made of a whole file is made against `file_size`.
    pub fn from_header(prefix: &[u8], file_size: u64, label: impl Into<String>) -> Result<Option<GgufFile>, GgufError> {
        let label = label.into();
        let got = prefix.len() as u64;
        if got > file_size {
            return Err(GgufError::new(label, None, GgufErrorKind::LongerThanAnnounced { announced: file_size }));
        }
        match parse_header(prefix, file_size) {
            Ok(h) => Ok(Some(Self::with_header(label, Storage::copy_of(&[]), file_size, false, h))),
            Err(e) if got < file_size && e.may_end_within(file_size) => Ok(None),
            Err(e) => Err(GgufError::new(label, e.context, e.kind.with_file_size(got, file_size))),
        }
    }

    fn with_header(label: String, storage: Storage, size: u64, has_data: bool, h: Header) -> GgufFile {
        GgufFile {
            label,
            storage,
            size,
            has_data,
            version: h.version,
            alignment: h.alignment,
            data_offset: h.data_offset,
            metadata: h.metadata,
            key_order: h.key_order,
            tensors: h.tensors,
            name_order: h.name_order,
        }
    }

    fn parse(label: String, storage: Storage) -> Result<GgufFile, GgufError> {
        let size = storage.bytes().len() as u64;
        match parse_header(storage.bytes(), size) {
            Ok(h) => Ok(Self::with_header(label, storage, size, true, h)),
            Err(e) => Err(GgufError::new(label, e.context, e.kind)),
        }
    }

    /// The path (or label) used in error messages.
    pub fn label(&self) -> &str {
        &self.label
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn alignment(&self) -> u32 {
        self.alignment
    }

    /// Where the data section starts. With no tensors it may lie past the end of the file,
    /// since llama.cpp does not require the final padding then.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    pub fn file_size(&self) -> u64 {
        self.size
    }

    /// Whether the tensors' data is here ([`GgufFile::tensor_data`]); false for a header
    /// read alone ([`GgufFile::from_header`]).
    pub fn has_data(&self) -> bool {
        self.has_data
    }

    /// The whole file (nothing for a header read alone).
    pub fn bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// Key-value pairs in file order.
    pub fn metadata(&self) -> impl ExactSizeIterator<Item = (&str, &Value)> + '_ {
        self.metadata.iter().map(|kv| (kv.0.as_str(), &kv.1))
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        find(&self.key_order, |i| self.metadata.get(i).map(|kv| kv.0.as_str()), key)
            .and_then(|i| self.metadata.get(i))
            .map(|kv| &kv.1)
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        find(&self.name_order, |i| self.tensors.get(i).map(|t| t.name.as_str()), name).and_then(|i| self.tensors.get(i))
    }

    /// The bytes of a tensor, borrowed from the map.
    ///
    /// # Panics
    /// If `info` came from a different, smaller file, or this one is a header read alone
    /// ([`GgufFile::has_data`]): a caller bug, like an out-of-range slice index. Infos from
    /// this file were bounds-checked when it was parsed.
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        // end ≥ start, so a start past usize is an end past it too.
        let range = info
            .start
            .checked_add(info.n_bytes)
            .and_then(|end| usize::try_from(end).ok())
            .map(|end| (info.start as usize)..end);
        range
            .and_then(|r| self.bytes().get(r))
            .expect("tensor_data: the TensorInfo belongs to another GgufFile, or this one is a header read alone")
    }

    /// The bytes of the tensor called `name`.
    pub fn tensor_bytes(&self, name: &str) -> Option<&[u8]> {
        self.tensor(name).map(|t| self.tensor_data(t))
    }

    fn err(&self, kind: GgufErrorKind) -> GgufError {
        GgufError::new(&self.label, None, kind)
    }

    fn missing(&self, key: &str) -> GgufError {
        self.err(GgufErrorKind::MissingKey { key: short(key) })
    }

    fn wrong_type(&self, key: &str, expected: &'static str, found: &Value) -> GgufError {
        self.err(GgufErrorKind::WrongValueType { key: short(key), expected, found: found.type_description() })
    }
}

/// Typed getters. llama.cpp is type-strict (a u32 key stored as i32 is an error), so these
/// are too: `get_x` fails with `MissingKey` or `WrongValueType`; `get_x_opt` returns
/// `Ok(None)` for a missing key and still fails on a wrong type.
macro_rules! getters {
    ($($get:ident, $get_opt:ident, $expected:literal, $ret:ty, |$v:ident| $pat:pat => $out:expr;)*) => {
        impl GgufFile { $(
            #[doc = concat!("The `", $expected, "` value of `key`.")]
            pub fn $get(&self, key: &str) -> Result<$ret, GgufError> {
                self.$get_opt(key)?.ok_or_else(|| self.missing(key))
            }

            #[doc = concat!("The `", $expected, "` value of `key`, or `None` if absent.")]
            pub fn $get_opt(&self, key: &str) -> Result<Option<$ret>, GgufError> {
                match self.get(key) {
                    None => Ok(None),
                    Some($v) => match $v {
                        $pat => Ok(Some($out)),
                        other => Err(self.wrong_type(key, $expected, other)),
                    },
                }
            }
        )* }
    };
}

getters! {
    get_u8, get_u8_opt, "u8", u8, |v| Value::U8(x) => *x;
    get_i8, get_i8_opt, "i8", i8, |v| Value::I8(x) => *x;
    get_u16, get_u16_opt, "u16", u16, |v| Value::U16(x) => *x;
    get_i16, get_i16_opt, "i16", i16, |v| Value::I16(x) => *x;
    get_u32, get_u32_opt, "u32", u32, |v| Value::U32(x) => *x;
    get_i32, get_i32_opt, "i32", i32, |v| Value::I32(x) => *x;
    get_u64, get_u64_opt, "u64", u64, |v| Value::U64(x) => *x;
    get_i64, get_i64_opt, "i64", i64, |v| Value::I64(x) => *x;
    get_f32, get_f32_opt, "f32", f32, |v| Value::F32(x) => *x;
    get_f64, get_f64_opt, "f64", f64, |v| Value::F64(x) => *x;
    get_bool, get_bool_opt, "bool", bool, |v| Value::Bool(x) => *x;
    get_str, get_str_opt, "str", &str, |v| Value::String(s) => s.as_str();
    get_array, get_array_opt, "array", &Array, |v| Value::Array(a) => a;
    get_string_array, get_string_array_opt, "array of str", &StringArray, |v| Value::Array(Array::String(a)) => a;
    get_f32_array, get_f32_array_opt, "array of f32", &[f32], |v| Value::Array(Array::F32(a)) => a.as_slice();
    get_i32_array, get_i32_array_opt, "array of i32", &[i32], |v| Value::Array(Array::I32(a)) => a.as_slice();
    get_u32_array, get_u32_array_opt, "array of u32", &[u32], |v| Value::Array(Array::U32(a)) => a.as_slice();
}

/// Binary search of `order` (indices sorted by name) for `name`.
fn find<'a>(order: &[usize], name_of: impl Fn(usize) -> Option<&'a str>, name: &str) -> Option<usize> {
    order.binary_search_by(|&i| name_of(i).unwrap_or("").cmp(name)).ok().and_then(|pos| order.get(pos).copied())
}

/// Indices 0..n sorted by name, and the first name that occurs twice.
fn sorted_index<'a>(n: usize, name_of: impl Fn(usize) -> &'a str) -> (Vec<usize>, Option<&'a str>) {
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_unstable_by(|&a, &b| name_of(a).cmp(name_of(b)));
    let dup = order.windows(2).find_map(|w| match w {
        [a, b] if name_of(*a) == name_of(*b) => Some(name_of(*a)),
        _ => None,
    });
    (order, dup)
}

/// A parse failure before the file label is attached.
struct Located {
    context: Option<String>,
    kind: GgufErrorKind,
}

impl Located {
    /// Whether a header that failed for want of bytes in a prefix could still parse from a
    /// longer one of a file of `file_size` bytes: what it needed ends inside the file (a
    /// count at its elements' least size: a tensor info's, a key-value pair's, else 1 byte).
    fn may_end_within(&self, file_size: u64) -> bool {
        match self.kind {
            GgufErrorKind::Truncated { offset, needed, .. } => offset.saturating_add(needed) <= file_size,
            GgufErrorKind::CountTooLarge { what, count, offset, .. } => {
                let least = match what {
                    "tensor info" => MIN_TENSOR_INFO_BYTES,
                    "key-value pair" => MIN_KV_BYTES,
                    _ => 1,
                } as u64;
                count.saturating_mul(least) <= file_size.saturating_sub(offset)
            }
            _ => false,
        }
    }
}

impl GgufErrorKind {
    /// A truncation found in a prefix of `got` bytes, said of the whole file's `file_size`.
    fn with_file_size(self, got: u64, file_size: u64) -> GgufErrorKind {
        match self {
            GgufErrorKind::Truncated { what, offset, needed, file_size: f } if f == got => {
                GgufErrorKind::Truncated { what, offset, needed, file_size }
            }
            GgufErrorKind::CountTooLarge { what, count, offset, .. } if got < file_size => {
                GgufErrorKind::CountTooLarge { what, count, offset, remaining: file_size.saturating_sub(offset) }
            }
            k => k,
        }
    }
}

impl From<GgufErrorKind> for Located {
    fn from(kind: GgufErrorKind) -> Self {
        Located { context: None, kind }
    }
}

fn at(context: impl FnOnce() -> String) -> impl FnOnce(GgufErrorKind) -> Located {
    move |kind| Located { context: Some(context()), kind }
}

/// A key-value pair. Boxed so that the list costs 8 bytes per pair, less than the smallest
/// encoded pair (14 bytes): however many tiny pairs a file packs in, the list's allocation
/// stays below the file's size.
type Entry = Box<(String, Value)>;

struct Header {
    version: u32,
    alignment: u32,
    data_offset: u64,
    metadata: Vec<Entry>,
    key_order: Vec<usize>,
    tensors: Vec<TensorInfo>,
    name_order: Vec<usize>,
}

/// Parses the header at the start of `bytes`, the whole file or (streamed) its first bytes
/// of a file of `file_size` bytes.
fn parse_header(bytes: &[u8], file_size: u64) -> Result<Header, Located> {
    use GgufErrorKind::*;
    let mut c = Cursor { buf: bytes, pos: 0 };

    let magic: [u8; 4] = c.array("magic")?;
    if &magic != super::GGUF_MAGIC {
        return Err(BadMagic { found: magic }.into());
    }
    let version = c.u32("version")?;
    // v1 used 32-bit counts; v2 and v3 share this layout (v3 only allowed big-endian files,
    // which the version check below rejects since their version reads as 0x03000000).
    if !(2..=3).contains(&version) {
        return Err(UnsupportedVersion { version }.into());
    }
    let tensor_count = c.u64("tensor count")?;
    let kv_count = c.u64("key-value count")?;
    // Both lists have to fit in what is left; checking the tensor count here too reports an
    // absurd count before the KV pairs are decoded.
    let kv_count = c.check_count(kv_count, MIN_KV_BYTES, "key-value pair")?;
    c.check_count(tensor_count, MIN_TENSOR_INFO_BYTES, "tensor info")?;

    let mut metadata = Vec::with_capacity(capacity_for::<Entry>(kv_count, c.remaining()));
    for i in 0..kv_count {
        let key = c.string("key").map_err(at(|| format!("key #{i}")))?;
        if key.is_empty() {
            return Err(at(|| format!("key #{i}"))(EmptyKey));
        }
        let value = c
            .u32("value type")
            .and_then(|ty| read_value(&mut c, ty))
            .map_err(at(|| format!("key '{}'", short(key))))?;
        metadata.push(Box::new((key.to_owned(), value)));
    }
    let (key_order, dup) = sorted_index(metadata.len(), |i| metadata.get(i).map_or("", |kv| kv.0.as_str()));
    if let Some(key) = dup {
        return Err(DuplicateKey { key: short(key) }.into());
    }

    let alignment = match find(&key_order, |i| metadata.get(i).map(|kv| kv.0.as_str()), ALIGNMENT_KEY)
        .and_then(|i| metadata.get(i))
        .map(|kv| &kv.1)
    {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) if a.is_power_of_two() => *a,
        Some(v) => {
            return Err(BadAlignment { found: format!("{} {}", v.type_description(), v.summary(3, 20)) }.into());
        }
    };

    let tensor_count = c.check_count(tensor_count, MIN_TENSOR_INFO_BYTES, "tensor info")?;
    let align = u64::from(alignment);
    let overflow = |what: &str| Overflow { what: what.to_owned() };

    // First pass: validate every tensor info and llama.cpp's offset rule (tensor i+1 starts
    // where tensor i's padded data ends, the first at 0) while keeping nothing, so that a
    // truncated or inconsistent header is refused before the list is allocated.
    let infos = c;
    let mut expected = 0u64;
    let mut data_end = 0u64;
    for i in 0..tensor_count {
        let t = read_tensor_info(&mut c, i)?;
        let ctx = || format!("tensor '{}'", t.name);
        if t.offset != expected {
            return Err(at(ctx)(BadOffset { offset: t.offset, expected }));
        }
        data_end = t.offset.checked_add(t.n_bytes).ok_or_else(|| at(ctx)(overflow("data end")))?;
        expected = align_up(t.n_bytes, align)
            .and_then(|padded| t.offset.checked_add(padded))
            .ok_or_else(|| at(ctx)(overflow("next data offset")))?;
    }
    let data_offset = align_up(c.pos as u64, align).ok_or_else(|| overflow("data offset"))?;

    // With sequential offsets the last tensor's data ends last; if that is past the end of
    // the file, find and name the first tensor that is.
    if data_offset.checked_add(data_end).is_none_or(|end| end > file_size) {
        let mut c = infos;
        for i in 0..tensor_count {
            let t = read_tensor_info(&mut c, i)?;
            let ctx = || format!("tensor '{}'", t.name);
            let start = data_offset.checked_add(t.offset).ok_or_else(|| at(ctx)(overflow("data start")))?;
            if start.checked_add(t.n_bytes).is_none_or(|end| end > file_size) {
                return Err(at(ctx)(DataOutOfBounds { start, len: t.n_bytes, file_size }));
            }
        }
    }

    // Second pass: everything is known good, so the list is allocated once, at its size.
    let mut c = infos;
    let mut tensors = Vec::with_capacity(tensor_count);
    for i in 0..tensor_count {
        let t = read_tensor_info(&mut c, i)?;
        // Inside the file, as checked above (a u64: a header read alone may describe a file larger
        // than this address space).
        let start = data_offset
            .checked_add(t.offset)
            .ok_or_else(|| at(|| format!("tensor '{}'", t.name))(overflow("data start")))?;
        tensors.push(TensorInfo {
            name: t.name.to_owned(),
            dims: t.dims,
            n_dims: t.n_dims,
            ty: t.ty,
            offset: t.offset,
            n_bytes: t.n_bytes,
            n_elements: t.n_elements,
            start,
        });
    }
    let (name_order, dup) = sorted_index(tensors.len(), |i| tensors.get(i).map_or("", |t| t.name.as_str()));
    if let Some(name) = dup {
        return Err(DuplicateTensor { name: name.to_owned() }.into());
    }

    Ok(Header { version, alignment, data_offset, metadata, key_order, tensors, name_order })
}

/// A tensor info as read and validated, its name still borrowed from the file.
struct RawInfo<'a> {
    name: &'a str,
    dims: [u64; MAX_DIMS],
    n_dims: u8,
    ty: GgmlType,
    offset: u64,
    n_bytes: u64,
    n_elements: u64,
}

fn read_tensor_info<'a>(c: &mut Cursor<'a>, index: usize) -> Result<RawInfo<'a>, Located> {
    use GgufErrorKind::*;
    let name = c.string("tensor name").map_err(at(|| format!("tensor #{index}")))?;
    if name.len() > MAX_NAME_LEN {
        return Err(at(|| format!("tensor #{index}"))(NameTooLong { name: short(name), len: name.len() }));
    }
    let ctx = || format!("tensor '{name}'");
    let n_dims = c.u32("dimension count").map_err(at(ctx))?;
    if n_dims as usize > MAX_DIMS {
        return Err(at(ctx)(TooManyDims { n_dims: n_dims.into() }));
    }
    let mut dims = [1u64; MAX_DIMS];
    for (j, d) in dims.iter_mut().take(n_dims as usize).enumerate() {
        *d = c.u64("dimension").map_err(at(ctx))?;
        // ggml stores dimensions as int64_t.
        if *d > i64::MAX as u64 {
            return Err(at(ctx)(Overflow { what: format!("dimension {j} is {d}, more than i64::MAX") }));
        }
    }
    let n_elements =
        dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)).filter(|&n| n <= i64::MAX as u64).ok_or_else(
            || {
                at(ctx)(Overflow {
                    what: format!("element count of shape {:?}", dims.get(..n_dims as usize).unwrap_or(&dims)),
                })
            },
        )?;
    let id = c.u32("ggml type").map_err(at(ctx))?;
    let ty = GgmlType::from_id(id).map_err(|_| at(ctx)(UnknownType { id }))?;
    let block_size = ty.block_size() as u64;
    if dims[0] % block_size != 0 {
        return Err(at(ctx)(ShapeNotBlockAligned { ty, dim0: dims[0], block_size }));
    }
    let n_bytes = ty.bytes_for(n_elements).ok_or_else(|| at(ctx)(Overflow { what: "byte size".into() }))?;
    let offset = c.u64("data offset").map_err(at(ctx))?;
    Ok(RawInfo { name, dims, n_dims: n_dims as u8, ty, offset, n_bytes, n_elements })
}

fn read_value(c: &mut Cursor<'_>, type_id: u32) -> Result<Value, GgufErrorKind> {
    let ty = ValueType::from_id(type_id).ok_or(GgufErrorKind::UnknownValueType { id: type_id })?;
    Ok(match ty {
        ValueType::U8 => Value::U8(c.u8("u8 value")?),
        ValueType::I8 => Value::I8(i8::from_le_bytes(c.array("i8 value")?)),
        ValueType::U16 => Value::U16(u16::from_le_bytes(c.array("u16 value")?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(c.array("i16 value")?)),
        ValueType::U32 => Value::U32(c.u32("u32 value")?),
        ValueType::I32 => Value::I32(i32::from_le_bytes(c.array("i32 value")?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(c.array("f32 value")?)),
        ValueType::Bool => Value::Bool(to_bool(c.u8("bool value")?)?),
        ValueType::String => Value::String(c.string("string value")?.to_owned()),
        ValueType::Array => {
            let elem = c.u32("array element type")?;
            let count = c.u64("array length")?;
            Value::Array(read_array(c, elem, count, 1)?)
        }
        ValueType::U64 => Value::U64(c.u64("u64 value")?),
        ValueType::I64 => Value::I64(i64::from_le_bytes(c.array("i64 value")?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(c.array("f64 value")?)),
    })
}

fn to_bool(b: u8) -> Result<bool, GgufErrorKind> {
    match b {
        0 => Ok(false),
        1 => Ok(true),
        value => Err(GgufErrorKind::BadBool { value }),
    }
}

fn read_array(c: &mut Cursor<'_>, elem_id: u32, count: u64, depth: usize) -> Result<Array, GgufErrorKind> {
    if depth > MAX_ARRAY_DEPTH {
        return Err(GgufErrorKind::NestingTooDeep { max: MAX_ARRAY_DEPTH });
    }
    let elem = ValueType::from_id(elem_id).ok_or(GgufErrorKind::UnknownValueType { id: elem_id })?;
    Ok(match elem {
        ValueType::U8 => Array::U8(c.pod_array(count, |b: [u8; 1]| b[0])?),
        ValueType::I8 => Array::I8(c.pod_array(count, i8::from_le_bytes)?),
        ValueType::U16 => Array::U16(c.pod_array(count, u16::from_le_bytes)?),
        ValueType::I16 => Array::I16(c.pod_array(count, i16::from_le_bytes)?),
        ValueType::U32 => Array::U32(c.pod_array(count, u32::from_le_bytes)?),
        ValueType::I32 => Array::I32(c.pod_array(count, i32::from_le_bytes)?),
        ValueType::F32 => Array::F32(c.pod_array(count, f32::from_le_bytes)?),
        ValueType::U64 => Array::U64(c.pod_array(count, u64::from_le_bytes)?),
        ValueType::I64 => Array::I64(c.pod_array(count, i64::from_le_bytes)?),
        ValueType::F64 => Array::F64(c.pod_array(count, f64::from_le_bytes)?),
        ValueType::Bool => {
            let n = c.check_count(count, 1, "bool array")?;
            let bytes = c.take(n as u64, "bool array")?;
            if let Some(&value) = bytes.iter().find(|&&b| b > 1) {
                return Err(GgufErrorKind::BadBool { value });
            }
            Array::Bool(bytes.iter().map(|&b| b == 1).collect())
        }
        ValueType::String => {
            let n = c.check_count(count, ValueType::String.min_encoded_size(), "string array")?;
            // A first pass over the lengths sizes the buffer exactly, so it is allocated once
            // and never larger than the strings in the file.
            let mut probe = *c;
            let mut total = 0usize;
            for _ in 0..n {
                let len = probe.u64("string length")?;
                total = total.saturating_add(probe.take(len, "string")?.len());
            }
            let mut strings = StringArray::with_capacity(n, total);
            for _ in 0..n {
                strings.push(c.string("string array element")?);
            }
            Array::String(strings)
        }
        ValueType::Array => {
            let n = c.check_count(count, ValueType::Array.min_encoded_size(), "nested array")?;
            let mut arrays = Vec::with_capacity(capacity_for::<Array>(n, c.remaining()));
            for _ in 0..n {
                let inner = c.u32("array element type")?;
                let len = c.u64("array length")?;
                arrays.push(read_array(c, inner, len, depth + 1)?);
            }
            Array::Array(arrays)
        }
    })
}

/// How many `T`s to reserve for a list of `count` entries when `remaining` bytes are left:
/// never more memory than the bytes themselves, however large the count claims to be. The
/// list still grows past that if the entries really are there.
fn capacity_for<T>(count: usize, remaining: usize) -> usize {
    count.min(remaining / size_of::<T>().max(1))
}

#[derive(Clone, Copy)]
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn truncated(&self, what: &'static str, needed: u64) -> GgufErrorKind {
        GgufErrorKind::Truncated { what, offset: self.pos as u64, needed, file_size: self.buf.len() as u64 }
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], GgufErrorKind> {
        let slice =
            usize::try_from(n).ok().and_then(|n| self.pos.checked_add(n)).and_then(|end| self.buf.get(self.pos..end));
        match slice {
            Some(s) => {
                self.pos += s.len();
                Ok(s)
            }
            None => Err(self.truncated(what, n)),
        }
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufErrorKind> {
        let s = self.take(N as u64, what)?;
        s.first_chunk::<N>().copied().ok_or_else(|| self.truncated(what, N as u64))
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, GgufErrorKind> {
        self.array::<1>(what).map(|[b]| b)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, GgufErrorKind> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, GgufErrorKind> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: &'static str) -> Result<&'a str, GgufErrorKind> {
        let len = self.u64(what)?;
        let start = self.pos as u64;
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes).map_err(|_| GgufErrorKind::BadUtf8 { what, offset: start })
    }

    /// Checks that `count` entries of at least `min_size` bytes each fit in the rest of the
    /// file, before anything is reserved for them.
    fn check_count(&self, count: u64, min_size: usize, what: &'static str) -> Result<usize, GgufErrorKind> {
        let remaining = self.remaining();
        let max = remaining / min_size.max(1);
        match usize::try_from(count) {
            Ok(n) if n <= max => Ok(n),
            _ => {
                Err(GgufErrorKind::CountTooLarge { what, count, offset: self.pos as u64, remaining: remaining as u64 })
            }
        }
    }

    fn pod_array<const N: usize, T>(&mut self, count: u64, decode: fn([u8; N]) -> T) -> Result<Vec<T>, GgufErrorKind> {
        let n = self.check_count(count, N, "array element")?;
        // n * N <= remaining, so this cannot overflow.
        let bytes = self.take((n * N) as u64, "array elements")?;
        let (chunks, _) = bytes.as_chunks::<N>();
        Ok(chunks.iter().map(|b| decode(*b)).collect())
    }
}
