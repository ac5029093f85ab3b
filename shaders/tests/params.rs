//! Every kernel's WGSL `Params` against the `#[repr(C)]` struct the host fills for it
//! ([`duet_shaders::Op::params`]): the same members in the same order, of the same types,
//! at the same byte offsets. A field added, dropped, reordered or retyped on one side only
//! fails here instead of feeding a kernel garbage.

use duet_shaders::{Field, ParamType, Variant, source};
use naga::{AddressSpace, ScalarKind, TypeInner, VectorSize};

/// The members of the uniform `P` of a variant's WGSL as (name, type, offset).
fn wgsl_params(v: &Variant) -> Vec<Field> {
    let src = source(v);
    let module =
        naga::front::wgsl::parse_str(&src).unwrap_or_else(|e| panic!("{}: {}", v.label(), e.emit_to_string(&src)));
    let (_, var) = module
        .global_variables
        .iter()
        .find(|(_, g)| g.name.as_deref() == Some("P"))
        .unwrap_or_else(|| panic!("{}: no global P", v.label()));
    assert_eq!(var.space, AddressSpace::Uniform, "{}: P is not a uniform", v.label());
    let TypeInner::Struct { members, .. } = &module.types[var.ty].inner else {
        panic!("{}: P is not a struct", v.label())
    };
    members
        .iter()
        .map(|m| {
            let ty = match &module.types[m.ty].inner {
                TypeInner::Scalar(s) if s.kind == ScalarKind::Uint && s.width == 4 => ParamType::U32,
                TypeInner::Scalar(s) if s.kind == ScalarKind::Float && s.width == 4 => ParamType::F32,
                TypeInner::Array { base, size: naga::ArraySize::Constant(n), .. }
                    if n.get() == 2
                        && matches!(module.types[*base].inner,
                            TypeInner::Vector { size: VectorSize::Quad, scalar } if scalar.kind == ScalarKind::Uint) =>
                {
                    ParamType::U32x4x2
                }
                other => panic!("{}: member {:?} has a type the host does not fill: {other:?}", v.label(), m.name),
            };
            let name = m.name.clone().unwrap_or_default();
            Field { name: Box::leak(name.into_boxed_str()), ty, offset: m.offset as usize }
        })
        .collect()
}

#[test]
fn every_kernel_params_struct_matches_its_wgsl() {
    let mut checked = std::collections::BTreeSet::new();
    for v in Variant::all() {
        let (name, fields) = v.op.params();
        let wgsl = wgsl_params(&v);
        assert_eq!(wgsl, fields, "{}: WGSL Params vs {name}", v.label());
        checked.insert(name);
    }
    // Every struct is some kernel's, so every kernel kind was reflected.
    let all: std::collections::BTreeSet<&str> = duet_shaders::PARAMS_STRUCTS.iter().copied().collect();
    assert_eq!(checked, all);
}

/// The check itself sees a difference: a struct with two fields swapped does not match.
#[test]
fn a_reordered_struct_is_caught() {
    let v = Variant::new(duet_shaders::Op::RmsNorm, false);
    let (_, fields) = v.op.params();
    let mut swapped = fields.to_vec();
    swapped.swap(1, 2);
    (swapped[1].offset, swapped[2].offset) = (swapped[2].offset, swapped[1].offset);
    assert_ne!(wgsl_params(&v), swapped);
}
