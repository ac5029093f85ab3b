//! The ops a model needs, implemented by every backend. The model ([`crate::model`]) is
//! written once against this trait; the CPU backend is the reference the GPU backend is
//! tested against.
//!
//! Activations are 2-D: `rows` tokens × `cols` features, f32. A backend may run ops eagerly
//! (CPU) or record them and run them at [`Backend::read_rows`] (GPU).

use std::sync::Arc;

use duet_quant::GgmlType;
use duet_quant::gguf::GgufFile;

use crate::error::RuntimeError;
use crate::kv_cache::KvCacheSpec;
use crate::kv_pages::SeqPages;
use crate::model_config::ModelConfig;
pub use crate::observe::{KernelTime, Observer, Probe};

/// A tensor of the model file as the backend receives it at load time.
#[derive(Clone, Copy, Debug)]
pub struct WeightView<'a> {
    /// For messages only: a backend stores and multiplies a weight by its `role`.
    pub name: &'a str,
    pub role: WeightRole,
    pub ty: GgmlType,
    /// Elements per row (GGUF dims[0]); 1-D tensors are one row.
    pub cols: usize,
    pub rows: usize,
    pub data: &'a [u8],
    /// The file whose bytes `data` lies inside (its memory map: a backend may keep referring
    /// to it instead of copying), or None for bytes that go once loaded (a streamed file).
    pub file: Option<&'a Arc<GgufFile>>,
}

/// How the model uses a weight, decided when the model is loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightRole {
    /// The token table: rows gathered by token id (and the output projection when the
    /// output is tied to it).
    Embedding,
    /// A projection multiplied by activations.
    Matrix,
    /// A vector applied element-wise (norm weights, biases).
    Vector,
    /// A small matrix applied to each selected head's attention output in f32 (DEX's W_D).
    HeadMatrix,
}

/// RoPE parameters shared by all layers.
#[derive(Clone, Debug)]
pub struct RopeSpec {
    /// Rotated dimensions per head (pairs (2i, 2i+1) for i < n_rot/2).
    pub n_rot: usize,
    pub freq_base: f32,
    pub freq_scale: f32,
    /// Per-pair frequency divisors (llama3 scaling's `rope_freqs.weight`), if any.
    pub freq_factors: Option<Vec<f32>>,
}

impl RopeSpec {
    /// θ_i for pair i: freq_base^(−2i/n_rot) / factor_i.
    pub fn theta(&self, i: usize) -> f32 {
        let base = self.freq_base.powf(-(2.0 * i as f32) / self.n_rot as f32);
        match &self.freq_factors {
            Some(f) => base / f[i],
            None => base,
        }
    }

    /// The angular frequency of every rotated pair.
    pub fn thetas(&self) -> Vec<f32> {
        (0..self.n_rot / 2).map(|i| self.theta(i)).collect()
    }
}

/// How a layer combines attention heads.
#[derive(Clone, Debug, PartialEq)]
pub enum AttentionKind {
    /// Llama: each query head attends with its KV head.
    Standard,
    /// DIFF: query head j (< H/2) pairs with head j + H/2; output
    /// `RMSNorm(A1·V − λ·A2·V) · (1 − λ_init)` over 2·head_dim, see docs/diff-attention.md.
    Differential {
        lambda: f32,
        lambda_init: f32,
        /// Optional learned sub-norm weight (official DIFF checkpoints), 2·head_dim values.
        sub_norm: Option<Vec<f32>>,
    },
    /// DIFF V2: each query head attends exactly as in [`AttentionKind::Standard`]; the model
    /// then combines heads 2i and 2i+1 with per-token gates ([`Backend::pair_combine`]).
    PairedHeads,
}

/// Everything attention needs besides its inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionSpec {
    pub kind: AttentionKind,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Usually head_dim^-0.5.
    pub scale: f32,
    pub rms_eps: f32,
    /// Quantize the attention logits before each softmax (`None`: full precision).
    pub logit_quant: Option<LogitQuant>,
}

/// Absmax quantization of the attention logits `s = scale·q·k` over the causal positions,
/// before each softmax (for DIFF, each branch's): `s' = step·clamp(round(s / step), −m, m)`
/// with `m = 2^(bits−1) − 1`, `step = absmax / m` (round: halves away from zero; step 0
/// gives 0), as the DIFF paper's §3.7 quantizes them.
#[derive(Clone, Debug, PartialEq)]
pub struct LogitQuant {
    /// 2 to 16.
    pub bits: u32,
    pub scale: LogitScale,
}

