//! Bind-group layouts (created once, with the backend) and compute pipelines (created once
//! per variant, cached). Counters of both let a test check that nothing is created after
//! the first token.

use std::collections::HashMap;
use std::sync::Arc;

use duet_shaders::{Op, Variant};

/// The binding shapes of the kernels: binding 0 is the per-dispatch parameters (a uniform
/// with a dynamic offset), then storage buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayoutKind {
    /// read, read, read_write (matvec, matmul, embed, rms_norm, rotate, pair_combine,
    /// attn_combine).
    In2Out1,
    /// read weights, read activations, four read_write outputs (the split matvec).
    MatVecSplit,
    /// read weights, read activations, read_write output, read RMSNorm weight (a matvec with
    /// a folded norm).
    MatVecNorm,
    /// The split matvec's, then the RMSNorm weight.
    MatVecSplitNorm,
    /// read, read_write (rope, swiglu, add, copy_row, kv_window, dex, logit_reduce).
    In1Out1,
    /// read rows, read_write cache, read page tables (kv_write).
    CacheWrite,
    /// read RoPE table, read_write Q and K, read V, read_write K and V caches, read page
    /// tables (rope_kv).
    RopeKv,
    /// read Q, read K cache, read_write absmax, read page tables, read RoPE table
    /// (logit_absmax).
    LogitAbsmax,
    /// read Q, K, V, read_write partials, read logit absmax, read page tables, read RoPE
    /// table (attention; the table read where K is stored before RoPE).
    Attention,
}

impl LayoutKind {
    pub fn of(op: Op) -> LayoutKind {
        match op {
            Op::MatVec { epi: duet_shaders::MvEpilogue::Split, norm: false, .. } => LayoutKind::MatVecSplit,
            Op::MatVec { epi: duet_shaders::MvEpilogue::Split, norm: true, .. } => LayoutKind::MatVecSplitNorm,
            Op::MatVec { norm: true, .. } => LayoutKind::MatVecNorm,
            Op::MatVec { .. }
            | Op::MatMul(_)
            | Op::MatMulCoop { .. }
            | Op::Embed(_)
            | Op::RmsNorm
            | Op::Rotate
            | Op::PairCombine
            | Op::AttnCombine { .. } => LayoutKind::In2Out1,
            Op::Rope | Op::SwiGlu | Op::Add | Op::CopyRow | Op::KvWindow | Op::Dex | Op::LogitReduce => {
                LayoutKind::In1Out1
            }
            Op::KvWrite(_) => LayoutKind::CacheWrite,
            Op::RopeKv { .. } => LayoutKind::RopeKv,
            Op::LogitAbsmax(_) => LayoutKind::LogitAbsmax,
            Op::Attention { .. } => LayoutKind::Attention,
        }
    }

    fn storage(self) -> &'static [bool] {
        // true = read-only
        match self {
            LayoutKind::In2Out1 => &[true, true, false],
            LayoutKind::MatVecSplit => &[true, true, false, false, false, false],
            LayoutKind::MatVecNorm => &[true, true, false, true],
            LayoutKind::MatVecSplitNorm => &[true, true, false, false, false, false, true],
            LayoutKind::In1Out1 => &[true, false],
            LayoutKind::CacheWrite => &[true, false, true],
            LayoutKind::RopeKv => &[true, false, false, true, false, false, true],
            LayoutKind::LogitAbsmax => &[true, true, false, true, true],
            LayoutKind::Attention => &[true, true, true, false, true, true, true],
        }
    }

    /// Whether each storage binding is read-only.
    pub fn read_only(self) -> &'static [bool] {
        self.storage()
    }

    pub fn n_storage(self) -> usize {
        self.storage().len()
    }

    const ALL: [LayoutKind; 9] = [
        LayoutKind::In2Out1,
        LayoutKind::MatVecSplit,
        LayoutKind::MatVecNorm,
        LayoutKind::MatVecSplitNorm,
        LayoutKind::RopeKv,
        LayoutKind::In1Out1,
        LayoutKind::CacheWrite,
        LayoutKind::LogitAbsmax,
        LayoutKind::Attention,
    ];
}

/// Bytes of one dispatch's parameter slot (every Params struct fits).
pub const PARAMS_SLOT: u64 = 256;

pub struct Pipelines {
    layouts: HashMap<LayoutKind, (wgpu::BindGroupLayout, wgpu::PipelineLayout)>,
    pipelines: HashMap<Variant, Arc<wgpu::ComputePipeline>>,
    /// Bind-group and pipeline layouts created (all at construction).
    pub layouts_created: usize,
    pub pipelines_created: usize,
    /// Build the modules of [`Op::trusted`] kernels without naga's runtime checks.
    trusted: bool,
}

impl Pipelines {
    pub fn new(device: &wgpu::Device, trusted: bool) -> Pipelines {
        let mut layouts = HashMap::new();
        let mut created = 0;
        for kind in LayoutKind::ALL {
            let mut entries = vec![wgpu::BindGroupLayoutEntry {
                binding: 0,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Uniform,
                    has_dynamic_offset: true,
                    min_binding_size: wgpu::BufferSize::new(PARAMS_SLOT),
                },
                count: None,
            }];
            for (i, &read_only) in kind.storage().iter().enumerate() {
                entries.push(wgpu::BindGroupLayoutEntry {
                    binding: 1 + i as u32,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Storage { read_only },
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                });
            }
            let bgl = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some("duet bind group layout"),
                entries: &entries,
            });
            let pl = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some("duet pipeline layout"),
                bind_group_layouts: &[Some(&bgl)],
                immediate_size: 0,
            });
            created += 2;
            layouts.insert(kind, (bgl, pl));
        }
        Pipelines { layouts, pipelines: HashMap::new(), layouts_created: created, pipelines_created: 0, trusted }
    }

    pub fn bind_group_layout(&self, kind: LayoutKind) -> &wgpu::BindGroupLayout {
        &self.layouts[&kind].0
    }

    /// The pipeline of `v`, compiled on first use.
    pub fn get(&mut self, device: &wgpu::Device, v: Variant) -> Arc<wgpu::ComputePipeline> {
        if let Some(p) = self.pipelines.get(&v) {
            return Arc::clone(p);
        }
        let label = v.label();
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(&label),
            source: wgpu::ShaderSource::Wgsl(duet_shaders::source(&v).into()),
        };
        let module = if self.trusted && v.op.trusted() {
            // SAFETY: Op::trusted kernels index only inside their bindings by construction
            // (their buffers are padded for it) and every loop of theirs ends.
            unsafe { device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) }
        } else {
            device.create_shader_module(desc)
        };
        let layout = &self.layouts[&LayoutKind::of(v.op)].1;
        let p = Arc::new(device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&label),
            layout: Some(layout),
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        }));
        self.pipelines_created += 1;
        self.pipelines.insert(v, Arc::clone(&p));
        p
    }
}
