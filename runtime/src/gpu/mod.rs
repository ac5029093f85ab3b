//! The GPU backend on wgpu (Vulkan, Metal, DX12): the same ops as the CPU backend, as WGSL
//! kernels from `duet-shaders`.
//!
//! * [`device`]: adapter choice, limits, features (f16), error reporting.
//! * [`pipelines`]: bind-group layouts (created with the backend) and the pipeline cache.
//! * [`buffers`]: activations, weights in their GGUF bytes (split in row ranges that fit a
//!   binding), the K/V cache.
//! * [`record`]: all ops of a token go into one compute pass, submitted once at
//!   [`Backend::read_rows`], which reads the logits back.
//! * [`matmul`], [`attention`], [`attention_rows`] (several sequences' decoded tokens in
//!   one pass), [`ops`]: the ops.
//!
//! Weights for the matrix kernels stay in their GGUF blocks; vectors (norms, biases) and
//! DEX matrices are converted to f32 at load.

mod attention;
mod attention_rows;
pub mod buffers;
pub mod device;
mod matmul;
mod ops;
pub mod pipelines;
pub mod profile;
mod record;
pub mod sweep;
pub mod tune;

use std::collections::HashMap;
use std::sync::Arc;

use duet_shaders::{KernelParams, Op, Variant};

pub use buffers::{GpuKvCache, GpuTensor, GpuWeight};
pub use device::{AdapterChoice, GpuOptions};
pub use record::SUBMIT_EVERY;
pub use tune::GpuTune;
pub use wgpu::{AdapterInfo, Backend as WgpuBackend, DeviceType};

use crate::backend::{Backend, Normed, RopeSpec, SeqSpan, WeightView};
use crate::error::RuntimeError;
use crate::kv_cache::KvCacheSpec;
use buffers::{Allocator, Buf};
use device::GpuContext;
use pipelines::{LayoutKind, Pipelines};
use record::Recorder;

pub struct GpuBackend {
    ctx: GpuContext,
    alloc: Allocator,
    pipes: Pipelines,
    rec: Recorder,
    /// Token ids of the pending embedding lookup.
    ids: Arc<Buf>,
    ids_pending: bool,
    /// (cos, sin) per (position, pair) for one RoPE spec.
    rope: Option<RopeTable>,
    /// Small constant vectors (DIFF sub-norm weights, static logit scales) by content hash.
    constants: HashMap<u64, Arc<Buf>>,
    /// Scratch of the dynamic logit quantizations: its capacity in (row, head) slots, the
    /// per-(row, head) absmax table, the per-head one.
    logit_scratch: Option<(usize, Arc<Buf>, Arc<Buf>)>,
    /// Bound where a kernel's optional input is absent.
    dummy: Arc<Buf>,
    /// Bound where a split matvec has fewer than four outputs (one each: a writable buffer
    /// may not be bound twice in one dispatch).
    split_dummy: [Arc<Buf>; 3],
    /// Attention's scratch buffers, grown to fit: the rotated cache types' copies (Q, K, V,
    /// attention output) and the attend step's partials (attention::scratch).
    attn_scratch: Vec<Option<Arc<Buf>>>,
    /// One sequence's rows at a time, for batches the one-pass attention does not take.
    span_scratch: Option<attention_rows::SpanScratch>,
    /// Bytes of the largest activation tensor made so far.
    largest_tensor: u64,
    /// Sees the probes it wants, read back to the host as they are reached.
    observer: Option<Box<dyn crate::observe::Observer>>,
    /// A read-back error met while observing (observe cannot return one), reported by the
    /// next `read_rows`.
    observe_error: Option<RuntimeError>,
    /// The kinds of kernel dispatched so far, by parameter struct (tests/gpu_model.rs checks
    /// that a comparison with the CPU backend runs every kind).
    kinds_run: std::collections::BTreeSet<&'static str>,
}

/// A RoPE (cos, sin) table: the spec's key (n_rot, base, scale, factors hash), the
/// positions it covers, the buffer.
type RopeTable = ((usize, u32, u32, u64), usize, Arc<Buf>);

