//! `duet needle`'s results: the printed table (laid out like the DIFF paper's Table 3),
//! JSON, CSV, an SVG plot and the HTML report.

use std::fmt::Write;

use serde_json::{Value, json};

use crate::tools::attn_bench::output::csv_field;
use crate::tools::attn_bench::plot::{Panel, Series, render};
use crate::tools::insight::html::{Block, Report};
use crate::tools::insight::needle::NeedleResult;

/// One model's results over the depths.
pub struct ModelNeedle {
    pub model: String,
    pub arch: String,
    pub n_ctx: usize,
    pub results: Vec<NeedleResult>,
}

pub struct NeedleReport {
    pub needle: String,
    pub query: String,
    pub answer: String,
    pub haystack: String,
    pub models: Vec<ModelNeedle>,
}

/// A table cell from one result.
type Cell = dyn Fn(&NeedleResult) -> String;

/// The table: one row per model and metric, one column per depth.
pub fn to_table(r: &NeedleReport) -> String {
    let mut s = String::new();
    let Some(first) = r.models.first() else { return s };
    let label = |m: &ModelNeedle| format!("{} ({})", m.model, m.arch);
    let w = r.models.iter().map(|m| label(m).chars().count()).max().unwrap_or(0).max(5);
    let _ = write!(s, "{:<w$} {:<19}", "model", "metric");
    for res in &first.results {
        let _ = write!(s, " {:>7}", format!("{:.0}%", res.requested_depth));
    }
    s.push('\n');
    for m in &r.models {
        let answer = |x: &NeedleResult| format!("{:.3}", x.answer);
        let noise = |x: &NeedleResult| format!("{:.3}", x.noise);
        let retrieved = |x: &NeedleResult| String::from(if x.retrieved { "yes" } else { "no" });
        let rows: [(&str, &Cell); 3] =
            [("attention to answer", &answer), ("attention noise", &noise), ("retrieved", &retrieved)];
        for (name, f) in rows {
            let _ = write!(s, "{:<w$} {:<19}", label(m), name);
            for res in &m.results {
                let _ = write!(s, " {:>7}", f(res));
            }
            s.push('\n');
        }
    }
    s
}

pub fn to_json(r: &NeedleReport) -> Value {
    json!({
        "needle": r.needle,
        "query": r.query,
        "answer": r.answer,
        "haystack": r.haystack,
        "metric": "teacher-forced: the rows whose next token is an answer token; attention to answer = weight on the needle sentence, noise = weight on the rest of the haystack; means over rows, heads (DIFF: pairs, weights A1 − λ·A2) and layers",
        "models": r.models.iter().map(|m| json!({
            "model": m.model,
            "arch": m.arch,
            "n_ctx": m.n_ctx,
            "results": m.results.iter().map(|x| json!({
                "requested_depth": x.requested_depth,
                "depth": x.depth,
                "prompt_tokens": x.prompt_tokens,
                "attention_to_answer": x.answer,
                "attention_noise": x.noise,
                "layer_attention_to_answer": x.layer_answer,
                "layer_attention_noise": x.layer_noise,
                "retrieved": x.retrieved,
                "generated": x.generated,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

pub fn to_json_string(r: &NeedleReport) -> String {
    serde_json::to_string_pretty(&to_json(r)).expect("JSON of plain values")
}

pub fn to_csv(r: &NeedleReport) -> String {
    let mut s = String::from(
        "model,arch,requested_depth,depth,prompt_tokens,attention_to_answer,attention_noise,retrieved,generated\n",
    );
    for m in &r.models {
        for x in &m.results {
            let _ = writeln!(
                s,
                "{},{},{},{:.1},{},{:.6},{:.6},{},{}",
                csv_field(&m.model),
                m.arch,
                x.requested_depth,
                x.depth,
                x.prompt_tokens,
                x.answer,
                x.noise,
                x.retrieved,
                csv_field(&x.generated)
            );
        }
    }
    s
}

/// Two panels over depth: attention to answer and attention noise, a line per model.
pub fn to_svg(r: &NeedleReport) -> String {
    let series = |f: &dyn Fn(&NeedleResult) -> f64| -> Vec<Series> {
        r.models
            .iter()
            .map(|m| Series {
                label: format!("{} ({})", m.model, m.arch),
                points: m.results.iter().map(|x| (x.requested_depth, f(x))).collect(),
            })
            .collect()
    };
    let panels = [
        Panel {
            title: "Attention to answer ↑".into(),
            y_label: "weight".into(),
            series: series(&|x| x.answer),
            log_y: false,
        },
        Panel {
            title: "Attention noise ↓".into(),
            y_label: "weight".into(),
            series: series(&|x| x.noise),
            log_y: false,
        },
    ];
    let depths: Vec<f64> =
        r.models.first().map(|m| m.results.iter().map(|x| x.requested_depth).collect()).unwrap_or_default();
    render("duet needle: key-information retrieval", "needle depth (%)", &depths, false, &panels)
}

pub fn report(r: &NeedleReport) -> Report {
    Report {
        title: "duet needle: attention to the answer and attention noise".into(),
        blocks: vec![
            Block::Paragraph(format!(
                "Needle {:?} hidden in {}; query {:?}, answer {:?}. Teacher-forced: the rows whose next token is an answer token; attention to answer is the weight on the needle sentence, noise the weight on the rest of the haystack; means over those rows, every head (DIFF: every pair, weights A1 − λ·A2) and every layer. Retrieved: greedy decoding after the query starts with the answer.",
                r.needle, r.haystack, r.query, r.answer
            )),
            Block::Pre(to_table(r)),
            Block::Figure { caption: "Attention to answer and attention noise by needle depth".into(), svg: to_svg(r) },
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(depth: f64, answer: f64, retrieved: bool) -> NeedleResult {
        NeedleResult {
            requested_depth: depth,
            depth: depth + 1.5,
            prompt_tokens: 100,
            answer,
            noise: 0.5,
            layer_answer: vec![answer],
            layer_noise: vec![0.5],
            retrieved,
            generated: " marmalade, \"x\"".into(),
        }
    }

    #[test]
    fn table_csv_and_json_agree() {
        let r = NeedleReport {
            needle: "n".into(),
            query: "q".into(),
            answer: "a".into(),
            haystack: "h".into(),
            models: vec![ModelNeedle {
                model: "m.gguf".into(),
                arch: "diffllama".into(),
                n_ctx: 512,
                results: vec![result(0.0, 0.25, true), result(50.0, 0.125, false)],
            }],
        };
        let t = to_table(&r);
        assert!(t.lines().next().unwrap().contains("0%") && t.contains("0.250") && t.contains("0.125"), "{t}");
        assert!(t.lines().any(|l| l.contains("retrieved") && l.contains("yes") && l.contains("no")));
        let csv = to_csv(&r);
        assert_eq!(csv.lines().count(), 3);
        assert!(csv.contains("\" marmalade, \"\"x\"\"\""), "{csv}");
        let j = to_json(&r);
        assert_eq!(j["models"][0]["results"][1]["attention_to_answer"], 0.125);
        assert!(to_svg(&r).contains("Attention noise"));
    }
}
