//! Tools that show what attention does: attention maps of every layer and head (DIFF: both
//! softmaxes and their difference), the DIFF paper's key-information-retrieval metric, and
//! their rendering (heatmaps as SVG and PNG, a self-contained HTML report).
//!
//! * [`maps`]: Q/K capture on either backend and the maps computed from it.
//! * [`needle`]: retrieval prompts and attention to answer / attention noise.
//! * [`heatmap`], [`raster`]: figures; [`html`]: the report; [`npy`]: raw maps for scripts.

pub mod attn_map;
pub mod heatmap;
pub mod html;
pub mod maps;
pub mod needle;
pub mod needle_output;
pub mod npy;
pub mod raster;

use std::sync::{Arc, Mutex};

use crate::backend::Backend;
use crate::engine::Engine;
use crate::error::RuntimeError;
use maps::QkCapture;

/// Evaluates `tokens` from an empty cache and returns Q and K of the layers marked in
/// `wanted`. The engine's cache is left empty.
pub fn capture_qk<B: Backend>(
    engine: &mut Engine<B>,
    tokens: &[u32],
    wanted: Vec<bool>,
) -> Result<QkCapture, RuntimeError> {
    let capture = Arc::new(Mutex::new(QkCapture::new(wanted)));
    engine.reset();
    engine.backend.set_observer(Some(Box::new(Arc::clone(&capture))));
    let pass = engine.prefill(tokens);
    engine.backend.set_observer(None);
    engine.reset();
    pass?;
    let mut guard = capture.lock().unwrap_or_else(|p| p.into_inner());
    Ok(std::mem::replace(&mut *guard, QkCapture::new(Vec::new())))
}
