//! Hostile and broken GGUF input: every case must give a typed error (never a panic), and
//! no single allocation made while parsing may exceed the input's length plus a small
//! constant. A counting global allocator checks the latter for every parse in this file.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use common::{fresh_dir, sample_writer};
use duet_quant::gguf::{GgufError, GgufErrorKind, GgufFile, MAX_ARRAY_DEPTH};
use duet_test_support::Rng;

// ---------------------------------------------------------------------------------------
// Allocation accounting. Only the current thread's allocations made inside `parse` count,
// so tests running in parallel do not disturb each other.

struct CountingAlloc;

thread_local! {
    static MEASURING: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = MEASURING.try_with(|m| {
        if m.get() {
            let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
        }
    });
}

// SAFETY: forwards to the system allocator unchanged; `note` only touches const-initialised
// thread-locals without destructors, so it never allocates or recurses.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// What parsing may allocate beyond the input's length: the 64-byte-aligned copy of the
/// input rounds up by < 64 bytes, plus error messages and small bookkeeping.
const SLACK: usize = 1024;

fn parse_named(bytes: &[u8], label: &str) -> Result<GgufFile, GgufError> {
    LARGEST.with(|l| l.set(0));
    MEASURING.with(|m| m.set(true));
    let r = GgufFile::from_bytes_named(bytes, label);
    MEASURING.with(|m| m.set(false));
    let largest = LARGEST.with(|l| l.get());
    assert!(
        largest <= bytes.len() + SLACK,
        "parsing {} bytes made an allocation of {largest} bytes ({:?})",
        bytes.len(),
        r.as_ref().err().map(|e| e.to_string())
    );
    r
}

fn parse(bytes: &[u8]) -> Result<GgufFile, GgufError> {
    parse_named(bytes, "<memory>")
}

/// Parses `bytes`, which must fail, and returns the error.
fn fail(bytes: impl AsRef<[u8]>) -> GgufError {
    let bytes = bytes.as_ref();
    match parse(bytes) {
        Ok(_) => panic!("a malformed file ({} bytes) was accepted", bytes.len()),
        Err(e) => e,
    }
}

macro_rules! expect_kind {
    ($bytes:expr, $pat:pat $(if $guard:expr)?) => {{
        let e = fail(&$bytes);
        assert!(matches!(e.kind(), $pat $(if $guard)?), "line {}: unexpected error: {e}", line!());
        e
    }};
}

// ---------------------------------------------------------------------------------------
// A small GGUF byte builder, so each case can break exactly one thing.

