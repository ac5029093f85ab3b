//! A checked, memory-mapped reader for safetensors files and sharded checkpoints.
//!
//! Layout: u64 LE header length N · N bytes of JSON (`name → {dtype, shape, data_offsets}`,
//! plus an optional `__metadata__`) · tensor data. Every size and offset in the header is
//! checked against the file before a tensor can be read. Tensors are converted to f32 one
//! at a time; [`Checkpoint::release`] drops a tensor's pages from memory again so that peak
//! memory stays bounded by the largest tensor, not the model.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use duet_quant::GgmlType;
use memmap2::Mmap;
use serde_json::Value;

use crate::error::ConvertError;

/// Element types a checkpoint tensor may have. Only the float ones can be converted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F16,
    BF16,
}

impl Dtype {
    fn parse(s: &str) -> Option<Dtype> {
        match s {
            "F32" => Some(Dtype::F32),
            "F16" => Some(Dtype::F16),
            "BF16" => Some(Dtype::BF16),
            _ => None,
        }
    }
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::BF16 => 2,
        }
    }
    /// The GGUF type with the same element layout, for duet_quant's row conversions.
    pub fn ggml_type(self) -> GgmlType {
        match self {
            Dtype::F32 => GgmlType::F32,
            Dtype::F16 => GgmlType::F16,
            Dtype::BF16 => GgmlType::BF16,
        }
    }
}

/// One tensor's place in a file.
#[derive(Clone, Debug)]
pub struct TensorMeta {
    pub dtype: Dtype,
    /// Row-major shape, outermost first (HF `[out, in]`).
    pub shape: Vec<usize>,
    /// Which shard holds it.
    pub file: usize,
    /// Absolute byte range in that file.
    pub start: usize,
    pub end: usize,
}

impl TensorMeta {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

struct Shard {
    path: PathBuf,
    map: Mmap,
}

/// All safetensors files of one checkpoint, indexed by tensor name.
pub struct Checkpoint {
    shards: Vec<Shard>,
    tensors: BTreeMap<String, TensorMeta>,
}

impl Checkpoint {
    /// Opens `dir/model.safetensors`, or the shards listed in
    /// `dir/model.safetensors.index.json`.
    pub fn open_dir(dir: &Path) -> Result<Checkpoint, ConvertError> {
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if index.exists() {
            shard_list(&index)?.into_iter().map(|f| dir.join(f)).collect()
        } else if single.exists() {
            vec![single]
        } else {
            return Err(ConvertError::missing(
                dir,
                "no model.safetensors or model.safetensors.index.json (is this a Hugging Face model directory?)",
            ));
        };
        Checkpoint::open_files(&files)
    }

