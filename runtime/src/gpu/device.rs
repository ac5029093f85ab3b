//! Choosing an adapter, checking and requesting only the limits the kernels need, and
//! turning wgpu's asynchronous errors (device lost, out of memory, validation) into
//! [`RuntimeError`]s a user can act on.

use std::sync::{Arc, Mutex};

use crate::error::RuntimeError;

/// Which adapters [`GpuContext::new`] may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdapterChoice {
    /// Hardware only (discrete or integrated GPU; `--device auto`).
    Hardware,
    /// Any adapter, software ones (lavapipe) included (`--device gpu`).
    Any,
}

/// Options of the GPU backend.
#[derive(Clone, Debug)]
pub struct GpuOptions {
    pub adapter: AdapterChoice,
    /// f16 products in the matrix kernels: None = where a hardware adapter has SHADER_F16
    /// (software adapters such as lavapipe emulate f16 arithmetic, slower than f32);
    /// Some(b) forces it (Some(true) fails without it; `duet`'s `DUET_GPU_F16=0|1`).
    pub f16: Option<bool>,
    /// Caps the bytes bound per weight chunk and the activation batches the model plans for
    /// (tests use it to exercise splitting and batch shrinking).
    pub max_binding: Option<u64>,
    /// Time every kernel with timestamp queries ([`super::profile`]); an adapter without
    /// timestamps inside compute passes is refused.
    pub profile: bool,
    /// With `profile`: time whole passes only, their time split over their dispatches (the
    /// kernel sweep's passes of one kernel; no timestamp between dispatches).
    pub profile_passes: bool,
    /// Kernel choices (`--gpu-tune`): the matvec's shape, subgroups, trusted modules,
    /// fusion. Tests run every fallback on any adapter through it.
    pub tune: super::GpuTune,
    /// Dispatches recorded before they are submitted without waiting (at least 1); None:
    /// [`super::SUBMIT_EVERY`].
    pub submit_every: Option<usize>,
}

impl Default for GpuOptions {
    fn default() -> Self {
        GpuOptions {
            adapter: AdapterChoice::Any,
            f16: None,
            max_binding: None,
            profile: false,
            profile_passes: false,
            tune: super::GpuTune::default(),
            submit_every: None,
        }
    }
}

/// Errors wgpu reports asynchronously, collected until the next readback.
#[derive(Default)]
pub struct ErrorSink {
    pub lost: Option<String>,
    pub errors: Vec<String>,
    pub out_of_memory: bool,
}

pub struct GpuContext {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    /// Limits granted to the device.
    pub limits: wgpu::Limits,
    /// f16 products in the matrix kernels.
    pub f16: bool,
    /// Bytes of one weight chunk at most (a multiple of 4).
    pub max_chunk_bytes: u64,
    /// Kernels are timed ([`GpuOptions::profile`]), whole passes only
    /// ([`GpuOptions::profile_passes`]).
    pub profile: bool,
    pub profile_passes: bool,
    /// The matvec's workgroup shape (its `subgroups`: whether the SUBGROUP feature is on).
    pub mv_shape: duet_shaders::MvShape,
    /// Kernels proven in bounds skip naga's runtime checks ([`duet_shaders::Op::trusted`]).
    pub trusted: bool,
    /// Fused kernels (matvec epilogues, RoPE with the K/V write).
    pub fuse: bool,
    /// Workgroups a decoded row's attention is spread over (flash-decoding's chunks).
    pub decode_workgroups: usize,
    /// Products of up to this many tokens run the matvec once per token, not the matmul.
    pub matvec_tokens: usize,
    /// Their workgroups interleaved by token (`MatVecParams::tok_x`).
    pub matvec_interleave: bool,
    /// The prefill product runs on cooperative matrices (`Op::MatMulCoop`); else why not,
    /// when a hardware adapter cannot (for the description).
    pub coop: bool,
    pub coop_lacks: Option<String>,
    /// That product's tiles are 128 tokens wide rather than 64 (`Op::MatMulCoop::wide`).
    pub coop_wide: bool,
    /// Dispatches recorded before they are submitted.
    pub submit_every: usize,
    pub sink: Arc<Mutex<ErrorSink>>,
}

/// Workgroup memory the cooperative-matrix product uses (matmul_coop.wgsl: 14 KiB for tiles
/// of 64 tokens, 23 KiB for 128), asked for only where that kernel runs.
const fn coop_workgroup_bytes(wide: bool) -> u32 {
    if wide { 24576 } else { 16384 }
}

