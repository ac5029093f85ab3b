//! The writer: what it refuses, that it never leaves a partial file behind, the exact bytes
//! it writes, and round trips through our reader.

mod common;

use std::path::{Path, PathBuf};

use common::{fresh_dir, metadata_json, sample_writer};
use duet_quant::GgmlType;
use duet_quant::gguf::{Array, GgufDataWriter, GgufError, GgufErrorKind, GgufFile, GgufWriter, MAX_ARRAY_DEPTH, Value};

/// Names of everything in `dir`, so a test can assert nothing (not even a temp file) is left.
fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

fn target(test: &str) -> (PathBuf, PathBuf) {
    let dir = fresh_dir(test);
    let path = dir.join("out.gguf");
    (dir, path)
}

#[test]
fn exact_bytes_of_a_small_file() {
    let (_dir, path) = target("exact_bytes");
    let mut w = GgufWriter::new(&path);
    w.add("a", 7u32).unwrap();
    w.add("s", "hi").unwrap();
    w.add_tensor("t", &[3], GgmlType::F32).unwrap();
    w.add_tensor("u", &[1, 2], GgmlType::F16).unwrap();
    let mut d = w.start().unwrap();
    d.write_tensor("t", &[1; 12]).unwrap();
    d.write_tensor("u", &[2; 4]).unwrap();
    d.finish().unwrap();

    let mut want = Vec::new();
    want.extend_from_slice(b"GGUF");
    want.extend_from_slice(&3u32.to_le_bytes());
    want.extend_from_slice(&2u64.to_le_bytes()); // tensors
    want.extend_from_slice(&2u64.to_le_bytes()); // kvs
    want.extend_from_slice(&1u64.to_le_bytes());
    want.extend_from_slice(b"a");
    want.extend_from_slice(&4u32.to_le_bytes()); // u32
    want.extend_from_slice(&7u32.to_le_bytes());
    want.extend_from_slice(&1u64.to_le_bytes());
    want.extend_from_slice(b"s");
    want.extend_from_slice(&8u32.to_le_bytes()); // string
    want.extend_from_slice(&2u64.to_le_bytes());
    want.extend_from_slice(b"hi");
    want.extend_from_slice(&1u64.to_le_bytes());
    want.extend_from_slice(b"t");
    want.extend_from_slice(&1u32.to_le_bytes()); // n_dims
    want.extend_from_slice(&3u64.to_le_bytes());
    want.extend_from_slice(&0u32.to_le_bytes()); // F32
    want.extend_from_slice(&0u64.to_le_bytes()); // offset
    want.extend_from_slice(&1u64.to_le_bytes());
    want.extend_from_slice(b"u");
    want.extend_from_slice(&2u32.to_le_bytes());
    want.extend_from_slice(&1u64.to_le_bytes());
    want.extend_from_slice(&2u64.to_le_bytes());
    want.extend_from_slice(&1u32.to_le_bytes()); // F16
    want.extend_from_slice(&32u64.to_le_bytes()); // 12 bytes padded to 32
    want.resize(want.len().next_multiple_of(32), 0);
    want.extend_from_slice(&[1; 12]);
    want.resize(want.len() + 20, 0);
    want.extend_from_slice(&[2; 4]);
    want.resize(want.len() + 28, 0);
    assert_eq!(std::fs::read(&path).unwrap(), want);
}

#[test]
fn round_trip_through_our_reader() {
    for alignment in [32, 1, 64, 4096] {
        let (dir, path) = target(&format!("round_trip_{alignment}"));
        let (w, data) = sample_writer(&path, alignment, alignment.into());
        let meta = metadata_json(w.metadata());
        let specs = w.tensors().to_vec();
        let predicted_size = w.file_size();
        w.write_tensors_from(&data).unwrap();
        assert_eq!(entries(&dir), ["out.gguf"], "only the target remains");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), predicted_size, "file_size() predicts the output");

        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.version(), 3);
        assert_eq!(f.alignment(), alignment);
        assert_eq!(f.get_u32_opt("general.alignment").unwrap(), (alignment != 32).then_some(alignment));
        assert_eq!(metadata_json(f.metadata()), meta);
        assert_eq!(f.tensors().len(), specs.len());
        for ((t, spec), bytes) in f.tensors().iter().zip(&specs).zip(&data) {
            assert_eq!(t.name(), spec.name());
            assert_eq!(t.dims(), spec.dims());
            assert_eq!(t.ggml_type(), spec.ggml_type());
            assert_eq!(t.offset(), spec.offset());
            assert_eq!(t.n_bytes(), spec.n_bytes());
            assert_eq!(t.offset() % u64::from(alignment), 0);
            assert_eq!(f.tensor_data(t), bytes.as_slice(), "{}", t.name());
        }
        // The file ends with the last tensor's padding.
        let last = f.tensors().last().unwrap();
        assert_eq!(f.file_size(), (last.file_offset() + last.n_bytes()).next_multiple_of(alignment.into()));
    }
}

