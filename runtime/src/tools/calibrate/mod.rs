//! Calibration: activation statistics from running a model over text.
//!
//! A [`Calibrator`] observes the CPU backend's forward pass ([`crate::backend::Probe`]) and
//! records, per layer and head, the largest magnitude and the 99.9th percentile of Q, K, V,
//! the attention logits (recomputed from Q and K as `q·k/√d` over the causal positions; for
//! DIFF, query heads `0..H/2` are the first softmax branch and `H/2..H` the second), and per
//! layer of the hidden states; the k largest values and the median of the attention logits
//! and hidden states (the paper's Table 5); and the importance matrix (mean squared input
//! per column) of every linear layer.
//!
//! Stored in GGUF metadata ([`CalibrationReport::to_metadata`]), all f32 arrays, layer-major:
//!
//! | key | shape |
//! |---|---|
//! | `duet.calibration.tokens` (u32), `duet.calibration.source` (str) | |
//! | `duet.calibration.{q,logits}.{absmax,p999}` | n_layers × n_heads |
//! | `duet.calibration.{k,v}.{absmax,p999}` | n_layers × n_kv_heads |
//! | `duet.calibration.hidden.{absmax,p999}` | n_layers |
//! | `duet.calibration.{logits,hidden}.top` | [top-1, top-2, top-3, top-10, top-100, median] |
//! | `duet.imatrix.<tensor>` | one value per input column of that weight |

mod logits;
pub mod stats;

use std::collections::BTreeMap;

use duet_quant::gguf::{Array, GgufFile, Value};

use crate::observe::{Observer, Probe};
use crate::model::ModelConfig;
use stats::{MagnitudeStats, TopK};

/// Per-head statistics of one kind of activation, layer-major.
#[derive(Clone, Debug)]
pub struct HeadStats {
    pub n_heads: usize,
    pub stats: Vec<MagnitudeStats>,
}

impl HeadStats {
    fn new(n_layers: usize, n_heads: usize) -> HeadStats {
        HeadStats { n_heads, stats: vec![MagnitudeStats::default(); n_layers * n_heads] }
    }

    /// Adds rows of `n_heads` heads of `head_dim` values.
    fn add_rows(&mut self, layer: usize, data: &[f32], head_dim: usize) {
        for row in data.chunks_exact(self.n_heads * head_dim) {
            for (h, vals) in row.chunks_exact(head_dim).enumerate() {
                self.stats[layer * self.n_heads + h].add_all(vals);
            }
        }
    }

    pub fn absmax(&self) -> Vec<f32> {
        self.stats.iter().map(|s| s.absmax).collect()
    }

    pub fn p999(&self) -> Vec<f32> {
        self.stats.iter().map(|s| s.quantile(0.999)).collect()
    }
}

pub struct Calibrator {
    cfg: ModelConfig,
    pub q: HeadStats,
    pub k: HeadStats,
    pub v: HeadStats,
    pub logits: HeadStats,
    pub hidden: HeadStats,
    logits_top: TopK,
    logits_all: MagnitudeStats,
    hidden_top: TopK,
    hidden_all: MagnitudeStats,
    /// Per weight name: Σ x² per column and the number of rows summed.
    imatrix: BTreeMap<String, (Vec<f64>, u64)>,
    /// Keys of the current chunk, per layer (positions 0..), to recompute the logits.
    keys: Vec<Vec<f32>>,
    /// Tokens seen (rows of the output's input).
    pub tokens: usize,
}

impl Calibrator {
    pub fn new(cfg: &ModelConfig) -> Calibrator {
        let (l, h, kv) = (cfg.n_layers, cfg.n_heads, cfg.n_kv_heads);
        Calibrator {
            cfg: cfg.clone(),
            q: HeadStats::new(l, h),
            k: HeadStats::new(l, kv),
            v: HeadStats::new(l, kv),
            logits: HeadStats::new(l, h),
            hidden: HeadStats::new(l, 1),
            logits_top: TopK::new(100),
            logits_all: MagnitudeStats::default(),
            hidden_top: TopK::new(100),
            hidden_all: MagnitudeStats::default(),
            imatrix: BTreeMap::new(),
            keys: vec![Vec::new(); l],
            tokens: 0,
        }
    }

    fn add_imatrix(&mut self, names: &[String], data: &[f32], cols: usize) {
        for name in names {
            let e = self.imatrix.entry(name.clone()).or_insert_with(|| (vec![0.0; cols], 0));
            for row in data.chunks_exact(cols) {
                for (acc, &x) in e.0.iter_mut().zip(row) {
                    *acc += x as f64 * x as f64;
                }
                e.1 += 1;
            }
        }
    }