/// Why `adapter` cannot run the cooperative-matrix product (`Op::MatMulCoop`), or `None`
/// when it can: the feature (wgpu maps it on Vulkan; on Metal it offers 8 × 8 f32 alone),
/// a 16 × 16 × 16 f16 → f32 configuration, f16 arithmetic, subgroups of exactly 32 lanes
/// (the kernel gives each of its subgroups a 32 × 32 block of the tile) and the workgroup
/// memory of its tile (`wide`: 128 tokens).
pub fn coop_lacks(adapter: &wgpu::Adapter, f16: bool, wide: bool) -> Option<String> {
    use wgpu::CooperativeScalarType as S;
    if !adapter.features().contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
        return Some("no cooperative-matrix feature".into());
    }
    if !f16 {
        return Some("f16 arithmetic is off".into());
    }
    let info = adapter.get_info();
    if info.subgroup_min_size != 32 || info.subgroup_max_size != 32 {
        return Some(format!(
            "subgroups of {}-{} lanes, the kernel needs exactly 32",
            info.subgroup_min_size, info.subgroup_max_size
        ));
    }
    let fits = |p: &wgpu::CooperativeMatrixProperties| {
        (p.m_size, p.n_size, p.k_size, p.ab_type, p.cr_type) == (16, 16, 16, S::F16, S::F32)
    };
    if !adapter.cooperative_matrix_properties().iter().any(fits) {
        return Some("no 16x16x16 f16 -> f32 cooperative matrices".into());
    }
    let bytes = coop_workgroup_bytes(wide);
    if adapter.limits().max_compute_workgroup_storage_size < bytes {
        return Some(format!("less than {bytes} bytes of workgroup memory"));
    }
    None
}

/// Bytes of one binding we ever ask for: keeps every byte offset inside a shader below 2³¹.
const MAX_BINDING_WANTED: u64 = 1 << 31;

/// The adapters wgpu finds on the primary backends (Vulkan, Metal, DX12), best first:
/// discrete, integrated, virtual, then software (CPU) adapters.
pub fn adapters() -> Vec<wgpu::Adapter> {
    pollster::block_on(adapters_async())
}

/// [`adapters`] as a future (in a browser: the page's WebGPU adapter, if any).
pub async fn adapters_async() -> Vec<wgpu::Adapter> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: wgpu::Backends::PRIMARY,
        ..wgpu::InstanceDescriptor::new_without_display_handle_from_env()
    });
    let mut list = instance.enumerate_adapters(wgpu::Backends::PRIMARY).await;
    list.sort_by_key(|a| rank(a.get_info().device_type));
    list
}

fn rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    }
}

/// Whether `t` is real GPU hardware.
pub fn is_hardware(t: wgpu::DeviceType) -> bool {
    matches!(t, wgpu::DeviceType::DiscreteGpu | wgpu::DeviceType::IntegratedGpu)
}

/// "NAME (Vulkan, integrated GPU)".
pub fn describe(info: &wgpu::AdapterInfo) -> String {
    let ty = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => "discrete GPU",
        wgpu::DeviceType::IntegratedGpu => "integrated GPU",
        wgpu::DeviceType::VirtualGpu => "virtual GPU",
        wgpu::DeviceType::Cpu => "software adapter on the CPU",
        wgpu::DeviceType::Other => "other adapter",
    };
    // A browser does not tell pages its adapter's name (WebGPU's adapter info may be empty).
    let name = if info.name.is_empty() { "(unnamed)" } else { info.name.as_str() };
    format!("{name} ({:?}, {ty})", info.backend)
}

/// The limits the kernels need (everything else stays at the downlevel defaults).
fn required_limits(adapter: &wgpu::Limits) -> wgpu::Limits {
    wgpu::Limits {
        // Attention binds Q, K, V, the output, the sub-norm weight, the logit absmax table
        // and the K/V page tables (WebGPU guarantees 8).
        max_storage_buffers_per_shader_stage: 7,
        max_dynamic_uniform_buffers_per_pipeline_layout: 1,
        max_uniform_buffer_binding_size: 256,
        max_compute_workgroup_storage_size: 8192,
        max_compute_invocations_per_workgroup: 256,
        max_compute_workgroup_size_x: 256,
        max_compute_workgroups_per_dimension: 65535,
        // Larger bindings mean fewer weight chunks: take what the adapter offers (big
        // weights are split in row ranges to fit whatever this is).
        max_storage_buffer_binding_size: adapter.max_storage_buffer_binding_size.clamp(1 << 20, MAX_BINDING_WANTED),
        max_buffer_size: adapter.max_buffer_size.clamp(1 << 20, MAX_BINDING_WANTED),
        min_uniform_buffer_offset_alignment: adapter.min_uniform_buffer_offset_alignment.max(32),
        min_storage_buffer_offset_alignment: adapter.min_storage_buffer_offset_alignment.max(32),
        ..wgpu::Limits::downlevel_defaults()
    }
}