/// Workgroups for `n` items of `per_group` each, folded into 2-D past 65535.
fn grid(n: usize, per_group: usize) -> (u32, u32) {
    let groups = n.div_ceil(per_group.max(1)) as u64;
    if groups <= 65535 { (groups as u32, 1) } else { (65535, groups.div_ceil(65535) as u32) }
}

impl GpuBackend {
    /// Opens an adapter (see [`GpuOptions`]) and creates the layouts and the kernels every
    /// model uses.
    pub fn new(opts: &GpuOptions) -> Result<GpuBackend, RuntimeError> {
        pollster::block_on(Self::new_async(opts))
    }

    /// [`GpuBackend::new`] as a future (in a browser the adapter and device are promises).
    pub async fn new_async(opts: &GpuOptions) -> Result<GpuBackend, RuntimeError> {
        let ctx = GpuContext::new_async(opts).await?;
        let alloc = Allocator::default();
        let pipes = Pipelines::new(&ctx.device, ctx.trusted);
        let rec = Recorder::new(&ctx, &alloc);
        let ids = alloc.storage(&ctx, 4 * 512, "token ids");
        let dummy = alloc.storage(&ctx, 16, "unused binding");
        let split_dummy = std::array::from_fn(|_| alloc.storage(&ctx, 16, "unused output"));
        let mut b = GpuBackend {
            ctx,
            alloc,
            pipes,
            rec,
            ids,
            ids_pending: false,
            rope: None,
            constants: HashMap::new(),
            logit_scratch: None,
            dummy,
            split_dummy,
            attn_scratch: Vec::new(),
            span_scratch: None,
            largest_tensor: 0,
            observer: None,
            observe_error: None,
            kinds_run: Default::default(),
        };
        b.prepare(&[Op::RmsNorm, Op::Rope, Op::SwiGlu, Op::Add, Op::CopyRow])?;
        Ok(b)
    }

    /// Compiles the kernels of `ops` now (so that none is created once tokens run).
    pub fn prepare(&mut self, ops: &[Op]) -> Result<(), RuntimeError> {
        for &op in ops {
            let v = Variant::new(op, self.ctx.f16);
            let (pipes, dev) = (&mut self.pipes, &self.ctx.device);
            self.ctx.checked(&format!("kernel {}", v.label()), || {
                pipes.get(dev, v);
            })?;
        }
        Ok(())
    }

    /// The adapter's name, backend and type.
    pub fn adapter_info(&self) -> &wgpu::AdapterInfo {
        &self.ctx.info
    }

    /// Whether the matrix kernels use f16 products.
    pub fn uses_f16(&self) -> bool {
        self.ctx.f16
    }

    /// Compute pipelines created so far.
    pub fn pipelines_created(&self) -> usize {
        self.pipes.pipelines_created
    }

    /// Bind-group and pipeline layouts created so far (all of them by [`GpuBackend::new`]).
    pub fn layouts_created(&self) -> usize {
        self.pipes.layouts_created
    }

    /// Bind groups created so far (cached, so a steady state creates none).
    pub fn bind_groups_created(&self) -> usize {
        self.rec.bind_groups_created
    }

    /// Command submissions so far.
    pub fn submissions(&self) -> usize {
        self.rec.submissions
    }

    /// Dispatches recorded so far.
    pub fn dispatches(&self) -> usize {
        self.rec.dispatches
    }