fn s(bytes: &[u8]) -> Vec<u8> {
    let mut v = (bytes.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(bytes);
    v
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn kv(key: &[u8], ty: u32, payload: &[u8]) -> Vec<u8> {
    cat(&[&s(key), &ty.to_le_bytes(), payload])
}

fn kv_u32(key: &str, v: u32) -> Vec<u8> {
    kv(key.as_bytes(), 4, &v.to_le_bytes())
}

/// Array payload: element type, count, element bytes.
fn arr(elem: u32, count: u64, elems: &[u8]) -> Vec<u8> {
    cat(&[&elem.to_le_bytes(), &count.to_le_bytes(), elems])
}

fn tensor_info(name: &[u8], dims: &[u64], ty: u32, offset: u64) -> Vec<u8> {
    let mut v = s(name);
    v.extend_from_slice(&(dims.len() as u32).to_le_bytes());
    for d in dims {
        v.extend_from_slice(&d.to_le_bytes());
    }
    v.extend_from_slice(&ty.to_le_bytes());
    v.extend_from_slice(&offset.to_le_bytes());
    v
}

/// Header, KV pairs and tensor infos with counts from the slices, padded to `align`, then
/// `data` bytes of tensor data.
fn build(kvs: &[Vec<u8>], tensors: &[Vec<u8>], align: usize, data: usize) -> Vec<u8> {
    let mut v = b"GGUF".to_vec();
    v.extend_from_slice(&3u32.to_le_bytes());
    v.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    v.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
    kvs.iter().chain(tensors).for_each(|p| v.extend_from_slice(p));
    v.resize(v.len().next_multiple_of(align), 0);
    v.extend((0..data).map(|i| i as u8));
    v
}

fn with_counts(mut file: Vec<u8>, tensors: Option<u64>, kvs: Option<u64>) -> Vec<u8> {
    if let Some(t) = tensors {
        file[8..16].copy_from_slice(&t.to_le_bytes());
    }
    if let Some(k) = kvs {
        file[16..24].copy_from_slice(&k.to_le_bytes());
    }
    file
}

/// A valid file: two KVs, an F32 [8] tensor (32 bytes) and an F16 [4, 2] one (16 bytes).
fn valid() -> Vec<u8> {
    build(
        &[kv(b"general.architecture", 8, &s(b"x")), kv_u32("k", 7)],
        &[tensor_info(b"a", &[8], 0, 0), tensor_info(b"b", &[4, 2], 1, 32)],
        32,
        48,
    )
}

#[test]
fn the_builder_makes_valid_files() {
    let f = parse(&valid()).unwrap();
    assert_eq!(f.tensors().len(), 2);
    assert_eq!(f.get_u32("k").unwrap(), 7);
    assert_eq!(f.tensor_bytes("b").unwrap(), &(32..48).map(|i| i as u8).collect::<Vec<_>>()[..]);
    // Version 2 has the same layout and is accepted.
    let mut v2 = valid();
    v2[4] = 2;
    assert_eq!(parse(&v2).unwrap().version(), 2);
    // Zero dimensions mean one element, as in llama.cpp.
    let f = parse(&build(&[], &[tensor_info(b"scalar", &[], 0, 0)], 32, 4)).unwrap();
    assert_eq!((f.tensors()[0].n_elements(), f.tensors()[0].n_bytes()), (1, 4));
    // The final tensor's padding may be missing.
    let f = parse(&build(&[], &[tensor_info(b"t", &[3], 0, 0)], 32, 12)).unwrap();
    assert_eq!(f.tensors()[0].n_bytes(), 12);
}

#[test]
fn truncation_at_every_length_is_a_typed_error() {
    let dir = fresh_dir("malformed_truncation");
    let path = dir.join("sample.gguf");
    let (w, data) = sample_writer(&path, 64, 3);
    w.write_tensors_from(&data).unwrap();
    let fixtures = common::fixtures_dir();
    let files = [
        std::fs::read(&path).unwrap(),
        std::fs::read(fixtures.join("tensor_types.gguf")).unwrap(),
        std::fs::read(fixtures.join("kv_types.gguf")).unwrap(),
        valid(),
    ];
    for file in &files {
        let full = parse(file).unwrap();
        // The shortest valid prefix ends with the last tensor's data; with no tensors, with
        // the header, which lies within the last `alignment` bytes.
        let needed = full.tensors().iter().map(|t| t.file_offset() + t.n_bytes()).max();
        let mut first_ok = None;
        for len in 0..file.len() {
            match parse(&file[..len]) {
                Ok(_) => {
                    first_ok.get_or_insert(len);
                }
                Err(e) => {
                    assert!(first_ok.is_none(), "prefix {len} fails after a shorter one parsed: {e}");
                    assert!(
                        matches!(
                            e.kind(),
                            GgufErrorKind::Truncated { .. }
                                | GgufErrorKind::CountTooLarge { .. }
                                | GgufErrorKind::DataOutOfBounds { .. }
                        ),
                        "prefix {len}: {e}"
                    );
                }
            }
        }
        match needed {
            Some(n) => assert_eq!(first_ok, Some(n as usize).filter(|&n| n < file.len())),
            None => {
                let l = first_ok.unwrap_or(file.len());
                assert!(l + full.alignment() as usize > file.len(), "header ends at {l}");
            }
        }
    }
}

/// A header read from a stream's first bytes ([`GgufFile::from_header`]): `None` for every
/// prefix too short to hold it, then from the header's end on the whole file's metadata and
/// tensor infos, and no data.
#[test]
fn a_streamed_header_parses_once_it_is_complete() {
    let dir = fresh_dir("malformed_streamed_header");
    let path = dir.join("sample.gguf");
    let (w, data) = sample_writer(&path, 64, 3);
    w.write_tensors_from(&data).unwrap();
    let fixtures = common::fixtures_dir();
    for file in [std::fs::read(&path).unwrap(), std::fs::read(fixtures.join("kv_types.gguf")).unwrap(), valid()] {
        let full = parse(&file).unwrap();
        let size = file.len() as u64;
        let header_end = if full.tensors().is_empty() { file.len() } else { full.data_offset() as usize };
        let mut first = None;
        for len in 0..=file.len() {
            match GgufFile::from_header(&file[..len], size, "stream").unwrap() {
                None => assert!(first.is_none(), "prefix {len} is short after a shorter one parsed"),
                Some(h) => {
                    first.get_or_insert(len);
                    assert!(!h.has_data() && h.bytes().is_empty() && h.file_size() == size);
                    assert_eq!(h.tensors(), full.tensors());
                    // Debug forms: a NaN value is not equal to itself.
                    let dbg = |f: &GgufFile| format!("{:?}", f.metadata().collect::<Vec<_>>());
                    assert_eq!(dbg(&h), dbg(&full), "prefix {len}");
                }
            }
        }
        // The header ends within the data offset's padding (llama.cpp need not write it).
        let first = first.expect("the whole file parses");
        assert!(first <= header_end && first + full.alignment() as usize > header_end, "{first} vs {header_end}");
        assert!(full.has_data());
    }
    // Not GGUF: refused from the first bytes, not after reading the whole stream.
    let e = GgufFile::from_header(b"<!DOCTYPE html>", 1 << 30, "page.html").unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::BadMagic { .. }), "{e}");
    // A declared size the stream overran.
    let e = GgufFile::from_header(&valid(), 10, "short").unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::LongerThanAnnounced { announced: 10 }), "{e}");
    // A count no file of the announced size holds is refused from the prefix that has it,
    // not after the whole stream is read.
    let absurd = with_counts(valid(), Some(1 << 60), None);
    let e = GgufFile::from_header(&absurd, 1 << 40, "absurd.gguf").unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::CountTooLarge { count, .. } if *count == 1 << 60), "{e}");
    assert!(e.to_string().contains(&format!("{} bytes left", (1u64 << 40) - 24)), "{e}");
}

