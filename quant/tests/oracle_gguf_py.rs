//! Live, independent check against gguf-py (PyPI `gguf` 0.19 + numpy), run by CI.
//!
//! (a) gguf-py quantizes the committed golden inputs, the regenerated bulk inputs and fresh
//!     random rows to Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, F16 and BF16; our bytes must equal its bytes.
//! (b) gguf-py dequantizes OUR bytes (every case, with and without imatrix, plus random
//!     blocks and all 65536 F16/BF16 patterns) for every type it can decode, Q4_K/Q5_K/Q6_K
//!     included; our floats must equal its floats bit for bit.
//!
//! gguf-py is not ggml, and it differs from ggml in exactly three documented places, which are
//! the only differences accepted here (ggml is the reference; golden.rs proves we follow it):
//! * Q4_0/Q5_0 blocks of all ±0: ggml stores d = −0.0, gguf-py +0.0 (only the d bytes differ);
//! * F16 of a NaN: ggml (and we) write sign|0x7E00, numpy keeps payload bits;
//! * F16 → f32 of a signaling NaN: ggml (and we) quiet it, numpy keeps it signaling.
//!
//! Runs the committed script golden/gguf_py_oracle.py with `$DUET_PYTHON`; exchanges data
//! through files in a temporary directory.

#[path = "golden/golden_file.rs"]
mod golden_file;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use duet_quant::{GgmlType, dequantize};
use golden_file::*;

/// A temporary directory removed on drop (also when the test panics).
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let p = std::env::temp_dir().join(format!("duet-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/gguf_py_oracle.py")
}

/// Runs the jobs through gguf-py; returns its summary line.
fn run_oracle(python: &Path, dir: &TempDir, jobs: &str) -> String {
    let jobs_path = dir.file("jobs.txt");
    std::fs::write(&jobs_path, jobs).unwrap();
    let out = duet_test_support::run_python(python, &script(), &[jobs_path.as_os_str()]);
    let summary = out.trim().to_string();
    assert!(summary.starts_with("gguf "), "unexpected oracle output: {out}");
    summary
}

struct Input {
    name: String,
    n_per_row: usize,
    float_only: bool,
    x: Vec<f32>,
    imatrix: Option<Vec<f32>>,
}

/// The golden inputs, the bulk inputs, and rows that appear nowhere else.
fn inputs() -> Vec<Input> {
    let g = golden();
    let mut v: Vec<Input> = g
        .cases
        .iter()
        .map(|c| Input {
            name: c.name.clone(),
            n_per_row: c.n_per_row,
            float_only: c.float_only,
            x: c.x.clone(),
            imatrix: c.imatrix.clone(),
        })
        .collect();
    v.extend(g.bulk.iter().map(|c| Input {
        name: c.name.clone(),
        n_per_row: c.n_per_row,
        float_only: c.float_only,
        x: c.x.clone(),
        imatrix: c.imatrix.clone(),
    }));
    let mut rng = duet_test_support::Rng::new(0x0067_6775_662d_7079);
    let mut x = Vec::new();
    for scale in [1.0f32, 0.05, 20.0, 3e-4, 7e3] {
        x.extend(rng.normals(1024).into_iter().map(|v| v * scale));
    }
    let w: Vec<f32> = (0..1024).map(|i| if i % 7 == 0 { 0.0 } else { 0.1 + rng.uniform() * 5.0 }).collect();
    v.push(Input { name: "fresh_normal".into(), n_per_row: 1024, float_only: false, x, imatrix: Some(w) });
    let bits = (0..4096).map(|_| f32::from_bits(rng.next_u64() as u32)).collect();
    v.push(Input { name: "fresh_bits".into(), n_per_row: 1024, float_only: true, x: bits, imatrix: None });
    v
}

fn write_f32(path: &Path, v: &[f32]) {
    std::fs::write(path, f32_bytes(v)).unwrap();
}