    /// The kinds of kernel dispatched so far, named by their parameter structs
    /// ([`duet_shaders::PARAMS_STRUCTS`] lists them all).
    pub fn kernel_kinds_run(&self) -> &std::collections::BTreeSet<&'static str> {
        &self.kinds_run
    }

    /// Dispatches so far that wait for an earlier one of their pass (a pipeline barrier).
    pub fn barriers(&self) -> usize {
        self.rec.barriers
    }

    /// Bytes of the largest activation tensor made so far (tests of batch planning).
    pub fn largest_tensor_bytes(&self) -> u64 {
        self.largest_tensor
    }

    /// Submits the work recorded so far (with the pending token ids), and `readback` =
    /// (buffer, byte offset, bytes) copied to the readback buffer in the same submission.
    fn submit(&mut self, readback: Option<(&Buf, u64, u64)>) {
        self.rec.submit(&self.ctx, &self.alloc, readback);
        self.ids_pending = false;
    }

    /// Writes `data` into the first rows of `t` (tests and tools; the model itself only
    /// writes activations through ops). Recorded work runs first, so it sees the old values.
    pub fn upload(&mut self, t: &GpuTensor, data: &[f32]) {
        assert!(data.len() <= t.cap_rows * t.cols);
        self.submit(None);
        self.ctx.queue.write_buffer(&t.buf.buffer, 0, bytemuck::cast_slice(data));
    }

    /// The bytes of K (`v` false) or V cache rows `rows` of `layer` as stored, each
    /// [`duet_shaders::CacheFormat::word_row_bytes`] long (tests and tools). Recorded work runs first.
    pub fn read_kv_rows(
        &mut self,
        cache: &GpuKvCache,
        layer: usize,
        v: bool,
        rows: std::ops::Range<usize>,
    ) -> Result<Vec<u8>, RuntimeError> {
        let (buf, elem) = if v { (&cache.v[layer], cache.v_elem) } else { (&cache.k[layer], cache.k_elem) };
        assert!(rows.end <= cache.n_ctx, "read_kv_rows past the cache's positions");
        let rb = elem.word_row_bytes(cache.kv_dim) as u64;
        let (off, size) = (rows.start as u64 * rb, rows.len() as u64 * rb);
        if size == 0 {
            return Ok(Vec::new());
        }
        self.submit(Some((buf, off, size)));
        Ok(bytemuck::cast_slice::<f32, u8>(&self.rec.read(&self.ctx, size)?).to_vec())
    }

    /// The whole buffer of K (`v` false) or V of `layer` as stored: rows, or a per-channel
    /// cache's groups then its windows and sinks (tests and tools). Recorded work runs first.
    pub fn read_kv_buffer(&mut self, cache: &GpuKvCache, layer: usize, v: bool) -> Result<Vec<u8>, RuntimeError> {
        let (buf, elem) = if v { (&cache.v[layer], cache.v_elem) } else { (&cache.k[layer], cache.k_elem) };
        let size = elem.layer_bytes(cache.n_pages, cache.n_seqs, cache.kv_dim, true) as u64;
        self.submit(Some((buf, 0, size)));
        Ok(bytemuck::cast_slice::<f32, u8>(&self.rec.read(&self.ctx, size)?).to_vec())
    }

    /// The split matvec's unused outputs.
    fn split_dummies(&self) -> [Arc<Buf>; 3] {
        self.split_dummy.clone()
    }

    /// Records one dispatch of `op` with its parameter struct (the one [`Op::params`] names:
    /// checked, so that no kernel is handed another's parameters).
    fn run<P: KernelParams>(&mut self, op: Op, params: &P, bufs: &[&Arc<Buf>], groups: (u32, u32)) {
        self.run_weighted(op, params, bufs, (groups.0, groups.1, 1), 0)
    }

    /// [`GpuBackend::run`] for a matrix kernel that reads `weight_bytes` of weights (the
    /// profile's bandwidth column), over workgroups in three dimensions (the matvec's z is
    /// its token).
    fn run_weighted<P: KernelParams>(
        &mut self,
        op: Op,
        params: &P,
        bufs: &[&Arc<Buf>],
        groups: (u32, u32, u32),
        weight_bytes: u64,
    ) {
        assert_eq!(P::NAME, op.params().0, "the parameters of {op:?}");
        self.kinds_run.insert(P::NAME);
        let v = Variant::new(op, self.ctx.f16);
        let pipeline = self.pipes.get(&self.ctx.device, v);
        let words: &[u32] = bytemuck::cast_slice(bytemuck::bytes_of(params));
        self.rec.dispatch(
            &self.ctx,
            &self.pipes,
            &self.alloc,
            (v, weight_bytes),
            pipeline,
            LayoutKind::of(op),
            words,
            bufs,
            groups,
        );
    }

    /// The (cos, sin) table of `rope` covering positions `0..n_pos`.
    fn rope_table(&mut self, rope: &RopeSpec, n_pos: usize) -> Arc<Buf> {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        if let Some(ff) = &rope.freq_factors {
            for v in ff {
                v.to_bits().hash(&mut h);
            }
        }
        let key = (rope.n_rot, rope.freq_base.to_bits(), rope.freq_scale.to_bits(), h.finish());
        if let Some((k, n, buf)) = &self.rope
            && *k == key
            && *n >= n_pos
        {
            return Arc::clone(buf);
        }
        let n = n_pos.next_power_of_two().max(1024);
        let thetas = rope.thetas();
        let mut cs = Vec::with_capacity(n * thetas.len() * 2);
        for pos in 0..n {
            // As the CPU backend: the angle in f32, then sin and cos.
            let p = pos as f32 * rope.freq_scale;
            for &th in &thetas {
                let (s, c) = (p * th).sin_cos();
                cs.extend([c, s]);
            }
        }
        let buf = self.alloc.init(&self.ctx, bytemuck::cast_slice(&cs), "rope table");
        self.rope = Some((key, n, Arc::clone(&buf)));
        buf
    }
}