#[test]
fn bad_magic_and_versions() {
    let mut f = valid();
    f[..4].copy_from_slice(b"GGUG");
    let e = expect_kind!(f, GgufErrorKind::BadMagic { found } if found == b"GGUG");
    assert!(e.to_string().starts_with("<memory>: not a GGUF file"), "{e}");
    expect_kind!(b"GGML\x03\0\0\0", GgufErrorKind::BadMagic { .. });
    for version in [0u32, 1, 4, 0x0300_0000, u32::MAX] {
        let mut f = valid();
        f[4..8].copy_from_slice(&version.to_le_bytes());
        expect_kind!(f, GgufErrorKind::UnsupportedVersion { version: v } if *v == version);
    }
}

#[test]
fn counts_and_lengths_past_the_end() {
    use GgufErrorKind::*;
    for count in [u64::MAX, 1 << 63, 1 << 32, 1000] {
        expect_kind!(with_counts(valid(), Some(count), None), CountTooLarge { what: "tensor info", .. });
        expect_kind!(with_counts(valid(), None, Some(count)), CountTooLarge { what: "key-value pair", .. });
    }
    // One more pair than the file holds: the parse runs into the tensor infos and then off
    // the end (or into garbage); in any case an error.
    fail(with_counts(valid(), None, Some(3)));
    fail(with_counts(valid(), Some(3), None));

    for len in [u64::MAX, u64::MAX - 7, 1 << 63, 1 << 32, 100] {
        let key = cat(&[&len.to_le_bytes(), b"key"]);
        expect_kind!(build(&[key], &[], 32, 0), Truncated { .. });
        let value = kv(b"k", 8, &cat(&[&len.to_le_bytes(), b"abc"]));
        let e = expect_kind!(build(&[value], &[], 32, 0), Truncated { .. });
        assert!(e.to_string().starts_with("<memory>: key 'k': truncated: string value"), "{e}");
        let name = cat(&[&len.to_le_bytes(), b"t", &1u32.to_le_bytes(), &8u64.to_le_bytes()]);
        expect_kind!(build(&[], &[name], 32, 0), Truncated { .. });
    }
    // Array counts: elements of every size, strings and nested arrays.
    for elem in 0..13u32 {
        for count in [u64::MAX, u64::MAX / 2 + 1, 1 << 61, 1 << 32, 1000] {
            let f = build(&[kv(b"a", 9, &arr(elem, count, &[0; 16]))], &[], 32, 0);
            expect_kind!(f, CountTooLarge { .. });
        }
    }
    // Counts that pass the size check (each element could be 12 bytes) but lie: a nested
    // array element is 48 bytes in memory, so trusting the count would reserve 4× the file.
    let garbage = vec![0xff; 12 * 10_000];
    let f = build(&[kv(b"a", 9, &arr(9, 10_000, &garbage))], &[], 32, 0);
    expect_kind!(f, UnknownValueType { id: u32::MAX });
    let f = build(&[], &[], 32, 0);
    let lying_tensors = with_counts([f, vec![0xff; 24 * 10_000]].concat(), Some(10_000), None);
    fail(lying_tensors);
    // A string array whose count fits but whose strings run off the end.
    let strings = cat(&[&s(b"ok"), &100u64.to_le_bytes(), b"short"]);
    expect_kind!(build(&[kv(b"a", 9, &arr(8, 2, &strings))], &[], 32, 0), Truncated { .. });
}

