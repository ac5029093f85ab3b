//! Every shader variant parses and validates with naga, with the capabilities wgpu derives
//! from the features the GPU backend requests (SHADER_F16 for the f16 variants) and the
//! downlevel flags of a compliant Vulkan/Metal/DX12 adapter. Needs no adapter.

mod common;

use duet_shaders::{Variant, source};
use naga::valid::{ValidationFlags, Validator};
use wgpu_types::Features;

fn validate(v: &Variant) -> Result<(), String> {
    common::module(v).map(|_| ())
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
    // What the registry must cover, derived from the vocabularies rather than counted by
    // hand: every weight type's matmul, embedding and matvec, every cache format's write,
    // logit absmax and attention (as K and as V, standard and DIFF, decode and prefill), and
    // every kernel's parameter struct (so every kind of op).
    use duet_shaders::{AttnShape, CacheFormat, Op, PARAMS_STRUCTS, WEIGHT_TYPES};
    let ops: Vec<Op> = all.iter().map(|v| v.op).collect();
    for t in WEIGHT_TYPES {
        assert!(
            ops.contains(&Op::MatMul(t))
                && ops.contains(&Op::MatMulCoop { ty: t, wide: false })
                && ops.contains(&Op::MatMulCoop { ty: t, wide: true })
                && ops.contains(&Op::Embed(t)),
            "{t}"
        );
        assert!(ops.iter().any(|o| matches!(o, Op::MatVec { ty, .. } if *ty == t)), "matvec {t}");
    }
    for c in CacheFormat::ALL {
        assert!(ops.contains(&Op::KvWrite(c)) && ops.contains(&Op::LogitAbsmax(c)), "{c}");
        for diff in [false, true] {
            for shape in [AttnShape::Decode, AttnShape::Prefill] {
                for other in CacheFormat::ALL {
                    for (k, v) in [(c, other), (other, c)] {
                        assert!(ops.contains(&Op::Attention { diff, shape, k, v }), "attention {c}");
                    }
                }
            }
        }
    }
    let structs: std::collections::BTreeSet<&str> = ops.iter().map(|o| o.params().0).collect();
    assert_eq!(structs, PARAMS_STRUCTS.iter().copied().collect());
    // Every op that computes in f16 has its f16 form too.
    for o in ops.iter().filter(|o| o.uses_f16()) {
        assert!(all.iter().any(|v| v.op == *o && v.f16), "{o:?} lacks its f16 form");
    }
}

#[test]
fn f16_variants_need_shader_f16() {
    // Without the capability an f16 variant must be rejected: the backend only builds them
    // when the adapter has SHADER_F16.
    let v = Variant::new(duet_shaders::Op::MatMul(duet_shaders::GgmlType::Q4_0), true);
    let src = source(&v);
    let module = naga::front::wgsl::parse_str(&src).unwrap();
    let caps = common::capabilities(Features::empty());
    assert!(Validator::new(ValidationFlags::all(), caps).validate(&module).is_err());
}

#[test]
fn cooperative_matrix_variants_need_the_feature() {
    // The tensor-core product is refused with f16 alone: the backend builds it only where
    // the adapter has cooperative matrices.
    let v = Variant::new(duet_shaders::Op::MatMulCoop { ty: duet_shaders::GgmlType::Q4_0, wide: false }, false);
    let src = source(&v);
    let module = naga::front::wgsl::parse_str(&src).unwrap();
    let caps = common::capabilities(Features::SHADER_F16);
    assert!(Validator::new(ValidationFlags::all(), caps).validate(&module).is_err());
    assert!(validate(&v).is_ok());
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
    let caps = common::capabilities(Features::empty());
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