/// Where a logit quantization's absmax comes from. The dynamic ones are taken over the query
/// rows evaluated together (a whole sequence in perplexity and attn-bench, one row per
/// decoded token); static ones do not depend on batching.
#[derive(Clone, Debug, PartialEq)]
pub enum LogitScale {
    /// One absmax over the layer's whole logit tensor (every head and row).
    Tensor,
    /// One per query head (per DIFF branch), over all rows.
    Head,
    /// One per query head and row.
    Row,
    /// Fixed, one per query head of the layer (calibration's `duet.calibration.logits.absmax`).
    Static(Vec<f32>),
}

impl LogitQuant {
    /// `m = 2^(bits−1) − 1`.
    pub fn qmax(&self) -> f32 {
        ((1u32 << (self.bits - 1)) - 1) as f32
    }

    /// Quantizes `s` in place against `absmax` (see the type's docs).
    pub fn apply(qmax: f32, absmax: f32, s: &mut [f32]) {
        let step = absmax / qmax;
        if step == 0.0 || !step.is_finite() {
            if step == 0.0 {
                s.fill(0.0);
            }
            return;
        }
        for v in s.iter_mut() {
            *v = step * (*v / step).round().clamp(-qmax, qmax);
        }
    }
}

/// RMSNorm of `x`'s rows with `weight` and `eps`: the input of the products that take it
/// ([`Backend::norm_matmul_group`], [`Backend::norm_matmul_swiglu`]). A backend may fold the
/// norm into them; otherwise it writes the normalised rows into `xn` first (which then
/// holds them; folded, `xn` is left as it was).
pub struct Normed<'a, T, W> {
    pub x: &'a T,
    pub weight: &'a W,
    pub eps: f32,
    pub xn: &'a mut T,
}

/// One sequence's rows in a batch ([`Backend::attention`]): batch rows `first..first + rows`
/// are its positions `pos0..`, attended as `spec` says (the session's run settings).
#[derive(Clone, Copy)]
pub struct SeqSpan<'a> {
    pub seq: SeqPages<'a>,
    pub first: usize,
    pub rows: usize,
    pub pos0: usize,
    pub spec: &'a AttentionSpec,
}

impl<'a> SeqSpan<'a> {
    /// A batch of one sequence: all `rows` rows are its positions `pos0..`.
    pub fn whole(seq: SeqPages<'a>, rows: usize, pos0: usize, spec: &'a AttentionSpec) -> Self {
        SeqSpan { seq, first: 0, rows, pos0, spec }
    }
}

pub trait Backend {
    /// Activations, `rows × cols` f32.
    type Tensor;
    /// A weight matrix or vector resident on the backend.
    type Weight;
    /// The K/V cache of all layers: pages shared by the sequences of one
    /// [`KvCacheSpec`] ([`crate::kv_pages`]).
    type KvCache;

    /// A one-line description (device name, threads, kernel set).
    fn describe(&self) -> String;
    /// Each kernel's device time since the last call, longest first, where the backend
    /// times its kernels (the GPU with `GpuOptions::profile`); else None.
    fn take_kernel_times(&mut self) -> Option<Vec<KernelTime>> {
        None
    }
    /// Kernel dispatches and the barriers between them so far, where the backend records
    /// dispatches (the GPU); else None.
    fn dispatch_counts(&self) -> Option<(usize, usize)> {
        None
    }
    /// The largest tensor `new_tensor` can make, in bytes (None: no limit but memory).
    fn max_tensor_bytes(&self) -> Option<u64> {
        None
    }

    /// Refuses, before anything is allocated, sessions this backend cannot hold: a K/V
    /// cache of `cache` and a batch context of `max_batch` rows for a model of `config` (the
    /// error names the sizes and the largest context that fits).
    fn check_session(
        &self,
        _config: &ModelConfig,
        _cache: &KvCacheSpec,
        _max_batch: usize,
    ) -> Result<(), RuntimeError> {
        Ok(())
    }

