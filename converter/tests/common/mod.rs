//! Helpers shared by the converter's acceptance tests: temporary directories, a small
//! safetensors reader/writer (independent of duet's), conversions through the library and
//! the gguf-py checker (`check_gguf.py`).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use duet_convert::{Conversion, Options, Override, Preset, Quiet};
use serde_json::{Value, json};

/// The committed tiny checkpoints.
pub fn fixture(name: &str) -> PathBuf {
    duet_test_support::repo_root().join("tests/fixtures/models").join(name)
}

pub const FIXTURES: [&str; 4] = ["diffllama-gqa", "diffllama-tied-llama3", "llama-gqa", "llama-dex"];

/// A directory under the system temp dir, removed (with its contents) on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "duet-convert-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
    pub fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.0.join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Converts through the library, as `duet convert` does.
pub fn convert(input: &Path, preset: Preset, out: &Path, keep_dex: bool, overrides: &[&str]) -> Conversion {
    let opts = Options {
        input: input.to_path_buf(),
        preset,
        overrides: overrides.iter().map(|o| Override::parse(o).unwrap()).collect(),
        imatrix: None,
        keep_dex,
        threads: 0,
        name: None,
    };
    let conv = Conversion::prepare(&opts).unwrap_or_else(|e| panic!("preparing {}: {e}", input.display()));
    conv.write(out, 0, &Quiet).unwrap_or_else(|e| panic!("writing {}: {e}", out.display()));
    conv
}

/// One job for check_gguf.py.
pub fn job(gguf: &Path, source: &Path, preset: Preset, keep_dex: bool, overrides: &[&str]) -> Value {
    json!({
        "gguf": gguf, "source": source, "preset": preset.name(), "keep_dex": keep_dex,
        "overrides": overrides,
    })
}

/// Runs converter/tests/check_gguf.py on `jobs` with the oracle Python and returns one summary
/// per job (it panics, with the checker's list of failures, if any check failed). `None`
/// when no oracle is configured (a recorded skip; a failure under DUET_REQUIRE_ORACLES).
pub fn check(test: &str, dir: &TempDir, jobs: &[Value]) -> Option<Vec<Value>> {
    let python = duet_test_support::oracle_python(test)?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/check_gguf.py");
    let jobs_path = dir.join(format!("{test}-jobs.json"));
    std::fs::write(&jobs_path, serde_json::to_vec_pretty(&Value::Array(jobs.to_vec())).unwrap()).unwrap();
    let out = duet_test_support::run_python(&python, &script, &[jobs_path.as_os_str()]);
    let summaries: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(summaries.len(), jobs.len(), "one summary per job:\n{out}");
    for s in &summaries {
        assert_eq!(s["ok"], json!(true), "{s}");
    }
    Some(summaries)
}

/// Per-type statistics of one summary: `(tensors, byte_exact)` of `ty` (0, 0 if absent).
pub fn type_stats(summary: &Value, ty: &str) -> (u64, u64) {
    let t = &summary["types"][ty];
    (t["tensors"].as_u64().unwrap_or(0), t["byte_exact"].as_u64().unwrap_or(0))
}

// --- safetensors, written out again (duet's reader is what is under test) -----------------

#[derive(Clone, Debug)]
pub struct StTensor {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl StTensor {
    /// The values as f32 (exact for F32, F16 and BF16).
    pub fn f32s(&self) -> Vec<f32> {
        match self.dtype.as_str() {
            "F32" => self.data.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect(),
            "BF16" => self
                .data
                .chunks_exact(2)
                .map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16))
                .collect(),
            "F16" => self.data.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            other => panic!("{}: dtype {other}", self.name),
        }
    }

    pub fn with_f32(&self, dtype: &str, v: &[f32]) -> StTensor {
        let data = match dtype {
            "F32" => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            "BF16" => v
                .iter()
                .flat_map(|x| {
                    assert_eq!(x.to_bits() & 0xffff, 0, "{}: {x} is not a bf16 value", self.name);
                    ((x.to_bits() >> 16) as u16).to_le_bytes()
                })
                .collect(),
            "F16" => v
                .iter()
                .flat_map(|x| {
                    let h = half::f16::from_f32(*x);
                    assert_eq!(h.to_f32().to_bits(), x.to_bits(), "{}: {x} is not an f16 value", self.name);
                    h.to_le_bytes()
                })
                .collect(),
            other => panic!("dtype {other}"),
        };
        StTensor { name: self.name.clone(), dtype: dtype.into(), shape: self.shape.clone(), data }
    }
}

pub fn read_safetensors(path: &Path) -> Vec<StTensor> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let mut out = Vec::new();
    for (name, e) in header {
        if name == "__metadata__" {
            continue;
        }
        let off = e["data_offsets"].as_array().unwrap();
        let (a, b) = (off[0].as_u64().unwrap() as usize, off[1].as_u64().unwrap() as usize);
        out.push(StTensor {
            name,
            dtype: e["dtype"].as_str().unwrap().into(),
            shape: e["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect(),
            data: data[a..b].to_vec(),
        });
    }
    out
}

/// Writes the tensors in the given order, with a `__metadata__` entry as transformers does.
pub fn write_safetensors(path: &Path, tensors: &[StTensor]) {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut data = Vec::new();
    for t in tensors {
        let begin = data.len();
        data.extend_from_slice(&t.data);
        header.insert(t.name.clone(), json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [begin, data.len()]}));
    }
    let mut h = serde_json::to_vec(&Value::Object(header)).unwrap();
    while !(8 + h.len()).is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    std::fs::write(path, out).unwrap();
}

/// Copies every file of `src` except the safetensors ones (config, tokenizer, ...).
pub fn copy_side_files(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if p.is_file() && !name.contains(".safetensors") {
            std::fs::copy(&p, dst.join(&name)).unwrap();
        }
    }
}

/// Writes `tensors` as `n` shards plus model.safetensors.index.json.
pub fn write_sharded(dir: &Path, tensors: &[StTensor], n: usize) {
    let per = tensors.len().div_ceil(n);
    let mut weight_map = serde_json::Map::new();
    let mut total = 0usize;
    for (i, chunk) in tensors.chunks(per).enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", i + 1, n);
        write_safetensors(&dir.join(&file), chunk);
        for t in chunk {
            weight_map.insert(t.name.clone(), json!(file));
            total += t.data.len();
        }
    }
    let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), serde_json::to_vec_pretty(&index).unwrap()).unwrap();
}
