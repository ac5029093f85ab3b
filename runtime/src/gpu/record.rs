//! Recording: every op of a token appends a dispatch (pipeline, bind group, parameter
//! offset, workgroup counts) to a list; [`Recorder::submit`] writes all the parameters in
//! one buffer write, records every dispatch into one compute pass of one command encoder,
//! adds the readback copy and submits. Every [`SUBMIT_EVERY`] dispatches (by default) the list so far
//! is submitted without waiting, so that the GPU runs the start of a token while the host
//! records and encodes the rest. Bind groups are cached by the ids of the
//! buffers they bind (the parameters go through a dynamic offset), so after the first token
//! no bind group is created either.

use std::collections::HashMap;
use std::sync::Arc;

use duet_shaders::Variant;

use super::buffers::{Allocator, Buf};
use super::device::GpuContext;
use super::pipelines::{LayoutKind, PARAMS_SLOT, Pipelines};
use super::profile::{HostStep, KernelTime, MAX_TIMESTAMPS, Profiler};
use crate::error::RuntimeError;

struct Dispatch {
    variant: Variant,
    /// Weight bytes it reads (matrix kernels), for the profile's bandwidth.
    weight_bytes: u64,
    pipeline: Arc<wgpu::ComputePipeline>,
    bind_group: Arc<wgpu::BindGroup>,
    offset: u32,
    groups: (u32, u32, u32),
}

/// Parameter slots per submission before a mid-token flush is needed.
const PARAM_SLOTS: u64 = 4096;

/// Dispatches recorded before they are submitted (llama.cpp's Vulkan backend submits every
/// 100 graph nodes for the same reason): encoding a whole token before the GPU starts put
/// the host's time in front of the GPU's. wgpu encodes ~4 µs a dispatch; at 25 the GPU
/// starts sooner than at 100 (H200, ~200 dispatches a token: decode 1.04-1.06×,
/// gpu-h200-2026-11-27-8df709e.md).
pub const SUBMIT_EVERY: usize = 25;

pub struct Recorder {
    params: Arc<Buf>,
    staging: Vec<u8>,
    pending: Vec<Dispatch>,
    bind_groups: HashMap<(LayoutKind, Vec<u64>), Arc<wgpu::BindGroup>>,
    readback: Option<wgpu::Buffer>,
    readback_size: u64,
    /// Submissions and dispatches so far (tests check the submissions per token).
    pub submissions: usize,
    pub dispatches: usize,
    /// Dispatches that wait for earlier ones: those that bind a buffer an earlier dispatch
    /// of the pass wrote, or write one it used — where wgpu puts a pipeline barrier.
    pub barriers: usize,
    /// Each buffer's last use in the current pass: written (true) or only read.
    last_use: HashMap<u64, bool>,
    pub bind_groups_created: usize,
    /// Times every kernel when the context was opened with `profile`.
    profiler: Option<Profiler>,
    /// An error met reading the timestamps back, reported by the next `read`.
    profile_error: Option<RuntimeError>,
}

impl Recorder {
    pub fn new(ctx: &GpuContext, alloc: &Allocator) -> Recorder {
        let size = PARAM_SLOTS * PARAMS_SLOT;
        let buffer = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("duet params"),
            size,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Recorder {
            params: alloc.wrap(buffer, size),
            staging: Vec::new(),
            pending: Vec::new(),
            bind_groups: HashMap::new(),
            readback: None,
            readback_size: 0,
            submissions: 0,
            dispatches: 0,
            barriers: 0,
            last_use: HashMap::new(),
            bind_groups_created: 0,
            profiler: ctx.profile.then(|| Profiler::new(ctx, ctx.profile_passes)),
            profile_error: None,
        }
    }

    /// Each kernel variant's GPU time since the last call (None without profiling).
    pub fn take_kernel_times(&mut self) -> Option<Vec<KernelTime>> {
        self.profiler.as_mut().map(Profiler::take)
    }