#[test]
fn chunked_writes_equal_whole_writes() {
    let (_dir, whole) = target("chunked");
    let chunked = whole.with_file_name("chunked.gguf");
    let (w, data) = sample_writer(&whole, 64, 1);
    w.write_tensors_from(&data).unwrap();

    let (w, data) = sample_writer(&chunked, 64, 1);
    let names: Vec<String> = w.tensors().iter().map(|t| t.name().to_owned()).collect();
    let mut d = w.start().unwrap();
    for (i, (name, bytes)) in names.iter().zip(&data).enumerate() {
        d.begin_tensor(name).unwrap();
        // Chunks of 1, 2, 3, ... bytes, plus empty ones, which must be harmless.
        let mut rest = bytes.as_slice();
        let mut k = i % 3 + 1;
        while !rest.is_empty() {
            let (a, b) = rest.split_at(k.min(rest.len()));
            d.write_data(a).unwrap();
            d.write_data(&[]).unwrap();
            rest = b;
            k += 1;
        }
        d.end_tensor().unwrap();
    }
    assert!(d.next_tensor().is_none());
    d.finish().unwrap();
    assert_eq!(std::fs::read(&whole).unwrap(), std::fs::read(&chunked).unwrap());
}

#[test]
fn header_refusals() {
    let mut w = GgufWriter::new("unused.gguf");
    let name63 = "n".repeat(63);
    w.add_tensor(name63.as_str(), &[4], GgmlType::F32).unwrap();
    let e = w.add_tensor("n".repeat(64), &[4], GgmlType::F32).unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::NameTooLong { len: 64, .. }), "{e}");
    assert!(e.to_string().starts_with("unused.gguf: "), "{e}");
    let e = w.add_tensor("ü".repeat(32), &[4], GgmlType::F32).unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::NameTooLong { len: 64, .. }), "bytes, not chars: {e}");
    let e = w.add_tensor(name63.as_str(), &[4], GgmlType::F32).unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::DuplicateTensor { .. }), "{e}");

    let e = w.add_tensor("q", &[48, 2], GgmlType::Q4_0).unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::ShapeNotBlockAligned { dim0: 48, block_size: 32, .. }), "{e}");
    assert_eq!(e.to_string(), "unused.gguf: tensor 'q': dims[0] = 48 is not a multiple of the Q4_0 block size 32");
    let e = w.add_tensor("k", &[128], GgmlType::Q6_K).unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::ShapeNotBlockAligned { block_size: 256, .. }), "{e}");
    // Rows must be whole blocks; other axes need not be.
    w.add_tensor("k2", &[256, 3], GgmlType::Q6_K).unwrap();
    let e = w.add_tensor("d0", &[], GgmlType::F32).unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::NoDims), "{e}");
    let e = w.add_tensor("d5", &[1, 1, 1, 1, 1], GgmlType::F32).unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::TooManyDims { n_dims: 5 }), "{e}");
    let e = w.add_tensor("big", &[1 << 32, 1 << 32], GgmlType::F32).unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::Overflow { .. }), "{e}");
    let e = w.add_tensor("big2", &[0, u64::MAX], GgmlType::F32).unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::Overflow { .. }), "a dimension past i64::MAX: {e}");
    assert_eq!(w.tensors().len(), 2, "refused tensors are not declared");

    w.add("k", 1u32).unwrap();
    let e = w.add("k", 2u32).unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::DuplicateKey { key } if key == "k"), "{e}");
    let e = w.add("", 2u32).unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::EmptyKey), "{e}");
    for bad in [0u32, 3, 48] {
        let e = w.set_alignment(bad).unwrap_err();
        assert!(matches!(e.kind(), GgufErrorKind::BadAlignment { .. }), "{bad}: {e}");
        let e = w.add("general.alignment", bad).unwrap_err();
        assert!(matches!(e.kind(), GgufErrorKind::BadAlignment { .. }), "{bad}: {e}");
    }
    let e = w.add("general.alignment", 64i32).unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::BadAlignment { found } if found == "i32 64"), "{e}");
    assert_eq!(w.alignment(), 32);
    assert_eq!(w.metadata().len(), 1, "refused keys are not added");

    // Arrays nested beyond the reader's limit are refused too.
    let mut deep = Array::U8(vec![1]);
    for _ in 0..MAX_ARRAY_DEPTH {
        deep = Array::Array(vec![deep]);
    }
    let e = w.add("deep", deep).unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::NestingTooDeep { .. }), "{e}");
}

