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
use duet_quant::gemm::{ActKind, GemmKernels, PackedMatrix, QActs, available, serial, variants};

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
    if args.iter().any(|a| a == "--stream") {
        stream(&sets, &filter, 1 << 30);
        return;
    }
    if args.iter().any(|a| a == "--ab") {
        ab(&filter);
        return;
    }
    if args.iter().any(|a| a == "--l2") {
        stream(&sets, &filter, 1 << 20);
        return;
    }
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
            let tq2 = median_time(reps.min(7), || aq.quantize_two_level(&x, n_pp, cols, &serial));
            println!(
                "| {label} | quantize 128×{cols} activations at two levels ({kind:?}) | | | | {:.3} | |",
                tq2 * 1e3
            );
        }
    }
    eprintln!("total {:.1} s", start.elapsed().as_secs_f64());
}

/// Decode over distinct matrices of `total` bytes in all: 1 GiB (`--stream`) is beyond the
/// caches, the speed when weights stream from DRAM as in real decoding; 1 MiB (`--l2`) stays
/// in L2, the kernels' compute limit.
fn stream(sets: &[GemmKernels], filter: &[&String], total: usize) {
    println!(
        "| type | kernels | decode GB/s, {} MiB of weights (1 thread, CPU time) | two-level decode GB/s |",
        total >> 20
    );
    println!("|---|---|---|---|");
    let (rows, cols) = if total < (64 << 20) { (256usize, 2048usize) } else { (2048, 2048) };
    if total >= (64 << 20) {
        // Baseline: the plain read bandwidth (AVX2 loads, summed).
        let buf: Vec<u64> = (0..(1usize << 27)).map(|i| i as u64).collect();
        let mut sink = 0u64;
        let t = median_time(5, || {
            let mut acc = [0u64; 8];
            for c in buf.chunks_exact(8) {
                for i in 0..8 {
                    acc[i] ^= c[i];
                }
            }
            sink ^= acc.iter().fold(0, |a, b| a ^ b);
        });
        println!("| (read baseline) | xor of 1 GiB | {:.1} | {sink} |", (buf.len() * 8) as f64 / t / 1e9);
    }
    for ty in [GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::F16] {
        if !filter.is_empty() && !filter.iter().any(|f| ty.to_string().contains(f.as_str())) {
            continue;
        }
        let w = pseudo_normal(rows * cols, 1);
        let row_bytes = duet_quant::row_bytes(ty, cols).unwrap();
        let mut wb = vec![0u8; row_bytes * rows];
        duet_quant::quantize(ty, &w, cols, &mut wb).unwrap();
        let one = PackedMatrix::pack(ty, &wb, rows, cols, &serial).unwrap();
        let n_mat = (total / one.bytes()).max(1);
        let mats: Vec<PackedMatrix> = (0..n_mat).map(|_| one.clone()).collect();
        let kind = ActKind::for_weight(ty).unwrap();
        let x = pseudo_normal(cols, 2);
        let mut a1 = QActs::new(kind);
        a1.quantize(&x, 1, cols, &serial);
        // The runtime's default decode: one token at two levels.
        let mut a2 = QActs::new(kind);
        a2.quantize_two_level(&x, 1, cols, &serial);
        let mut out = vec![0f32; rows];
        for k in sets.iter().filter(|k| k.fast) {
            let reps = if total < (64 << 20) { 200 } else { 5 };
            let [t1, t2] = [&a1, &a2].map(|a| {
                median_time(reps, || {
                    for m in &mats {
                        gemm(k, m, a, &mut out);
                    }
                })
            });
            let gbs = |t: f64| (n_mat * one.bytes()) as f64 / t / 1e9;
            println!("| {ty} | {} | {:.1} | {:.1} |", k.name, gbs(t1), gbs(t2));
        }
    }
}

/// Interleaved A/B comparison of the kernel sets and their tuning variants: rounds of one
/// timed call per set, best (minimum) time per set. Interleaving puts every set under the
/// same background load; the minimum is the least disturbed run.
fn ab(filter: &[&String]) {
    let mut sets: Vec<GemmKernels> = available().into_iter().filter(|k| k.fast).collect();
    sets.extend(variants());
    println!(
        "| type | shape | kernels | decode (L2) GB/s | two-level decode (L2) GB/s | pp128 GMAC/s | two-level pp128 GMAC/s |"
    );
    println!("|---|---|---|---|---|---|---|");
    for ty in [GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q4_1, GgmlType::Q5_K] {
        if !filter.is_empty() && !filter.iter().any(|f| ty.to_string().contains(f.as_str())) {
            continue;
        }
        let (rows, cols) = (256usize, 2048usize);
        let w = pseudo_normal(rows * cols, 1);
        let row_bytes = duet_quant::row_bytes(ty, cols).unwrap();
        let mut wb = vec![0u8; row_bytes * rows];
        duet_quant::quantize(ty, &w, cols, &mut wb).unwrap();
        let packed = PackedMatrix::pack(ty, &wb, rows, cols, &serial).unwrap();
        let kind = ActKind::for_weight(ty).unwrap();
        let x = pseudo_normal(128 * cols, 2);
        let mut a1 = QActs::new(kind);
        a1.quantize(&x[..cols], 1, cols, &serial);
        // One token at two levels (the runtime's default decode): 2 rows.
        let mut a2 = QActs::new(kind);
        a2.quantize_two_level(&x[..cols], 1, cols, &serial);
        let mut ap = QActs::new(kind);
        ap.quantize(&x, 128, cols, &serial);
        // 128 tokens at two levels (the default prompt): 256 rows, 128 outputs (a pair's sum
        // each); GMAC/s counts tokens.
        let mut ap2 = QActs::new(kind);
        ap2.quantize_two_level(&x, 128, cols, &serial);
        let mut out = vec![0f32; rows * 128];
        let mut best = vec![(f64::MAX, f64::MAX, f64::MAX, f64::MAX); sets.len()];
        for _ in 0..15 {
            for (i, k) in sets.iter().enumerate() {
                let t0 = cpu_seconds();
                for _ in 0..20 {
                    gemm(k, &packed, &a1, &mut out);
                }
                let t1 = cpu_seconds();
                for _ in 0..20 {
                    gemm(k, &packed, &a2, &mut out);
                }
                let t2 = cpu_seconds();
                gemm(k, &packed, &ap, &mut out);
                let t3 = cpu_seconds();
                gemm(k, &packed, &ap2, &mut out);
                let t4 = cpu_seconds();
                let b = &mut best[i];
                *b = (b.0.min((t1 - t0) / 20.0), b.1.min((t2 - t1) / 20.0), b.2.min(t3 - t2), b.3.min(t4 - t3));
            }
        }
        for (k, (td, td2, tp, tp2)) in sets.iter().zip(best) {
            println!(
                "| {ty} | {rows}x{cols} | {} | {:.1} | {:.1} | {:.1} | {:.1} |",
                k.name,
                packed.bytes() as f64 / td / 1e9,
                packed.bytes() as f64 / td2 / 1e9,
                (rows * cols * 128) as f64 / tp / 1e9,
                (rows * cols * 128) as f64 / tp2 / 1e9
            );
        }
    }
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