    /// Records one dispatch of `pipeline` (compiled from `variant`) over `groups` workgroups
    /// with parameters `params` (a `#[repr(C)]` struct of 4-byte fields) and the storage
    /// buffers `bufs` in binding order; `weight_bytes` is what a matrix kernel reads of its
    /// weights (0 for other kernels).
    #[allow(clippy::too_many_arguments)]
    pub fn dispatch(
        &mut self,
        ctx: &GpuContext,
        pipes: &Pipelines,
        alloc: &Allocator,
        (variant, weight_bytes): (Variant, u64),
        pipeline: Arc<wgpu::ComputePipeline>,
        kind: LayoutKind,
        params: &[u32],
        bufs: &[&Arc<Buf>],
        groups: (u32, u32, u32),
    ) {
        assert_eq!(bufs.len(), kind.n_storage(), "binding count of {kind:?}");
        assert!(params.len() * 4 <= PARAMS_SLOT as usize);
        if groups.0 == 0 || groups.1 == 0 || groups.2 == 0 {
            return;
        }
        let timestamps_full = self.profiler.is_some() && self.pending.len() + 1 >= MAX_TIMESTAMPS as usize;
        if self.staging.len() as u64 + PARAMS_SLOT > self.params.size || timestamps_full {
            // More dispatches than parameter slots (or timestamps): run what is recorded so far.
            self.submit(ctx, alloc, None);
        }
        // After that flush: its time is the submission's (and its wait's), not the recording's.
        let started = self.profiler.is_some().then(web_time::Instant::now);
        let offset = self.staging.len() as u32;
        self.staging.extend(params.iter().flat_map(|v| v.to_le_bytes()));
        self.staging.resize(offset as usize + PARAMS_SLOT as usize, 0);
        let key = (kind, bufs.iter().map(|b| b.id).chain([self.params.id]).collect::<Vec<u64>>());
        let bind_group = match self.bind_groups.get(&key) {
            Some(bg) => Arc::clone(bg),
            None => {
                let mut entries = vec![wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &self.params.buffer,
                        offset: 0,
                        size: wgpu::BufferSize::new(PARAMS_SLOT),
                    }),
                }];
                for (i, b) in bufs.iter().enumerate() {
                    entries
                        .push(wgpu::BindGroupEntry { binding: 1 + i as u32, resource: b.buffer.as_entire_binding() });
                }
                let bg = Arc::new(ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: None,
                    layout: pipes.bind_group_layout(kind),
                    entries: &entries,
                }));
                self.bind_groups_created += 1;
                self.bind_groups.insert(key, Arc::clone(&bg));
                bg
            }
        };
        self.pending.push(Dispatch { variant, weight_bytes, pipeline, bind_group, offset, groups });
        self.dispatches += 1;
        // wgpu changes a buffer's state, with a barrier, between a write and any later use
        // and between a read and a later write; reads after reads need none.
        let mut waits = false;
        for (b, &read_only) in bufs.iter().zip(kind.read_only()) {
            if let Some(&written) = self.last_use.get(&b.id) {
                waits |= written || !read_only;
            }
        }
        for (b, &read_only) in bufs.iter().zip(kind.read_only()) {
            self.last_use.insert(b.id, !read_only);
        }
        self.barriers += usize::from(waits);
        if let (Some(p), Some(t0)) = (self.profiler.as_mut(), started) {
            p.host(HostStep::Record, t0.elapsed());
        }
        if self.pending.len() >= ctx.submit_every {
            self.submit(ctx, alloc, None);
        }
    }

    /// Submits everything recorded, then copies `readback` = (buffer, byte offset, bytes)
    /// into the readback buffer in the same submission.
    pub fn submit(&mut self, ctx: &GpuContext, alloc: &Allocator, readback: Option<(&Buf, u64, u64)>) {
        let started = web_time::Instant::now();
        // Release bind groups that hold buffers dropped since the last submission.
        let dead: Vec<u64> = std::mem::take(&mut *alloc.dead.lock().unwrap_or_else(|p| p.into_inner()));
        if !dead.is_empty() {
            self.bind_groups.retain(|(_, ids), _| !ids.iter().any(|i| dead.contains(i)));
        }
        if !self.staging.is_empty() {
            ctx.queue.write_buffer(&self.params.buffer, 0, &self.staging);
        }
        let mut enc = ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("duet token") });
        let profiled = self.profiler.as_ref().filter(|_| !self.pending.is_empty());
        if !self.pending.is_empty() {
            // Timestamps after every dispatch, or (passes_only) at the pass's ends.
            let whole = profiled.filter(|p| p.passes_only);
            let each = profiled.filter(|p| !p.passes_only);
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("duet ops"),
                timestamp_writes: whole.map(Profiler::pass_writes),
            });
            if let Some(p) = each {
                p.stamp(&mut pass, 0);
            }
            for (i, d) in self.pending.iter().enumerate() {
                pass.set_pipeline(&d.pipeline);
                pass.set_bind_group(0, Some(d.bind_group.as_ref()), &[d.offset]);
                pass.dispatch_workgroups(d.groups.0, d.groups.1, d.groups.2);
                if let Some(p) = each {
                    p.stamp(&mut pass, i + 1);
                }
            }
        }
        if let Some(p) = profiled {
            p.resolve(&mut enc, if p.passes_only { 2 } else { self.pending.len() + 1 });
        }
        if let Some((src, off, size)) = readback {
            if self.readback_size < size {
                let cap = size.next_multiple_of(1 << 16);
                self.readback = Some(ctx.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("duet readback"),
                    size: cap,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }));
                self.readback_size = cap;
            }
            enc.copy_buffer_to_buffer(&src.buffer, off, self.readback.as_ref().expect("just created"), 0, size);
        }
        ctx.queue.submit([enc.finish()]);
        self.submissions += 1;
        if let Some(p) = self.profiler.as_mut() {
            p.host(HostStep::Submit, started.elapsed());
        }
        if let Some(p) = self.profiler.as_mut().filter(|_| !self.pending.is_empty()) {
            let kernels: Vec<(Variant, u64)> = self.pending.iter().map(|d| (d.variant, d.weight_bytes)).collect();
            let waited = web_time::Instant::now();
            if let Err(e) = p.collect(ctx, &kernels) {
                self.profile_error.get_or_insert(e);
            }
            p.host(HostStep::Wait, waited.elapsed());
        }
        self.pending.clear();
        self.staging.clear();
        // A new pass starts with the next dispatch (submissions are ordered: no barrier).
        self.last_use.clear();
    }

    /// Waits for the last submission and returns the first `size` bytes of the readback
    /// buffer as f32.
    pub fn read(&mut self, ctx: &GpuContext, size: u64) -> Result<Vec<f32>, RuntimeError> {
        crate::ready::finish(self.read_async(ctx, size))
    }

    /// [`Recorder::read`] as a future. Natively the device is waited for before the future
    /// is first polled, so it is ready then; in a browser (WebGPU) the mapping completes from
    /// the page's event loop, which wakes the task.
    pub async fn read_async(&mut self, ctx: &GpuContext, size: u64) -> Result<Vec<f32>, RuntimeError> {
        if let Some(e) = self.profile_error.take() {
            return Err(e);
        }
        let started = web_time::Instant::now();
        let rb = self.readback.as_ref().expect("submit with a readback first");
        let state = Arc::new(std::sync::Mutex::new(MapState::default()));
        {
            let state = Arc::clone(&state);
            rb.map_async(wgpu::MapMode::Read, 0..size, move |r| {
                let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
                s.result = Some(r);
                if let Some(w) = s.waker.take() {
                    w.wake();
                }
            });
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            let poll = ctx.device.poll(wgpu::PollType::wait_indefinitely());
            if let Some(e) = ctx.take_error() {
                return Err(e);
            }
            if let Err(e) = poll {
                return Err(RuntimeError::Device(format!("waiting for the GPU failed: {e}")));
            }
            if state.lock().unwrap_or_else(|p| p.into_inner()).result.is_none() {
                return Err(RuntimeError::Device("the GPU did not finish the readback".into()));
            }
        }
        let mapped = Mapped(state).await;
        if let Some(e) = ctx.take_error() {
            // Left mapped, the buffer would fail every later readback with "already mapped".
            if mapped.is_ok() {
                rb.unmap();
            }
            return Err(e);
        }
        if let Err(e) = mapped {
            return Err(RuntimeError::Device(format!("reading results back from the GPU failed: {e}")));
        }
        let out = {
            let view = rb
                .get_mapped_range(0..size)
                .map_err(|e| RuntimeError::Device(format!("reading results back from the GPU failed: {e}")))?;
            bytemuck::cast_slice::<u8, f32>(&view).to_vec()
        };
        rb.unmap();
        if let Some(p) = self.profiler.as_mut() {
            p.host(HostStep::Wait, started.elapsed());
        }
        Ok(out)
    }
}

/// A readback's mapping in progress: its result once `map_async`'s callback has run, and the
/// task to wake then.
#[derive(Default)]
struct MapState {
    result: Option<Result<(), wgpu::BufferAsyncError>>,
    waker: Option<std::task::Waker>,
}

/// The mapping as a future.
struct Mapped(Arc<std::sync::Mutex<MapState>>);

impl std::future::Future for Mapped {
    type Output = Result<(), wgpu::BufferAsyncError>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let mut s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match s.result.take() {
            Some(r) => std::task::Poll::Ready(r),
            None => {
                s.waker = Some(cx.waker().clone());
                std::task::Poll::Pending
            }
        }
    }
}