#[test]
fn alignment_key_follows_set_alignment() {
    let mut w = GgufWriter::new("unused.gguf");
    w.add("a", 1u8).unwrap();
    w.add_tensor("t0", &[3], GgmlType::F32).unwrap();
    w.add_tensor("t1", &[3], GgmlType::F32).unwrap();
    w.set_alignment(32).unwrap();
    assert_eq!(w.metadata().len(), 1, "the default alignment adds no key");
    w.set_alignment(128).unwrap();
    assert_eq!(w.tensors()[1].offset(), 128, "offsets follow the alignment");
    w.add("b", 1u8).unwrap();
    w.set_alignment(16).unwrap();
    let keys: Vec<(&str, &Value)> = w.metadata().collect();
    assert_eq!(keys, [("a", &Value::U8(1)), ("general.alignment", &Value::U32(16)), ("b", &Value::U8(1))]);
    assert_eq!(w.tensors()[1].offset(), 16);
    let e = w.add("general.alignment", 16u32).unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::DuplicateKey { .. }));
}

/// Runs `body` on a started writer for a one-tensor file of 8 F32 values, expecting an
/// error of the given kind; then nothing may remain but a pre-existing target, unchanged.
fn expect_failure(
    test: &str,
    body: impl Fn(&mut GgufDataWriter) -> Result<(), GgufError>,
    check: impl Fn(&GgufErrorKind) -> bool,
) {
    for existing in [false, true] {
        let (dir, path) = target(&format!("{test}_{existing}"));
        if existing {
            std::fs::write(&path, b"old contents").unwrap();
        }
        let mut w = GgufWriter::new(&path);
        w.add("k", 1u32).unwrap();
        w.add_tensor("a", &[8], GgmlType::F32).unwrap();
        w.add_tensor("b", &[8], GgmlType::F32).unwrap();
        let mut d = w.start().unwrap();
        let tmp = d.temp_path().to_path_buf();
        assert!(tmp.exists());
        let e = body(&mut d).expect_err("the write must fail");
        assert!(check(e.kind()), "{test}: unexpected error {e}");
        assert!(!tmp.exists(), "{test}: the temp file is removed as soon as the error happens");
        // Everything after an error is refused.
        assert!(matches!(d.write_data(&[0; 4]).unwrap_err().kind(), GgufErrorKind::Misuse(_)));
        assert!(matches!(d.finish().unwrap_err().kind(), GgufErrorKind::Misuse(_)));
        let want: &[&str] = &["out.gguf"];
        assert_eq!(entries(&dir), if existing { want } else { &[] }, "{test}");
        if existing {
            assert_eq!(std::fs::read(&path).unwrap(), b"old contents");
        }
    }
}

#[test]
fn data_refusals_leave_nothing_behind() {
    use GgufErrorKind::*;
    expect_failure(
        "too_many",
        |d| d.write_tensor("a", &[0; 33]),
        |k| matches!(k, WrongDataSize { expected: 32, got: 33 }),
    );
    expect_failure(
        "too_many_chunked",
        |d| {
            d.begin_tensor("a")?;
            d.write_data(&[0; 20])?;
            d.write_data(&[0; 20])
        },
        |k| matches!(k, WrongDataSize { expected: 32, got: 40 }),
    );
    expect_failure(
        "too_few",
        |d| d.write_tensor("a", &[0; 31]),
        |k| matches!(k, WrongDataSize { expected: 32, got: 31 }),
    );
    expect_failure("out_of_order", |d| d.write_tensor("b", &[0; 32]), |k| matches!(k, OutOfOrder { .. }));
    expect_failure("unknown_name", |d| d.begin_tensor("zzz"), |k| matches!(k, OutOfOrder { .. }));
    expect_failure(
        "one_too_many",
        |d| {
            d.write_tensor("a", &[0; 32])?;
            d.write_tensor("b", &[0; 32])?;
            d.write_tensor("b", &[0; 32])
        },
        |k| matches!(k, OutOfOrder { .. }),
    );
    expect_failure("data_before_begin", |d| d.write_data(&[0; 4]), |k| matches!(k, Misuse(_)));
    expect_failure(
        "begin_twice",
        |d| {
            d.begin_tensor("a")?;
            d.begin_tensor("a")
        },
        |k| matches!(k, Misuse(_)),
    );
    expect_failure("end_before_begin", |d| d.end_tensor(), |k| matches!(k, Misuse(_)));
    expect_failure(
        "finish_early",
        |d| {
            d.write_tensor("a", &[0; 32])?;
            // finish consumes the writer; a stand-in keeps `d` usable for the checks.
            std::mem::replace(d, started_elsewhere()).finish()
        },
        |k| matches!(k, Misuse(m) if m.contains("1 of 2")),
    );
}

