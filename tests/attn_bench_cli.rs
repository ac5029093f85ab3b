//! `duet attn-bench --quick` end to end on the committed fixtures (a calibrated DiffLlama
//! and a Llama): JSON checked against runtime/src/tools/attn_bench/schema.json, the SVG parsed
//! as XML, the CSV and table consistent with the JSON, and bad input refused cleanly.

mod common;

use std::path::Path;

use common::{duet, ok, temp_dir};
use duet_test_support::json_schema::validate;
use serde_json::Value;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn convert(fixture: &str, out: &Path, calibrate: Option<&Path>) {
    let src = root().join("tests/fixtures/models").join(fixture);
    let mut args = vec!["convert", src.to_str().unwrap(), "--type", "q8_0", "-q", "-o", out.to_str().unwrap()];
    if let Some(c) = calibrate {
        args.extend(["--calibrate", c.to_str().unwrap()]);
    }
    ok(&duet(&args));
}

#[test]
fn quick_run_writes_valid_json_csv_svg() {
    let t = temp_dir("quick");
    let text = root().join("tests/smollm2/text.txt");
    let (diff, llama) = (t.0.join("diff.gguf"), t.0.join("llama.gguf"));
    convert("diffllama-gqa", &diff, Some(&text));
    convert("llama-gqa", &llama, None);
    let prefix = t.0.join("out");
    let stdout = ok(&duet(&[
        "attn-bench",
        "--quick",
        "-q",
        "-m",
        diff.to_str().unwrap(),
        "-m",
        llama.to_str().unwrap(),
        "-f",
        text.to_str().unwrap(),
        "-o",
        prefix.to_str().unwrap(),
    ]));

    let json: Value = serde_json::from_str(&std::fs::read_to_string(prefix.with_extension("json")).unwrap()).unwrap();
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("runtime/src/tools/attn_bench/schema.json")).unwrap())
            .unwrap();
    validate(&json, &schema).unwrap_or_else(|e| panic!("attn-bench JSON breaks its schema: {e}"));

    let models = json["models"].as_array().unwrap();
    assert_eq!(models.len(), 2);
    let (d, l) = (&models[0], &models[1]);
    assert_eq!(d["arch"], "diffllama");
    assert_eq!(l["arch"], "llama");
    // --quick: baseline + logits {8,4} × {tensor,row,static} + {k,v,kv} × {8,4} × {block32,
    // chan-rot}; static only where the file is calibrated, and the rotated V (blocks of 64)
    // only where K/V rows have whole blocks of 64 (not the Llama fixture's 32).
    assert_eq!(d["runs"].as_array().unwrap().len(), 1 + 6 + 12);
    assert_eq!(l["runs"].as_array().unwrap().len(), 1 + 4 + 8);
    let skipped: Vec<&str> = l["skipped"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
    assert!(skipped[0].contains("no calibration"), "{skipped:?}");
    assert!(skipped.iter().any(|s| s.contains("rot64 caches (v)") && s.contains("blocks of 64")), "{skipped:?}");
    for m in models {
        let runs = m["runs"].as_array().unwrap();
        let base = &runs[0];
        assert_eq!((base["target"].as_str(), base["bits"].as_u64()), (Some("none"), Some(16)));
        assert_eq!(base["mean_kl"].as_f64(), Some(0.0));
        assert_eq!(base["top1"].as_f64(), Some(1.0));
        let n_layers = m["n_layers"].as_u64().unwrap() as usize;
        for r in runs {
            assert_eq!(r["layer_rel_err"].as_array().unwrap().len(), n_layers);
            assert_eq!(r["diff_rel_err"].is_array(), m["arch"] == "diffllama");
        }
        // Fewer bits, more damage: the 4-bit K+V cache moves the output more than 8-bit.
        let kv = |bits: u64| {
            runs.iter().find(|r| r["target"] == "kv" && r["bits"].as_u64() == Some(bits)).unwrap()["mean_kl"]
                .as_f64()
                .unwrap()
        };
        assert!(kv(4) > kv(8) && kv(8) > 0.0, "{}: KL at 8 bits {} vs 4 bits {}", m["model"], kv(8), kv(4));
    }

    let svg = std::fs::read_to_string(prefix.with_extension("svg")).unwrap();
    let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("SVG is not XML: {e}"));
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    assert!(svg.contains("diff.gguf kv") && svg.contains("llama.gguf logits"), "a line per model and target");
    assert!(svg.contains("diff.gguf kv (chan32+rot64)"), "a line per cache format");

    let csv = std::fs::read_to_string(prefix.with_extension("csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 1 + 19 + 13, "a header and a line per run");
    assert!(lines.iter().skip(1).all(|l| l.split(',').count() == lines[0].split(',').count()));

    for needle in [
        "attention logits",
        "hidden states",
        "| kv | 4 | block32 |",
        "| kv | 4 | chan32+rot64 |",
        "| k | 8 | chan32 |",
        "A1·V−λA2·V",
        "wrote ",
    ] {
        assert!(stdout.contains(needle), "table lacks {needle:?}:\n{stdout}");
    }
}

#[test]
fn bad_input_is_refused_cleanly() {
    let t = temp_dir("bad");
    let text = root().join("tests/smollm2/text.txt");
    let o = duet(&[
        "attn-bench",
        "-m",
        "/nonexistent.gguf",
        "-f",
        text.to_str().unwrap(),
        "-o",
        t.0.join("x").to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("/nonexistent.gguf") && !err.contains("panicked"), "{err}");
    assert!(!t.0.join("x.json").exists(), "no output after a failure");
    let o = duet(&["attn-bench", "-m", "/nonexistent.gguf", "-f", text.to_str().unwrap(), "--bits", "1"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("--bits 1"));
}

/// `--windows`: the text is cut like `duet perplexity` cuts its chunks and every metric pools
/// all windows, so the 16-bit baseline's perplexity over 3 windows of 32 tokens is the one
/// `duet perplexity -c 32 --max-tokens 96` reports (f16 K/V cache in both).
#[test]
fn windows_pool_like_perplexity_chunks() {
    let t = temp_dir("windows");
    let text = root().join("tests/smollm2/text.txt");
    let model = t.0.join("llama.gguf");
    convert("llama-gqa", &model, None);
    let (m, f) = (model.to_str().unwrap(), text.to_str().unwrap());
    let prefix = t.0.join("w");
    ok(&duet(&[
        "attn-bench",
        "-q",
        "-m",
        m,
        "-f",
        f,
        "-c",
        "32",
        "-w",
        "3",
        "--bits",
        "8",
        "--targets",
        "k",
        "-o",
        prefix.to_str().unwrap(),
    ]));
    let json: Value = serde_json::from_str(&std::fs::read_to_string(prefix.with_extension("json")).unwrap()).unwrap();
    let report = &json["models"][0];
    assert_eq!((report["tokens"].as_u64(), report["windows"].as_u64()), (Some(96), Some(3)));
    let ppl = report["runs"][0]["ppl"].as_f64().unwrap();

    let out = ok(&duet(&["perplexity", "-q", "--device", "cpu", "-m", m, "-f", f, "-c", "32", "--max-tokens", "96"]));
    let want: f64 = out
        .split("PPL = ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no PPL in {out:?}"));
    assert!((ppl - want).abs() <= 1e-4 * want, "attn-bench baseline PPL {ppl} vs duet perplexity {want}");

    // Zero windows is a usage error.
    let o = duet(&["attn-bench", "-m", m, "-f", f, "-w", "0"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("--windows must be at least 1"));
}
