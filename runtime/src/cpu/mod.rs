//! The CPU backend: the reference every other backend is tested against, and the fallback
//! for machines without a usable GPU. Weights stay in their GGUF blocks inside the memory
//! map; work is spread over a fork-join thread pool.

mod attention;
pub mod bandwidth;
mod gemm_choice;
mod kernel_choice;
mod matmul;
pub mod ops;
pub mod pool;
#[cfg(target_arch = "x86_64")]
mod simd;
mod tensor;

use std::sync::{Arc, OnceLock};

use duet_quant::GgmlType;
use duet_quant::dot::{Kernels, kernels};

pub use attention::{CpuKvCache, Placement};
pub use gemm_choice::GemmChoice;
pub use kernel_choice::{KernelChoice, choose_kernels};
pub use matmul::ActPrecision;
pub use tensor::{CpuTensor, CpuWeight, Storage};

use crate::backend::{Backend, RopeSpec, SeqSpan, WeightRole, WeightView};
use crate::error::RuntimeError;
use crate::kv_cache::KvCacheSpec;
use matmul::ActCache;
use pool::ThreadPool;

pub struct CpuBackend {
    pool: ThreadPool,
    kernels: &'static Kernels,
    /// Packed matmul kernels by weight type, when this CPU has a fast set
    /// ([`KernelChoice::gemm`]); timed at load ([`GemmChoice`]).
    gemm: Option<GemmChoice>,
    acts: ActCache,
    /// Cached RoPE frequencies (they depend only on the spec).
    thetas: Option<Vec<f32>>,
    /// Sees activations at the probe points (calibration), if installed.
    observer: Option<Box<dyn crate::observe::Observer>>,
    /// The K/V caches' diagnostic perturbation ([`CpuKvCache::new`]; 0: none).
    kv_jitter: f32,
}

impl CpuBackend {
    /// `threads` = 0 picks the number of physical-ish cores available.
    pub fn new(threads: usize) -> CpuBackend {
        let threads = if threads == 0 { default_threads() } else { threads };
        CpuBackend {
            pool: ThreadPool::new(threads),
            kernels: kernels(),
            gemm: GemmChoice::new(),
            acts: ActCache::default(),
            thetas: None,
            observer: None,
            kv_jitter: 0.0,
        }
    }

    /// Perturbs every K/V value the caches made from now on store by a relative `rel`
    /// ([`CpuKvCache::new`]'s diagnostic, which refuses a `rel` outside [0, 1)).
    pub fn set_kv_jitter(&mut self, rel: f32) {
        self.kv_jitter = rel;
    }

    pub fn threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// How activations are quantized for the integer matmuls (default [`ActPrecision::Q8x2`]).
    pub fn set_act_precision(&mut self, precision: ActPrecision) {
        self.acts = ActCache::new(precision);
    }

    pub fn act_precision(&self) -> ActPrecision {
        self.acts.precision
    }

    /// Makes the packed kernel candidate `name` multiply every weight type, untimed
    /// ([`GemmChoice::pin`]); call before loading weights.
    pub fn pin_gemm(&mut self, name: &str) -> Result<(), RuntimeError> {
        match self.gemm.as_mut() {
            Some(g) => g.pin(name).map_err(RuntimeError::Usage),
            None => Err(RuntimeError::Usage(
                "this process runs no packed kernels (DUET_GEMM=off or none fits this CPU)".into(),
            )),
        }
    }

    /// The packed kernel candidates of this process, the default first (empty without packed
    /// kernels).
    pub fn gemm_candidates(&self) -> Vec<&'static str> {
        self.gemm.as_ref().map(GemmChoice::candidate_names).unwrap_or_default()
    }

    fn thetas(&mut self, rope: &RopeSpec) -> &[f32] {
        // Compared whole (frequency factors included): the K reader of keys stored before
        // RoPE computes its own from `rope`, and a stale entry would turn Q by others.
        let thetas = rope.thetas();
        if self.thetas.as_ref() != Some(&thetas) {
            self.thetas = Some(thetas);
        }
        self.thetas.as_ref().expect("just set")
    }
}

