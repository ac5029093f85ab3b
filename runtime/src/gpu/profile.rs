//! Per-kernel GPU time from timestamp queries (`duet bench --gpu-profile`).
//!
//! A profiled submission writes a timestamp before its first dispatch and after each one,
//! so dispatch i took `t[i+1] - t[i]`. wgpu puts a barrier between dependent dispatches
//! of a pass, so on a real GPU these differences are each kernel's time including its wait
//! for the previous one to drain, the cost a token pays for it. The submission is then
//! waited for (profiling serialises the CPU and the GPU: tokens/s measured with it on are
//! lower than without) and the differences are summed per kernel variant.
//!
//! The host's part of a token is timed beside it ([`HostStep`]): recording the dispatches,
//! encoding and submitting them, and waiting for the results (the GPU's time plus what the
//! driver adds), so that the profile shows what a faster kernel cannot win back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use duet_shaders::Variant;

use super::device::GpuContext;
use crate::error::RuntimeError;

/// Timestamps in one query set (wgpu's maximum): a submission holds at most one fewer
/// dispatches.
pub const MAX_TIMESTAMPS: u32 = wgpu::QUERY_SET_MAX_QUERIES;

/// The features a device needs for [`Profiler`].
pub const FEATURES: wgpu::Features =
    wgpu::Features::TIMESTAMP_QUERY.union(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES);

pub use crate::observe::KernelTime;

/// The host's steps of a token that the profile times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HostStep {
    /// Recording the dispatches (parameters, bind group look-ups).
    Record,
    /// Encoding the compute pass and submitting it.
    Submit,
    /// Waiting for a submission to finish and mapping its results.
    Wait,
}

impl HostStep {
    fn label(self) -> &'static str {
        match self {
            HostStep::Record => "host: recording dispatches",
            HostStep::Submit => "host: encoding and submitting",
            HostStep::Wait => "host: waiting for the results",
        }
    }
}

pub struct Profiler {
    /// Time whole passes (timestamps at their start and end only) and split each pass's
    /// time evenly over its dispatches: for passes of one kernel (the kernel sweeps), with
    /// no timestamp between dispatches to add its own cost.
    pub passes_only: bool,
    queries: wgpu::QuerySet,
    /// Resolved timestamps (u64 ticks), then copied to `read` to map.
    resolve: wgpu::Buffer,
    read: wgpu::Buffer,
    ns_per_tick: f64,
    /// Per variant: calls, nanoseconds, weight bytes.
    totals: HashMap<Variant, (u64, f64, u64)>,
    /// Per host step: times, nanoseconds.
    host: HashMap<HostStep, (u64, f64)>,
}

impl Profiler {
    pub fn new(ctx: &GpuContext, passes_only: bool) -> Profiler {
        let bytes = MAX_TIMESTAMPS as u64 * wgpu::QUERY_SIZE as u64;
        let buffer = |label, usage| {
            ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes,
                usage,
                mapped_at_creation: false,
            })
        };
        Profiler {
            passes_only,
            queries: ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("duet kernel timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: MAX_TIMESTAMPS,
            }),
            resolve: buffer("duet timestamps", wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC),
            read: buffer("duet timestamps read", wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST),
            ns_per_tick: ctx.queue.get_timestamp_period() as f64,
            totals: HashMap::new(),
            host: HashMap::new(),
        }
    }

    /// Adds one `step` on the host that took `elapsed`.
    pub fn host(&mut self, step: HostStep, elapsed: std::time::Duration) {
        let e = self.host.entry(step).or_insert((0, 0.0));
        e.0 += 1;
        e.1 += elapsed.as_nanos() as f64;
    }

    /// The timestamps of a pass timed whole ([`Profiler::passes_only`]): 0 at its start, 1
    /// at its end.
    pub fn pass_writes(&self) -> wgpu::ComputePassTimestampWrites<'_> {
        wgpu::ComputePassTimestampWrites {
            query_set: &self.queries,
            beginning_of_pass_write_index: Some(0),
            end_of_pass_write_index: Some(1),
        }
    }

    /// Timestamp `i` of the pass: 0 before the first dispatch, i after dispatch i−1.
    pub fn stamp(&self, pass: &mut wgpu::ComputePass<'_>, i: usize) {
        pass.write_timestamp(&self.queries, i as u32);
    }

    /// Copies the `n` timestamps of the pass just recorded to the mappable buffer.
    pub fn resolve(&self, enc: &mut wgpu::CommandEncoder, n: usize) {
        enc.resolve_query_set(&self.queries, 0..n as u32, &self.resolve, 0);
        enc.copy_buffer_to_buffer(&self.resolve, 0, &self.read, 0, (n * wgpu::QUERY_SIZE as usize) as u64);
    }

    /// Waits for the submission whose pass ran `kernels` (variant, weight bytes) in order and
    /// adds each one's time.
    pub fn collect(&mut self, ctx: &GpuContext, kernels: &[(Variant, u64)]) -> Result<(), RuntimeError> {
        let n = if self.passes_only { 2 } else { kernels.len() + 1 };
        let bytes = (n * wgpu::QUERY_SIZE as usize) as u64;
        let slot = Arc::new(Mutex::new(None));
        {
            let slot = Arc::clone(&slot);
            self.read.map_async(wgpu::MapMode::Read, 0..bytes, move |r| {
                *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
            });
        }
        ctx.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| RuntimeError::Device(format!("waiting for the GPU failed: {e}")))?;
        if !matches!(slot.lock().unwrap_or_else(|p| p.into_inner()).take(), Some(Ok(()))) {
            return Err(RuntimeError::Device("reading the kernel timestamps back failed".into()));
        }
        {
            let view = self
                .read
                .get_mapped_range(0..bytes)
                .map_err(|e| RuntimeError::Device(format!("reading the kernel timestamps back failed: {e}")))?;
            let ticks: &[u64] = bytemuck::cast_slice(&view);
            if self.passes_only {
                let ns = ticks[1].saturating_sub(ticks[0]) as f64 * self.ns_per_tick / kernels.len().max(1) as f64;
                for &(k, bytes) in kernels {
                    let e = self.totals.entry(k).or_insert((0, 0.0, 0));
                    e.0 += 1;
                    e.1 += ns;
                    e.2 += bytes;
                }
            }
            for (&(k, bytes), w) in kernels.iter().zip(ticks.windows(2)).filter(|_| !self.passes_only) {
                // Timestamps may wrap or be reordered by a driver: count such a gap as 0.
                let ns = w[1].saturating_sub(w[0]) as f64 * self.ns_per_tick;
                let e = self.totals.entry(k).or_insert((0, 0.0, 0));
                e.0 += 1;
                e.1 += ns;
                e.2 += bytes;
            }
        }
        self.read.unmap();
        Ok(())
    }

    /// The time per kernel variant and host step since the last call, longest first;
    /// starts afresh.
    pub fn take(&mut self) -> Vec<KernelTime> {
        let mut out: Vec<KernelTime> = self
            .totals
            .drain()
            .map(|(v, (calls, ns, weight_bytes))| KernelTime {
                kernel: v.label(),
                calls,
                seconds: ns * 1e-9,
                weight_bytes,
                on_host: false,
            })
            .chain(self.host.drain().map(|(step, (calls, ns))| KernelTime {
                kernel: step.label().into(),
                calls,
                seconds: ns * 1e-9,
                weight_bytes: 0,
                on_host: true,
            }))
            .collect();
        out.sort_by(|a, b| b.seconds.total_cmp(&a.seconds).then_with(|| a.kernel.cmp(&b.kernel)));
        out
    }
}
