//! Acceptance #4: the DEX fixture (llama-dex: heads {0, 2} of layer 0 and {1} of layer 1)
//! converts folded and unfolded (--keep-dex).
//!
//! Folded: attn_output = Wo·(I − λ·W_D)ᵀ on the adapted heads' columns, computed here in f64
//! from the safetensors values (not with duet's fold), within one f32 rounding; every other
//! column, every other tensor, bit-identical to the unfolded file. Unfolded: Wo unchanged,
//! blk.N.attn_dex.weight / attn_dex_lambda.weight hold W_D and λ exactly, and the
//! duet.dex.head_mask key marks the adapted heads. gguf-py checks both files too.

mod common;

use common::{TempDir, check, convert, fixture, job, read_safetensors};
use duet_convert::Preset;
use duet_quant::GgmlType;
use duet_quant::gguf::{Array, GgufFile, Value};

fn f32s(f: &GgufFile, name: &str) -> Vec<f32> {
    let t = f.tensor(name).unwrap_or_else(|| panic!("no tensor {name}"));
    assert_eq!(t.ggml_type(), GgmlType::F32, "{name}");
    f.tensor_data(t).chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
}

#[test]
fn dex_folds_into_attn_output_or_stays_separate() {
    let src = fixture("llama-dex");
    let cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
    let heads: Vec<Vec<usize>> = serde_json::from_value(cfg["dex"]["heads"].clone()).unwrap();
    assert_eq!(heads, vec![vec![0, 2], vec![1]]);
    let n_heads = cfg["num_attention_heads"].as_u64().unwrap() as usize;
    let hidden = cfg["hidden_size"].as_u64().unwrap() as usize;
    let hd = hidden / n_heads;
    let st: std::collections::HashMap<String, Vec<f64>> = read_safetensors(&src.join("model.safetensors"))
        .into_iter()
        .map(|t| (t.name.clone(), t.f32s().into_iter().map(f64::from).collect()))
        .collect();

    let dir = TempDir::new("dex");
    let folded_path = dir.join("folded.gguf");
    let kept_path = dir.join("kept.gguf");
    convert(&src, Preset::F32, &folded_path, false, &[]);
    convert(&src, Preset::F32, &kept_path, true, &[]);
    let folded = GgufFile::open(&folded_path).unwrap();
    let kept = GgufFile::open(&kept_path).unwrap();

    for (layer, hs) in heads.iter().enumerate() {
        let p = format!("model.layers.{layer}.self_attn");
        let wo = &st[&format!("{p}.o_proj.weight")]; // [hidden][n_heads·hd], row-major
        let wd = &st[&format!("{p}.dex_proj.weight")]; // [hd][hd]
        let lambda = st[&format!("{p}.dex_lambda")][0];
        let cols = n_heads * hd;
        let got = f32s(&folded, &format!("blk.{layer}.attn_output.weight"));
        assert_eq!(got.len(), hidden * cols);
        let mut changed = 0usize;
        for r in 0..hidden {
            for h in 0..n_heads {
                for j in 0..hd {
                    let c = h * hd + j;
                    let g = got[r * cols + c] as f64;
                    if hs.contains(&h) {
                        // (Wo_h · (I − λ W_D)ᵀ)[r][j] = Σ_k Wo_h[r][k] · (δ_jk − λ·W_D[j][k])
                        let want: f64 = (0..hd)
                            .map(|k| {
                                wo[r * cols + h * hd + k] * (f64::from(u8::from(j == k)) - lambda * wd[j * hd + k])
                            })
                            .sum();
                        // One rounding of the exact product to f32: at most an ulp.
                        assert!(
                            (g - want).abs() <= want.abs() * 2f64.powi(-23) + 1e-300,
                            "layer {layer} row {r} head {h} col {j}: {g} vs {want}"
                        );
                        changed += usize::from(g != wo[r * cols + c]);
                    } else {
                        assert_eq!(g, wo[r * cols + c], "layer {layer} row {r} head {h}: untouched");
                    }
                }
            }
        }
        assert!(changed > hidden * hs.len() * hd / 2, "layer {layer}: the fold changes the adapted heads");

        // Unfolded: Wo as in the checkpoint, W_D and λ as tensors.
        let wo_kept = f32s(&kept, &format!("blk.{layer}.attn_output.weight"));
        assert!(wo_kept.iter().zip(wo).all(|(a, b)| *a as f64 == *b));
        let wd_kept = f32s(&kept, &format!("blk.{layer}.attn_dex.weight"));
        assert_eq!(kept.tensor(&format!("blk.{layer}.attn_dex.weight")).unwrap().dims(), &[hd as u64, hd as u64]);
        assert!(wd_kept.iter().zip(wd).all(|(a, b)| *a as f64 == *b));
        assert_eq!(f32s(&kept, &format!("blk.{layer}.attn_dex_lambda.weight")), vec![lambda as f32]);
    }

    // Nothing else differs between the two files.
    let mut compared = 0;
    for t in folded.tensors() {
        assert!(!t.name().contains("dex"), "the folded file has no DEX tensors");
        if !t.name().ends_with("attn_output.weight") {
            assert!(folded.tensor_data(t) == kept.tensor_bytes(t.name()).unwrap(), "{} differs", t.name());
            compared += 1;
        }
    }
    assert_eq!(compared, folded.tensors().len() - 2);
    assert_eq!(kept.tensors().len(), folded.tensors().len() + 4);
    assert!(folded.get("duet.dex.head_mask").is_none());
    let mask = kept.get("duet.dex.head_mask").expect("--keep-dex records the head mask");
    assert_eq!(mask, &Value::Array(Array::U8(vec![1, 0, 1, 0, 0, 1, 0, 0])));

    // gguf-py's view of both (and of a quantized folded file), with the checker's own fold.
    let q = dir.join("folded-q8_0.gguf");
    convert(&src, Preset::Q8_0, &q, false, &[]);
    let jobs = [
        job(&folded_path, &src, Preset::F32, false, &[]),
        job(&kept_path, &src, Preset::F32, true, &[]),
        job(&q, &src, Preset::Q8_0, false, &[]),
    ];
    if let Some(s) = check("dex_folds_into_attn_output_or_stays_separate", &dir, &jobs) {
        for name in ["blk.0.attn_output.weight", "blk.1.attn_output.weight"] {
            assert!(s[0]["dex_changed"][name].as_f64().unwrap() > 0.01, "the checker folded {name}");
        }
    }
}