    fn load_weight(&mut self, w: &WeightView<'_>) -> Result<Self::Weight, RuntimeError>;
    /// Loads weights that the model multiplies by the same input (q, k, v and DIFF V2's λ;
    /// gate and up), so that a backend may keep them together and read them in one pass
    /// ([`Backend::matmul_group`], [`Backend::matmul_swiglu`]). Default: each alone.
    fn load_weight_group(&mut self, ws: &[WeightView<'_>]) -> Result<Vec<Self::Weight>, RuntimeError> {
        ws.iter().map(|w| self.load_weight(w)).collect()
    }
    fn new_tensor(&mut self, rows: usize, cols: usize) -> Self::Tensor;
    /// Changes how many rows of a tensor are in use (at most its allocated rows).
    fn set_rows(&mut self, t: &mut Self::Tensor, rows: usize);
    fn new_kv_cache(&mut self, spec: &KvCacheSpec) -> Result<Self::KvCache, RuntimeError>;

    /// out[i] = row `tokens[i]` of `table`.
    fn embed(&mut self, table: &Self::Weight, tokens: &[u32], out: &mut Self::Tensor);
    /// out = x / rms(x) · weight, row by row.
    fn rms_norm(&mut self, x: &Self::Tensor, weight: &Self::Weight, eps: f32, out: &mut Self::Tensor);
    /// out = x · wᵀ (w is `out.cols × x.cols`).
    fn matmul(&mut self, w: &Self::Weight, x: &Self::Tensor, out: &mut Self::Tensor);
    /// out += x · wᵀ: a projection and the residual add after it. Default: the product into
    /// `scratch` (out's shape), then the add.
    fn matmul_add(&mut self, w: &Self::Weight, x: &Self::Tensor, scratch: &mut Self::Tensor, out: &mut Self::Tensor) {
        self.matmul(w, x, scratch);
        self.add(out, scratch);
    }
    /// outs[i] = x · ws[i]ᵀ for weights loaded together ([`Backend::load_weight_group`]).
    /// Default: one product each.
    fn matmul_group(&mut self, ws: &[&Self::Weight], x: &Self::Tensor, outs: &mut [&mut Self::Tensor]) {
        for (w, out) in ws.iter().zip(outs.iter_mut()) {
            self.matmul(w, x, out);
        }
    }
    /// [`Backend::matmul_group`] of RMSNorm(`n.x`) (see [`Normed`]). Default: the norm into
    /// `n.xn`, then the products.
    fn norm_matmul_group(
        &mut self,
        n: Normed<'_, Self::Tensor, Self::Weight>,
        ws: &[&Self::Weight],
        outs: &mut [&mut Self::Tensor],
    ) {
        self.rms_norm(n.x, n.weight, n.eps, n.xn);
        self.matmul_group(ws, n.xn, outs);
    }
    /// [`Backend::matmul_swiglu`] of RMSNorm(`n.x`) (see [`Normed`]). Default: the norm into
    /// `n.xn`, then the products and SwiGLU.
    fn norm_matmul_swiglu(
        &mut self,
        n: Normed<'_, Self::Tensor, Self::Weight>,
        w_gate: &Self::Weight,
        w_up: &Self::Weight,
        gate: &mut Self::Tensor,
        up: &mut Self::Tensor,
    ) {
        self.rms_norm(n.x, n.weight, n.eps, n.xn);
        self.matmul_swiglu(w_gate, w_up, n.xn, gate, up);
    }
    /// gate = silu(x · w_gateᵀ) · (x · w_upᵀ), the two loaded together; `up` is scratch of
    /// gate's shape. Default: both products, then [`Backend::swiglu`].
    fn matmul_swiglu(
        &mut self,
        w_gate: &Self::Weight,
        w_up: &Self::Weight,
        x: &Self::Tensor,
        gate: &mut Self::Tensor,
        up: &mut Self::Tensor,
    ) {
        self.matmul(w_gate, x, gate);
        self.matmul(w_up, x, up);
        self.swiglu(gate, up);
    }
    /// x += bias on every row.
    fn add_bias(&mut self, x: &mut Self::Tensor, bias: &Self::Weight);
    /// Rotates adjacent pairs of each head; row r is at position pos0 + r.
    fn rope(&mut self, x: &mut Self::Tensor, n_heads: usize, head_dim: usize, pos0: usize, rope: &RopeSpec);
    /// The attention step of layer `layer` for a batch: for each sequence's rows (`spans`,
    /// in batch-row order, covering every row of `q`, `k`, `v`), RoPE on its rows of `q`
    /// and `k` at its positions `pos0..` (where `rope` is given; None: they are rotated
    /// already, e.g. so that an observer saw them), its K and V rows stored in `cache`
    /// (whose pages cover them), then causal attention of each query row over its
    /// sequence's positions 0..=pos into `out`, with the span's settings (`spec`). With
    /// `pairs` (DIFF V2: the gates λ before their sigmoid, and the combined heads' tensor),
    /// [`Backend::pair_combine`] follows into `pairs.1`, `out` then scratch: a backend may
    /// merge the pairs as it combines attention's partial results. Every span's result is
    /// that of the span alone; a backend attends all spans in one pass where it can.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &mut self,
        q: &mut Self::Tensor,
        k: &mut Self::Tensor,
        v: &Self::Tensor,
        cache: &mut Self::KvCache,
        layer: usize,
        spans: &[SeqSpan<'_>],
        rope: Option<&RopeSpec>,
        pairs: Option<(&Self::Tensor, &mut Self::Tensor)>,
        out: &mut Self::Tensor,
    );
    /// DEX: for each adapted head h, `o_h ← o_h − λ·o_h·W_D` (`w_d` is head_dim × head_dim).
    fn dex(&mut self, x: &mut Self::Tensor, w_d: &Self::Weight, lambda: f32, heads: &[usize], head_dim: usize);
    /// DIFF V2's combine step: for each row and pair i (head_dim values each),
    /// `out_i = att_2i − sigmoid(gate_i)·att_2i+1`. `att` is rows × 2·n_pairs·head_dim (the
    /// attention output of the query heads), `gate` rows × n_pairs (λ before the sigmoid),
    /// `out` rows × n_pairs·head_dim.
    fn pair_combine(&mut self, att: &Self::Tensor, gate: &Self::Tensor, head_dim: usize, out: &mut Self::Tensor);
    /// gate = silu(gate) · up.
    fn swiglu(&mut self, gate: &mut Self::Tensor, up: &Self::Tensor);
    /// x += y.
    fn add(&mut self, x: &mut Self::Tensor, y: &Self::Tensor);
    /// Copies rows `src_row..src_row + n` of `x` into rows `dst_row..` of `out` (same
    /// number of columns), in one operation.
    fn copy_rows(&mut self, x: &Self::Tensor, src_row: usize, out: &mut Self::Tensor, dst_row: usize, n: usize);
    /// Copies row `src_row` of `x` into row `dst_row` of `out`.
    fn copy_row(&mut self, x: &Self::Tensor, src_row: usize, out: &mut Self::Tensor, dst_row: usize) {
        self.copy_rows(x, src_row, out, dst_row, 1)
    }
    /// Rows `rows` of `t` on the host (for the GPU: submits all recorded work in one
    /// submission and waits). Errors the device reported since the last read (device
    /// lost, out of memory) come back here.
    fn read_rows(&mut self, t: &Self::Tensor, rows: std::ops::Range<usize>) -> Result<Vec<f32>, RuntimeError>;
    /// [`Backend::read_rows`] as a future, for a device whose results arrive only after the
    /// caller yields (WebGPU in a browser). Native backends' futures are ready when first
    /// polled (the default: the synchronous read).
    fn read_rows_async(
        &mut self,
        t: &Self::Tensor,
        rows: std::ops::Range<usize>,
    ) -> impl std::future::Future<Output = Result<Vec<f32>, RuntimeError>> {
        std::future::ready(self.read_rows(t, rows))
    }
    /// Installs (or, with None, removes and returns) the observer that sees activations at
    /// the probe points: calibration, attn-bench's per-layer errors, attention maps.
    fn set_observer(&mut self, observer: Option<Box<dyn Observer>>) -> Option<Box<dyn Observer>>;
    /// Shows the activations at `probe` of `layer` (positions pos0..) to the installed
    /// observer, if it wants them.
    fn observe(&mut self, probe: Probe, layer: usize, pos0: usize, t: &Self::Tensor);
    /// Whether an installed observer wants `probe` of `layer`.
    fn observes(&self, probe: Probe, layer: usize) -> bool;
}