    /// The importance matrix: per weight, the mean squared input of each column.
    pub fn imatrix(&self) -> BTreeMap<String, Vec<f32>> {
        self.imatrix
            .iter()
            .map(|(k, (sums, n))| (k.clone(), sums.iter().map(|s| (s / (*n).max(1) as f64) as f32).collect()))
            .collect()
    }

    /// Table 5 of the DIFF paper: [top-1, top-2, top-3, top-10, top-100, median] of |x|.
    fn table(top: &TopK, all: &MagnitudeStats) -> [f32; 6] {
        let t = top.sorted();
        let at = |i: usize| t.get(i).copied().unwrap_or(0.0);
        [at(0), at(1), at(2), at(9), at(99), all.quantile(0.5)]
    }

    pub fn report(&self, source: &str) -> CalibrationReport {
        CalibrationReport {
            source: source.to_string(),
            tokens: self.tokens,
            n_layers: self.cfg.n_layers,
            n_heads: self.cfg.n_heads,
            n_kv_heads: self.cfg.n_kv_heads,
            q: (self.q.absmax(), self.q.p999()),
            k: (self.k.absmax(), self.k.p999()),
            v: (self.v.absmax(), self.v.p999()),
            logits: (self.logits.absmax(), self.logits.p999()),
            hidden: (self.hidden.absmax(), self.hidden.p999()),
            logits_top: Self::table(&self.logits_top, &self.logits_all),
            hidden_top: Self::table(&self.hidden_top, &self.hidden_all),
            imatrix: self.imatrix(),
        }
    }
}

impl Observer for Calibrator {
    fn observe(&mut self, probe: Probe, layer: usize, pos0: usize, data: &[f32], rows: usize, cols: usize) {
        let hd = self.cfg.head_dim;
        let w = |n: &str| format!("blk.{layer}.{n}.weight");
        match probe {
            Probe::AttnIn => self.add_imatrix(&[w("attn_q"), w("attn_k"), w("attn_v")], data, cols),
            Probe::AttnOut => self.add_imatrix(&[w("attn_output")], data, cols),
            Probe::FfnIn => self.add_imatrix(&[w("ffn_gate"), w("ffn_up")], data, cols),
            Probe::FfnDownIn => self.add_imatrix(&[w("ffn_down")], data, cols),
            Probe::OutputIn => {
                self.add_imatrix(&["output.weight".to_string()], data, cols);
                self.tokens += rows;
            }
            Probe::Q => {
                self.q.add_rows(layer, data, hd);
                logits::add_logits(self, layer, pos0, data, rows);
            }
            Probe::K => {
                self.k.add_rows(layer, data, hd);
                // Keys arrive (and are cached) before the queries of the same rows are used.
                let keys = &mut self.keys[layer];
                keys.truncate(pos0 * cols);
                keys.extend_from_slice(data);
            }
            Probe::V => self.v.add_rows(layer, data, hd),
            Probe::AttnBranches | Probe::PairGates => {}
            Probe::Hidden => {
                self.hidden.add_rows(layer, data, cols);
                for &x in data {
                    self.hidden_top.add(x);
                    self.hidden_all.add(x);
                }
            }
        }
    }
}

/// What calibration found, ready to be stored in a GGUF and printed.
#[derive(Clone, Debug, PartialEq)]
pub struct CalibrationReport {
    pub source: String,
    pub tokens: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    /// (absmax, p99.9), layer-major.
    pub q: (Vec<f32>, Vec<f32>),
    pub k: (Vec<f32>, Vec<f32>),
    pub v: (Vec<f32>, Vec<f32>),
    pub logits: (Vec<f32>, Vec<f32>),
    pub hidden: (Vec<f32>, Vec<f32>),
    /// [top-1, top-2, top-3, top-10, top-100, median] of |x|.
    pub logits_top: [f32; 6],
    pub hidden_top: [f32; 6],
    pub imatrix: BTreeMap<String, Vec<f32>>,
}

const PREFIX: &str = "duet.calibration";

impl CalibrationReport {
    /// GGUF metadata for this report (see the module documentation for the keys).
    pub fn to_metadata(&self) -> Vec<(String, Value)> {
        let arr = |v: &[f32]| Value::Array(Array::F32(v.to_vec()));
        let mut md = vec![
            (format!("{PREFIX}.tokens"), Value::U32(self.tokens as u32)),
            (format!("{PREFIX}.source"), Value::String(self.source.clone())),
        ];
        for (name, (absmax, p999)) in
            [("q", &self.q), ("k", &self.k), ("v", &self.v), ("logits", &self.logits), ("hidden", &self.hidden)]
        {
            md.push((format!("{PREFIX}.{name}.absmax"), arr(absmax)));
            md.push((format!("{PREFIX}.{name}.p999"), arr(p999)));
        }
        md.push((format!("{PREFIX}.logits.top"), arr(&self.logits_top)));
        md.push((format!("{PREFIX}.hidden.top"), arr(&self.hidden_top)));
        for (name, imp) in &self.imatrix {
            md.push((format!("duet.imatrix.{name}"), arr(imp)));
        }
        md
    }