fn hex(b: &[u8]) -> String {
    b.iter().fold(String::new(), |mut s, v| {
        let _ = write!(s, "{v:02x}");
        s
    })
}

fn is_float(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F16 | GgmlType::BF16)
}

/// Why a block of our bytes may differ from gguf-py's (see the module docs), or None.
fn known_quant_divergence(ty: GgmlType, x: &[f32], ours: &[u8], theirs: &[u8]) -> Option<&'static str> {
    let zero_d = |d: &[u8]| d == [0x00, 0x00] || d == [0x00, 0x80];
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0
            if x.iter().all(|&v| v == 0.0)
                && ours[2..] == theirs[2..]
                && zero_d(&ours[..2])
                && zero_d(&theirs[..2]) =>
        {
            Some("sign of d in an all-zero Q4_0/Q5_0 block")
        }
        GgmlType::F16 if x[0].is_nan() => {
            let nan = |b: &[u8]| {
                let h = u16::from_le_bytes([b[0], b[1]]);
                h & 0x7C00 == 0x7C00 && h & 0x3FF != 0
            };
            (nan(ours) && nan(theirs)).then_some("payload of an F16 NaN")
        }
        _ => None,
    }
}

#[test]
fn gguf_py_quantizes_like_us() {
    let Some(python) = duet_test_support::oracle_python("oracle_gguf_py::gguf_py_quantizes_like_us") else {
        return;
    };
    let types =
        [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::F16, GgmlType::BF16];
    let dir = TempDir::new("gguf-py-quant");
    let inputs = inputs();
    let mut jobs = String::new();
    for (i, inp) in inputs.iter().enumerate() {
        write_f32(&dir.file(&format!("x{i}.f32")), &inp.x);
        for ty in types {
            if inp.float_only && !is_float(ty) {
                continue;
            }
            let (x, out) = (dir.file(&format!("x{i}.f32")), dir.file(&format!("g{i}_{}.bin", ty.name())));
            writeln!(jobs, "quant\t{}\t{}\t{}\t{}", ty.name(), inp.n_per_row, x.display(), out.display()).unwrap();
        }
    }
    let summary = run_oracle(&python, &dir, &jobs);

    let mut failures = Vec::new();
    let mut accepted = std::collections::BTreeMap::<String, usize>::new();
    let mut compared = 0usize;
    for (i, inp) in inputs.iter().enumerate() {
        for ty in types {
            if inp.float_only && !is_float(ty) {
                continue;
            }
            let theirs = std::fs::read(dir.file(&format!("g{i}_{}.bin", ty.name()))).unwrap();
            let ours = ours(ty, &inp.x, inp.n_per_row, None);
            assert_eq!(ours.len(), theirs.len(), "{ty} {}: size", inp.name);
            let (blck, tsize) = (ty.block_size(), ty.type_size());
            for (b, (o, t)) in ours.chunks_exact(tsize).zip(theirs.chunks_exact(tsize)).enumerate() {
                compared += 1;
                if o == t {
                    continue;
                }
                let xb = &inp.x[b * blck..(b + 1) * blck];
                match known_quant_divergence(ty, xb, o, t) {
                    Some(why) => *accepted.entry(format!("{ty} {}: {why}", inp.name)).or_default() += 1,
                    None if failures.len() < 12 => failures.push(format!(
                        "{ty} {} block {b} (row {}):\n  ours   {}\n  gguf-py {}",
                        inp.name,
                        b * blck / inp.n_per_row,
                        hex(o),
                        hex(t)
                    )),
                    None => failures.push(String::new()),
                }
            }
        }
    }
    eprintln!("{summary}: {compared} blocks compared");
    for (what, n) in &accepted {
        eprintln!("  accepted known gguf-py divergence ×{n}: {what}");
    }
    let shown: Vec<&String> = failures.iter().filter(|s| !s.is_empty()).collect();
    assert!(
        failures.is_empty(),
        "{} blocks differ from gguf-py's quantization:\n{}",
        failures.len(),
        shown.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n")
    );
    assert!(compared > 100_000, "too little compared: {compared}");
}

