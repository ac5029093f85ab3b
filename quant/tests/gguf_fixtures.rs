//! Our reader against files written by gguf-py (tests/gguf-fixtures, made by
//! make_fixtures.py): every value must match the sidecar JSON exactly (floats bitwise) and
//! every tensor's bytes must be the ones gguf-py was given.

mod common;

use common::{fixtures_dir, hex, metadata_json};
use duet_quant::GgmlType;
use duet_quant::gguf::{Array, GgufErrorKind, GgufFile, Value};
use serde_json::Value as Json;

const FIXTURES: &[&str] = &["kv_types", "tensor_types", "align128"];

fn load(name: &str) -> (GgufFile, Json) {
    let dir = fixtures_dir();
    let side = std::fs::read_to_string(dir.join(format!("{name}.json"))).expect("sidecar");
    let side: Json = serde_json::from_str(&side).expect("sidecar JSON");
    let file = GgufFile::open(dir.join(format!("{name}.gguf"))).unwrap_or_else(|e| panic!("{e}"));
    (file, side)
}

#[test]
fn fixtures_match_their_sidecars() {
    for &name in FIXTURES {
        let (f, side) = load(name);
        assert_eq!(u64::from(f.version()), side["version"].as_u64().unwrap(), "{name}");
        assert_eq!(u64::from(f.alignment()), side["alignment"].as_u64().unwrap(), "{name}");
        assert_eq!(metadata_json(f.metadata()), side["metadata"], "{name}: metadata");

        let expected = side["tensors"].as_array().unwrap();
        assert_eq!(f.tensors().len(), expected.len(), "{name}");
        let mut next_offset = 0;
        for (t, e) in f.tensors().iter().zip(expected) {
            let what = format!("{name}: {}", t.name());
            assert_eq!(t.name(), e["name"].as_str().unwrap(), "{what}");
            assert_eq!(Some(t.ggml_type()), GgmlType::from_name(e["type"].as_str().unwrap()), "{what}");
            let dims: Vec<u64> = e["dims"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
            assert_eq!(t.dims(), dims.as_slice(), "{what}");
            let data = f.tensor_data(t);
            assert_eq!(hex(data), e["hex"].as_str().unwrap(), "{what}: data");
            assert_eq!(data.len() as u64, t.n_bytes(), "{what}");
            assert_eq!(t.offset(), next_offset, "{what}");
            next_offset = t.offset() + t.n_bytes().next_multiple_of(u64::from(f.alignment()));
            // The map is page-aligned, so data aligned in the file is aligned in memory.
            assert_eq!(data.as_ptr() as usize % f.alignment() as usize, 0, "{what}");
            assert_eq!(f.tensor(t.name()), Some(t));
            assert_eq!(f.tensor_bytes(t.name()), Some(data));
        }
        assert_eq!(f.data_offset() % u64::from(f.alignment()), 0);
        // The same bytes through the in-memory path give the same result.
        let g = GgufFile::from_bytes(f.bytes()).unwrap();
        assert_eq!(metadata_json(g.metadata()), side["metadata"]);
        assert_eq!(g.tensors(), f.tensors());
    }
}

#[test]
fn fixtures_are_small() {
    let total: u64 = std::fs::read_dir(fixtures_dir()).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum();
    assert!(total < 200 * 1024, "fixtures take {total} bytes");
}

#[test]
fn typed_getters_are_type_strict() {
    let (f, _) = load("kv_types");
    assert_eq!(f.get_u8("t.u8").unwrap(), 255);
    assert_eq!(f.get_i8("t.i8").unwrap(), -128);
    assert_eq!(f.get_u16("t.u16").unwrap(), 65535);
    assert_eq!(f.get_i16("t.i16").unwrap(), -32768);
    assert_eq!(f.get_u32("t.u32").unwrap(), u32::MAX);
    assert_eq!(f.get_i32("t.i32").unwrap(), i32::MIN);
    assert_eq!(f.get_f32("t.f32").unwrap().to_bits(), 1e-5f32.to_bits());
    assert_eq!(f.get_f32("t.f32.neg_zero").unwrap().to_bits(), 0x8000_0000);
    assert!(f.get_f32("t.f32.nan").unwrap().is_nan());
    assert!(f.get_bool("t.bool.true").unwrap());
    assert!(!f.get_bool("t.bool.false").unwrap());
    assert_eq!(f.get_str("t.str").unwrap(), "hello");
    assert_eq!(f.get_str("t.str.empty").unwrap(), "");
    assert_eq!(f.get_str("t.str.unicode").unwrap(), "Grüße, 世界! 🦀 e\u{301} \0 tab\tnl\n");
    assert_eq!(f.get_u64("t.u64").unwrap(), u64::MAX);
    assert_eq!(f.get_i64("t.i64").unwrap(), i64::MIN);
    assert_eq!(f.get_f64("t.f64").unwrap(), std::f64::consts::E);
    assert_eq!(f.get_u8("ключ.unicode").unwrap(), 7);
    assert_eq!(f.get_string_array("a.str").unwrap().to_vec(), ["<unk>", "", "▁the", "Ġworld", "🦀", "a b"]);
    assert_eq!(f.get_i32_array("a.inferred_i32").unwrap(), [3, 1, 4, 1, 5]);
    assert_eq!(f.get_u32_array("a.u32").unwrap(), [1, 2, u32::MAX]);
    assert_eq!(f.get_f32_array("a.inferred_f32").unwrap(), [0.1f32, 0.2]);
    assert!(f.get_string_array("e.str").unwrap().is_empty());
    assert_eq!(
        f.get("n.typed"),
        Some(&Value::Array(Array::Array(vec![Array::U8(vec![1, 2]), Array::U8(vec![]), Array::U8(vec![3])])))
    );

    // llama.cpp would refuse an i32 where it wants a u32; so do we.
    let e = f.get_u32("t.i32").unwrap_err();
    assert!(
        matches!(e.kind(), GgufErrorKind::WrongValueType { key, expected: "u32", found } if key == "t.i32" && found == "i32")
    );
    assert!(e.to_string().contains("kv_types.gguf: key 't.i32' is i32, expected u32"), "{e}");
    let e = f.get_f32_array("a.f64").unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::WrongValueType { found, .. } if found == "array of f64"));
    assert!(matches!(f.get_u32("no.such.key").unwrap_err().kind(), GgufErrorKind::MissingKey { .. }));
    // The _opt flavour tells a missing key (Ok(None)) from a wrong type (Err).
    assert_eq!(f.get_u32_opt("no.such.key").unwrap(), None);
    assert_eq!(f.get_u32_opt("t.u32").unwrap(), Some(u32::MAX));
    assert!(f.get_u32_opt("t.i32").is_err());
    assert!(f.get_str_opt("t.u8").is_err());
}

#[test]
fn summaries_read_like_gguf_dump() {
    let (f, _) = load("kv_types");
    let show = |k: &str| f.get(k).unwrap().to_string();
    assert_eq!(show("a.str"), r#"["<unk>", "", "▁the", "Ġworld", "🦀", … 6 items]"#);
    assert_eq!(show("n.i32"), "[[1, 2, 3], [4], [5, 6]]");
    assert_eq!(show("t.f32"), "1e-5");
    assert_eq!(show("e.u32"), "[]");
    assert_eq!(f.get("a.bool").unwrap().summary(2, 10).to_string(), "[true, false, … 3 items]");
    let keys: Vec<&str> = f.metadata().map(|(k, _)| k).take(3).collect();
    assert_eq!(keys, ["general.architecture", "t.u8", "t.i8"]);
}

#[test]
fn open_reports_missing_files_with_their_path() {
    let path = fixtures_dir().join("does-not-exist.gguf");
    let e = GgufFile::open(&path).expect_err("missing file");
    assert!(matches!(e.kind(), GgufErrorKind::Io { .. }));
    assert!(e.to_string().starts_with(&path.display().to_string()), "{e}");
    assert!(std::error::Error::source(&e).is_some());
}
