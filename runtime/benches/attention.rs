//! Decode-step attention over a long K/V cache, per pair of K/V cache types, on the CPU
//! backend: `cargo bench -p duet-runtime --bench attention [-- CONTEXT]` (default 2048
//! cached positions). One query row attends over the whole cache, as in decode; cache
//! types are timed round-robin so they share the machine's noise, and the medians are
//! compared with f16. Shapes: SmolLM2's attention (9 query heads, 3 KV heads, head_dim 64), a DIFF layer
//! of that width (8 query heads in 4 pairs, 4 KV heads), and both at an 8B-class width (32
//! query / 8 KV heads of 128), whose cache no longer fits in L2.

use std::time::Instant;

use duet_runtime::backend::{AttentionKind, AttentionSpec, Backend, SeqSpan};
use duet_runtime::cpu::CpuBackend;
use duet_runtime::kv_cache::{CacheFormat, KvCacheSpec};
use duet_runtime::kv_pages::{SeqPages, pages_for};

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32 ^ seed).wrapping_mul(2_654_435_761).rotate_left(11).wrapping_mul(747_796_405);
            (h >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let ctx: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(2048);
    use CacheFormat::*;
    let types = [(F16, F16), (Q8, Q8), (Q4, Q4), (Q8c, Q8r), (Q6c, Q6r), (Q4c, Q4r), (Q4c, F16), (F16, Q4r)];
    let shapes = [
        ("standard 9/3 heads, hd 64", AttentionKind::Standard, 9, 3, 64),
        (
            "DIFF 8/4 heads, hd 64",
            AttentionKind::Differential { lambda: 0.5, lambda_init: 0.2, sub_norm: None },
            8,
            4,
            64,
        ),
        // An 8B-class layer (Llama 3 8B's 32/8 heads of 128): 8 MiB of f16 K+V at 2k, past L2.
        ("standard 32/8 heads, hd 128", AttentionKind::Standard, 32, 8, 128),
        (
            "DIFF 32/8 heads, hd 128",
            AttentionKind::Differential { lambda: 0.5, lambda_init: 0.2, sub_norm: None },
            32,
            8,
            128,
        ),
    ];
    println!("decode attention over {ctx} cached positions, 2 threads; median of 300 calls");
    println!("| shape | K / V cache | bytes/position (K+V) | µs per call | vs f16 |");
    println!("|---|---|---|---|---|");
    for (name, kind, n_heads, n_kv, hd) in shapes {
        let spec = AttentionSpec {
            kind,
            n_heads,
            n_kv_heads: n_kv,
            head_dim: hd,
            scale: (hd as f32).powf(-0.5),
            rms_eps: 1e-5,
            logit_quant: None,
        };
        let (q_dim, kv_dim) = (n_heads * hd, n_kv * hd);
        // One sequence, its pages in order.
        let pages: Vec<u32> = (0..pages_for(ctx + 1) as u32).collect();
        let seq = SeqPages { pages: &pages, slot: 0, sink: 0 };
        let mut b = CpuBackend::new(2);
        let mut caches: Vec<_> = types
            .iter()
            .map(|&(kt, vt)| {
                let kv = KvCacheSpec {
                    n_layers: 1,
                    n_ctx: ctx + 1,
                    n_seqs: 1,
                    kv_dim,
                    head_dim: hd,
                    k_type: kt,
                    v_type: vt,
                };
                let mut cache = b.new_kv_cache(&kv).unwrap();
                // Fill the cache in chunks of 256 positions.
                for p0 in (0..ctx).step_by(256) {
                    let rows = 256.min(ctx - p0);
                    let mut q = b.new_tensor(rows, q_dim);
                    let mut k = b.new_tensor(rows, kv_dim);
                    let mut v = b.new_tensor(rows, kv_dim);
                    q.data.copy_from_slice(&values(rows * q_dim, 1 + p0 as u32));
                    k.data.copy_from_slice(&values(rows * kv_dim, 2 + p0 as u32));
                    v.data.copy_from_slice(&values(rows * kv_dim, 3 + p0 as u32));
                    let mut out = b.new_tensor(rows, q_dim);
                    let span = [SeqSpan::whole(seq, rows, p0, &spec)];
                    b.attention(&mut q, &mut k, &v, &mut cache, 0, &span, None, None, &mut out);
                }
                cache
            })
            .collect();
        let mut q = b.new_tensor(1, q_dim);
        let mut k = b.new_tensor(1, kv_dim);
        let mut v = b.new_tensor(1, kv_dim);
        q.data.copy_from_slice(&values(q_dim, 7));
        k.data.copy_from_slice(&values(kv_dim, 8));
        v.data.copy_from_slice(&values(kv_dim, 9));
        let mut out = b.new_tensor(1, q_dim);
        let mut times = vec![Vec::new(); types.len()];
        for round in 0..310 {
            for (i, cache) in caches.iter_mut().enumerate() {
                let t0 = Instant::now();
                let span = [SeqSpan::whole(seq, 1, ctx, &spec)];
                b.attention(&mut q, &mut k, &v, cache, 0, &span, None, None, &mut out);
                if round >= 10 {
                    times[i].push(t0.elapsed().as_secs_f64() * 1e6);
                }
            }
        }
        let med: Vec<f64> = times.iter_mut().map(|t| median(t)).collect();
        for (i, (kt, vt)) in types.iter().enumerate() {
            let pages = pages_for(ctx + 1);
            let bytes = (kt.layer_bytes(pages, 1, kv_dim, false) + vt.layer_bytes(pages, 1, kv_dim, false)) as f64
                / (ctx + 1) as f64;
            println!("| {name} | {kt} / {vt} | {bytes:.1} | {:.1} | {:.2}× |", med[i], med[i] / med[0]);
        }
    }
}
