//! attn-bench results as JSON (schema `duet.attn-bench/1`, documented in
//! docs/attn-bench.schema.json), CSV, a readable table and an SVG plot.

use serde_json::{Value, json};

use super::plot::{Panel, Series, render};
use super::{BenchReport, ModelReport, RunResult};

pub const SCHEMA: &str = "duet.attn-bench/1";

fn target_name(r: &RunResult) -> &'static str {
    r.target.map_or("none", |t| t.name())
}

/// "tensor"/"head"/"row"/"static" for logit runs, the cache scheme's label for cache runs
/// ("block32", or "chan32", "rot64", "chan32+rot64"), "none" for the baseline.
fn granularity_name(r: &RunResult) -> &'static str {
    match (r.target, r.granularity, r.cache_scheme) {
        (Some(_), Some(g), _) => g.name(),
        (Some(t), None, Some(c)) => c.label(t),
        _ => "none",
    }
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 }
}

fn max(v: &[f64]) -> f64 {
    v.iter().fold(0f64, |m, &x| m.max(x))
}

/// JSON numbers must be finite: anything else (a diverged run) becomes null.
fn num(x: f64) -> Value {
    if x.is_finite() { json!(x) } else { Value::Null }
}

fn nums(v: &[f64]) -> Value {
    Value::Array(v.iter().map(|&x| num(x)).collect())
}

pub fn to_json(r: &BenchReport) -> Value {
    let models: Vec<Value> = r
        .models
        .iter()
        .map(|m| {
            let runs: Vec<Value> = m
                .runs
                .iter()
                .map(|run| {
                    json!({
                        "target": target_name(run),
                        "bits": run.bits,
                        "granularity": granularity_name(run),
                        "ppl": num(run.ppl),
                        "mean_kl": num(run.mean_kl),
                        "top1": num(run.top1),
                        "layer_rel_err": nums(&run.layer_rel_err),
                        "branch1_rel_err": run.branch1_rel_err.as_deref().map_or(Value::Null, nums),
                        "branch2_rel_err": run.branch2_rel_err.as_deref().map_or(Value::Null, nums),
                        "diff_rel_err": run.diff_rel_err.as_deref().map_or(Value::Null, nums),
                    })
                })
                .collect();
            json!({
                "model": m.path,
                "arch": m.arch,
                "n_layers": m.n_layers,
                "tokens": m.n_tokens,
                "windows": m.n_windows,
                "outliers": {
                    "columns": ["top1", "top2", "top3", "top10", "top100", "median"],
                    "attention_logits": m.logits_top,
                    "hidden_states": m.hidden_top,
                },
                "runs": runs,
                "skipped": m.skipped,
            })
        })
        .collect();
    json!({ "schema": SCHEMA, "text": r.text, "tokens": r.n_tokens, "models": models })
}

/// [`to_json`], pretty-printed.
pub fn to_json_string(r: &BenchReport) -> String {
    serde_json::to_string_pretty(&to_json(r)).expect("JSON values serialise")
}

/// A CSV field, quoted when it holds a comma, a quote or a newline.
pub(crate) fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_string() }
}

/// One line per (model, run); layer errors summarised by mean and max.
pub fn to_csv(r: &BenchReport) -> String {
    let mut out = String::from(
        "model,arch,target,bits,granularity,ppl,mean_kl,top1,layer_rel_err_mean,layer_rel_err_max,\
         branch1_rel_err_mean,branch2_rel_err_mean,diff_rel_err_mean\n",
    );
    for m in &r.models {
        for run in &m.runs {
            let opt = |v: &Option<Vec<f64>>| v.as_deref().map_or(String::new(), |v| format!("{:.6e}", mean(v)));
            out.push_str(&format!(
                "{},{},{},{},{},{:.6},{:.6e},{:.6},{:.6e},{:.6e},{},{},{}\n",
                csv_field(&m.path),
                m.arch,
                target_name(run),
                run.bits,
                granularity_name(run),
                run.ppl,
                run.mean_kl,
                run.top1,
                mean(&run.layer_rel_err),
                max(&run.layer_rel_err),
                opt(&run.branch1_rel_err),
                opt(&run.branch2_rel_err),
                opt(&run.diff_rel_err),
            ));
        }
    }
    out
}

