//! Acceptance #3: a real llama.cpp GGUF (SmolLM2-135M-Instruct, Q4_1 with a Q8_0 tied
//! embedding, tensors stored in name order) re-quantizes to q8_0 and q4_k_m. gguf-py reads
//! the results; tensor count, names and shapes match the source; tensors that keep their
//! type are byte-identical to it; the others are within their type's bound of the source's
//! dequantized values (and byte-identical to gguf.quants.quantize for Q8_0/Q5_0); the types
//! follow llama-quantize's rules.

mod common;

use common::{TempDir, check, convert, job, type_stats};
use duet_convert::Preset;
use duet_quant::gguf::GgufFile;

const TEST: &str = "smollm2_requantizes_to_q8_0_and_q4_k_m";

#[test]
fn smollm2_requantizes_to_q8_0_and_q4_k_m() {
    let Some(src_path) = duet_test_support::asset(TEST, "DUET_SMOLLM2", "SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let dir = TempDir::new("requant");
    let src = GgufFile::open(&src_path).unwrap();
    let mut jobs = Vec::new();
    for preset in [Preset::Q8_0, Preset::Q4KM] {
        let out = dir.join(format!("smollm2-{}.gguf", preset.name()));
        convert(&src_path, preset, &out, false, &[]);
        let f = GgufFile::open(&out).unwrap();
        assert_eq!(f.tensors().len(), src.tensors().len());
        let mut kept = 0;
        for (a, b) in src.tensors().iter().zip(f.tensors()) {
            assert_eq!(
                (a.name(), a.dims()),
                (b.name(), b.dims()),
                "{}: names and shapes in source order",
                preset.name()
            );
            if a.ggml_type() == b.ggml_type() {
                kept += 1;
                assert!(
                    src.tensor_data(a) == f.tensor_data(b),
                    "{}: {} kept its type but not its bytes",
                    preset.name(),
                    a.name()
                );
            }
        }
        // Norms (61 F32 tensors) always; the Q8_0 tied embedding is already what both presets want.
        assert_eq!(kept, 62, "{}: tensors that keep their type", preset.name());
        assert_eq!(f.get_u32("general.file_type").unwrap(), preset.file_type());
        assert_eq!(f.get_str("tokenizer.ggml.pre").unwrap(), src.get_str("tokenizer.ggml.pre").unwrap());
        jobs.push(job(&out, &src_path, preset, false, &[]));
    }
    let Some(summaries) = check(TEST, &dir, &jobs) else {
        return;
    };
    let q8 = &summaries[0];
    assert_eq!(type_stats(q8, "Q8_0"), (211, 211), "every matrix Q8_0, each compared byte for byte");
    let q4 = &summaries[1];
    // Rows of 576 do not fit 256-blocks: Q4_K → Q5_0, Q6_K → Q8_0; ffn_down rows are 1536.
    assert_eq!(type_stats(q4, "Q4_K").0 + type_stats(q4, "Q6_K").0, 30, "ffn_down: Q4_K or Q6_K");
    assert_eq!(type_stats(q4, "Q6_K").0, 14, "use_more_bits(i, 30) picks 14 of 30 layers");
    let (n5, exact5) = type_stats(q4, "Q5_0");
    assert_eq!(n5, exact5);
    assert!(n5 > 150);
}