#[test]
fn bad_shapes() {
    use GgufErrorKind::*;
    // n_dims above 4, up to u32::MAX: refused before any dimension is read.
    for n_dims in [5u32, 64, u32::MAX] {
        let mut ti = s(b"t");
        ti.extend_from_slice(&n_dims.to_le_bytes());
        ti.extend_from_slice(&[1; 64]);
        let e = expect_kind!(build(&[], &[ti], 32, 0), TooManyDims { n_dims: n } if *n == u64::from(n_dims));
        assert!(e.to_string().starts_with("<memory>: tensor 't': "), "{e}");
    }
    let overflow = [
        vec![1u64 << 32, 1 << 32],
        vec![1 << 62, 2],
        vec![u64::MAX],
        vec![1 << 63],
        vec![0, u64::MAX],
        vec![3, 5, 7, 1 << 61],
    ];
    for dims in &overflow {
        expect_kind!(build(&[], &[tensor_info(b"t", dims, 0, 0)], 32, 0), Overflow { .. });
    }
    // Elements fit in i64 but bytes do not fit in u64.
    expect_kind!(build(&[], &[tensor_info(b"t", &[1 << 31, 1 << 31], 28, 0)], 32, 0), Overflow { .. });
    // dims[0] must be whole blocks.
    let e =
        expect_kind!(build(&[], &[tensor_info(b"q", &[48, 2], 2, 0)], 32, 64), ShapeNotBlockAligned { dim0: 48, .. });
    assert_eq!(e.to_string(), "<memory>: tensor 'q': dims[0] = 48 is not a multiple of the Q4_0 block size 32");
    expect_kind!(build(&[], &[tensor_info(b"q", &[], 12, 0)], 32, 256), ShapeNotBlockAligned { dim0: 1, .. });
}

#[test]
fn bad_offsets() {
    use GgufErrorKind::*;
    let two = |off_a: u64, off_b: u64, data: usize| {
        build(&[], &[tensor_info(b"a", &[8], 0, off_a), tensor_info(b"b", &[8], 0, off_b)], 32, data)
    };
    parse(&two(0, 32, 64)).unwrap();
    expect_kind!(two(0, 16, 64), BadOffset { offset: 16, expected: 32 }); // misaligned
    expect_kind!(two(0, 0, 64), BadOffset { offset: 0, expected: 32 }); // overlapping
    expect_kind!(two(0, 64, 96), BadOffset { offset: 64, expected: 32 }); // gap
    expect_kind!(two(32, 64, 96), BadOffset { offset: 32, expected: 0 }); // first not at 0
    expect_kind!(two(0, u64::MAX, 64), BadOffset { .. });
    // With alignment 64 the second tensor must move to 64.
    let align64 = |off_b| {
        build(
            &[kv_u32("general.alignment", 64)],
            &[tensor_info(b"a", &[8], 0, 0), tensor_info(b"b", &[8], 0, off_b)],
            64,
            96,
        )
    };
    parse(&align64(64)).unwrap();
    expect_kind!(align64(32), BadOffset { offset: 32, expected: 64 });
}

