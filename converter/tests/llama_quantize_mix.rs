//! duet's type mix against llama-quantize's own choices: every tensor of every recorded case
//! (Llama shapes of 1 to 32 layers, GQA 1 to 8, tied and untied outputs, rows that are not
//! whole K-quant blocks) for every quantized preset, as llama-quantize at llama.cpp 0c1e57098
//! wrote them (fixtures/llama_quantize_mix.json, made by fixtures/make_llama_quantize_mix.sh
//! from llama-quantize itself). The plan is asked as `duet convert` asks it for a GGUF input:
//! in llama-quantize's order, tied when the file has no output.weight.

use duet_convert::Preset;
use duet_convert::quant_plan::{Planner, llama_cpp_order};
use serde_json::Value;

#[test]
fn the_type_mix_is_llama_quantizes_for_every_recorded_shape_and_preset() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama_quantize_mix.json");
    let record: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let (mut compared, mut differences) = (0usize, Vec::new());
    let cases = record["cases"].as_array().unwrap();
    assert!(cases.len() >= 5, "the record holds its cases");
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let n_layers = case["n_layers"].as_u64().unwrap() as usize;
        let tensors: Vec<(String, usize, usize)> = case["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                (t[0].as_str().unwrap().to_string(), t[1].as_u64().unwrap() as usize, t[2].as_u64().unwrap() as usize)
            })
            .collect();
        let tied = !tensors.iter().any(|t| t.0 == "output.weight");
        assert_eq!(tied, case["tied"].as_bool().unwrap(), "{name}: tied as recorded");
        let names: Vec<&str> = tensors.iter().map(|t| t.0.as_str()).collect();
        for (ty_name, want) in case["types"].as_object().unwrap() {
            let preset = Preset::parse(ty_name).unwrap_or_else(|| panic!("{ty_name}: not a duet preset"));
            let mut planner = Planner::new(preset, n_layers, tied, false, &[]);
            for i in llama_cpp_order(&names) {
                let (tensor, ne0, n_dims) = &tensors[i];
                let got = planner.choose(tensor, *n_dims, *ne0);
                // (Recorded in the order of "tensors".)
                let want = want[i].as_str().unwrap();
                compared += 1;
                if !got.name().eq_ignore_ascii_case(want) {
                    differences.push(format!("{name} {ty_name} {tensor}: duet {got}, llama-quantize {want}"));
                }
            }
        }
    }
    assert!(compared > 1000, "{compared} tensor choices compared");
    assert!(differences.is_empty(), "{} of {compared} differ:\n{}", differences.len(), differences.join("\n"));
}