/// The limits an adapter with `have` lacks, as "name wanted (it has n)".
pub fn lacking_limits(have: &wgpu::Limits) -> Vec<String> {
    let mut lacking = Vec::new();
    required_limits(have).check_limits_with_fail_fn(have, false, |limit, wanted, has| {
        lacking.push(format!("{limit} {wanted} (it has {has})"));
    });
    lacking
}

impl GpuContext {
    /// Opens the best adapter allowed by `opts`, or says why none can be used.
    pub fn new(opts: &GpuOptions) -> Result<GpuContext, RuntimeError> {
        pollster::block_on(Self::new_async(opts))
    }

    /// [`GpuContext::new`] as a future (a browser's adapter and device arrive as promises).
    pub async fn new_async(opts: &GpuOptions) -> Result<GpuContext, RuntimeError> {
        let list = adapters_async().await;
        if list.is_empty() {
            return Err(RuntimeError::Device(
                "no Vulkan, Metal or DX12 adapter found (install a GPU driver, or mesa-vulkan-drivers for the lavapipe software adapter; --device cpu runs on the CPU)".into(),
            ));
        }
        let mut reasons = Vec::new();
        for adapter in list {
            let info = adapter.get_info();
            if opts.adapter == AdapterChoice::Hardware && !is_hardware(info.device_type) {
                reasons.push(format!("{}: not a hardware GPU", describe(&info)));
                continue;
            }
            match Self::open(adapter, opts).await {
                Ok(ctx) => return Ok(ctx),
                Err(e) => reasons.push(e.to_string()),
            }
        }
        Err(RuntimeError::Device(format!("no usable GPU adapter: {}", reasons.join("; "))))
    }