#[test]
fn tensor_data_past_the_end() {
    use GgufErrorKind::*;
    let f = build(&[], &[tensor_info(b"blk.0.attn_q.weight", &[8], 0, 0), tensor_info(b"b", &[8], 0, 32)], 32, 63);
    let e = parse_named(&f, "model.gguf").err().unwrap();
    assert!(matches!(e.kind(), DataOutOfBounds { start: 160, len: 32, file_size: 191 }), "{e}");
    assert_eq!(
        e.to_string(),
        "model.gguf: tensor 'b': data (offset 160 + 32 bytes) ends past the end of the file (191 bytes)"
    );
    // A huge tensor whose size fits in u64 but not in the file.
    let f = build(&[], &[tensor_info(b"big", &[1 << 40], 0, 0)], 32, 16);
    expect_kind!(f, DataOutOfBounds { len, .. } if *len == 4 << 40);
    // Data section start past the end even for an empty tensor.
    let mut f = build(&[], &[tensor_info(b"e", &[0], 0, 0)], 1, 0);
    parse(&f).unwrap_err();
    f.resize(f.len().next_multiple_of(32), 0);
    assert_eq!(parse(&f).unwrap().tensors()[0].n_bytes(), 0);
}

#[test]
fn unknown_type_ids() {
    use GgufErrorKind::*;
    for id in [13u32, 99, u32::MAX] {
        let e = expect_kind!(build(&[kv(b"k", id, &[0; 8])], &[], 32, 0), UnknownValueType { id: i } if *i == id);
        assert!(e.to_string().contains("key 'k'"), "{e}");
        expect_kind!(build(&[kv(b"k", 9, &arr(id, 1, &[0; 8]))], &[], 32, 0), UnknownValueType { id: i } if *i == id);
    }
    // Removed ggml ids (Q4_2, Q4_3, repacked Q4_0_x_y) and ids past the table.
    for id in [4u32, 5, 31, 36, 1000, u32::MAX] {
        let e = expect_kind!(build(&[], &[tensor_info(b"w.weight", &[32], id, 0)], 32, 64), UnknownType { id: i } if *i == id);
        assert_eq!(e.to_string(), format!("<memory>: tensor 'w.weight': unknown ggml type id {id}"));
    }
}

#[test]
fn invalid_utf8() {
    use GgufErrorKind::*;
    let bad = b"ab\xff\xfe";
    expect_kind!(build(&[kv(bad, 4, &[0; 4])], &[], 32, 0), BadUtf8 { what: "key", .. });
    expect_kind!(build(&[kv(b"k", 8, &s(b"\xc3\x28"))], &[], 32, 0), BadUtf8 { what: "string value", .. });
    let strings = cat(&[&s(b"ok"), &s(b"\xed\xa0\x80")]); // an encoded surrogate
    expect_kind!(build(&[kv(b"k", 9, &arr(8, 2, &strings))], &[], 32, 0), BadUtf8 { .. });
    expect_kind!(build(&[], &[tensor_info(bad, &[8], 0, 0)], 32, 32), BadUtf8 { what: "tensor name", .. });
}

#[test]
fn bad_alignment() {
    use GgufErrorKind::*;
    for a in [0u32, 3, 48, u32::MAX] {
        let e = expect_kind!(build(&[kv_u32("general.alignment", a)], &[], 32, 0), BadAlignment { .. });
        assert!(e.to_string().contains(&format!("found u32 {a}")), "{e}");
    }
    expect_kind!(build(&[kv(b"general.alignment", 5, &32i32.to_le_bytes())], &[], 32, 0), BadAlignment { found } if found == "i32 32");
    expect_kind!(build(&[kv(b"general.alignment", 10, &32u64.to_le_bytes())], &[], 32, 0), BadAlignment { .. });
    expect_kind!(build(&[kv(b"general.alignment", 8, &s(b"32"))], &[], 32, 0), BadAlignment { .. });
    for a in [1u32, 2, 64, 1 << 31] {
        assert_eq!(parse(&build(&[kv_u32("general.alignment", a)], &[], 32, 0)).unwrap().alignment(), a);
    }
}

