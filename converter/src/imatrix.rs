//! Importance matrices: per weight tensor, one mean squared activation per input column,
//! which the K-quant (and Q4_0/Q4_1/Q5_x) searches use as error weights.
//!
//! Accepted files (both written by llama.cpp's `llama-imatrix`):
//! * GGUF (current llama.cpp): tensors `<name>.in_sum2` (F32, `[n_per_row, n_mat]`) and
//!   `<name>.counts` (F32, `[1, n_mat]`); importance = in_sum2 / counts.
//! * legacy `.dat`: i32 entry count, then per entry: i32 name length, name bytes, i32 ncall,
//!   i32 nval, nval f32 sums; importance = sum / ncall. Trailing data (last call, dataset
//!   name) is ignored.
//!
//! Names are GGUF tensor names (`blk.0.attn_q.weight`).

use std::collections::HashMap;
use std::path::Path;

use duet_quant::gguf::GgufFile;

use crate::error::ConvertError;

#[derive(Clone, Debug, Default)]
pub struct Imatrix {
    pub entries: HashMap<String, Vec<f32>>,
}

impl Imatrix {
    pub fn load(path: &Path) -> Result<Imatrix, ConvertError> {
        let bytes = duet_quant::input::read_limited(path, 1 << 30).map_err(|e| ConvertError::io(path, e))?;
        if bytes.starts_with(b"GGUF") { Imatrix::from_gguf(path) } else { Imatrix::from_dat(path, &bytes) }
    }

    /// The importance of each input column of tensor `name`, if recorded.
    pub fn get(&self, name: &str) -> Option<&[f32]> {
        self.entries.get(name).map(Vec::as_slice)
    }

    fn from_gguf(path: &Path) -> Result<Imatrix, ConvertError> {
        let file = GgufFile::open(path)?;
        let mut entries = HashMap::new();
        for t in file.tensors() {
            let Some(base) = t.name().strip_suffix(".in_sum2") else {
                continue;
            };
            let counts_name = format!("{base}.counts");
            let bad = |msg: String| ConvertError::corrupt(path, format!("imatrix entry '{base}': {msg}"));
            let counts = file.tensor(&counts_name).ok_or_else(|| bad(format!("no '{counts_name}' tensor")))?;
            let sums = read_f32_tensor(&file, t).ok_or_else(|| bad("in_sum2 is not F32".into()))?;
            let counts_v = read_f32_tensor(&file, counts).ok_or_else(|| bad("counts is not F32".into()))?;
            let n_per_row = t.dims()[0] as usize;
            // Several matrices (MoE experts) share one entry: a dense model has one.
            if counts_v.is_empty() || sums.len() != n_per_row * counts_v.len() {
                return Err(bad(format!("{} sums for {} matrices of {n_per_row} columns", sums.len(), counts_v.len())));
            }
            let c = counts_v[0];
            let imp: Vec<f32> = sums[..n_per_row].iter().map(|s| if c > 0.0 { s / c } else { 0.0 }).collect();
            entries.insert(base.to_string(), imp);
        }
        if entries.is_empty() {
            return Err(ConvertError::corrupt(path, "a GGUF file without any '*.in_sum2' tensors is not an imatrix"));
        }
        Ok(Imatrix { entries })
    }

    fn from_dat(path: &Path, b: &[u8]) -> Result<Imatrix, ConvertError> {
        let bad = |msg: &str| ConvertError::corrupt(path, format!("not a llama.cpp imatrix file: {msg}"));
        let mut cur = Cursor { b, pos: 0 };
        let n = cur.i32().ok_or_else(|| bad("truncated"))?;
        if n <= 0 {
            return Err(bad("no entries"));
        }
        let mut entries = HashMap::new();
        for _ in 0..n {
            let len = cur.i32().ok_or_else(|| bad("truncated"))?;
            if len <= 0 || len > 4096 {
                return Err(bad("bad name length"));
            }
            let name = cur.take(len as usize).ok_or_else(|| bad("truncated"))?;
            let name = std::str::from_utf8(name).map_err(|_| bad("name is not UTF-8"))?.to_string();
            let ncall = cur.i32().ok_or_else(|| bad("truncated"))?;
            let nval = cur.i32().ok_or_else(|| bad("truncated"))?;
            if nval <= 0 {
                return Err(bad("bad value count"));
            }
            let raw = cur.take(nval as usize * 4).ok_or_else(|| bad("truncated"))?;
            let vals: Vec<f32> = raw
                .chunks_exact(4)
                .map(|c| {
                    let s = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                    if ncall > 0 { s / ncall as f32 } else { s }
                })
                .collect();
            entries.insert(name, vals);
        }
        Ok(Imatrix { entries })
    }
}

/// Bounds-checked little-endian reads.
struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }
    fn i32(&mut self) -> Option<i32> {
        self.take(4).map(|s| i32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
}

fn read_f32_tensor(file: &GgufFile, t: &duet_quant::gguf::TensorInfo) -> Option<Vec<f32>> {
    if t.ggml_type() != duet_quant::GgmlType::F32 {
        return None;
    }
    Some(file.tensor_data(t).chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_legacy_dat() {
        let mut b = Vec::new();
        b.extend(1i32.to_le_bytes());
        let name = b"blk.0.attn_q.weight";
        b.extend((name.len() as i32).to_le_bytes());
        b.extend(name);
        b.extend(4i32.to_le_bytes()); // ncall
        b.extend(2i32.to_le_bytes()); // nval
        b.extend(8.0f32.to_le_bytes());
        b.extend(2.0f32.to_le_bytes());
        let p = std::env::temp_dir().join(format!("duet-imatrix-{}.dat", std::process::id()));
        std::fs::write(&p, &b).unwrap();
        let m = Imatrix::load(&p).unwrap();
        assert_eq!(m.get("blk.0.attn_q.weight"), Some(&[2.0f32, 0.5][..]));
        std::fs::write(&p, &b[..b.len() - 3]).unwrap();
        assert!(Imatrix::load(&p).err().unwrap().to_string().contains("truncated"));
        std::fs::remove_file(&p).unwrap();
    }
}
