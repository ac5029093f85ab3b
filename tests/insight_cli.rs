//! `duet attn-map` and `duet needle` end to end on the committed fixtures: the files they
//! write (SVG parsed as XML, PNG headers, .npy maps that are causal attention weights, JSON
//! and CSV that agree), GPU maps equal to the CPU's, the HTML reports (these two and
//! attn-bench's) rendered in headless Chromium without console errors and with every
//! figure drawn, and bad input refused with a message and nothing written.

mod common;

use std::path::{Path, PathBuf};

use common::{TempDir, duet, ok, temp_dir};
use duet_test_support::{chromium, load_in_chromium, no_gpu};
use serde_json::Value;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn convert(fixture: &str, out: &Path, ty: &str) {
    let src = root().join("tests/fixtures/models").join(fixture);
    ok(&duet(&["convert", src.to_str().unwrap(), "--type", ty, "-q", "-o", out.to_str().unwrap()]));
}

/// The GQA DiffLlama and Llama fixtures as Q8_0 GGUFs in `t`: (diff, llama).
fn q8_pair(t: &TempDir) -> (PathBuf, PathBuf) {
    let (diff, llama) = (t.0.join("diff.gguf"), t.0.join("llama.gguf"));
    convert("diffllama-gqa", &diff, "q8_0");
    convert("llama-gqa", &llama, "q8_0");
    (diff, llama)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

const PROMPT: &str = "Call me Ishmael. Some years ago, never mind how long.";

/// A `.npy` file of f32: (shape, data).
fn read_npy(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let b = std::fs::read(path).unwrap();
    assert_eq!(&b[..8], b"\x93NUMPY\x01\x00", "{}", path.display());
    let hlen = u16::from_le_bytes([b[8], b[9]]) as usize;
    let header = std::str::from_utf8(&b[10..10 + hlen]).unwrap();
    assert!(header.contains("'descr': '<f4'") && header.contains("'fortran_order': False"), "{header}");
    let shape_str = header.split("'shape': (").nth(1).unwrap().split(')').next().unwrap();
    let shape: Vec<usize> =
        shape_str.split(',').filter(|x| !x.trim().is_empty()).map(|x| x.trim().parse().unwrap()).collect();
    let data: Vec<f32> = b[10 + hlen..].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(shape.iter().product::<usize>(), data.len());
    (shape, data)
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Runs attn-map and returns the index.
fn attn_map(model: &Path, out: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["attn-map", "-q", "-m", s(model), "-p", PROMPT, "-o", s(out)];
    args.extend(extra);
    ok(&duet(&args));
    json(&out.join("maps.json"))
}

#[test]
fn attn_map_writes_causal_attention_weights_svg_png_and_an_index() {
    let t = temp_dir("maps");
    let (diff, llama) = q8_pair(&t);
    for (model, differential) in [(&diff, true), (&llama, false)] {
        let out = t.0.join(if differential { "diff-maps" } else { "llama-maps" });
        let index = attn_map(model, &out, &["--layers", "1", "--heads", "0,1"]);
        let n = index["tokens"].as_array().unwrap().len();
        assert!(n > 10, "the prompt's tokens are listed");
        let entries = index["entries"].as_array().unwrap();
        assert_eq!(entries.len(), 2, "layer 1, heads/pairs 0 and 1");
        let (shape, data) = read_npy(&out.join("layer01.npy"));
        let per_head = if differential { 3 } else { 1 };
        assert_eq!(shape, [2, per_head, n, n]);
        for (e, entry) in entries.iter().enumerate() {
            let map = |m: usize| &data[(e * per_head + m) * n * n..(e * per_head + m + 1) * n * n];
            let lambda = entry["lambda"].as_f64().map(|l| l as f32);
            assert_eq!(lambda.is_some(), differential);
            for m in 0..per_head {
                let w = map(m);
                for i in 0..n {
                    let row = &w[i * n..(i + 1) * n];
                    assert!(row[i + 1..].iter().all(|&x| x == 0.0), "causal: nothing after position {i}");
                    let sum: f32 = row.iter().sum();
                    // Softmax rows sum to 1; DIFF's A1 − λ·A2 rows to 1 − λ.
                    let want = if m == 2 { 1.0 - lambda.unwrap() } else { 1.0 };
                    assert!((sum - want).abs() < 1e-4, "entry {e} map {m} row {i} sums to {sum}, not {want}");
                    if m < 2 || !differential {
                        assert!(row.iter().all(|&x| x >= 0.0));
                    }
                }
            }
            if differential {
                let l = lambda.unwrap();
                for ((&a1, &a2), &d) in map(0).iter().zip(map(1)).zip(map(2)) {
                    assert!((a1 - l * a2 - d).abs() < 1e-6);
                }
            }
            for key in ["svg", "png"] {
                let f = out.join(entry[key].as_str().unwrap());
                let bytes = std::fs::read(&f).unwrap();
                if key == "svg" {
                    let text = String::from_utf8(bytes).unwrap();
                    let doc = roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
                    let images = doc.descendants().filter(|n| n.has_tag_name("image")).count();
                    assert_eq!(images, per_head, "one heatmap per map");
                    // n ≤ 70 tokens: cells are large enough for token labels on both axes.
                    let labels = doc.descendants().filter(|n| n.has_tag_name("text")).count();
                    assert!(labels >= 2 * n * per_head, "token labels on the axes ({labels} texts)");
                } else {
                    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
                    let width = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
                    assert!(width as usize > per_head * n, "{} is {width} px wide", f.display());
                }
            }
        }
    }
}

/// DIFF V2 pairs: A₂ᵢ and A₂ᵢ₊₁ are softmaxes, the combination is A₂ᵢ − λₜ·A₂ᵢ₊₁ with each
/// row's own λₜ ∈ (0, 1) from maps.json (rows sum to 1 − λₜ), and `lambda` is their mean.
#[test]
fn attn_map_of_diff_v2_pairs_uses_each_rows_gate() {
    let t = temp_dir("v2-maps");
    let v2 = t.0.join("v2.gguf");
    convert("diffllama-v2-gqa", &v2, "q8_0");
    let out = t.0.join("maps");
    let index = attn_map(&v2, &out, &["--layers", "0", "--heads", "1,3"]);
    assert_eq!(index["arch"], "diffllama_v2");
    let n = index["tokens"].as_array().unwrap().len();
    let (shape, data) = read_npy(&out.join("layer00.npy"));
    assert_eq!(shape, [2, 3, n, n]);
    for (e, entry) in index["entries"].as_array().unwrap().iter().enumerate() {
        let pair = entry["pair"].as_u64().unwrap() as usize;
        assert_eq!(entry["query_heads"], serde_json::json!([2 * pair, 2 * pair + 1]));
        let lambdas: Vec<f32> =
            entry["row_lambda"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        assert_eq!(lambdas.len(), n);
        assert!(lambdas.iter().all(|&l| l > 0.0 && l < 1.0), "sigmoid gates: {lambdas:?}");
        let mean = lambdas.iter().sum::<f32>() / n as f32;
        assert!((entry["lambda"].as_f64().unwrap() as f32 - mean).abs() < 1e-6);
        let spread = lambdas.iter().fold(0f32, |m, &l| m.max((l - mean).abs()));
        assert!(spread > 1e-3, "the gate depends on the token ({spread})");
        let map = |m: usize| &data[(e * 3 + m) * n * n..(e * 3 + m + 1) * n * n];
        for (i, &l) in lambdas.iter().enumerate() {
            for m in 0..2 {
                let sum: f32 = map(m)[i * n..(i + 1) * n].iter().sum();
                assert!((sum - 1.0).abs() < 1e-4, "entry {e} map {m} row {i} sums to {sum}");
            }
            let sum: f32 = map(2)[i * n..(i + 1) * n].iter().sum();
            assert!((sum - (1.0 - l)).abs() < 1e-4, "row {i}: {sum} vs 1 − λₜ = {}", 1.0 - l);
            for j in 0..n {
                let (a, b, d) = (map(0)[i * n + j], map(1)[i * n + j], map(2)[i * n + j]);
                assert!((a - l * b - d).abs() < 1e-6);
            }
        }
    }
}

/// GPU maps against the CPU's, on F32 weights. With f32 arithmetic (`DUET_GPU_F16=0`) the
/// two differ only in summation order, which layer 0 passes on to layer 1's q and k as
/// relative errors of a few 1e-6: ≤ 1e-4 (lavapipe: 3.6e-7 in layer 0, 3.1e-5 in layer 1). Where the adapter multiplies in f16 by
/// default (hardware with SHADER_F16), that run is checked too, against a bound from the
/// arithmetic: q and k rounded to f16 (relative error ≤ 2⁻¹¹ each) move a logit s by
/// ≤ 2⁻¹⁰·|s|, ≤ 8e-3 for the fixtures' |s| < 8; a softmax weight p moves by ≤ p(1−p) times
/// that, ≤ 2e-3, and a DIFF map (one softmax minus λ times another, λ < 1) by ≤ 4e-3.
#[test]
fn attn_map_on_the_gpu_matches_the_cpu() {
    let f16_default = match duet_runtime::gpu::GpuBackend::new(&Default::default()) {
        Ok(b) => duet_runtime::backend::Backend::describe(&b).contains("f16 (f32 sums) products"),
        Err(e) => {
            no_gpu("attn_map_on_the_gpu_matches_the_cpu", &format!("no usable GPU adapter ({e})"));
            return;
        }
    };
    let t = temp_dir("gpu");
    let mut runs = vec![("f32", "0", 1e-4f32)];
    if f16_default {
        runs.push(("f16", "1", 4e-3));
    }
    // DIFF and DIFF V2 (whose combined maps use the gates the GPU reads back).
    for fixture in ["diffllama-gqa", "diffllama-v2-gqa"] {
        let model = t.0.join(format!("{fixture}.gguf"));
        convert(fixture, &model, "f32");
        let cpu = t.0.join(format!("{fixture}-cpu"));
        attn_map(&model, &cpu, &["--device", "cpu"]);
        for &(arith, env, bound) in &runs {
            let gpu = t.0.join(format!("{fixture}-gpu-{arith}"));
            let o = std::process::Command::new(env!("CARGO_BIN_EXE_duet"))
                .args(["attn-map", "-q", "-m", s(&model), "-p", PROMPT, "-o", s(&gpu), "--device", "gpu"])
                .env("DUET_GPU_F16", env)
                .output()
                .unwrap();
            ok(&o);
            for l in ["layer00.npy", "layer01.npy"] {
                let (sa, a) = read_npy(&cpu.join(l));
                let (sb, b) = read_npy(&gpu.join(l));
                assert_eq!(sa, sb);
                let worst = a.iter().zip(&b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                eprintln!("{fixture} {l} {arith}: max |GPU − CPU| {worst:.2e}");
                assert!(worst <= bound, "{fixture} {l} ({arith} products): GPU and CPU maps differ by up to {worst}");
            }
        }
    }
}

#[test]
fn needle_reports_attention_to_answer_noise_and_retrieval() {
    let t = temp_dir("needle");
    let (diff, llama) = q8_pair(&t);
    let out = t.0.join("out");
    let stdout = ok(&duet(&[
        "needle",
        "-q",
        "-m",
        s(&diff),
        "-m",
        s(&llama),
        "--ctx",
        "200",
        "--depths",
        "0,50,100",
        "-o",
        s(&out),
        "--device",
        "cpu",
    ]));
    let j = json(&out.join("needle.json"));
    let models = j["models"].as_array().unwrap();
    assert_eq!(models.len(), 2);
    assert_eq!(models[0]["arch"], "diffllama");
    for m in models {
        let results = m["results"].as_array().unwrap();
        assert_eq!(results.len(), 3);
        let requested: Vec<f64> = results.iter().map(|r| r["requested_depth"].as_f64().unwrap()).collect();
        assert_eq!(requested, [0.0, 50.0, 100.0]);
        assert_eq!(results[0]["depth"], 0.0, "depth 0 puts the needle first");
        assert_eq!(results[2]["depth"], 100.0, "depth 100 puts it right before the query");
        for r in results {
            let (a, n) = (r["attention_to_answer"].as_f64().unwrap(), r["attention_noise"].as_f64().unwrap());
            assert!(r["prompt_tokens"].as_u64().unwrap() <= 200);
            assert!(a.is_finite() && n.is_finite() && a + n <= 1.0 + 1e-6, "{r}");
            if m["arch"] == "llama" {
                assert!(a >= 0.0 && n >= 0.0);
            }
            assert_eq!(r["layer_attention_to_answer"].as_array().unwrap().len(), 2);
        }
    }
    // The table prints what the JSON holds.
    let first = &models[0]["results"][0];
    assert!(stdout.contains(&format!("{:.3}", first["attention_to_answer"].as_f64().unwrap())), "{stdout}");
    assert_eq!(std::fs::read_to_string(out.join("needle.csv")).unwrap().lines().count(), 1 + 2 * 3);
    let svg = std::fs::read_to_string(out.join("needle.svg")).unwrap();
    roxmltree::Document::parse(&svg).unwrap();
}

#[test]
fn html_reports_load_in_chromium_without_errors_and_draw_every_figure() {
    let Some(browser) = chromium("html_reports_load_in_chromium_without_errors_and_draw_every_figure") else { return };
    let t = temp_dir("html");
    let (diff, llama) = q8_pair(&t);
    let maps = t.0.join("maps");
    let index = attn_map(&diff, &maps, &["--html"]);
    let needle = t.0.join("needle");
    ok(&duet(&[
        "needle",
        "-q",
        "-m",
        s(&diff),
        "-m",
        s(&llama),
        "--ctx",
        "128",
        "--depths",
        "0,100",
        "-o",
        s(&needle),
        "--html",
    ]));
    let bench = t.0.join("bench");
    let text = root().join("tests/smollm2/text.txt");
    ok(&duet(&["attn-bench", "--quick", "-q", "-m", s(&llama), "-f", s(&text), "-o", s(&bench), "--html"]));
    let pages = [
        (maps.join("report.html"), index["entries"].as_array().unwrap().len()),
        (needle.join("report.html"), 1),
        (bench.with_extension("html"), 1),
    ];
    for (page, figures) in pages {
        let html = std::fs::read_to_string(&page).unwrap();
        assert!(
            !html.contains("src=\"http") && !html.contains("href=\"http"),
            "{}: nothing from the network",
            page.display()
        );
        let check = load_in_chromium(&browser, &page);
        assert!(check.console.is_empty(), "{}: console messages {:?}", page.display(), check.console);
        assert_eq!(check.body_attr("data-errors"), None, "{}: script errors", page.display());
        assert_eq!(
            check.body_attr("data-figures"),
            Some(figures.to_string()),
            "{}: {}",
            page.display(),
            check.body_tag
        );
        assert_eq!(
            check.body_attr("data-rendered"),
            Some(figures.to_string()),
            "{}: every figure has a box",
            page.display()
        );
    }
}

/// Runs duet expecting a refusal: a nonzero exit, one "error:" message containing `want`, no
/// panic, and nothing at `out`.
fn refused(args: &[&str], want: &str, out: &Path) {
    let o = duet(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{args:?} should fail");
    assert!(err.contains("error:") && err.contains(want), "{args:?}: expected '{want}' in: {err}");
    assert!(!err.contains("panicked") && !err.contains("RUST_BACKTRACE"), "{args:?} panicked: {err}");
    assert!(!out.exists(), "{args:?} wrote {}", out.display());
}

#[test]
fn bad_input_is_refused_with_a_message_and_nothing_written() {
    let t = temp_dir("bad");
    let (diff, llama) = q8_pair(&t);
    let out = t.0.join("out");
    let o = s(&out);
    refused(
        &["attn-map", "-q", "-m", s(&llama), "-p", PROMPT, "--layers", "2", "-o", o],
        "layer 2 is out of range: the model has 2 layers",
        &out,
    );
    refused(
        &["attn-map", "-q", "-m", s(&llama), "-p", PROMPT, "--heads", "4", "-o", o],
        "head 4 is out of range: the model's layers have 4 heads",
        &out,
    );
    refused(&["attn-map", "-q", "-m", s(&diff), "-p", PROMPT, "--heads", "2", "-o", o], "have 2 DIFF head pairs", &out);
    refused(&["attn-map", "-q", "-m", s(&llama), "-p", PROMPT, "-c", "8", "-o", o], "but the context holds 8", &out);
    refused(&["attn-map", "-q", "-m", s(&llama), "-o", o], "no prompt", &out);
    refused(&["needle", "-q", "-m", s(&llama), "--ctx", "40", "-o", o], "the needle does not fit", &out);
    refused(
        &["needle", "-q", "-m", s(&llama), "--depths", "150", "-o", o],
        "depths are percentages from 0 to 100",
        &out,
    );
    refused(&["needle", "-q", "-m", s(&t.0.join("missing.gguf")), "-o", o], "no such model file", &out);
}
