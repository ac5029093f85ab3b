//! Parsing and validating a kernel variant the way wgpu does before handing it to a
//! platform's shader compiler, shared by the validation and translation tests.

use duet_shaders::{Variant, source};
use naga::valid::{Capabilities, ModuleInfo, ValidationFlags, Validator};
use wgpu_types::{DownlevelFlags, Features};

/// The device features the GPU backend requests to build `v`: SHADER_F16 for the f16
/// products, SUBGROUP for the subgroup reductions, EXPERIMENTAL_COOPERATIVE_MATRIX (and
/// SHADER_F16) for the tensor-core product (an adapter without them is given the other
/// variants).
pub fn features(v: &Variant) -> Features {
    let mut f = if v.f16 { Features::SHADER_F16 } else { Features::empty() };
    if v.op.uses_subgroups() {
        f |= Features::SUBGROUP;
    }
    if v.op.uses_coop() {
        f |= Features::SHADER_F16 | Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
    }
    f
}

/// The naga capabilities wgpu derives from `features` on a compliant Vulkan/Metal/DX12
/// adapter.
pub fn capabilities(features: Features) -> Capabilities {
    wgpu_naga_bridge::features_to_naga_capabilities(features, DownlevelFlags::compliant())
}

/// `v`'s WGSL parsed and validated with the capabilities of its own features, its
/// compute entry point `main` checked; the error as naga prints it.
pub fn module(v: &Variant) -> Result<(naga::Module, ModuleInfo), String> {
    let src = source(v);
    let module = naga::front::wgsl::parse_str(&src).map_err(|e| e.emit_to_string(&src))?;
    let info = Validator::new(ValidationFlags::all(), capabilities(features(v)))
        .validate(&module)
        .map_err(|e| e.emit_to_string(&src))?;
    let ep = module.entry_points.iter().find(|e| e.name == "main").ok_or("no entry point 'main'")?;
    if ep.stage != naga::ShaderStage::Compute {
        return Err("'main' is not a compute entry point".into());
    }
    Ok((module, info))
}