#[test]
fn duplicates_and_names() {
    use GgufErrorKind::*;
    expect_kind!(build(&[kv_u32("k", 1), kv_u32("j", 1), kv_u32("k", 2)], &[], 32, 0), DuplicateKey { key } if key == "k");
    let t = |name: &[u8], off| tensor_info(name, &[8], 0, off);
    expect_kind!(build(&[], &[t(b"w", 0), t(b"v", 32), t(b"w", 64)], 32, 96), DuplicateTensor { name } if name == "w");
    expect_kind!(build(&[kv(b"", 4, &[0; 4])], &[], 32, 0), EmptyKey);
    parse(&build(&[], &[t(&[b'n'; 63], 0)], 32, 32)).unwrap();
    let e = expect_kind!(build(&[], &[t(&[b'n'; 64], 0)], 32, 32), NameTooLong { len: 64, .. });
    assert!(e.to_string().starts_with("<memory>: tensor #0: name 'nnnn"), "{e}");
    // A huge name is cut short in the message.
    let e = expect_kind!(build(&[], &[t(&[b'n'; 100_000], 0)], 32, 32), NameTooLong { len: 100_000, .. });
    assert!(e.to_string().len() < 300, "{e}");
}

#[test]
fn bools_must_be_0_or_1() {
    use GgufErrorKind::*;
    for b in [0u8, 1] {
        assert_eq!(parse(&build(&[kv(b"b", 7, &[b])], &[], 32, 0)).unwrap().get_bool("b").unwrap(), b == 1);
    }
    for b in [2u8, 0xff] {
        expect_kind!(build(&[kv(b"b", 7, &[b])], &[], 32, 0), BadBool { value } if *value == b);
        expect_kind!(build(&[kv(b"b", 9, &arr(7, 3, &[1, 0, b]))], &[], 32, 0), BadBool { value } if *value == b);
    }
}

#[test]
fn nesting_depth_is_bounded() {
    use GgufErrorKind::*;
    let nested = |depth: usize| {
        // `depth` array headers, each holding one array, around an empty u8 array.
        let mut payload = Vec::new();
        for _ in 1..depth {
            payload.extend_from_slice(&9u32.to_le_bytes());
            payload.extend_from_slice(&1u64.to_le_bytes());
        }
        payload.extend_from_slice(&arr(0, 0, &[]));
        build(&[kv(b"n", 9, &payload)], &[], 32, 0)
    };
    let f = parse(&nested(MAX_ARRAY_DEPTH)).unwrap();
    assert!(f.get("n").unwrap().to_string().starts_with("[[[["));
    expect_kind!(nested(MAX_ARRAY_DEPTH + 1), NestingTooDeep { .. });
    // A million levels: refused without exhausting the stack.
    expect_kind!(nested(1_000_000), NestingTooDeep { .. });
}

#[test]
fn big_valid_arrays_stay_within_the_file_size() {
    // Fixed-size and string arrays are allocated at exactly their size, even when every
    // element is as small as the format allows.
    let n = 200_000u64;
    let empties = vec![0u8; 8 * n as usize];
    let f = parse(&build(&[kv(b"s", 9, &arr(8, n, &empties))], &[], 32, 0)).unwrap();
    assert_eq!(f.get_string_array("s").unwrap().len(), n as usize);
    let bools = vec![1u8; n as usize];
    parse(&build(&[kv(b"b", 9, &arr(7, n, &bools))], &[], 32, 0)).unwrap();
    let f = parse(&build(&[kv(b"f", 9, &arr(6, n, &vec![0u8; 4 * n as usize]))], &[], 32, 0)).unwrap();
    assert_eq!(f.get_f32_array("f").unwrap().len(), n as usize);
}

/// Reads everything a parsed file offers and checks its invariants.
fn exercise(f: &GgufFile) {
    let size = f.file_size();
    for (k, v) in f.metadata() {
        assert!(!k.is_empty());
        assert_eq!(f.get(k).map(|g| std::ptr::eq(g, v)), Some(true));
        let _ = v.summary(3, 10).to_string();
        let _ = (f.get_u32_opt(k), f.get_str_opt(k), f.get_string_array_opt(k), f.get_f32_array_opt(k));
    }
    let mut expected = 0;
    for t in f.tensors() {
        assert!(t.name().len() < 64 && t.n_dims() <= 4);
        assert_eq!(t.offset(), expected);
        let data = f.tensor_data(t);
        assert_eq!(data.len() as u64, t.n_bytes());
        assert!(t.file_offset() + t.n_bytes() <= size);
        assert_eq!(f.tensor(t.name()), Some(t));
        expected = t.offset() + t.n_bytes().next_multiple_of(u64::from(f.alignment()));
    }
}

