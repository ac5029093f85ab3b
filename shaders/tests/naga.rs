//! Every shader variant parses and validates with naga, with the capabilities wgpu derives
//! from the features the GPU backend requests (SHADER_F16 for the f16 variants) and the
//! downlevel flags of a compliant Vulkan/Metal/DX12 adapter. Needs no adapter.

use duet_shaders::{Variant, source};
use naga::valid::{ValidationFlags, Validator};
use wgpu_types::{DownlevelFlags, Features};

fn validate(v: &Variant) -> Result<(), String> {
    let src = source(v);
    let module = naga::front::wgsl::parse_str(&src).map_err(|e| e.emit_to_string(&src))?;
    let mut features = if v.f16 { Features::SHADER_F16 } else { Features::empty() };
    if v.op.uses_subgroups() {
        features |= Features::SUBGROUP;
    }
    let caps = wgpu_naga_bridge::features_to_naga_capabilities(features, DownlevelFlags::compliant());
    let mut validator = Validator::new(ValidationFlags::all(), caps);
    validator.validate(&module).map_err(|e| e.emit_to_string(&src))?;
    let ep = module.entry_points.iter().find(|e| e.name == "main").ok_or("no entry point 'main'")?;
    if ep.stage != naga::ShaderStage::Compute {
        return Err("'main' is not a compute entry point".into());
    }
    Ok(())
}

#[test]
fn every_variant_validates() {
    let all = Variant::all();
    let mut failures = Vec::new();
    for v in &all {
        if let Err(e) = validate(v) {
            failures.push(format!("{}:\n{e}", v.label()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} variants fail naga validation:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
    // 11 weight types × (matmul, embed, and the matvec's 4 epilogues in 4 default shapes —
    // hardware and software, with and without subgroups — 3 of them also with a folded
    // RMSNorm), the 2 × 12 matvec shapes for
    // Q4_0's store (of which 4 are default shapes), 10 plain ops (logit_reduce, kv_window,
    // rotate and pair_combine included), 8 RoPE-and-write passes (f16 and f32 K and V
    // caches, for one sequence and for rows of several), 11 cache writes, 11 logit-absmax
    // readers, 4 × 121 attend steps, 2 × 4 batched decode steps (plain caches) and 3
    // combine steps, plus the f16 forms of the 11 matmuls.
    assert_eq!(all.len(), 11 * (2 + 4 * 4 + 3 * 4) + (24 - 4) + 10 + 8 + 11 + 11 + 4 * 121 + 2 * 4 + 3 + 11);
}

#[test]
fn f16_variants_need_shader_f16() {
    // Without the capability an f16 variant must be rejected: the backend only builds them
    // when the adapter has SHADER_F16.
    let v = Variant::new(duet_shaders::Op::MatMul(duet_shaders::GgmlType::Q4_0), true);
    let src = source(&v);
    let module = naga::front::wgsl::parse_str(&src).unwrap();
    let caps = wgpu_naga_bridge::features_to_naga_capabilities(Features::empty(), DownlevelFlags::compliant());
    assert!(Validator::new(ValidationFlags::all(), caps).validate(&module).is_err());
}

#[test]
fn subgroup_variants_need_subgroup() {
    // Likewise the subgroup reductions: the backend builds them only with SUBGROUP.
    let shape = duet_shaders::MvShape::default_for(true, true);
    let op = duet_shaders::Op::MatVec {
        ty: duet_shaders::GgmlType::Q4_0,
        epi: duet_shaders::MvEpilogue::Store,
        shape,
        norm: false,
    };
    let src = source(&Variant::new(op, false));
    let module = naga::front::wgsl::parse_str(&src).unwrap();
    let caps = wgpu_naga_bridge::features_to_naga_capabilities(Features::empty(), DownlevelFlags::compliant());
    assert!(Validator::new(ValidationFlags::all(), caps).validate(&module).is_err());
}

#[test]
fn labels_are_unique() {
    let all = Variant::all();
    let mut labels: Vec<String> = all.iter().map(|v| v.label()).collect();
    labels.sort();
    labels.dedup();
    assert_eq!(labels.len(), all.len());
}
