//! How `duet bench` prints its rows (`-o`): a Markdown table with aligned columns, CSV, a
//! JSON array, or JSON lines as the rows are measured.

use super::super::info::human_bytes;

/// How the results are printed (`-o`, as llama-bench's).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// A Markdown table with aligned columns
    Md,
    Csv,
    /// One JSON array of the rows
    Json,
    /// One JSON object a row, each printed as soon as it is measured
    Jsonl,
}

/// One measured test.
pub struct Row {
    pub model: String,
    pub size: u64,
    pub params: u64,
    pub backend: String,
    pub threads: usize,
    pub kv: String,
    pub test: String,
    pub n_prompt: usize,
    pub n_gen: usize,
    pub depth: usize,
    pub parallel: usize,
    /// Tokens/s: median, min, max of the timed runs.
    pub tps: f64,
    pub tps_min: f64,
    pub tps_max: f64,
    /// Decode rows: the rate weights stream at.
    pub weights_gbs: Option<f64>,
}

impl Row {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "model": self.model, "size_bytes": self.size, "params": self.params, "backend": self.backend,
            "threads": self.threads, "kv_cache": self.kv, "test": self.test, "n_prompt": self.n_prompt,
            "n_gen": self.n_gen, "depth": self.depth, "parallel": self.parallel,
            "tps": self.tps, "tps_min": self.tps_min, "tps_max": self.tps_max, "weights_gbs": self.weights_gbs,
        })
    }

    /// The Markdown/CSV cells, in [`HEADER`]'s order.
    fn cells(&self) -> Vec<String> {
        vec![
            self.model.clone(),
            human_bytes(self.size),
            format!("{:.2} M", self.params as f64 / 1e6),
            self.backend.clone(),
            self.threads.to_string(),
            self.kv.clone(),
            self.test.clone(),
            format!("{:.2}", self.tps),
            format!("{:.2}–{:.2}", self.tps_min, self.tps_max),
            self.weights_gbs.map_or("—".to_string(), |g| format!("{g:.2}")),
        ]
    }
}

const HEADER: [&str; 10] = [
    "model",
    "size",
    "params",
    "backend",
    "threads",
    "KV cache",
    "test",
    "t/s (median)",
    "spread (min–max)",
    "weights GB/s",
];

/// Prints rows as `-o` says: Markdown, CSV and JSON at the end (aligned, or one array),
/// JSON lines as they come; what follows the table (dispatch counts, GPU profiles) after it,
/// on stderr for the machine-read formats so that stdout stays parseable.
pub struct Report {
    output: Output,
    rows: Vec<Row>,
    after: Vec<String>,
}

impl Report {
    pub fn new(output: Output) -> Report {
        Report { output, rows: Vec::new(), after: Vec::new() }
    }

    pub fn row(&mut self, r: Row) {
        eprintln!("bench: {} ({} threads) {}: {:.2} t/s", r.model, r.threads, r.test, r.tps);
        if self.output == Output::Jsonl {
            println!("{}", r.json());
        }
        self.rows.push(r);
    }

    /// Text for after the table.
    pub fn after(&mut self, text: String) {
        self.after.push(text);
    }

    /// A line after everything (printed at once).
    pub fn note(&self, text: String) {
        if self.output == Output::Md { println!("{text}") } else { eprintln!("{text}") }
    }

    pub fn finish(&mut self) {
        match self.output {
            Output::Md => {
                let cells: Vec<Vec<String>> = self.rows.iter().map(Row::cells).collect();
                let widths: Vec<usize> = (0..HEADER.len())
                    .map(|c| {
                        cells.iter().map(|r| r[c].chars().count()).chain([HEADER[c].chars().count()]).max().unwrap_or(0)
                    })
                    .collect();
                // Numbers right-aligned, text left-aligned.
                let right = |c: usize| matches!(c, 1 | 2 | 4 | 7 | 8 | 9);
                let line = |row: Vec<String>| {
                    let padded: Vec<String> = row
                        .iter()
                        .enumerate()
                        .map(|(c, v)| {
                            let pad = " ".repeat(widths[c] - v.chars().count());
                            if right(c) { format!("{pad}{v}") } else { format!("{v}{pad}") }
                        })
                        .collect();
                    format!("| {} |", padded.join(" | "))
                };
                println!("{}", line(HEADER.iter().map(|h| h.to_string()).collect()));
                let rule: Vec<String> = widths
                    .iter()
                    .enumerate()
                    .map(|(c, w)| if right(c) { format!("{}:", "-".repeat(w + 1)) } else { "-".repeat(w + 2) })
                    .collect();
                println!("|{}|", rule.join("|"));
                for r in cells {
                    println!("{}", line(r));
                }
            }
            Output::Csv => {
                let quote = |v: &str| {
                    if v.contains([',', '"', '\n']) { format!("\"{}\"", v.replace('"', "\"\"")) } else { v.to_string() }
                };
                println!(
                    "model,size_bytes,params,backend,threads,kv_cache,test,n_prompt,n_gen,depth,parallel,tps,tps_min,tps_max,weights_gbs"
                );
                for r in &self.rows {
                    println!(
                        "{},{},{},{},{},{},{},{},{},{},{},{:.4},{:.4},{:.4},{}",
                        quote(&r.model),
                        r.size,
                        r.params,
                        quote(&r.backend),
                        r.threads,
                        quote(&r.kv),
                        quote(&r.test),
                        r.n_prompt,
                        r.n_gen,
                        r.depth,
                        r.parallel,
                        r.tps,
                        r.tps_min,
                        r.tps_max,
                        r.weights_gbs.map_or(String::new(), |g| format!("{g:.4}"))
                    );
                }
            }
            Output::Json => {
                let all: Vec<serde_json::Value> = self.rows.iter().map(Row::json).collect();
                println!("{}", serde_json::to_string_pretty(&all).unwrap_or_default());
            }
            Output::Jsonl => {}
        }
        for text in std::mem::take(&mut self.after) {
            self.note(String::new());
            self.note(text);
        }
    }
}