/// A Markdown table per model (also readable in a terminal), plus its outlier table.
pub fn to_table(r: &BenchReport) -> String {
    let mut out = String::new();
    for m in &r.models {
        let windows = if m.n_windows > 1 { format!(" in {} windows", m.n_windows) } else { String::new() };
        out.push_str(&format!(
            "\n{} ({}, {} layers) over {} tokens{windows}\n\n",
            m.path, m.arch, m.n_layers, m.n_tokens
        ));
        out.push_str("| target | bits | granularity | PPL | mean KL | top-1 | attn-out rel. err (mean/max) |");
        let diff = m.runs.first().is_some_and(|r| r.diff_rel_err.is_some());
        if diff && m.arch == "diffllama_v2" {
            out.push_str(" head 2i | head 2i+1 | o₂ᵢ−σ(λ)·o₂ᵢ₊₁ |");
        } else if diff {
            out.push_str(" A1·V | A2·V | A1·V−λA2·V |");
        }
        out.push('\n');
        out.push_str("|---|---|---|---|---|---|---|");
        if diff {
            out.push_str("---|---|---|");
        }
        out.push('\n');
        for run in &m.runs {
            out.push_str(&format!(
                "| {} | {} | {} | {:.3} | {:.2e} | {:.1}% | {:.2e} / {:.2e} |",
                target_name(run),
                run.bits,
                granularity_name(run),
                run.ppl,
                run.mean_kl,
                100.0 * run.top1,
                mean(&run.layer_rel_err),
                max(&run.layer_rel_err)
            ));
            if diff {
                let f = |v: &Option<Vec<f64>>| v.as_deref().map_or("-".into(), |v| format!("{:.2e}", mean(v)));
                out.push_str(&format!(
                    " {} | {} | {} |",
                    f(&run.branch1_rel_err),
                    f(&run.branch2_rel_err),
                    f(&run.diff_rel_err)
                ));
            }
            out.push('\n');
        }
        out.push_str(&outlier_table(m));
        for s in &m.skipped {
            out.push_str(&format!("skipped: {s}\n"));
        }
    }
    out
}

fn outlier_table(m: &ModelReport) -> String {
    let row = |name: &str, t: &[f32; 6]| {
        format!("| {name} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} |\n", t[0], t[1], t[2], t[3], t[4], t[5])
    };
    format!(
        "\n| activation | top-1 | top-2 | top-3 | top-10 | top-100 | median |\n|---|---|---|---|---|---|---|\n{}{}",
        row("attention logits", &m.logits_top),
        row("hidden states", &m.hidden_top)
    )
}

/// Bits on x (16 → 4), one line per model and target (logit runs: the first granularity
/// measured; cache runs: each format), the granularity or the non-legacy cache format named
/// in the label; panels: mean KL (log scale), top-1 agreement, perplexity.
pub fn to_svg(r: &BenchReport) -> String {
    let mut kl = Vec::new();
    let mut top1 = Vec::new();
    let mut ppl = Vec::new();
    let short =
        |p: &str| std::path::Path::new(p).file_name().map_or(p.to_string(), |f| f.to_string_lossy().into_owned());
    for m in &r.models {
        let Some(base) = m.runs.iter().find(|r| r.target.is_none()) else { continue };
        let mut targets: Vec<(&str, &str)> = Vec::new();
        for run in m.runs.iter().filter(|r| r.target.is_some()) {
            let key = (target_name(run), granularity_name(run));
            let logit_taken = key.0 == "logits" && targets.iter().any(|t| t.0 == "logits");
            if !targets.contains(&key) && !logit_taken {
                targets.push(key);
            }
        }
        for (t, g) in targets {
            let runs: Vec<&RunResult> =
                m.runs.iter().filter(|r| target_name(r) == t && granularity_name(r) == g).collect();
            // Cache runs name their formats unless they are the legacy blocks.
            let label = if t == "logits" || g != "block32" {
                format!("{} {t} ({g})", short(&m.path))
            } else {
                format!("{} {t}", short(&m.path))
            };
            let pts = |f: &dyn Fn(&RunResult) -> f64, with_base: bool| {
                let mut p: Vec<(f64, f64)> = Vec::new();
                if with_base {
                    p.push((16.0, f(base)));
                }
                p.extend(runs.iter().map(|r| (r.bits as f64, f(r))));
                p.retain(|&(_, y)| y.is_finite());
                p
            };
            // KL is 0 at 16 bits: a log axis starts at the first quantized point.
            kl.push(Series { label: label.clone(), points: pts(&|r| r.mean_kl, false) });
            top1.push(Series { label: label.clone(), points: pts(&|r| 100.0 * r.top1, true) });
            ppl.push(Series { label, points: pts(&|r| r.ppl, true) });
        }
    }
    let panels = [
        Panel { title: "Mean KL to the 16-bit run".into(), y_label: "KL (nats)".into(), series: kl, log_y: true },
        Panel { title: "Top-1 agreement with 16-bit".into(), y_label: "%".into(), series: top1, log_y: false },
        Panel { title: "Perplexity".into(), y_label: "PPL".into(), series: ppl, log_y: false },
    ];
    render(
        &format!("duet attn-bench: {} tokens of {}", r.n_tokens, short(&r.text)),
        "bits",
        &[16.0, 8.0, 6.0, 4.0],
        true,
        &panels,
    )
}

/// The HTML report: the printed tables and the plot in one self-contained page.
pub fn to_html_report(r: &BenchReport) -> crate::tools::insight::html::Report {
    use crate::tools::insight::html::{Block, Report};
    Report {
        title: format!("duet attn-bench: {} tokens of {}", r.n_tokens, r.text),
        blocks: vec![
            Block::Pre(to_table(r)),
            Block::Figure {
                caption: "KL divergence, top-1 agreement and perplexity against the 16-bit run, by bits".into(),
                svg: to_svg(r),
            },
        ],
    }
}
