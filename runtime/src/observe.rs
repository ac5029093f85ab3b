//! What a backend shows of a run besides its results: the activations at probe points, to an
//! installed [`Observer`] (calibration, attn-bench, attention maps, all tools above the core),
//! and the time its kernels took ([`KernelTime`], `duet bench --gpu-profile`). Beside the
//! [`crate::backend::Backend`] trait, importing nothing of the model or the tools.

/// Points of the forward pass where an observer may look at activations (calibration).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Probe {
    /// The normalised input of the q/k/v projections (rows × n_embd).
    AttnIn,
    /// Queries after RoPE (rows × n_heads·head_dim).
    Q,
    /// Keys after RoPE (rows × n_kv_heads·head_dim), at positions pos0.. of the layer.
    K,
    /// Values (rows × n_kv_heads·head_dim).
    V,
    /// The attention output, the input of attn_output (rows × n_heads·head_dim; DIFF V2:
    /// after the pair combine, rows × n_heads/2·head_dim).
    AttnOut,
    /// DIFF V2: lambda_proj of the normalised input, before its sigmoid (rows × n_heads/2).
    PairGates,
    /// Each head pair's two branches before they are combined. DIFF (CPU only):
    /// `[A1·V | A2·V]` per pair (rows × (n_heads/2)·4·head_dim); DIFF V2 (both backends): the
    /// query heads' outputs, `[o_2i | o_2i+1]` per pair (rows × n_heads·head_dim).
    AttnBranches,
    /// The normalised input of ffn_gate/ffn_up (rows × n_embd).
    FfnIn,
    /// The SwiGLU output, the input of ffn_down (rows × n_ff).
    FfnDownIn,
    /// The residual stream after the layer (rows × n_embd).
    Hidden,
    /// The normalised input of the output projection (rows × n_embd).
    OutputIn,
}

impl Probe {
    pub const ALL: [Probe; 11] = [
        Probe::AttnIn,
        Probe::Q,
        Probe::K,
        Probe::V,
        Probe::AttnOut,
        Probe::PairGates,
        Probe::AttnBranches,
        Probe::FfnIn,
        Probe::FfnDownIn,
        Probe::Hidden,
        Probe::OutputIn,
    ];
}

/// Sees activations at the probe points of a forward pass (see [`Backend::set_observer`](crate::backend::Backend::set_observer)).
pub trait Observer: Send {
    /// Whether `observe` wants `probe` of `layer` at all. The GPU backend reads a tensor
    /// back (a submission and a wait) only for the probes an observer wants.
    fn wants(&self, _probe: Probe, _layer: usize) -> bool {
        true
    }
    /// `data` is `rows × cols` (row r at position pos0 + r) of `layer` (n_layers for the
    /// output's input).
    fn observe(&mut self, probe: Probe, layer: usize, pos0: usize, data: &[f32], rows: usize, cols: usize);
}

/// A shared observer: the caller keeps a handle to read the results afterwards.
impl<T: Observer> Observer for std::sync::Arc<std::sync::Mutex<T>> {
    fn wants(&self, probe: Probe, layer: usize) -> bool {
        self.lock().unwrap_or_else(|e| e.into_inner()).wants(probe, layer)
    }
    fn observe(&mut self, probe: Probe, layer: usize, pos0: usize, data: &[f32], rows: usize, cols: usize) {
        self.lock().unwrap_or_else(|e| e.into_inner()).observe(probe, layer, pos0, data, rows, cols);
    }
}

/// One kernel variant's share of the profiled time.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    /// The pipeline's label (`matvec-q4_0-f16`, `attention-f16`, …).
    pub kernel: String,
    pub calls: u64,
    pub seconds: f64,
    /// Weight bytes its calls read (the matrix kernels; 0 for the others).
    pub weight_bytes: u64,
    /// A step on the host (the GPU backend's `profile::HostStep`), not a GPU kernel.
    pub on_host: bool,
}
