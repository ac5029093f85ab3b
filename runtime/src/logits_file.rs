//! duet's logits file: every position's logits, so any two models or backends can be
//! compared (`duet perplexity --save-logits` / `--kl-base`).
//!
//! Layout, all little-endian:
//! `b"DLOG"` · u32 version = 1 · u32 n_tokens · u32 n_vocab · u32 token_ids[n_tokens] ·
//! f32 logits[n_tokens][n_vocab] (row t: the logits after reading tokens 0..=t).

use std::io::Write;
use std::path::Path;

use crate::error::RuntimeError;

pub struct LogitsFile {
    pub tokens: Vec<u32>,
    pub n_vocab: usize,
    /// n_tokens × n_vocab.
    pub logits: Vec<f32>,
}

impl LogitsFile {
    pub fn row(&self, t: usize) -> &[f32] {
        &self.logits[t * self.n_vocab..(t + 1) * self.n_vocab]
    }

    pub fn read(path: &Path) -> Result<LogitsFile, RuntimeError> {
        let label = path.display().to_string();
        let b = std::fs::read(path).map_err(|source| RuntimeError::Io { path: label.clone(), source })?;
        let bad = |m: &str| RuntimeError::Usage(format!("{label}: not a duet logits file ({m})"));
        if b.len() < 16 || &b[..4] != b"DLOG" {
            return Err(bad("no DLOG header"));
        }
        let u = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]) as usize;
        if u(4) != 1 {
            return Err(bad("unknown version"));
        }
        let (n, v) = (u(8), u(12));
        let want = n
            .checked_mul(v)
            .and_then(|nv| nv.checked_add(n))
            .and_then(|x| x.checked_mul(4))
            .and_then(|x| x.checked_add(16));
        if want != Some(b.len()) {
            return Err(bad("its size does not match its header"));
        }
        let tokens = (0..n).map(|i| u(16 + 4 * i) as u32).collect();
        let off = 16 + 4 * n;
        let logits = b[off..].chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        Ok(LogitsFile { tokens, n_vocab: v, logits })
    }

    /// Writes through duet_quant::output's AtomicFile: a temporary file beside `path`,
    /// renamed over it when complete; a device, FIFO, directory or link is never replaced.
    pub fn write(&self, path: &Path) -> Result<(), RuntimeError> {
        let label = path.display().to_string();
        let io = |source| RuntimeError::Io { path: label.clone(), source };
        let mut file = duet_quant::output::AtomicFile::create(path).map_err(io)?;
        {
            let mut f = std::io::BufWriter::new(file.file());
            f.write_all(b"DLOG").map_err(io)?;
            for x in [1u32, self.tokens.len() as u32, self.n_vocab as u32] {
                f.write_all(&x.to_le_bytes()).map_err(io)?;
            }
            for t in &self.tokens {
                f.write_all(&t.to_le_bytes()).map_err(io)?;
            }
            for l in &self.logits {
                f.write_all(&l.to_le_bytes()).map_err(io)?;
            }
            f.flush().map_err(io)?;
        }
        file.commit().map_err(io)
    }
}

/// log-softmax of one row, in f64.
pub fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let lse = row.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln() + max;
    row.iter().map(|&x| x as f64 - lse).collect()
}

/// KL(P_base ‖ P_test) of two logit rows.
pub fn kl_divergence(base: &[f32], test: &[f32]) -> f64 {
    kl_divergence_log(&log_softmax(base), &log_softmax(test))
}

/// KL(P_base ‖ P_test) of two rows already through [`log_softmax`].
pub fn kl_divergence_log(base: &[f64], test: &[f64]) -> f64 {
    base.iter().zip(test).map(|(p, q)| p.exp() * (p - q)).sum()
}

pub fn argmax(row: &[f32]) -> usize {
    row.iter().enumerate().fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| if v > bv { (i, v) } else { (bi, bv) }).0
}