/// A raw pointer that may be shared between threads because every thread writes disjoint
/// elements.
#[derive(Clone, Copy)]
pub(crate) struct SharedMut(*mut f32);
// SAFETY: see above; users document which elements each thread writes.
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}

impl SharedMut {
    pub(crate) fn new(p: *mut f32) -> SharedMut {
        SharedMut(p)
    }

    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }
}

/// All available cores (the OS's count); users can lower it with `-t`.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl Backend for CpuBackend {
    type Tensor = CpuTensor;
    type Weight = CpuWeight;
    type KvCache = CpuKvCache;

    fn describe(&self) -> String {
        let acts = match self.acts.precision {
            ActPrecision::Q8 => "Q8 activations",
            ActPrecision::Q8x2 => "two-level Q8 activations",
            ActPrecision::Auto => "two-level Q8 activations for up to 4 rows, Q8 for more",
        };
        let threads = match self.pool.n_threads() {
            1 => "1 thread".to_string(),
            n => format!("{n} threads"),
        };
        match &self.gemm {
            Some(g) => format!("CPU, {threads}, {} / {} kernels, {acts}", g.describe(), self.kernels.name),
            None => format!("CPU, {threads}, {} kernels, {acts}", self.kernels.name),
        }
    }

    fn check_session(
        &self,
        config: &crate::model::ModelConfig,
        cache: &KvCacheSpec,
        max_batch: usize,
    ) -> Result<(), RuntimeError> {
        // A tenth of what is available stays for the weights' pages and the rest of the system.
        match crate::memory::available_bytes() {
            Some(avail) => crate::memory::check_session(config, cache, max_batch, self.threads(), avail / 10 * 9),
            None => Ok(()),
        }
    }

    fn load_weight(&mut self, w: &WeightView<'_>) -> Result<CpuWeight, RuntimeError> {
        if !w.ty.is_supported() || w.ty == GgmlType::Q8_K {
            return Err(RuntimeError::Unsupported(format!(
                "tensor '{}' has type {}, which the CPU backend cannot compute with",
                w.name, w.ty
            )));
        }
        // Vectors (norms, biases, λ) are tiny and read often: keep them as f32.
        let f32_values = if w.rows == 1 {
            let mut v = vec![0f32; w.cols];
            duet_quant::dequantize(w.ty, w.data, &mut v)
                .map_err(|e| RuntimeError::BadModel(format!("tensor '{}': {e}", w.name)))?;
            Some(v)
        } else {
            None
        };
        let weight = CpuWeight {
            ty: w.ty,
            rows: w.rows,
            cols: w.cols,
            storage: match w.file {
                Some(file) => {
                    let base = file.bytes().as_ptr() as usize;
                    let start = (w.data.as_ptr() as usize).checked_sub(base).expect("weight data lies inside its file");
                    Storage::Mapped { file: Arc::clone(file), start, len: w.data.len() }
                }
                None => Storage::Owned(w.data.to_vec()),
            },
            f32_values,
            packed: OnceLock::new(),
        };
        // Repack matrices once, now (in parallel). The token embedding is read by rows for
        // the embedding lookup and is a matmul weight only when the output is tied to it: it
        // is packed at its first matmul instead, if ever.
        if let Some(choice) = self.gemm.as_mut()
            && w.rows > 1
            && w.role != WeightRole::Embedding
        {
            let packed = matmul::pack(&self.pool, &weight);
            if let Some(p) = &packed
                && choice.wants_timing(p.ty(), p.rows() * p.cols())
            {
                choice.time(&self.pool, p, self.acts.precision);
            }
            let _ = weight.packed.set(packed);
        }
        Ok(weight)
    }

    fn new_tensor(&mut self, rows: usize, cols: usize) -> CpuTensor {
        CpuTensor::new(rows, cols)
    }

    fn set_rows(&mut self, t: &mut CpuTensor, rows: usize) {
        assert!(rows * t.cols <= t.data.len(), "tensor holds {} rows, {rows} requested", t.data.len() / t.cols);
        t.rows = rows;
        t.version = tensor::fresh_version();
    }

    fn new_kv_cache(&mut self, spec: &KvCacheSpec) -> Result<CpuKvCache, RuntimeError> {
        CpuKvCache::new(spec, self.kv_jitter)
    }

    fn embed(&mut self, table: &CpuWeight, tokens: &[u32], out: &mut CpuTensor) {
        let row_bytes = table.row_bytes();
        let cols = table.cols;
        let bytes = table.bytes();
        let o = out.view_mut();
        for (i, &t) in tokens.iter().enumerate() {
            let t = t as usize;
            assert!(t < table.rows, "token id {t} is outside the vocabulary ({} tokens)", table.rows);
            duet_quant::dequantize(
                table.ty,
                &bytes[t * row_bytes..(t + 1) * row_bytes],
                &mut o[i * cols..(i + 1) * cols],
            )
            .expect("embedding rows are whole blocks of a supported type");
        }
    }

    fn rms_norm(&mut self, x: &CpuTensor, weight: &CpuWeight, eps: f32, out: &mut CpuTensor) {
        let cols = x.cols;
        let w = weight.values();
        let xv = x.view();
        let o = SharedMut::new(out.view_mut().as_mut_ptr());
        self.pool.for_chunks(x.rows, 8, &|rows| {
            for r in rows {
                // SAFETY: row r of `out` (rows × cols) is written by this chunk only.
                let or = unsafe { std::slice::from_raw_parts_mut(o.get().add(r * cols), cols) };
                ops::rms_norm_row(&xv[r * cols..(r + 1) * cols], Some(w), eps, or);
            }
        });
    }

    fn matmul(&mut self, w: &CpuWeight, x: &CpuTensor, out: &mut CpuTensor) {
        matmul::matmul(&self.pool, self.kernels, self.gemm.as_ref(), w, x, out, &mut self.acts);
    }

    fn add_bias(&mut self, x: &mut CpuTensor, bias: &CpuWeight) {
        let b = bias.values();
        for row in x.view_mut().chunks_exact_mut(b.len()) {
            for (v, &bb) in row.iter_mut().zip(b) {
                *v += bb;
            }
        }
    }

    fn rope(&mut self, x: &mut CpuTensor, n_heads: usize, head_dim: usize, pos0: usize, rope: &RopeSpec) {
        let thetas = self.thetas(rope).to_vec();
        let cols = x.cols;
        ops::rope_rows(x.view_mut(), cols, n_heads, head_dim, pos0, &thetas, rope.freq_scale);
    }

    fn attention(
        &mut self,
        q: &mut CpuTensor,
        k: &mut CpuTensor,
        v: &CpuTensor,
        cache: &mut CpuKvCache,
        layer: usize,
        spans: &[SeqSpan<'_>],
        rope: Option<&RopeSpec>,
        pairs: Option<(&CpuTensor, &mut CpuTensor)>,
        out: &mut CpuTensor,
    ) {
        let Some(first) = spans.first() else { return };
        let spec = first.spec;
        let (hd, q_cols, kv_cols) = (spec.head_dim, q.cols, k.cols);
        let thetas = rope.map(|r| self.thetas(r).to_vec());
        // A K cache of keys before RoPE stores them as they are; its reads rotate them.
        let n_pos = spans.iter().map(|s| s.pos0 + s.rows).max().unwrap_or(0);
        let keys_before_rope = cache.keys_before_rope(rope, n_pos);
        for s in spans {
            let rows = s.first..s.first + s.rows;
            let kr = &mut k.view_mut()[rows.start * kv_cols..rows.end * kv_cols];
            if let (Some(r), Some(thetas)) = (rope, &thetas) {
                let qr = &mut q.view_mut()[rows.start * q_cols..rows.end * q_cols];
                ops::rope_rows(qr, q_cols, q_cols / hd, hd, s.pos0, thetas, r.freq_scale);
                if !keys_before_rope {
                    ops::rope_rows(kr, kv_cols, kv_cols / hd, hd, s.pos0, thetas, r.freq_scale);
                }
            }
            let vr = &v.view()[rows.start * kv_cols..rows.end * kv_cols];
            cache.store(&s.seq, layer, s.pos0, kr, vr);
        }
        // DIFF's two branches, captured where an observer wants them (one sequence a step
        // then: the model runs observed sequences alone).
        let capture = matches!(spec.kind, crate::backend::AttentionKind::Differential { .. })
            && self.observer.as_ref().is_some_and(|o| o.wants(crate::backend::Probe::AttnBranches, layer));
        let mut branches = if capture { vec![0f32; q.rows * 2 * q.cols] } else { Vec::new() };
        let b = capture.then_some(branches.as_mut_slice());
        attention::attention_spans(&self.pool, cache, layer, q.view(), spans, out.view_mut(), b);
        if let Some(o) = self.observer.as_mut().filter(|_| capture) {
            o.observe(crate::backend::Probe::AttnBranches, layer, first.pos0, &branches, q.rows, 2 * q.cols);
        }
        if let Some((gate, combined)) = pairs {
            self.pair_combine(out, gate, hd, combined);
        }
    }

    fn dex(&mut self, x: &mut CpuTensor, w_d: &CpuWeight, lambda: f32, heads: &[usize], head_dim: usize) {
        let mut wd = vec![0f32; w_d.rows * w_d.cols];
        duet_quant::dequantize(w_d.ty, w_d.bytes(), &mut wd).expect("DEX matrix is a supported type");
        let cols = x.cols;
        for row in x.view_mut().chunks_exact_mut(cols) {
            ops::dex_row(row, &wd, lambda, heads, head_dim);
        }
    }

    fn pair_combine(&mut self, att: &CpuTensor, gate: &CpuTensor, head_dim: usize, out: &mut CpuTensor) {
        let n_pairs = gate.cols;
        assert!(
            att.cols == 2 * n_pairs * head_dim && out.cols == n_pairs * head_dim && att.rows == gate.rows,
            "pair_combine: att {}×{}, gate {}×{}, out ×{} do not fit head_dim {head_dim}",
            att.rows,
            att.cols,
            gate.rows,
            gate.cols,
            out.cols
        );
        let rows = att.rows;
        let o = out.view_mut();
        for r in 0..rows {
            ops::pair_combine_row(
                att.row(r),
                gate.row(r),
                head_dim,
                &mut o[r * n_pairs * head_dim..(r + 1) * n_pairs * head_dim],
            );
        }
    }

    fn swiglu(&mut self, gate: &mut CpuTensor, up: &CpuTensor) {
        let cols = gate.cols;
        let u = up.view();
        let g = SharedMut::new(gate.view_mut().as_mut_ptr());
        self.pool.for_chunks(u.len() / cols, 4, &|rows| {
            // SAFETY: these rows of `gate` are written by this chunk only.
            let gr = unsafe { std::slice::from_raw_parts_mut(g.get().add(rows.start * cols), rows.len() * cols) };
            ops::swiglu(gr, &u[rows.start * cols..rows.end * cols]);
        });
    }

    fn add(&mut self, x: &mut CpuTensor, y: &CpuTensor) {
        for (a, &b) in x.view_mut().iter_mut().zip(y.view()) {
            *a += b;
        }
    }

    fn copy_rows(&mut self, x: &CpuTensor, src_row: usize, out: &mut CpuTensor, dst_row: usize, n: usize) {
        let cols = x.cols;
        assert_eq!(out.cols, cols, "copy_rows into rows of another width");
        out.data[dst_row * cols..(dst_row + n) * cols].copy_from_slice(&x.data[src_row * cols..(src_row + n) * cols]);
        out.version = tensor::fresh_version();
    }

    fn read_rows(&mut self, t: &CpuTensor, rows: std::ops::Range<usize>) -> Result<Vec<f32>, RuntimeError> {
        Ok(t.data[rows.start * t.cols..rows.end * t.cols].to_vec())
    }

    fn set_observer(
        &mut self,
        observer: Option<Box<dyn crate::observe::Observer>>,
    ) -> Option<Box<dyn crate::observe::Observer>> {
        std::mem::replace(&mut self.observer, observer)
    }

    fn observes(&self, probe: crate::backend::Probe, layer: usize) -> bool {
        self.observer.as_ref().is_some_and(|o| o.wants(probe, layer))
    }

    fn observe(&mut self, probe: crate::backend::Probe, layer: usize, pos0: usize, t: &CpuTensor) {
        if !self.observes(probe, layer) {
            return;
        }
        if let Some(o) = self.observer.as_mut() {
            o.observe(probe, layer, pos0, t.view(), t.rows, t.cols);
        }
    }
}