    async fn open(adapter: wgpu::Adapter, opts: &GpuOptions) -> Result<GpuContext, RuntimeError> {
        let info = adapter.get_info();
        let name = describe(&info);
        let have = adapter.limits();
        let want = required_limits(&have);
        let lacking = lacking_limits(&have);
        if !lacking.is_empty() {
            return Err(RuntimeError::Device(format!("{name} lacks the limits duet needs: {}", lacking.join(", "))));
        }
        let down = adapter.get_downlevel_capabilities();
        if !down.flags.contains(wgpu::DownlevelFlags::COMPUTE_SHADERS) {
            return Err(RuntimeError::Device(format!("{name} cannot run compute shaders")));
        }
        if !down.flags.contains(wgpu::DownlevelFlags::SHADER_F16_IN_F32) {
            return Err(RuntimeError::Device(format!(
                "{name} lacks the f16 packing built-ins (downlevel flag SHADER_F16_IN_F32) the kernels use to read f16 scales"
            )));
        }
        let has_f16 = adapter.features().contains(wgpu::Features::SHADER_F16);
        let f16 = match opts.f16 {
            Some(true) if !has_f16 => {
                return Err(RuntimeError::Device(format!("{name} lacks the SHADER_F16 feature (f16 arithmetic)")));
            }
            Some(b) => b,
            None => has_f16 && info.device_type != wgpu::DeviceType::Cpu,
        };
        let mut features = if f16 { wgpu::Features::SHADER_F16 } else { wgpu::Features::empty() };
        let has_subgroups = adapter.features().contains(wgpu::Features::SUBGROUP);
        let subgroups = match opts.tune.subgroups {
            Some(true) if !has_subgroups => {
                return Err(RuntimeError::Device(format!(
                    "{name} lacks the SUBGROUP feature (subgroup operations): run with --gpu-tune subgroups=off"
                )));
            }
            Some(b) => b,
            None => has_subgroups,
        };
        if subgroups {
            features |= wgpu::Features::SUBGROUP;
        }
        if opts.profile {
            if !adapter.features().contains(super::profile::FEATURES) {
                return Err(RuntimeError::Device(format!(
                    "{name} cannot time kernels (it lacks timestamp queries inside compute passes)"
                )));
            }
            features |= super::profile::FEATURES;
        }
        // Tiles of 128 tokens by default: on an H200, pp512 1.07-1.13x the 64-token tiles'
        // (runtime/bench/results/gpu-h200-2026-11-28-coop.md).
        let coop_wide = opts.tune.coop_tokens != Some(64);
        let lacks = coop_lacks(&adapter, f16, coop_wide);
        let coop = match opts.tune.coop {
            Some(true) if lacks.is_some() => {
                return Err(RuntimeError::Device(format!(
                    "{name} cannot run the cooperative-matrix product ({}): run with --gpu-tune coop=off",
                    lacks.unwrap_or_default()
                )));
            }
            Some(b) => b,
            None => lacks.is_none(),
        };
        let mut want = want;
        let mut experimental = wgpu::ExperimentalFeatures::disabled();
        if coop {
            features |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
            want.max_compute_workgroup_storage_size =
                want.max_compute_workgroup_storage_size.max(coop_workgroup_bytes(coop_wide));
            // SAFETY: wgpu's experimental features may have bugs of wgpu's own; the one used
            // here is the cooperative-matrix kernel, tested against the CPU backend on the
            // GPUs that run it (gpu_ops), and `--gpu-tune coop=off` leaves it out.
            experimental = unsafe { wgpu::ExperimentalFeatures::enabled() };
        }
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("duet"),
                required_features: features,
                required_limits: want.clone(),
                experimental_features: experimental,
                memory_hints: wgpu::MemoryHints::Performance,
                ..Default::default()
            })
            .await
            .map_err(|e| RuntimeError::Device(format!("{name}: cannot open the device: {e}")))?;
        let sink = Arc::new(Mutex::new(ErrorSink::default()));
        {
            let sink = Arc::clone(&sink);
            device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
                let mut s = sink.lock().unwrap_or_else(|p| p.into_inner());
                if matches!(e, wgpu::Error::OutOfMemory { .. }) {
                    s.out_of_memory = true;
                }
                s.errors.push(e.to_string());
            }));
        }
        {
            let sink = Arc::clone(&sink);
            device.set_device_lost_callback(move |reason, msg| {
                let mut s = sink.lock().unwrap_or_else(|p| p.into_inner());
                s.lost = Some(format!("{reason:?}: {msg}"));
            });
        }
        let mut max_chunk_bytes = want.max_storage_buffer_binding_size.min(want.max_buffer_size);
        if let Some(cap) = opts.max_binding {
            max_chunk_bytes = max_chunk_bytes.min(cap.max(4));
        }
        max_chunk_bytes &= !3;
        let hardware = is_hardware(info.device_type);
        let mv_shape = match opts.tune.matvec {
            Some((wg, rows)) => duet_shaders::MvShape { wg, rows, subgroups },
            None => duet_shaders::MvShape::default_for(hardware, subgroups),
        };
        Ok(GpuContext {
            device,
            queue,
            info,
            limits: want,
            f16,
            max_chunk_bytes,
            profile: opts.profile,
            profile_passes: opts.profile_passes,
            mv_shape,
            // Measured on an H200 (gpu-h200-2026-11-27-8df709e.md): decode 1.07-1.11x; the
            // software adapters keep naga's checks (they are where new kernels are tested).
            trusted: opts.tune.trusted.unwrap_or(hardware),
            fuse: opts.tune.fuse.unwrap_or(true),
            decode_workgroups: opts.tune.attn_workgroups.unwrap_or(super::attention::DECODE_WORKGROUPS),
            matvec_tokens: opts.tune.matvec_tokens.unwrap_or(super::matmul::MATVEC_TOKENS),
            // Off until a GPU run measures it (gpu_speed.sh's several-streams rows time it):
            // lavapipe, whose "workgroups" are CPU loops, ran 4 streams at 0.80x with it
            // (duet-diff-ref, bench --parallel 4: 58.6 vs 73.6 t/s).
            matvec_interleave: opts.tune.matvec_interleave.unwrap_or(false),
            coop,
            coop_wide,
            coop_lacks: if coop || !hardware { None } else { lacks.or_else(|| Some("--gpu-tune coop=off".into())) },
            submit_every: opts.submit_every.unwrap_or(super::SUBMIT_EVERY).max(1),
            sink,
        })
    }

    /// A one-line description: adapter, backend, type, the arithmetic used and the kernel
    /// choices (with the fallback an adapter that lacks a feature runs).
    pub fn describe(&self) -> String {
        let s = self.mv_shape;
        format!(
            "GPU {}, {} prefill products{}, f32 decode and attention, matvec {}x{} with {}{}{}",
            describe(&self.info),
            if self.f16 { "f16 (f32 sums)" } else { "f32" },
            match (&self.coop_lacks, self.coop) {
                (_, true) => format!(
                    " on cooperative matrices (tiles of {} tokens)",
                    duet_shaders::coop_tile_tokens(self.coop_wide)
                ),
                (Some(why), false) => format!(" without cooperative matrices ({why})"),
                (None, false) => String::new(),
            },
            s.wg,
            s.rows,
            if s.subgroups { "subgroup sums" } else { "workgroup-memory sums (no subgroups)" },
            if self.trusted { ", trusted modules" } else { "" },
            if self.fuse { "" } else { ", unfused" },
        )
    }

    /// The first error wgpu reported since the last check, worded for users.
    pub fn take_error(&self) -> Option<RuntimeError> {
        let mut s = self.sink.lock().unwrap_or_else(|p| p.into_inner());
        let name = describe(&self.info);
        if let Some(l) = s.lost.take() {
            return Some(RuntimeError::Device(format!(
                "the GPU device {name} was lost ({l}); rerun with --device cpu, or update the GPU driver"
            )));
        }
        if s.out_of_memory {
            s.out_of_memory = false;
            let detail = s.errors.drain(..).next().unwrap_or_default();
            return Some(RuntimeError::Device(format!(
                "the GPU {name} ran out of memory ({detail}); lower --ctx-size or --batch-size, use a smaller model, or --device cpu"
            )));
        }
        if !s.errors.is_empty() {
            let all: Vec<String> = s.errors.drain(..).collect();
            return Some(RuntimeError::Device(format!("GPU error on {name}: {}", all.join("; "))));
        }
        None
    }

    /// Runs `f` (which creates resources) and reports an out-of-memory or validation error
    /// it caused. In a browser an error scope's result is a promise that only the page's
    /// event loop settles: there `f`'s errors reach the uncaptured-error sink instead, and
    /// the next readback reports them.
    pub fn checked<T>(&self, what: &str, f: impl FnOnce() -> T) -> Result<T, RuntimeError> {
        #[cfg(target_arch = "wasm32")]
        {
            let _ = what;
            return Ok(f());
        }
        #[cfg(not(target_arch = "wasm32"))]
        self.checked_now(what, f)
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn checked_now<T>(&self, what: &str, f: impl FnOnce() -> T) -> Result<T, RuntimeError> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let val = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let out = f();
        let v = pollster::block_on(val.pop());
        let o = pollster::block_on(oom.pop());
        let name = describe(&self.info);
        if let Some(e) = o {
            return Err(RuntimeError::Device(format!("the GPU {name} is out of memory for {what}: {e}")));
        }
        if let Some(e) = v {
            return Err(RuntimeError::Device(format!("GPU error creating {what} on {name}: {e}")));
        }
        Ok(out)
    }
}