const INTERESTING_U64: &[u64] = &[
    0,
    1,
    2,
    4,
    8,
    31,
    32,
    63,
    64,
    255,
    1 << 16,
    (1 << 31) - 1,
    1 << 31,
    u32::MAX as u64,
    1 << 32,
    1 << 40,
    (1 << 62) + 1,
    i64::MAX as u64,
    1 << 63,
    u64::MAX - 7,
    u64::MAX,
];
const INTERESTING_U32: &[u32] = &[0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 14, 30, 41, 42, 64, 1 << 31, u32::MAX];

fn mutate(rng: &mut Rng, file: &mut Vec<u8>, header_len: usize) {
    let hot = header_len.clamp(1, file.len().max(1));
    let pos = |rng: &mut Rng, len: usize| rng.below(len.max(1));
    match rng.below(8) {
        0 => {
            for _ in 0..1 + rng.below(4) {
                if !file.is_empty() {
                    let i = pos(rng, hot.min(file.len()));
                    file[i] ^= 1 << rng.below(8);
                }
            }
        }
        1 => {
            if !file.is_empty() {
                let i = pos(rng, hot.min(file.len()));
                file[i] = rng.next_u64() as u8;
            }
        }
        2 => {
            let mut v = INTERESTING_U64[rng.below(INTERESTING_U64.len())];
            if rng.below(4) == 0 {
                v = file.len() as u64 + rng.below(3) as u64 - 1;
            }
            let i = pos(rng, hot.min(file.len()));
            for (j, b) in v.to_le_bytes().into_iter().enumerate() {
                if let Some(x) = file.get_mut(i + j) {
                    *x = b;
                }
            }
        }
        3 => {
            let v = INTERESTING_U32[rng.below(INTERESTING_U32.len())];
            let i = pos(rng, hot.min(file.len()));
            for (j, b) in v.to_le_bytes().into_iter().enumerate() {
                if let Some(x) = file.get_mut(i + j) {
                    *x = b;
                }
            }
        }
        4 => file.truncate(pos(rng, file.len())),
        5 => {
            let i = pos(rng, hot.min(file.len()));
            let junk: Vec<u8> = (0..1 + rng.below(16)).map(|_| rng.next_u64() as u8).collect();
            file.splice(i..i, junk);
        }
        6 => {
            let i = pos(rng, hot.min(file.len()));
            let end = (i + 1 + rng.below(24)).min(file.len());
            file.drain(i..end);
        }
        _ => {
            // Copy a stretch of the header elsewhere: duplicate keys, names, shapes.
            let len = 1 + rng.below(48);
            let from = pos(rng, hot.min(file.len()));
            let to = pos(rng, hot.min(file.len()));
            let chunk: Vec<u8> = file.iter().skip(from).take(len).copied().collect();
            file.splice(to..to, chunk);
        }
    }
}

#[test]
fn randomized_mutations_never_panic() {
    let dir = fresh_dir("malformed_mutations");
    let path = dir.join("sample.gguf");
    let (w, data) = sample_writer(&path, 32, 11);
    w.write_tensors_from(&data).unwrap();
    let fixtures = common::fixtures_dir();
    let bases = [
        std::fs::read(&path).unwrap(),
        std::fs::read(fixtures.join("tensor_types.gguf")).unwrap(),
        std::fs::read(fixtures.join("kv_types.gguf")).unwrap(),
        std::fs::read(fixtures.join("align128.gguf")).unwrap(),
        valid(),
    ];
    let mut rng = Rng::new(0x6767_7566);
    let (mut accepted, mut rejected) = (0, 0);
    let mut kinds = std::collections::HashSet::new();
    for base in &bases {
        let header_len = parse(base).unwrap().data_offset() as usize;
        for _ in 0..1500 {
            let mut file = base.clone();
            for _ in 0..1 + rng.below(3) {
                mutate(&mut rng, &mut file, header_len);
            }
            match parse(&file) {
                Ok(f) => {
                    exercise(&f);
                    accepted += 1;
                }
                Err(e) => {
                    assert!(!e.to_string().is_empty());
                    kinds.insert(std::mem::discriminant(e.kind()));
                    rejected += 1;
                }
            }
        }
    }
    // Both outcomes must be common, and the rejections varied, or the mutations are not
    // reaching the deeper checks.
    assert!(
        accepted > 100 && rejected > 5000 && kinds.len() >= 12,
        "accepted {accepted}, rejected {rejected}, {} kinds of error",
        kinds.len()
    );
}
