//! Acceptance #1: every tiny fixture converts at every preset, gguf-py reads every output, and
//! each tensor gguf-py dequantizes matches the (q/k-permuted) source values within its
//! type's error bound; Q8_0/Q4_0 (and the other types gguf-py quantizes bit-exactly) are
//! byte-identical to `gguf.quants.quantize`; metadata keys and types match config.json and
//! the tokenizer files. The checks live in check_gguf.py, which shares no code with duet.

mod common;

use common::{FIXTURES, TempDir, check, convert, fixture, job, type_stats};
use duet_convert::Preset;

#[test]
fn every_fixture_at_every_preset_matches_its_source() {
    let dir = TempDir::new("presets");
    let mut jobs = Vec::new();
    for name in FIXTURES {
        for preset in Preset::ALL {
            let out = dir.join(format!("{name}-{}.gguf", preset.name()));
            convert(&fixture(name), preset, &out, false, &[]);
            jobs.push(job(&out, &fixture(name), preset, false, &[]));
        }
    }
    let Some(summaries) = check("every_fixture_at_every_preset_matches_its_source", &dir, &jobs) else {
        return;
    };
    let by = |fixture: &str, preset: Preset| {
        let file = format!("{fixture}-{}.gguf", preset.name());
        summaries.iter().find(|s| s["gguf"].as_str().unwrap().ends_with(&file)).unwrap()
    };
    // The checker passed every job; make sure the interesting checks actually ran.
    for name in FIXTURES {
        for preset in Preset::ALL {
            let s = by(name, preset);
            for ty in ["Q8_0", "Q4_0", "Q5_0", "Q5_1", "F16", "BF16"] {
                let (n, exact) = type_stats(s, ty);
                assert_eq!(n, exact, "{name} {}: every {ty} tensor is compared byte for byte", preset.name());
            }
        }
        assert!(type_stats(by(name, Preset::Q8_0), "Q8_0").0 >= 14, "{name}: q8_0 quantizes every matrix");
        assert!(type_stats(by(name, Preset::Q4_0), "Q4_0").0 >= 13, "{name}: q4_0 quantizes every matrix");
        assert!(type_stats(by(name, Preset::F16), "F16").0 >= 14, "{name}: f16 stores every matrix as F16");
        assert!(type_stats(by(name, Preset::BF16), "BF16").0 >= 14, "{name}: bf16 stores every matrix as BF16");
    }
    // hidden 256 is the one fixture whose rows fit K-quant blocks: all three K types checked.
    let g = "diffllama-gqa";
    assert!(type_stats(by(g, Preset::Q4KM), "Q4_K").0 > 0 && type_stats(by(g, Preset::Q4KM), "Q6_K").0 > 0);
    assert!(type_stats(by(g, Preset::Q5KM), "Q5_K").0 > 0);
    assert!(type_stats(by(g, Preset::Q4KS), "Q5_K").0 > 0);
    assert!(type_stats(by(g, Preset::Q6K), "Q6_K").0 >= 16);
    // The others (rows of 64 and 160) exercise llama.cpp's shape fallbacks Q5_0, Q5_1, Q8_0.
    let t = "diffllama-tied-llama3";
    assert!(type_stats(by(t, Preset::Q4KM), "Q5_0").0 > 0);
    assert!(type_stats(by(t, Preset::Q5KM), "Q5_1").0 > 0);
    assert!(type_stats(by(t, Preset::Q6K), "Q8_0").0 > 0);
}

#[test]
fn tensor_type_overrides_apply_before_the_shape_fallback() {
    // First match wins; a K-quant override on rows of 64 falls back like any K-quant; a
    // manual attn_v type is not counted by the attn_v rule (llama.cpp).
    let dir = TempDir::new("overrides");
    let cases: [(&str, Preset, &[&str]); 3] = [
        ("diffllama-gqa", Preset::Q4KM, &[r"blk\.0\.attn_v\.weight=q8_0", r"ffn_(up|gate)=q5_1", r"ffn_.*=q4_0"]),
        ("diffllama-tied-llama3", Preset::Q4_0, &[r"token_embd=q4_k", r"attn_output=q6_k"]),
        ("llama-gqa", Preset::F16, &[r"attn_q=q8_0"]),
    ];
    let mut jobs = Vec::new();
    for (name, preset, overrides) in cases {
        let out = dir.join(format!("{name}-{}.gguf", preset.name()));
        convert(&fixture(name), preset, &out, false, overrides);
        jobs.push(job(&out, &fixture(name), preset, false, overrides));
    }
    // Types the rules above imply, stated here so that the test does not only trust the checker.
    let f = duet_quant::gguf::GgufFile::open(dir.join("diffllama-gqa-q4_k_m.gguf")).unwrap();
    let ty = |f: &duet_quant::gguf::GgufFile, n: &str| f.tensor(n).unwrap().ggml_type().name().to_string();
    assert_eq!(ty(&f, "blk.0.attn_v.weight"), "Q8_0");
    // blk.1's attn_v is the first one counted: use_more_bits(0, 2) is false → Q4_K.
    assert_eq!(ty(&f, "blk.1.attn_v.weight"), "Q4_K");
    assert_eq!(ty(&f, "blk.1.ffn_up.weight"), "Q5_1");
    assert_eq!(ty(&f, "blk.0.ffn_gate.weight"), "Q5_1");
    assert_eq!(ty(&f, "blk.1.ffn_down.weight"), "Q4_0");
    assert_eq!(ty(&f, "blk.0.attn_q.weight"), "Q4_K");
    assert_eq!(ty(&f, "output.weight"), "Q6_K");
    let t = duet_quant::gguf::GgufFile::open(dir.join("diffllama-tied-llama3-q4_0.gguf")).unwrap();
    assert_eq!(ty(&t, "token_embd.weight"), "Q5_0", "Q4_K on rows of 64 falls back to Q5_0");
    assert_eq!(ty(&t, "blk.2.attn_output.weight"), "Q8_0", "Q6_K on rows of 64 falls back to Q8_0");
    assert_eq!(ty(&t, "blk.2.attn_q.weight"), "Q4_0");
    let l = duet_quant::gguf::GgufFile::open(dir.join("llama-gqa-f16.gguf")).unwrap();
    assert_eq!(ty(&l, "blk.0.attn_q.weight"), "F16", "float presets ignore overrides, as llama-quantize does");
    check("tensor_type_overrides_apply_before_the_shape_fallback", &dir, &jobs);
}
