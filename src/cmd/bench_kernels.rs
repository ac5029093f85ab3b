//! `duet bench --gpu-kernels`: the decode matvec's variants timed on this machine's GPU
//! (duet_runtime::gpu::sweep), as tables: each variant's time on each matrix, and each
//! weight type's layer time per variant (the matrices of one Llama layer, as a decoded token
//! reads them), best first.

use anyhow::Result;
use duet_runtime::gpu::AdapterChoice;
use duet_runtime::gpu::sweep::{MatvecCase, MatvecTiming, POOL_BYTES, llama_cases, matvec_sweep};

/// Which matrices to time.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelSet {
    /// The matrices of TinyLlama-1.1B and Llama-3-8B in Q4_0, Q4_K, Q6_K and Q8_0 (weights
    /// cycling through 256 MiB pools; ~1 GiB of GPU memory a pool type)
    Llama,
    /// Two small matrices and small pools: checks that the sweep runs (tests, software adapters)
    Test,
}

/// Times of each variant name ("128x2", "128x2 trusted", "128x2-nosub") over `cases`.
fn variant(t: &MatvecTiming) -> String {
    format!("{}{}", t.shape, if t.trusted { " trusted" } else { "" })
}

pub fn run(adapter: AdapterChoice, set: KernelSet) -> Result<()> {
    let (cases, dispatches, pool) = match set {
        KernelSet::Llama => (llama_cases(), 100, POOL_BYTES),
        KernelSet::Test => (
            vec![
                MatvecCase { ty: duet_quant::GgmlType::Q4_0, rows: 96, cols: 256, what: "small" },
                MatvecCase { ty: duet_quant::GgmlType::Q6_K, rows: 40, cols: 512, what: "small" },
            ],
            4,
            1 << 16,
        ),
    };
    let timings = matvec_sweep(adapter, &cases, dispatches, pool, |m| eprintln!("kernel sweep: {m}"))?;
    let mut variants: Vec<String> = Vec::new();
    for t in &timings {
        let v = variant(t);
        if !variants.contains(&v) {
            variants.push(v);
        }
    }
    let time = |v: &str, c: &MatvecCase| {
        timings.iter().find(|t| variant(t) == v && t.case == *c).map(|t| (t.seconds, t.bytes_per_second()))
    };
    println!(
        "Decode matvec, µs per dispatch (GB/s of weights read), {dispatches} back-to-back dispatches a pass timed by the pass's timestamps:"
    );
    println!();
    print!("| variant |");
    for c in &cases {
        print!(" {} {}×{} ({}) |", c.ty, c.rows, c.cols, c.what);
    }
    println!();
    println!("|---|{}", "---|".repeat(cases.len()));
    for v in &variants {
        print!("| {v} |");
        for c in &cases {
            match time(v, c) {
                Some((s, bps)) => print!(" {:.2} ({:.0}) |", s * 1e6, bps / 1e9),
                None => print!(" — |"),
            }
        }
        println!();
    }
    // Per type: a layer's matrices (each case of the type once per time it appears in a
    // layer) summed, per variant, best first.
    let layer = |what: &str| -> usize {
        match what {
            "1.1B q, o" | "1.1B k, v" | "1.1B gate, up" | "8B q, o" | "8B gate, up" => 2,
            _ => 1,
        }
    };
    println!();
    println!(
        "Per weight type and model: the layer's matrices (q, k, v, o, gate, up, down) summed, best variants first:"
    );
    println!();
    println!("| type | model | best | µs a layer | next | µs | worst | µs |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut groups: Vec<(duet_quant::GgmlType, &str)> = Vec::new();
    for c in &cases {
        let model = c.what.split(' ').next().unwrap_or("");
        if !groups.contains(&(c.ty, model)) {
            groups.push((c.ty, model));
        }
    }
    for (ty, model) in groups {
        let members: Vec<&MatvecCase> =
            cases.iter().filter(|c| c.ty == ty && c.what.starts_with(model) && !c.what.contains("output")).collect();
        let mut sums: Vec<(f64, &String)> = variants
            .iter()
            .filter_map(|v| {
                members
                    .iter()
                    .map(|c| time(v, c).map(|(s, _)| s * layer(c.what) as f64))
                    .sum::<Option<f64>>()
                    .map(|s| (s, v))
            })
            .collect();
        sums.sort_by(|a, b| a.0.total_cmp(&b.0));
        if let (Some(best), Some(worst)) = (sums.first(), sums.last()) {
            let next = sums.get(1).unwrap_or(best);
            println!(
                "| {ty} | {model} | {} | {:.1} | {} | {:.1} | {} | {:.1} |",
                best.1,
                best.0 * 1e6,
                next.1,
                next.0 * 1e6,
                worst.1,
                worst.0 * 1e6
            );
        }
    }
    Ok(())
}