#[test]
fn gguf_py_dequantizes_our_bytes_like_we_do() {
    let Some(python) = duet_test_support::oracle_python("oracle_gguf_py::gguf_py_dequantizes_our_bytes_like_we_do")
    else {
        return;
    };
    let types = GgmlType::WEIGHT_TYPES;
    let g = golden();
    let dir = TempDir::new("gguf-py-dequant");
    // (type, label, our bytes)
    let mut blobs: Vec<(GgmlType, String, Vec<u8>)> = Vec::new();
    for inp in inputs() {
        for ty in types {
            if inp.float_only && !is_float(ty) {
                continue;
            }
            blobs.push((ty, inp.name.clone(), ours(ty, &inp.x, inp.n_per_row, None)));
            if let Some(w) = &inp.imatrix
                && !is_float(ty)
            {
                blobs.push((ty, format!("{} (imatrix)", inp.name), ours(ty, &inp.x, inp.n_per_row, Some(w))));
            }
        }
    }
    for ty in types {
        let rb = if is_float(ty) {
            (0..=u16::MAX).flat_map(u16::to_le_bytes).collect()
        } else {
            g.entries[&format!("rb/{}", ty.name())].clone()
        };
        blobs.push((ty, "random blocks".into(), rb));
    }
    let mut jobs = String::new();
    for (k, (ty, _, bytes)) in blobs.iter().enumerate() {
        let (q, y) = (dir.file(&format!("q{k}.bin")), dir.file(&format!("y{k}.f32")));
        std::fs::write(&q, bytes).unwrap();
        writeln!(jobs, "dequant\t{}\t{}\t{}", ty.name(), q.display(), y.display()).unwrap();
    }
    let summary = run_oracle(&python, &dir, &jobs);

    let mut failures = Vec::new();
    let mut accepted = 0usize;
    let mut compared = 0usize;
    for (k, (ty, label, bytes)) in blobs.iter().enumerate() {
        let theirs = f32s(&std::fs::read(dir.file(&format!("y{k}.f32"))).unwrap());
        let mut ours = vec![0f32; bytes.len() / ty.type_size() * ty.block_size()];
        dequantize(*ty, bytes, &mut ours).unwrap();
        assert_eq!(ours.len(), theirs.len(), "{ty} {label}: length");
        for (i, (o, t)) in ours.iter().zip(&theirs).enumerate() {
            compared += 1;
            let (ob, tb) = (o.to_bits(), t.to_bits());
            if ob == tb {
                continue;
            }
            if *ty == GgmlType::F16 {
                let h = u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]);
                let snan = h & 0x7C00 == 0x7C00 && h & 0x3FF != 0 && h & 0x200 == 0;
                if snan && ob ^ tb == 0x0040_0000 {
                    accepted += 1; // signaling NaN: we quiet it as ggml does, numpy does not
                    continue;
                }
            }
            if failures.len() < 12 {
                let blk = i / ty.block_size();
                let ts = ty.type_size();
                failures.push(format!(
                    "{ty} {label} value {i}: ours {o:e} ({ob:#010x}), gguf-py {t:e} ({tb:#010x}); block {}",
                    hex(&bytes[blk * ts..(blk + 1) * ts])
                ));
            } else {
                failures.push(String::new());
            }
        }
    }
    eprintln!(
        "{summary}: {compared} values from {} blobs compared; {accepted} F16 signaling NaNs accepted",
        blobs.len()
    );
    let shown: Vec<&str> = failures.iter().filter(|s| !s.is_empty()).map(|s| s.as_str()).collect();
    assert!(failures.is_empty(), "{} values differ from gguf-py:\n{}", failures.len(), shown.join("\n"));
    assert!(compared > 1_000_000, "too little compared: {compared}");
}
