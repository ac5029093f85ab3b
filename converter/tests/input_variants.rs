//! Acceptance #2: the same values stored differently — one F32 file, one BF16 file (tensors in
//! another order), three BF16 shards, two F32 shards, F16/F32 mixed — convert to byte-identical
//! GGUFs at q4_k_m and f16 (and equal to the committed BF16 fixture's conversion).

mod common;

use common::{
    StTensor, TempDir, convert, copy_side_files, fixture, read_safetensors, write_safetensors, write_sharded,
};
use duet_convert::Preset;

#[test]
fn sharded_bf16_f32_and_mixed_inputs_convert_to_identical_files() {
    let dir = TempDir::new("variants");
    for name in ["diffllama-gqa", "diffllama-tied-llama3", "llama-dex"] {
        let src = fixture(name);
        let tensors = read_safetensors(&src.join("model.safetensors"));
        assert!(tensors.iter().all(|t| t.dtype == "BF16"), "{name}: the fixtures are BF16");
        let as_dtype =
            |dtype: &str| -> Vec<StTensor> { tensors.iter().map(|t| t.with_f32(dtype, &t.f32s())).collect() };
        // F16 where the value is exactly representable (most), F32 for the tensors where not.
        let mixed: Vec<StTensor> = tensors
            .iter()
            .map(|t| {
                let v = t.f32s();
                let exact = v.iter().all(|x| half::f16::from_f32(*x).to_f32().to_bits() == x.to_bits());
                t.with_f32(if exact { "F16" } else { "F32" }, &v)
            })
            .collect();
        assert!(mixed.iter().any(|t| t.dtype == "F16"), "{name}: the mixed variant holds F16 tensors");
        let mut reversed = as_dtype("BF16");
        reversed.reverse();

        // Every variant lives in a directory named like the fixture: general.name comes from it.
        let variant = |v: &str| {
            let d = dir.join(v).join(name);
            copy_side_files(&src, &d);
            d
        };
        let mut inputs = vec![("fixture", src.clone())];
        let d = variant("f32");
        write_safetensors(&d.join("model.safetensors"), &as_dtype("F32"));
        inputs.push(("f32", d));
        let d = variant("bf16-reordered");
        write_safetensors(&d.join("model.safetensors"), &reversed);
        inputs.push(("bf16-reordered", d));
        let d = variant("bf16-3-shards");
        write_sharded(&d, &as_dtype("BF16"), 3);
        inputs.push(("bf16-3-shards", d));
        let d = variant("f32-2-shards");
        write_sharded(&d, &as_dtype("F32"), 2);
        inputs.push(("f32-2-shards", d));
        let d = variant("f16-f32-mixed");
        write_safetensors(&d.join("model.safetensors"), &mixed);
        inputs.push(("f16-f32-mixed", d));
        assert!(dir.join("bf16-3-shards").join(name).join("model-00003-of-00003.safetensors").exists());

        for preset in [Preset::Q4KM, Preset::F16, Preset::F32] {
            let mut reference: Option<Vec<u8>> = None;
            for (label, input) in &inputs {
                let out = dir.join(format!("{name}-{label}-{}.gguf", preset.name()));
                convert(input, preset, &out, false, &[]);
                let bytes = std::fs::read(&out).unwrap();
                match &reference {
                    None => reference = Some(bytes),
                    Some(r) => assert!(
                        *r == bytes,
                        "{name} {}: the {label} input gives a different file than the committed fixture",
                        preset.name()
                    ),
                }
            }
        }
    }
}