    /// Opens the given safetensors files as one checkpoint. A tensor name may appear once.
    pub fn open_files(files: &[PathBuf]) -> Result<Checkpoint, ConvertError> {
        let mut ckpt = Checkpoint { shards: Vec::new(), tensors: BTreeMap::new() };
        for path in files {
            // A FIFO named model.safetensors would block the open: regular files only.
            duet_quant::input::check_regular(path).map_err(|e| ConvertError::io(path, e))?;
            let file = File::open(path).map_err(|e| ConvertError::io(path, e))?;
            // SAFETY: the file is opened read-only; if another process truncates it while we
            // read, we may see SIGBUS — the same contract every mmap-based loader has.
            let map = unsafe { Mmap::map(&file) }.map_err(|e| ConvertError::io(path, e))?;
            let idx = ckpt.shards.len();
            for (name, meta) in parse_header(path, &map, idx)? {
                if ckpt.tensors.insert(name.clone(), meta).is_some() {
                    return Err(ConvertError::corrupt(path, format!("tensor '{name}' appears in more than one shard")));
                }
            }
            ckpt.shards.push(Shard { path: path.clone(), map });
        }
        Ok(ckpt)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    pub fn meta(&self, name: &str) -> Option<&TensorMeta> {
        self.tensors.get(name)
    }

    /// Path of the shard holding `name` (for error messages).
    pub fn path_of(&self, meta: &TensorMeta) -> &Path {
        &self.shards[meta.file].path
    }

    /// The tensor's raw bytes inside the map.
    pub fn raw(&self, meta: &TensorMeta) -> &[u8] {
        &self.shards[meta.file].map[meta.start..meta.end]
    }

    /// Reads a tensor converted to f32 (exact for F16/BF16 sources).
    pub fn read_f32(&self, name: &str) -> Result<Vec<f32>, ConvertError> {
        let meta =
            self.meta(name).ok_or_else(|| ConvertError::shape(format!("the checkpoint has no tensor '{name}'")))?;
        let mut out = vec![0f32; meta.numel()];
        duet_quant::dequantize(meta.dtype.ggml_type(), self.raw(meta), &mut out)
            .map_err(|source| ConvertError::Quant { tensor: name.to_string(), source })?;
        Ok(out)
    }

    /// Tells the kernel we are done with a tensor's pages, so a streaming conversion does not
    /// keep the whole checkpoint resident.
    pub fn release(&self, meta: &TensorMeta) {
        let map = &self.shards[meta.file].map;
        // Advice is best-effort: failure only costs memory, never correctness.
        #[cfg(unix)]
        unsafe {
            // SAFETY: DontNeed on a read-only file mapping only drops clean pages; later reads
            // fault them back in from the file.
            let _ = map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, meta.start, meta.end - meta.start);
        }
        #[cfg(not(unix))]
        let _ = map;
    }
}

fn shard_list(index: &Path) -> Result<Vec<String>, ConvertError> {
    let text = duet_quant::input::read_text(index, duet_quant::input::MAX_JSON_BYTES)
        .map_err(|e| ConvertError::io(index, e))?;
    let json: Value =
        serde_json::from_str(&text).map_err(|e| ConvertError::corrupt(index, format!("not valid JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| ConvertError::corrupt(index, "no \"weight_map\" object"))?;
    let mut files: Vec<String> = Vec::new();
    for (tensor, file) in map {
        let file = file.as_str().ok_or_else(|| {
            ConvertError::corrupt(index, format!("weight_map entry for '{tensor}' is not a file name"))
        })?;
        // Shards must sit beside the index: refuse paths that climb out of the directory.
        if file.contains('/') || file.contains('\\') || file == ".." {
            return Err(ConvertError::corrupt(index, format!("shard name '{file}' is not a plain file name")));
        }
        if !files.iter().any(|f| f == file) {
            files.push(file.to_string());
        }
    }
    if files.is_empty() {
        return Err(ConvertError::corrupt(index, "weight_map lists no shards"));
    }
    files.sort();
    Ok(files)
}

/// The tensors a safetensors file's bytes declare (`path` names it in errors): the header
/// length, the JSON header and every entry checked against the data that follows. For
/// fuzzers and tests; [`Checkpoint`] opens files.
pub fn parse_header_bytes(path: &Path, data: &[u8]) -> Result<Vec<(String, TensorMeta)>, ConvertError> {
    parse_header(path, data, 0)
}

fn parse_header(path: &Path, data: &[u8], file_idx: usize) -> Result<Vec<(String, TensorMeta)>, ConvertError> {
    let corrupt = |msg: String| ConvertError::corrupt(path, msg);
    if data.len() < 8 {
        return Err(corrupt(format!("{} bytes is too short for a safetensors header", data.len())));
    }
    let n = u64::from_le_bytes(data[..8].try_into().expect("8 bytes"));
    let header_end = 8u64
        .checked_add(n)
        .filter(|&e| e <= data.len() as u64)
        .ok_or_else(|| corrupt(format!("header length {n} runs past the end of the file ({} bytes)", data.len())))?
        as usize;
    let json: Value =
        serde_json::from_slice(&data[8..header_end]).map_err(|e| corrupt(format!("header is not valid JSON: {e}")))?;
    let obj = json.as_object().ok_or_else(|| corrupt("header is not a JSON object".into()))?;
    let data_len = data.len() - header_end;
    let mut out = Vec::with_capacity(obj.len());
    for (name, entry) in obj {
        if name == "__metadata__" {
            continue;
        }
        let bad = |what: &str| corrupt(format!("tensor '{name}': {what}"));
        let dtype_s = entry.get("dtype").and_then(Value::as_str).ok_or_else(|| bad("no dtype"))?;
        let dtype = Dtype::parse(dtype_s).ok_or_else(|| {
            ConvertError::unsupported(format!(
                "{}: tensor '{name}' has dtype {dtype_s}; only F32, F16 and BF16 weights can be converted",
                path.display()
            ))
        })?;
        let shape: Vec<usize> = entry
            .get("shape")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no shape"))?
            .iter()
            .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
            .collect::<Option<_>>()
            .ok_or_else(|| bad("shape is not a list of sizes"))?;
        let offsets = entry.get("data_offsets").and_then(Value::as_array).ok_or_else(|| bad("no data_offsets"))?;
        let (begin, end) = match offsets.as_slice() {
            [b, e] => (b.as_u64().ok_or_else(|| bad("bad offset"))?, e.as_u64().ok_or_else(|| bad("bad offset"))?),
            _ => return Err(bad("data_offsets must hold two numbers")),
        };
        let numel =
            shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)).ok_or_else(|| bad("shape overflows"))?;
        let want = numel.checked_mul(dtype.size()).ok_or_else(|| bad("size overflows"))? as u64;
        if begin > end || end > data_len as u64 {
            return Err(bad(&format!("data [{begin}, {end}) lies outside the {data_len} data bytes")));
        }
        if end - begin != want {
            return Err(bad(&format!("holds {} bytes but shape {shape:?} of {dtype_s} needs {want}", end - begin)));
        }
        out.push((
            name.clone(),
            TensorMeta {
                dtype,
                shape,
                file: file_idx,
                start: header_end + begin as usize,
                end: header_end + end as usize,
            },
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a safetensors file from (name, dtype, shape, bytes).
    pub(crate) fn write(path: &Path, tensors: &[(&str, &str, Vec<usize>, Vec<u8>)]) {
        let mut header = serde_json::Map::new();
        let mut data = Vec::new();
        for (name, dtype, shape, bytes) in tensors {
            let begin = data.len();
            data.extend_from_slice(bytes);
            header.insert(
                name.to_string(),
                serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [begin, data.len()]}),
            );
        }
        let h = serde_json::to_vec(&Value::Object(header)).unwrap();
        let mut out = (h.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&h);
        out.extend_from_slice(&data);
        std::fs::write(path, out).unwrap();
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn reads_all_float_dtypes() {
        let dir = std::env::temp_dir().join(format!("duet-st-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("model.safetensors");
        let vals = [1.5f32, -2.0, 0.25, 3.0];
        let f16: Vec<u8> = vals.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect();
        let bf16: Vec<u8> = vals.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect();
        write(
            &p,
            &[("a", "F32", vec![2, 2], f32_bytes(&vals)), ("b", "F16", vec![4], f16), ("c", "BF16", vec![1, 4], bf16)],
        );
        let ck = Checkpoint::open_dir(&dir).unwrap();
        for name in ["a", "b", "c"] {
            assert_eq!(ck.read_f32(name).unwrap(), vals, "{name}");
        }
        assert_eq!(ck.meta("a").unwrap().shape, vec![2, 2]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rejects_bad_headers() {
        let dir = std::env::temp_dir().join(format!("duet-st-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("x.safetensors");
        // Header length beyond the file.
        std::fs::write(&p, [0xff, 0xff, 0, 0, 0, 0, 0, 0, b'{', b'}']).unwrap();
        let e = Checkpoint::open_files(std::slice::from_ref(&p)).err().unwrap().to_string();
        assert!(e.contains("runs past the end"), "{e}");
        // Data range outside the file.
        let h = br#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
        let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(h);
        bytes.extend_from_slice(&[0; 8]);
        std::fs::write(&p, &bytes).unwrap();
        let e = Checkpoint::open_files(std::slice::from_ref(&p)).err().unwrap().to_string();
        assert!(e.contains("lies outside"), "{e}");
        // Unsupported dtype.
        write(&p, &[("ids", "I64", vec![1], vec![0; 8])]);
        let e = Checkpoint::open_files(std::slice::from_ref(&p)).err().unwrap().to_string();
        assert!(e.contains("dtype I64"), "{e}");
        // Size that disagrees with the shape.
        write(&p, &[("w", "F32", vec![3], vec![0; 8])]);
        let e = Checkpoint::open_files(std::slice::from_ref(&p)).err().unwrap().to_string();
        assert!(e.contains("needs 12"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
