//! Helpers shared by the GGUF integration tests (each test binary uses a subset).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use duet_quant::GgmlType;
use duet_quant::gguf::{Array, GgufWriter, StringArray, Value};
use duet_test_support::Rng;
use serde_json::{Value as Json, json};

pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gguf-fixtures")
}

/// A fresh, empty directory for one test under cargo's per-target temp dir.
pub fn fresh_dir(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("duet-quant-gguf").join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create test dir");
    dir
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The JSON encoding make_fixtures.py documents: floats as their IEEE bits, arrays as
/// {"elem", "items"}.
pub fn value_json(v: &Value) -> Json {
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::F32(x) => json!(x.to_bits()),
        Value::Bool(x) => json!(x),
        Value::String(s) => json!(s),
        Value::Array(a) => array_json(a),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F64(x) => json!(x.to_bits()),
    }
}

pub fn array_json(a: &Array) -> Json {
    let items: Vec<Json> = match a {
        Array::U8(v) => v.iter().map(|x| json!(x)).collect(),
        Array::I8(v) => v.iter().map(|x| json!(x)).collect(),
        Array::U16(v) => v.iter().map(|x| json!(x)).collect(),
        Array::I16(v) => v.iter().map(|x| json!(x)).collect(),
        Array::U32(v) => v.iter().map(|x| json!(x)).collect(),
        Array::I32(v) => v.iter().map(|x| json!(x)).collect(),
        Array::F32(v) => v.iter().map(|x| json!(x.to_bits())).collect(),
        Array::Bool(v) => v.iter().map(|x| json!(x)).collect(),
        Array::String(v) => v.iter().map(|x| json!(x)).collect(),
        Array::Array(v) => v.iter().map(array_json).collect(),
        Array::U64(v) => v.iter().map(|x| json!(x)).collect(),
        Array::I64(v) => v.iter().map(|x| json!(x)).collect(),
        Array::F64(v) => v.iter().map(|x| json!(x.to_bits())).collect(),
    };
    json!({"elem": a.elem_type().name(), "items": items})
}

pub fn metadata_json<'a>(kvs: impl Iterator<Item = (&'a str, &'a Value)>) -> Json {
    Json::Array(kvs.map(|(k, v)| json!({"key": k, "type": v.type_id().name(), "value": value_json(v)})).collect())
}

/// Every value type, edge values, unicode, empty and nested arrays.
pub fn add_every_kv(w: &mut GgufWriter) {
    let kvs: Vec<(&str, Value)> = vec![
        ("general.architecture", "diffllama".into()),
        ("t.u8", 255u8.into()),
        ("t.i8", (-128i8).into()),
        ("t.u16", 65535u16.into()),
        ("t.i16", (-32768i16).into()),
        ("t.u32", u32::MAX.into()),
        ("t.i32", i32::MIN.into()),
        ("t.f32", 1e-5f32.into()),
        ("t.f32.nan", f32::from_bits(0x7fc0_0001).into()),
        ("t.f32.neg_zero", (-0.0f32).into()),
        ("t.bool", true.into()),
        ("t.bool.false", false.into()),
        ("t.str", "hello".into()),
        ("t.str.empty", "".into()),
        ("t.str.unicode", "Grüße, 世界! 🦀 e\u{301} \0 tab\tnl\n".into()),
        ("t.u64", u64::MAX.into()),
        ("t.i64", i64::MIN.into()),
        ("t.f64", std::f64::consts::E.into()),
        ("t.f64.inf", f64::NEG_INFINITY.into()),
        ("ключ", 7u8.into()),
        ("a.u8", vec![0u8, 1, 255].into()),
        ("a.i8", vec![-128i8, 0, 127].into()),
        ("a.u16", vec![0u16, 65535].into()),
        ("a.i16", vec![i16::MIN, i16::MAX].into()),
        ("a.u32", vec![1u32, 2, u32::MAX].into()),
        ("a.i32", vec![-1i32, 0, i32::MAX].into()),
        ("a.f32", vec![0.5f32, -0.0, f32::INFINITY, f32::NAN, f32::MAX].into()),
        ("a.bool", vec![true, false, true].into()),
        ("a.u64", vec![0u64, u64::MAX].into()),
        ("a.i64", vec![i64::MIN, i64::MAX].into()),
        ("a.f64", vec![1.0f64, -1e-300].into()),
        ("a.str", vec!["<unk>", "", "▁the", "Ġworld", "🦀", "a b"].into()),
        ("e.u32", Vec::<u32>::new().into()),
        ("e.str", StringArray::new().into()),
        ("e.bool", Vec::<bool>::new().into()),
        ("n.i32", vec![Array::I32(vec![1, 2, 3]), Array::I32(vec![]), Array::I32(vec![4])].into()),
        ("n.str", vec![Array::String(vec!["a", "bc"].into()), Array::String(vec!["", "日本"].into())].into()),
        ("n.deep", vec![Array::Array(vec![Array::F64(vec![0.25])]), Array::Array(vec![])].into()),
        ("n.empty", Vec::<Array>::new().into()),
    ];
    for (k, v) in kvs {
        w.add(k, v).expect("valid key");
    }
}

/// One tensor of each type the runtime uses plus a few plain ones, 1-D to 4-D.
pub const SAMPLE_TENSORS: &[(&str, &[u64], GgmlType)] = &[
    ("f32.1d", &[7], GgmlType::F32),
    ("f16.2d", &[5, 3], GgmlType::F16),
    ("bf16.3d", &[3, 2, 2], GgmlType::BF16),
    ("q4_0.2d", &[64, 3], GgmlType::Q4_0),
    ("q4_1.1d", &[64], GgmlType::Q4_1),
    ("q5_0.3d", &[32, 1, 2], GgmlType::Q5_0),
    ("q5_1.2d", &[32, 2], GgmlType::Q5_1),
    ("q8_0.4d", &[32, 3, 1, 2], GgmlType::Q8_0),
    ("q4_k.2d", &[512, 2], GgmlType::Q4_K),
    ("q5_k.1d", &[256], GgmlType::Q5_K),
    ("q6_k.4d", &[256, 1, 2, 1], GgmlType::Q6_K),
    ("i8.1d", &[5], GgmlType::I8),
    ("i32.2d", &[2, 2], GgmlType::I32),
    ("f64.1d", &[3], GgmlType::F64),
    ("empty.f32", &[0, 4], GgmlType::F32),
    ("blk.0.attn_lambda_q1.weight", &[16], GgmlType::F32),
];

/// A writer for `path` holding every kind of KV and `SAMPLE_TENSORS`, and random data for
/// each tensor.
pub fn sample_writer(path: &Path, alignment: u32, seed: u64) -> (GgufWriter, Vec<Vec<u8>>) {
    let mut w = GgufWriter::new(path);
    add_every_kv(&mut w);
    w.set_alignment(alignment).expect("power of two");
    w.add("after.alignment", 1u32).expect("valid key");
    let mut rng = Rng::new(seed);
    let mut data = Vec::new();
    for &(name, dims, ty) in SAMPLE_TENSORS {
        w.add_tensor(name, dims, ty).expect("valid tensor");
        let n = ty.bytes_for(dims.iter().product()).expect("whole blocks") as usize;
        data.push((0..n).map(|_| rng.next_u64() as u8).collect());
    }
    (w, data)
}
