//! Text embeddings (`duet serve`'s `/v1/embeddings`): the model's last hidden states — the
//! input of its output projection, after the final RMS norm — mean-pooled over every token
//! of the text and scaled to unit length (L2), so that a dot product is the cosine
//! similarity. A decoder model's states each see only the tokens before them; the mean over
//! all of them gives every token a share, as llama.cpp's `--pooling mean` does.
//!
//! The forward pass is the model's own ([`Model::decode`]); an observer of
//! [`Probe::OutputIn`] reads the states.

use std::sync::{Arc, Mutex};

use crate::backend::Backend;
use crate::error::RuntimeError;
use crate::kv_cache::CacheFormat;
use crate::model::{BatchContext, Logits, Model};
use crate::observe::{Observer, Probe};

/// Sums the rows it sees of the output's input.
struct Pool {
    sum: Vec<f64>,
    rows: usize,
}

impl Observer for Pool {
    fn wants(&self, probe: Probe, _layer: usize) -> bool {
        probe == Probe::OutputIn
    }
    fn observe(&mut self, probe: Probe, _layer: usize, _pos0: usize, data: &[f32], rows: usize, cols: usize) {
        if probe != Probe::OutputIn {
            return;
        }
        if self.sum.len() != cols {
            self.sum = vec![0.0; cols];
        }
        for r in data.chunks_exact(cols).take(rows) {
            for (s, &x) in self.sum.iter_mut().zip(r) {
                *s += x as f64;
            }
        }
        self.rows += rows;
    }
}

/// The embedding of `tokens` (n_embd values, unit length), evaluated in a cache of its own
/// through `ctx`'s steps.
pub fn embed<B: Backend>(
    model: &Model<B>,
    b: &mut B,
    ctx: &mut BatchContext<B>,
    tokens: &[u32],
) -> Result<Vec<f32>, RuntimeError> {
    if tokens.is_empty() {
        return Err(RuntimeError::Usage("nothing to embed: the text has no tokens".into()));
    }
    let mut session = model.new_session(b, tokens.len(), CacheFormat::F16, CacheFormat::F16)?;
    let pool = Arc::new(Mutex::new(Pool { sum: Vec::new(), rows: 0 }));
    let before = b.set_observer(Some(Box::new(Arc::clone(&pool))));
    // A step's worth of tokens at a time: every row's logits are made (the states are read
    // on their way to them) and dropped, so memory stays at one step's rows × the vocabulary.
    let mut run = Ok(());
    for piece in tokens.chunks(ctx.cap().max(1)) {
        if let Err(e) = model.decode_one(b, ctx, &mut session, piece, Logits::All) {
            run = Err(e);
            break;
        }
    }
    b.set_observer(before);
    run?;
    let pool = pool.lock().unwrap_or_else(|p| p.into_inner());
    if pool.rows != tokens.len() {
        return Err(RuntimeError::Device(format!(
            "the forward pass reported {} hidden states for {} tokens",
            pool.rows,
            tokens.len()
        )));
    }
    let mean: Vec<f64> = pool.sum.iter().map(|s| s / pool.rows as f64).collect();
    let norm = mean.iter().map(|x| x * x).sum::<f64>().sqrt();
    Ok(mean.iter().map(|x| if norm > 0.0 { (x / norm) as f32 } else { 0.0 }).collect())
}