impl Backend for GpuBackend {
    type Tensor = GpuTensor;
    type Weight = GpuWeight;
    type KvCache = GpuKvCache;

    fn describe(&self) -> String {
        self.ctx.describe()
    }

    fn take_kernel_times(&mut self) -> Option<Vec<profile::KernelTime>> {
        self.rec.take_kernel_times()
    }

    fn dispatch_counts(&self) -> Option<(usize, usize)> {
        Some((self.rec.dispatches, self.rec.barriers))
    }

    fn load_weight(&mut self, w: &WeightView<'_>) -> Result<GpuWeight, RuntimeError> {
        matmul::load_weight(self, w)
    }

    fn max_tensor_bytes(&self) -> Option<u64> {
        // The binding limit, or GpuOptions::max_binding's smaller cap (tests).
        Some(self.ctx.max_chunk_bytes)
    }

    fn new_tensor(&mut self, rows: usize, cols: usize) -> GpuTensor {
        let bytes = (rows.max(1) * cols * 4) as u64;
        let limit = self.ctx.limits.max_storage_buffer_binding_size.min(self.ctx.limits.max_buffer_size);
        assert!(
            bytes <= limit,
            "an activation of {rows} × {cols} f32 ({bytes} bytes) exceeds what {} binds at once ({limit} bytes): lower --batch-size",
            device::describe(&self.ctx.info)
        );
        // Whole slots of 16 values: the matvec loads a row's activations in vec4s, the last
        // slot's past the row's end (masked).
        let buf = self.alloc.storage(&self.ctx, bytes.next_multiple_of(64), "activations");
        self.largest_tensor = self.largest_tensor.max(bytes);
        GpuTensor { buf, rows, cap_rows: rows, cols }
    }

    fn set_rows(&mut self, t: &mut GpuTensor, rows: usize) {
        assert!(rows <= t.cap_rows, "tensor holds {} rows, {rows} requested", t.cap_rows);
        t.rows = rows;
    }

    fn new_kv_cache(&mut self, spec: &KvCacheSpec) -> Result<GpuKvCache, RuntimeError> {
        attention::new_kv_cache(self, spec)
    }

    fn embed(&mut self, table: &GpuWeight, tokens: &[u32], out: &mut GpuTensor) {
        matmul::embed(self, table, tokens, out)
    }

    fn rms_norm(&mut self, x: &GpuTensor, weight: &GpuWeight, eps: f32, out: &mut GpuTensor) {
        ops::rms_norm(self, x, weight, eps, out)
    }