/// A throwaway started writer (its own directory, removed on drop).
fn started_elsewhere() -> GgufDataWriter {
    let (_dir, path) = target("stand_in");
    let mut w = GgufWriter::new(path);
    w.add_tensor("x", &[1], GgmlType::F32).unwrap();
    w.start().unwrap()
}

#[test]
fn dropping_an_unfinished_writer_removes_the_temp_file() {
    let (dir, path) = target("dropped");
    std::fs::write(&path, b"old").unwrap();
    let mut w = GgufWriter::new(&path);
    w.add_tensor("a", &[8], GgmlType::F32).unwrap();
    let mut d = w.start().unwrap();
    d.begin_tensor("a").unwrap();
    d.write_data(&[1; 16]).unwrap();
    assert_eq!(entries(&dir).len(), 2, "target and temp file while writing");
    drop(d);
    assert_eq!(entries(&dir), ["out.gguf"]);
    assert_eq!(std::fs::read(&path).unwrap(), b"old");

    // Dropped right after start, and with every tensor written but no finish().
    let mut w = GgufWriter::new(&path);
    w.add_tensor("a", &[8], GgmlType::F32).unwrap();
    drop(w.start().unwrap());
    let mut w = GgufWriter::new(&path);
    w.add_tensor("a", &[8], GgmlType::F32).unwrap();
    let mut d = w.start().unwrap();
    d.write_tensor("a", &[1; 32]).unwrap();
    drop(d);
    assert_eq!(entries(&dir), ["out.gguf"]);
    assert_eq!(std::fs::read(&path).unwrap(), b"old");
}

#[test]
fn iterator_writes_check_the_tensor_count() {
    let (dir, path) = target("iter_count");
    let (w, mut data) = sample_writer(&path, 32, 5);
    data.pop();
    let e = w.write_tensors_from(&data).unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::Misuse(m) if m.contains("ran out")), "{e}");
    assert!(entries(&dir).is_empty());

    let (w, mut data) = sample_writer(&path, 32, 5);
    data.push(vec![]);
    let e = w.write_tensors_from(&data).unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::Misuse(m) if m.contains("more data")), "{e}");
    assert!(entries(&dir).is_empty());

    // A generator works as well as a collection.
    let mut w = GgufWriter::new(&path);
    w.add_tensor("a", &[4], GgmlType::F32).unwrap();
    w.add_tensor("b", &[2], GgmlType::F32).unwrap();
    let sizes: Vec<usize> = w.tensors().iter().map(|t| t.n_bytes() as usize).collect();
    w.write_tensors_from(sizes.iter().enumerate().map(|(i, &n)| vec![i as u8 + 1; n])).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.tensor_bytes("a"), Some(&[1u8; 16][..]));
    assert_eq!(f.tensor_bytes("b"), Some(&[2u8; 8][..]));
}

#[test]
fn io_errors_name_the_path() {
    let (dir, _) = target("io_errors");
    let path = dir.join("no/such/dir/out.gguf");
    let mut w = GgufWriter::new(&path);
    w.add("k", 1u8).unwrap();
    let e = w.start().err().expect("cannot create");
    assert!(matches!(e.kind(), GgufErrorKind::Io { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.starts_with(&path.display().to_string()) && msg.contains("temporary file"), "{msg}");

    let e = GgufWriter::new("/").start().err().expect("no file name");
    assert!(matches!(e.kind(), GgufErrorKind::Io { .. }), "{e}");
}

#[test]
fn a_file_without_tensors() {
    let (_dir, path) = target("no_tensors");
    let mut w = GgufWriter::new(&path);
    w.add("general.architecture", "x").unwrap();
    w.start().unwrap().finish().unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert!(f.tensors().is_empty());
    assert_eq!(f.get_str("general.architecture").unwrap(), "x");
    assert_eq!(f.file_size() % 32, 0);
}