/// Gives the GPU drivers the environment they expect, so that probing for an adapter prints
/// nothing: with `XDG_RUNTIME_DIR` unset, Mesa's Vulkan drivers (through libwayland) print
/// "error: XDG_RUNTIME_DIR is invalid or not set in the environment." while the loader
/// enumerates them — noise, not an error of ours. When it is unset or not a directory, it is
/// pointed at a private directory of this user (`$TMPDIR/duet-runtime-UID`, mode 0700). Linux
/// only (elsewhere there is nothing to do).
///
/// # Safety
/// It sets an environment variable: call it before any other thread exists (first thing in
/// `main`).
pub unsafe fn prepare_loader_environment() {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt};
        let ok = std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|d| std::path::Path::new(&d).is_dir());
        if ok {
            return;
        }
        let Ok(uid) = std::fs::metadata("/proc/self").map(|m| m.uid()) else { return };
        let dir = std::env::temp_dir().join(format!("duet-runtime-{uid}"));
        let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
        let ours = std::fs::metadata(&dir).is_ok_and(|m| m.is_dir() && m.uid() == uid);
        if ours {
            // SAFETY: the caller guarantees no other thread reads or writes the environment.
            unsafe { std::env::set_var("XDG_RUNTIME_DIR", &dir) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_modest_and_a_lacking_one_is_named() {
        // Any WebGPU-compliant adapter has what the kernels need.
        assert!(lacking_limits(&wgpu::Limits::default()).is_empty());
        assert!(
            lacking_limits(&wgpu::Limits::downlevel_defaults()).iter().all(|l| l.starts_with("max_storage_buffers"))
        );
        // WebGL2-class adapters have no storage buffers in compute: say which limit.
        let l = lacking_limits(&wgpu::Limits::downlevel_webgl2_defaults());
        assert!(l.iter().any(|m| m.starts_with("max_storage_buffers_per_shader_stage 7 (it has 0)")), "{l:?}");
    }
}