    fn load_weight_group(&mut self, ws: &[WeightView<'_>]) -> Result<Vec<GpuWeight>, RuntimeError> {
        matmul::load_weight_group(self, ws)
    }

    fn matmul(&mut self, w: &GpuWeight, x: &GpuTensor, out: &mut GpuTensor) {
        matmul::matmul(self, w, x, out)
    }

    fn matmul_add(&mut self, w: &GpuWeight, x: &GpuTensor, scratch: &mut GpuTensor, out: &mut GpuTensor) {
        matmul::matmul_add(self, w, x, scratch, out)
    }

    fn matmul_group(&mut self, ws: &[&GpuWeight], x: &GpuTensor, outs: &mut [&mut GpuTensor]) {
        matmul::matmul_group(self, ws, x, outs)
    }

    fn norm_matmul_group(
        &mut self,
        n: Normed<'_, GpuTensor, GpuWeight>,
        ws: &[&GpuWeight],
        outs: &mut [&mut GpuTensor],
    ) {
        matmul::norm_matmul_group(self, n, ws, outs)
    }

    fn norm_matmul_swiglu(
        &mut self,
        n: Normed<'_, GpuTensor, GpuWeight>,
        w_gate: &GpuWeight,
        w_up: &GpuWeight,
        gate: &mut GpuTensor,
        up: &mut GpuTensor,
    ) {
        matmul::norm_matmul_swiglu(self, n, w_gate, w_up, gate, up)
    }

    fn matmul_swiglu(
        &mut self,
        w_gate: &GpuWeight,
        w_up: &GpuWeight,
        x: &GpuTensor,
        gate: &mut GpuTensor,
        up: &mut GpuTensor,
    ) {
        matmul::matmul_swiglu(self, w_gate, w_up, x, gate, up)
    }

    fn add_bias(&mut self, x: &mut GpuTensor, bias: &GpuWeight) {
        ops::add(self, x, bias.single(), bias.cols)
    }

    fn rope(&mut self, x: &mut GpuTensor, n_heads: usize, head_dim: usize, pos0: usize, rope: &RopeSpec) {
        ops::rope(self, x, n_heads, head_dim, pos0, rope)
    }

    fn attention(
        &mut self,
        q: &mut GpuTensor,
        k: &mut GpuTensor,
        v: &GpuTensor,
        cache: &mut GpuKvCache,
        layer: usize,
        spans: &[SeqSpan<'_>],
        rope: Option<&RopeSpec>,
        pairs: Option<(&GpuTensor, &mut GpuTensor)>,
        out: &mut GpuTensor,
    ) {
        attention_rows::attention_spans(self, q, k, v, cache, layer, spans, rope, pairs, out)
    }

    fn dex(&mut self, x: &mut GpuTensor, w_d: &GpuWeight, lambda: f32, heads: &[usize], head_dim: usize) {
        ops::dex(self, x, w_d, lambda, heads, head_dim)
    }

    fn pair_combine(&mut self, att: &GpuTensor, gate: &GpuTensor, head_dim: usize, out: &mut GpuTensor) {
        ops::pair_combine(self, att, gate, head_dim, out)
    }

    fn swiglu(&mut self, gate: &mut GpuTensor, up: &GpuTensor) {
        ops::swiglu(self, gate, up)
    }

    fn add(&mut self, x: &mut GpuTensor, y: &GpuTensor) {
        let n = x.rows * x.cols;
        ops::add(self, x, &Arc::clone(&y.buf), n)
    }

    fn copy_rows(&mut self, x: &GpuTensor, src_row: usize, out: &mut GpuTensor, dst_row: usize, n: usize) {
        ops::copy_rows(self, x, src_row, out, dst_row, n)
    }

    fn read_rows(&mut self, t: &GpuTensor, rows: std::ops::Range<usize>) -> Result<Vec<f32>, RuntimeError> {
        crate::ready::finish(self.read_rows_async(t, rows))
    }

    async fn read_rows_async(&mut self, t: &GpuTensor, rows: std::ops::Range<usize>) -> Result<Vec<f32>, RuntimeError> {
        if let Some(e) = self.observe_error.take() {
            return Err(e);
        }
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        assert!(rows.end <= t.cap_rows, "read_rows past the tensor's rows");
        let off = (rows.start * t.cols * 4) as u64;
        let size = (rows.len() * t.cols * 4) as u64;
        self.submit(Some((&t.buf, off, size)));
        self.rec.read_async(&self.ctx, size).await
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

    /// Reads the tensor back (submitting the work recorded so far) when the observer wants
    /// it: slow, meant for tools that look at activations, not for generation.
    fn observe(&mut self, probe: crate::backend::Probe, layer: usize, pos0: usize, t: &GpuTensor) {
        if self.observe_error.is_some() || !self.observes(probe, layer) {
            return;
        }
        match self.read_rows(t, 0..t.rows) {
            Ok(data) => {
                if let Some(o) = self.observer.as_mut() {
                    o.observe(probe, layer, pos0, &data, t.rows, t.cols);
                }
            }
            Err(e) => self.observe_error = Some(e),
        }
    }
}
