//! Packed matmul kernels against the per-row dot kernels, one thread.
//!
//!     cargo bench -p duet-quant --bench gemm [-- FILTER] [--quick]
//!
//! Shapes are TinyLlama-1.1B's FFN (5632×2048 and 2048×5632). For each weight type and
//! kernel set: decode (1 token; GB/s of weights streamed; the matrix stays in the last-level
//! cache when it fits, so this is the kernel's speed, not DRAM's) and prompt processing (128
//! tokens; GMAC/s). Times are medians of repeated runs, measured as this thread's CPU time
//! (CLOCK_THREAD_CPUTIME_ID on Linux) so that other load on the machine inflates them less.

use std::time::Instant;

use duet_quant::GgmlType;
use duet_quant::dot::{ActRow, kernels};
use duet_quant::gemm::{ActKind, GemmKernels, PackedMatrix, QActs, available, serial};

#[cfg(target_os = "linux")]
fn cpu_seconds() -> f64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    unsafe extern "C" {
        fn clock_gettime(clk: i32, ts: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: a valid out-pointer; the call only writes it.
    unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.sec as f64 + ts.nsec as f64 * 1e-9
}

#[cfg(not(target_os = "linux"))]
fn cpu_seconds() -> f64 {
    use std::sync::OnceLock;
    static T0: OnceLock<Instant> = OnceLock::new();
    T0.get_or_init(Instant::now).elapsed().as_secs_f64()
}

/// Median seconds per call of `f`, over `reps` timed calls after a warm-up.
fn median_time(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut v: Vec<f64> = (0..reps)
        .map(|_| {
            let t = cpu_seconds();
            f();
            cpu_seconds() - t
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn pseudo_normal(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            let mut u = 0.0;
            for _ in 0..4 {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                u += (s >> 11) as f64 / (1u64 << 53) as f64;
            }
            ((u - 2.0) * 1.7) as f32
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let quick = args.iter().any(|a| a == "--quick");
    let filter: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let types = [
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q5_K,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::F16,
        GgmlType::BF16,
    ];
    let sets = available();
    let start = Instant::now();
    println!("| type | shape | kernels | decode µs | decode GB/s | pp128 ms | pp128 GMAC/s |");
    println!("|---|---|---|---|---|---|---|");
    for ty in types {
        for (rows, cols) in [(5632usize, 2048usize), (2048, 5632)] {
            let label = format!("{ty} {rows}x{cols}");
            if !filter.is_empty() && !filter.iter().any(|f| label.contains(f.as_str())) {
                continue;
            }
            let w = pseudo_normal(rows * cols, 1);
            let row_bytes = duet_quant::row_bytes(ty, cols).unwrap();
            let mut wb = vec![0u8; row_bytes * rows];
            duet_quant::quantize(ty, &w, cols, &mut wb).unwrap();
            let n_pp = 128;
            let x = pseudo_normal(n_pp * cols, 2);
            let reps = if quick { 5 } else { 21 };
            // Per-row reference kernels (what the runtime used before packing).
            {
                let k = kernels();
                let act = ActRow::quantize_for(ty, &x[..cols]);
                let mut out = vec![0f32; rows];
                let t = median_time(reps, || {
                    for (r, o) in out.iter_mut().enumerate() {
                        *o = k.vec_dot(ty, &wb[r * row_bytes..(r + 1) * row_bytes], &act).unwrap();
                    }
                });
                let acts: Vec<ActRow> =
                    (0..n_pp).map(|i| ActRow::quantize_for(ty, &x[i * cols..(i + 1) * cols])).collect();
                let mut out = vec![0f32; rows * n_pp];
                let tp = median_time(reps.min(5), || {
                    for r in 0..rows {
                        let wr = &wb[r * row_bytes..(r + 1) * row_bytes];
                        for (i, a) in acts.iter().enumerate() {
                            out[i * rows + r] = k.vec_dot(ty, wr, a).unwrap();
                        }
                    }
                });
                report(&label, &format!("per-row {}", k.name), t, wb.len(), tp, rows * cols * n_pp);
            }
            let packed = PackedMatrix::pack(ty, &wb, rows, cols, &serial).unwrap();
            let kind = ActKind::for_weight(ty).unwrap();
            let mut a1 = QActs::new(kind);
            a1.quantize(&x[..cols], 1, cols, &serial);
            let mut ap = QActs::new(kind);
            ap.quantize(&x, n_pp, cols, &serial);
            for k in sets.iter().filter(|k| k.fast) {
                let mut out = vec![0f32; rows * n_pp];
                let t = median_time(reps, || gemm(k, &packed, &a1, &mut out));
                let tp = median_time(reps.min(7), || gemm(k, &packed, &ap, &mut out));
                report(&label, k.name, t, packed.bytes(), tp, rows * cols * n_pp);
            }
            // Activation quantization (part of every matmul's cost).
            let mut aq = QActs::new(kind);
            let tq = median_time(reps.min(7), || aq.quantize(&x, n_pp, cols, &serial));
            println!("| {label} | quantize 128×{cols} activations ({kind:?}) | | | | {:.3} | |", tq * 1e3);
        }
    }
    eprintln!("total {:.1} s", start.elapsed().as_secs_f64());
}

fn gemm(k: &GemmKernels, w: &PackedMatrix, a: &QActs, out: &mut [f32]) {
    k.gemm(w, a, out).unwrap();
}

fn report(label: &str, kname: &str, t_dec: f64, bytes: usize, t_pp: f64, macs: usize) {
    println!(
        "| {label} | {kname} | {:.1} | {:.1} | {:.2} | {:.1} |",
        t_dec * 1e6,
        bytes as f64 / t_dec / 1e9,
        t_pp * 1e3,
        macs as f64 / t_pp / 1e9
    );
}