    /// Reads a report back from a GGUF (None when the file has no calibration).
    pub fn from_gguf(file: &GgufFile) -> Result<Option<CalibrationReport>, crate::RuntimeError> {
        let Some(tokens) = file.get_u32_opt(&format!("{PREFIX}.tokens"))? else { return Ok(None) };
        let cfg = ModelConfig::from_gguf(file)?;
        let get = |k: &str| -> Result<Vec<f32>, crate::RuntimeError> {
            Ok(file.get_f32_array(&format!("{PREFIX}.{k}"))?.to_vec())
        };
        let pair = |k: &str| -> Result<(Vec<f32>, Vec<f32>), crate::RuntimeError> {
            Ok((get(&format!("{k}.absmax"))?, get(&format!("{k}.p999"))?))
        };
        let top = |k: &str| -> Result<[f32; 6], crate::RuntimeError> {
            let v = get(&format!("{k}.top"))?;
            v.as_slice()
                .try_into()
                .map_err(|_| crate::RuntimeError::BadModel(format!("{PREFIX}.{k}.top must hold 6 values")))
        };
        let mut imatrix = BTreeMap::new();
        for (k, v) in file.metadata() {
            if let (Some(name), Value::Array(Array::F32(a))) = (k.strip_prefix("duet.imatrix."), v) {
                imatrix.insert(name.to_string(), a.clone());
            }
        }
        Ok(Some(CalibrationReport {
            source: file.get_str_opt(&format!("{PREFIX}.source"))?.unwrap_or_default().to_string(),
            tokens: tokens as usize,
            n_layers: cfg.n_layers,
            n_heads: cfg.n_heads,
            n_kv_heads: cfg.n_kv_heads,
            q: pair("q")?,
            k: pair("k")?,
            v: pair("v")?,
            logits: pair("logits")?,
            hidden: pair("hidden")?,
            logits_top: top("logits")?,
            hidden_top: top("hidden")?,
            imatrix,
        }))
    }

    /// The outlier table of the DIFF paper (Table 5): largest magnitudes and the median.
    pub fn outlier_table(&self) -> String {
        let row = |name: &str, t: &[f32; 6]| {
            format!("| {name} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} |", t[0], t[1], t[2], t[3], t[4], t[5])
        };
        [
            "| activation | top-1 | top-2 | top-3 | top-10 | top-100 | median |".to_string(),
            "|---|---|---|---|---|---|---|".to_string(),
            row("attention logits", &self.logits_top),
            row("hidden states", &self.hidden_top),
        ]
        .join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Arch, ModelConfig, RopeConfig};

    fn cfg() -> ModelConfig {
        ModelConfig {
            arch: Arch::DiffLlama,
            n_vocab: 10,
            n_embd: 8,
            n_ff: 16,
            n_layers: 1,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 2,
            rms_eps: 1e-5,
            n_ctx_train: 16,
            rope: RopeConfig { n_rot: 2, freq_base: 10000.0, freq_scale: 1.0 },
        }
    }

    #[test]
    fn logits_are_the_causal_scaled_dot_products() {
        let c = cfg();
        let mut cal = Calibrator::new(&c);
        // Two chunks of rows, to check keys accumulate across calls of one sequence.
        let k: Vec<f32> = (0..3 * 4).map(|i| (i as f32 * 0.7).sin()).collect(); // 3 rows × kv_dim 4
        let q: Vec<f32> = (0..3 * 8).map(|i| (i as f32 * 1.3).cos() * 3.0).collect(); // 3 rows × q_dim 8
        cal.observe(Probe::K, 0, 0, &k[..4], 1, 4);
        cal.observe(Probe::Q, 0, 0, &q[..8], 1, 8);
        cal.observe(Probe::K, 0, 1, &k[4..], 2, 4);
        cal.observe(Probe::Q, 0, 1, &q[8..], 2, 8);
        let scale = 2f32.powf(-0.5);
        for h in 0..4 {
            let g = h / 2;
            let mut max = 0f32;
            let mut n = 0;
            for r in 0..3 {
                for j in 0..=r {
                    let s = (0..2).map(|d| q[r * 8 + h * 2 + d] * k[j * 4 + g * 2 + d]).sum::<f32>() * scale;
                    max = max.max(s.abs());
                    n += 1;
                }
            }
            let st = &cal.logits.stats[h];
            assert_eq!(st.count, n);
            assert!((st.absmax - max).abs() < 1e-6, "head {h}: {} vs {max}", st.absmax);
        }
    }
}
