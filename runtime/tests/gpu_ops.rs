//! Every GPU op against the CPU backend (the reference), on random data and odd shapes:
//! row counts, token counts and (for the float types) row lengths that are not multiples
//! of the workgroup, tile or block sizes. Normalised MSE = Σ(gpu − cpu)² / Σ cpu².
//!
//! The matrix products are checked twice: against exact arithmetic on the CPU backend's
//! own dequantized weights (what the GPU computes: dequantized weights × f32 activations),
//! and against the CPU backend's matmul with ggml's single Q8 activations (the coarser of
//! its two settings: it rounds activations to 8 bits for its integer dot products), so that
//! comparison has per-type bounds. Runs on any adapter,
//! lavapipe included; without one every test skips with the reason.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use duet_quant::GgmlType;
use duet_quant::gguf::{GgufFile, GgufWriter};
use duet_runtime::backend::{AttentionKind, AttentionSpec, Backend, RopeSpec, SeqSpan, WeightRole, WeightView};
use duet_runtime::cpu::{CpuBackend, CpuTensor};
use duet_runtime::gpu::{GpuBackend, GpuOptions, GpuTensor, GpuTune};
use duet_runtime::kv_cache::{CacheFormat, CacheLayout, KvCacheSpec};
use duet_runtime::kv_pages::{PAGE, SeqPages, pages_for};
use duet_test_support::{Rng, no_gpu};

fn gpu(test: &str, f16: bool, max_binding: Option<u64>) -> Option<GpuBackend> {
    gpu_with(test, GpuOptions { f16: Some(f16), max_binding, ..Default::default() })
}

fn gpu_with(test: &str, opts: GpuOptions) -> Option<GpuBackend> {
    match GpuBackend::new(&opts) {
        Ok(b) => Some(b),
        Err(e) => {
            no_gpu(test, &format!("no usable GPU adapter ({e})"));
            None
        }
    }
}

fn nmse(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let (mut num, mut den) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        assert!(g.is_finite(), "non-finite GPU value {g}");
        num += (g as f64 - w as f64).powi(2);
        den += (w as f64).powi(2);
    }
    if den == 0.0 { num } else { num / den }
}

static FILE_NO: AtomicUsize = AtomicUsize::new(0);

/// A GGUF file holding `tensors` (name, type, rows, cols, f32 values quantized to type).
fn weights_file(tensors: &[(&str, GgmlType, usize, usize, Vec<f32>)]) -> Arc<GgufFile> {
    let path = std::env::temp_dir().join(format!(
        "duet-gpu-ops-{}-{}.gguf",
        std::process::id(),
        FILE_NO.fetch_add(1, Ordering::Relaxed)
    ));
    let mut w = GgufWriter::new(&path);
    let mut bytes = Vec::new();
    for (name, ty, rows, cols, vals) in tensors {
        let dims: Vec<u64> = if *rows == 1 { vec![*cols as u64] } else { vec![*cols as u64, *rows as u64] };
        w.add_tensor(*name, &dims, *ty).unwrap();
        let mut b = vec![0u8; duet_quant::row_bytes(*ty, *cols).unwrap() * rows];
        duet_quant::quantize(*ty, vals, *cols, &mut b).unwrap();
        bytes.push(b);
    }
    let mut dw = w.start().unwrap();
    for ((name, ..), b) in tensors.iter().zip(&bytes) {
        dw.write_tensor(name, b).unwrap();
    }
    dw.finish().unwrap();
    let file = Arc::new(GgufFile::from_bytes(std::fs::read(&path).unwrap()).unwrap());
    let _ = std::fs::remove_file(&path);
    file
}

/// A view of tensor `name`: a vector if it has one row, else a matrix (DEX's W_D: `dex_view`).
fn view<'a>(file: &'a Arc<GgufFile>, name: &'a str) -> WeightView<'a> {
    let info = file.tensor(name).unwrap();
    let d = info.dims();
    let (cols, rows) = (d[0] as usize, if d.len() > 1 { d[1] as usize } else { 1 });
    let role = if rows == 1 { WeightRole::Vector } else { WeightRole::Matrix };
    WeightView { name, role, ty: info.ggml_type(), cols, rows, data: file.tensor_data(info), file: Some(file) }
}

fn dex_view<'a>(file: &'a Arc<GgufFile>, name: &'a str) -> WeightView<'a> {
    WeightView { role: WeightRole::HeadMatrix, ..view(file, name) }
}

/// The same activations on both backends.
struct Pair {
    cpu: CpuBackend,
    gpu: GpuBackend,
}

impl Pair {
    fn tensor(&mut self, rows: usize, cols: usize, data: &[f32]) -> (CpuTensor, GpuTensor) {
        let mut c = self.cpu.new_tensor(rows, cols);
        c.data[..data.len()].copy_from_slice(data);
        let g = self.gpu.new_tensor(rows, cols);
        self.gpu.upload(&g, data);
        (c, g)
    }

    fn read(&mut self, c: &CpuTensor, g: &GpuTensor) -> (Vec<f32>, Vec<f32>) {
        let cv = self.cpu.read_rows(c, 0..c.rows).unwrap();
        let gv = self.gpu.read_rows(g, 0..g.rows).unwrap();
        (gv, cv)
    }
}

/// Every weight type the GPU multiplies: F32 and the quantized and half types.
fn types() -> impl Iterator<Item = GgmlType> {
    std::iter::once(GgmlType::F32).chain(GgmlType::WEIGHT_TYPES)
}

/// The CPU backend with ggml's single Q8 activation rounding (`--cpu-acts q8`).
fn ggml_cpu() -> CpuBackend {
    let mut b = CpuBackend::new(2);
    b.set_act_precision(duet_runtime::cpu::ActPrecision::Q8);
    b
}

/// Bound of GPU vs CPU-backend matmul: the CPU rounds activations to Q8 (Q8_K for the
/// K-quants), so this is the CPU's activation rounding, not a GPU error.
fn cpu_matmul_bound(t: GgmlType) -> f64 {
    match t {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1e-7,
        _ => 1e-4,
    }
}

/// The matvec settings every product test runs, whichever adapter runs it: the adapter's
/// default; the workgroup-memory reduction (no subgroups) in the hardware default shape;
/// one row per workgroup of 256 threads, more threads than a short row has slots, with
/// products of up to 16 tokens by token, their workgroups interleaved by token (the second
/// takes them one token per dispatch z; the default, each as its adapter does); and trusted modules (no naga bounds checks) in the
/// software default shape, with every product of several tokens through the matmul. The
/// second also forces the tiled matmul on an adapter with cooperative matrices.
fn matvec_tunings() -> Vec<GpuTune> {
    vec![
        GpuTune::default(),
        // (And the tiled f16 matmul where the adapter would take cooperative matrices.)
        GpuTune {
            matvec: Some((128, 2)),
            subgroups: Some(false),
            coop: Some(false),
            matvec_interleave: Some(false),
            ..Default::default()
        },
        GpuTune {
            matvec: Some((256, 1)),
            matvec_tokens: Some(16),
            matvec_interleave: Some(true),
            ..Default::default()
        },
        GpuTune { matvec: Some((32, 4)), trusted: Some(true), matvec_tokens: Some(1), ..Default::default() },
    ]
}

/// Every weight type through the matvec (in each of [`matvec_tunings`]), the matmul and
/// the embedding.
fn matmul_checks(test: &str, f16: bool, exact_bound: f64) {
    for tune in matvec_tunings() {
        let Some(gpu) = gpu_with(test, GpuOptions { f16: Some(f16), tune, ..Default::default() }) else { return };
        eprintln!("{test}: {}", gpu.describe());
        matmul_checks_on(gpu, f16, exact_bound);
    }
}

fn matmul_checks_on(gpu: GpuBackend, f16: bool, exact_bound: f64) {
    let mut p = Pair { cpu: ggml_cpu(), gpu };
    let mut rng = Rng::new(7);
    for ty in types() {
        let bs = ty.block_size();
        // Row lengths: whole blocks, an odd number of them; float types: not a multiple of 4
        // (the matvec's last slot masked); more slots than 32 threads take in one step, so
        // that the matvec's threads loop, and fewer than 256 have, so that some idle. Rows:
        // not a multiple of 2 or 4 (the last workgroup's spare rows).
        let cols = match bs {
            1 => 1203,
            32 => 32 * 41,
            _ => 256 * 5,
        };
        let rows = 133;
        let wv = rng.normals(rows * cols);
        let file = weights_file(&[("w", ty, rows, cols, wv)]);
        let wc = p.cpu.load_weight(&view(&file, "w")).unwrap();
        let wg = p.gpu.load_weight(&view(&file, "w")).unwrap();
        // What both backends multiply by: the weights as the CPU backend dequantizes them.
        let mut deq = vec![0f32; rows * cols];
        duet_quant::dequantize(ty, file.tensor_bytes("w").unwrap(), &mut deq).unwrap();
        // 3 tokens: the matvec by token (but float rows not of whole vec4s, and the
        // mvtok=1 tuning); 9: past the default's 8, the matmul (but mvtok=16); 70: the matmul.
        for t in [1usize, 3, 9, 70] {
            let xv = rng.normals(t * cols);
            let (xc, xg) = p.tensor(t, cols, &xv);
            let (mut oc, mut og) = p.tensor(t, rows, &[]);
            p.cpu.matmul(&wc, &xc, &mut oc);
            p.gpu.matmul(&wg, &xg, &mut og);
            let (g, c) = p.read(&oc, &og);
            let exact: Vec<f32> = (0..t * rows)
                .map(|i| {
                    let (tt, r) = (i / rows, i % rows);
                    (0..cols).map(|k| deq[r * cols + k] as f64 * xv[tt * cols + k] as f64).sum::<f64>() as f32
                })
                .collect();
            let e_exact = nmse(&g, &exact);
            let e_cpu = nmse(&g, &c);
            eprintln!(
                "matmul {ty:>5} {rows}x{cols} tokens {t:>2} f16={f16}: nmse vs exact {e_exact:.2e}, vs CPU backend {e_cpu:.2e}"
            );
            assert!(e_exact <= exact_bound, "{ty} t={t}: nmse vs exact {e_exact:.3e} > {exact_bound:.0e}");
            let cb = if f16 { cpu_matmul_bound(ty).max(exact_bound) } else { cpu_matmul_bound(ty) };
            assert!(e_cpu <= cb, "{ty} t={t}: nmse vs CPU backend {e_cpu:.3e} > {cb:.0e}");
            // The residual add in the product's epilogue (attn_output, ffn_down): r + x·wᵀ.
            let rv = rng.normals(t * rows);
            let (_, mut og) = p.tensor(t, rows, &rv);
            let (_, mut scratch) = p.tensor(t, rows, &[]);
            p.gpu.matmul_add(&wg, &xg, &mut scratch, &mut og);
            let got = p.gpu.read_rows(&og, 0..t).unwrap();
            let want: Vec<f32> = exact.iter().zip(&rv).map(|(e, r)| e + r).collect();
            let e_add = nmse(&got, &want);
            eprintln!("matmul_add {ty:>5} {rows}x{cols} tokens {t:>2} f16={f16}: nmse vs exact {e_add:.2e}");
            assert!(e_add <= exact_bound, "{ty} t={t}: matmul_add nmse vs exact {e_add:.3e} > {exact_bound:.0e}");
        }
        // Embedding lookup: exact (both dequantize the same bytes).
        let ids: Vec<u32> = (0..9).map(|_| rng.below(rows) as u32).collect();
        let (mut ec, mut eg) = p.tensor(ids.len(), cols, &[]);
        p.cpu.embed(&wc, &ids, &mut ec);
        p.gpu.embed(&wg, &ids, &mut eg);
        let (g, c) = p.read(&ec, &eg);
        let e = nmse(&g, &c);
        eprintln!("embed  {ty:>5}: nmse {e:.2e}");
        assert!(e <= 1e-12, "embed {ty}: nmse {e:.3e}");
    }
}

#[test]
fn matmul_and_embed_every_type_f32() {
    // Worst measured on lavapipe 1.2e-13 (2026-11-27; the bound was 1e-10).
    matmul_checks("matmul_and_embed_every_type_f32", false, 1e-11);
}

#[test]
fn matmul_and_embed_every_type_f16() {
    // f16 products: weights and activations rounded to f16 (2⁻¹¹ relative), sums in f32.
    matmul_checks("matmul_and_embed_every_type_f16", true, 2e-6);
}

/// The prefill product on cooperative matrices (tensor cores), named rather than left to
/// the default (which picks it too where the adapter has them), so that it cannot pass on
/// the fallback: every weight type as in `matmul_and_embed_every_type_f16`, the same
/// bound. Where the adapter lacks them (lavapipe) the request is refused with the reason:
/// a recorded skip, a failure under `$DUET_REQUIRE_COOP` (runtime/bench/gpu_speed.sh sets
/// it on NVIDIA machines).
#[test]
fn matmul_on_cooperative_matrices() {
    let test = "matmul_on_cooperative_matrices";
    // Both tile widths (64 and 128 tokens, the default): 70 tokens leave a partial tile in each.
    for tokens in [64, 128] {
        let tune = GpuTune { coop: Some(true), coop_tokens: Some(tokens), ..Default::default() };
        match GpuBackend::new(&GpuOptions { f16: Some(true), tune, ..Default::default() }) {
            Ok(gpu) => {
                eprintln!("{test}: {}", gpu.describe());
                let want = format!("on cooperative matrices (tiles of {tokens} tokens)");
                assert!(gpu.describe().contains(&want), "{}", gpu.describe());
                matmul_checks_on(gpu, true, 2e-6);
            }
            Err(e) if e.to_string().contains("cannot run the cooperative-matrix product") => {
                assert!(e.to_string().contains("--gpu-tune coop=off"), "{e}");
                return duet_test_support::machine_lacks(test, "DUET_REQUIRE_COOP", &e.to_string());
            }
            Err(e) => return no_gpu(test, &format!("no usable GPU adapter ({e})")),
        }
    }
}

/// Weights larger than one binding are split into row ranges: the result is the same.
#[test]
fn split_weights_match() {
    let test = "split_weights_match";
    let Some(gpu) = gpu(test, false, Some(4096)) else { return };
    let mut p = Pair { cpu: ggml_cpu(), gpu };
    let mut rng = Rng::new(11);
    let (rows, cols) = (301, 64);
    let file = weights_file(&[("w", GgmlType::Q8_0, rows, cols, rng.normals(rows * cols))]);
    let wg = p.gpu.load_weight(&view(&file, "w")).unwrap();
    let wc = p.cpu.load_weight(&view(&file, "w")).unwrap();
    // 68 bytes a row, 4096 bytes a binding: 60 rows a chunk, 6 chunks.
    for t in [1usize, 5] {
        let xv = rng.normals(t * cols);
        let (xc, xg) = p.tensor(t, cols, &xv);
        let (mut oc, mut og) = p.tensor(t, rows, &[]);
        p.cpu.matmul(&wc, &xc, &mut oc);
        p.gpu.matmul(&wg, &xg, &mut og);
        let (g, c) = p.read(&oc, &og);
        let e = nmse(&g, &c);
        assert!(e <= 1e-4, "split matmul t={t}: {e:.3e}");
    }
    let ids = [0u32, 59, 60, 300, 150];
    let (mut ec, mut eg) = p.tensor(ids.len(), cols, &[]);
    p.cpu.embed(&wc, &ids, &mut ec);
    p.gpu.embed(&wg, &ids, &mut eg);
    let (g, c) = p.read(&ec, &eg);
    assert_eq!(g, c, "split embedding rows");
}

/// x · wᵀ in f64 on the weights as the CPU dequantizes them (t tokens of `cols` values).
fn exact_product(deq: &[f32], rows: usize, cols: usize, xv: &[f32]) -> Vec<f64> {
    let t = xv.len() / cols;
    (0..t * rows)
        .map(|i| {
            let (tt, r) = (i / rows, i % rows);
            (0..cols).map(|k| deq[r * cols + k] as f64 * xv[tt * cols + k] as f64).sum::<f64>()
        })
        .collect()
}

fn nmse64(got: &[f32], want: &[f64]) -> f64 {
    nmse(got, &want.iter().map(|&v| v as f32).collect::<Vec<_>>())
}

/// The fused products against exact arithmetic, in every matvec tuning and unfused: q, k, v
/// (and a fourth, DIFF V2's λ) loaded as one group and multiplied by one split matvec;
/// gate and up by one SwiGLU matvec; the residual add in the epilogue; each with the RMSNorm
/// before it folded in. A token and three (the fused matvecs by token, but the matmul path
/// under mvtok=1 and unfused) for the common types and one generic slot reader.
#[test]
fn fused_products_match_exact() {
    let test = "fused_products_match_exact";
    let mut tunings = matvec_tunings();
    tunings.push(GpuTune { fuse: Some(false), ..Default::default() });
    for tune in tunings {
        let Some(gpu) = gpu_with(test, GpuOptions { f16: Some(false), tune, ..Default::default() }) else { return };
        eprintln!("{test}: {}", gpu.describe());
        fused_products_on(gpu);
    }
}

fn fused_products_on(mut gpu: GpuBackend) {
    let mut rng = Rng::new(19);
    for ty in [GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q5_K, GgmlType::F16] {
        let cols = if ty.block_size() == 256 { 512 } else { 320 };
        // q, k, v, λ; gate, up; a square projection for the residual add.
        let shapes = [("q", 70), ("k", 33), ("v", 33), ("l", 5), ("gate", 97), ("up", 97), ("o", cols)];
        let vals: Vec<Vec<f32>> = shapes.iter().map(|(_, r)| rng.normals(r * cols)).collect();
        let tensors: Vec<(&str, GgmlType, usize, usize, Vec<f32>)> =
            shapes.iter().zip(&vals).map(|(&(n, r), v)| (n, ty, r, cols, v.clone())).collect();
        let file = weights_file(&tensors);
        let deq = |name: &str, rows: usize| {
            let mut d = vec![0f32; rows * cols];
            duet_quant::dequantize(ty, file.tensor_bytes(name).unwrap(), &mut d).unwrap();
            d
        };
        let qkvl: Vec<WeightView> = ["q", "k", "v", "l"].iter().map(|n| view(&file, n)).collect();
        let ws = gpu.load_weight_group(&qkvl).unwrap();
        let ffn = gpu.load_weight_group(&[view(&file, "gate"), view(&file, "up")]).unwrap();
        let wo = gpu.load_weight(&view(&file, "o")).unwrap();
        for t in [1usize, 3] {
            let xv = rng.normals(t * cols);
            let xg = gpu.new_tensor(t, cols);
            gpu.upload(&xg, &xv);
            // The split: three outputs, then four.
            for n in [3usize, 4] {
                let mut outs: Vec<GpuTensor> = shapes[..n].iter().map(|&(_, r)| gpu.new_tensor(t, r)).collect();
                let wrefs: Vec<&_> = ws[..n].iter().collect();
                let mut orefs: Vec<&mut GpuTensor> = outs.iter_mut().collect();
                gpu.matmul_group(&wrefs, &xg, &mut orefs);
                for (o, &(name, rows)) in outs.iter().zip(&shapes[..n]) {
                    let got = gpu.read_rows(o, 0..t).unwrap();
                    let e = nmse64(&got, &exact_product(&deq(name, rows), rows, cols, &xv));
                    eprintln!("matmul_group of {n} {ty:>5} {name} t={t}: nmse {e:.2e}");
                    assert!(e <= 1e-11, "matmul_group of {n} {ty} {name} t={t}: nmse {e:.3e}");
                }
            }
            // The same products of RMSNorm(r)·g (folded into the matvecs for a token): the
            // split of four, SwiGLU, and a weight alone (the output projection's case).
            let rv: Vec<f32> = rng.normals(t * cols).iter().map(|v| 3.0 * v).collect();
            let gv: Vec<f32> = rng.normals(cols).iter().map(|v| 1.0 + 0.2 * v).collect();
            let rg = gpu.new_tensor(t, cols);
            gpu.upload(&rg, &rv);
            let norm_file = weights_file(&[("norm", GgmlType::F32, 1, cols, gv.clone())]);
            let ng = gpu.load_weight(&view(&norm_file, "norm")).unwrap();
            let eps = 1e-5f32;
            // x = r / sqrt(mean(r²) + eps) · g, in f64.
            let normed: Vec<f32> = rv
                .chunks(cols)
                .flat_map(|row| {
                    let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / cols as f64;
                    let inv = 1.0 / (ms + eps as f64).sqrt();
                    row.iter().zip(&gv).map(move |(&v, &g)| (v as f64 * inv * g as f64) as f32).collect::<Vec<_>>()
                })
                .collect();
            let mut xn = gpu.new_tensor(t, cols);
            let mut outs: Vec<GpuTensor> = shapes[..4].iter().map(|&(_, r)| gpu.new_tensor(t, r)).collect();
            {
                let wrefs: Vec<&_> = ws.iter().collect();
                let mut orefs: Vec<&mut GpuTensor> = outs.iter_mut().collect();
                let n = duet_runtime::backend::Normed { x: &rg, weight: &ng, eps, xn: &mut xn };
                gpu.norm_matmul_group(n, &wrefs, &mut orefs);
            }
            for (o, &(name, rows)) in outs.iter().zip(&shapes[..4]) {
                let got = gpu.read_rows(o, 0..t).unwrap();
                let e = nmse64(&got, &exact_product(&deq(name, rows), rows, cols, &normed));
                eprintln!("norm_matmul_group {ty:>5} {name} t={t}: nmse {e:.2e}");
                assert!(e <= 1e-11, "norm_matmul_group {ty} {name} t={t}: nmse {e:.3e}");
            }
            let mut alone = gpu.new_tensor(t, cols);
            let n = duet_runtime::backend::Normed { x: &rg, weight: &ng, eps, xn: &mut xn };
            gpu.norm_matmul_group(n, &[&wo], &mut [&mut alone]);
            let got = gpu.read_rows(&alone, 0..t).unwrap();
            let e = nmse64(&got, &exact_product(&deq("o", cols), cols, cols, &normed));
            assert!(e <= 1e-11, "norm_matmul_group of one {ty} t={t}: nmse {e:.3e}");
            let (mut gate, mut up) = (gpu.new_tensor(t, 97), gpu.new_tensor(t, 97));
            let n = duet_runtime::backend::Normed { x: &rg, weight: &ng, eps, xn: &mut xn };
            gpu.norm_matmul_swiglu(n, &ffn[0], &ffn[1], &mut gate, &mut up);
            let got = gpu.read_rows(&gate, 0..t).unwrap();
            let g = exact_product(&deq("gate", 97), 97, cols, &normed);
            let u = exact_product(&deq("up", 97), 97, cols, &normed);
            let want: Vec<f64> = g.iter().zip(&u).map(|(&g, &u)| g / (1.0 + (-g).exp()) * u).collect();
            let e = nmse64(&got, &want);
            eprintln!("norm_matmul_swiglu {ty:>5} t={t}: nmse {e:.2e}");
            assert!(e <= 1e-11, "norm_matmul_swiglu {ty} t={t}: nmse {e:.3e}");
            // SwiGLU.
            let (mut gate, mut up) = (gpu.new_tensor(t, 97), gpu.new_tensor(t, 97));
            gpu.matmul_swiglu(&ffn[0], &ffn[1], &xg, &mut gate, &mut up);
            let got = gpu.read_rows(&gate, 0..t).unwrap();
            let (g, u) = (exact_product(&deq("gate", 97), 97, cols, &xv), exact_product(&deq("up", 97), 97, cols, &xv));
            let want: Vec<f64> = g.iter().zip(&u).map(|(&g, &u)| g / (1.0 + (-g).exp()) * u).collect();
            let e = nmse64(&got, &want);
            eprintln!("matmul_swiglu {ty:>5} t={t}: nmse {e:.2e}");
            assert!(e <= 1e-11, "matmul_swiglu {ty} t={t}: nmse {e:.3e}");
            // The residual add: out = r + x·woᵀ.
            let rv = rng.normals(t * cols);
            let mut out = gpu.new_tensor(t, cols);
            gpu.upload(&out, &rv);
            let mut scratch = gpu.new_tensor(t, cols);
            gpu.matmul_add(&wo, &xg, &mut scratch, &mut out);
            let got = gpu.read_rows(&out, 0..t).unwrap();
            let want: Vec<f64> =
                exact_product(&deq("o", cols), cols, cols, &xv).iter().zip(&rv).map(|(p, &r)| p + r as f64).collect();
            let e = nmse64(&got, &want);
            eprintln!("matmul_add {ty:>5} t={t}: nmse {e:.2e}");
            assert!(e <= 1e-11, "matmul_add {ty} t={t}: nmse {e:.3e}");
        }
    }
}

/// GPU against CPU row and element ops (norms, RoPE, SwiGLU, adds, DEX, the pair combine):
/// f32 both, the same formulas, only exp/sqrt and summation order differ.
const ROW_OP_BOUND: f64 = 3e-13;

#[test]
fn row_and_element_ops() {
    let test = "row_and_element_ops";
    let Some(gpu) = gpu(test, false, None) else { return };
    let mut p = Pair { cpu: ggml_cpu(), gpu };
    let mut rng = Rng::new(3);
    let (rows, cols) = (37, 300);
    let nw = rng.normals(cols);
    let bias = rng.normals(cols);
    let (n_heads, hd) = (6, 50); // cols = 300
    let wd: Vec<f32> = rng.normals(hd * hd).iter().map(|v| v * 0.1).collect();
    let file = weights_file(&[
        ("norm", GgmlType::F32, 1, cols, nw),
        ("bias", GgmlType::F32, 1, cols, bias),
        ("blk.0.attn_dex.weight", GgmlType::F32, hd, hd, wd),
    ]);
    let (nc, ng) = (p.cpu.load_weight(&view(&file, "norm")).unwrap(), p.gpu.load_weight(&view(&file, "norm")).unwrap());
    let (bc, bg) = (p.cpu.load_weight(&view(&file, "bias")).unwrap(), p.gpu.load_weight(&view(&file, "bias")).unwrap());
    let dname = "blk.0.attn_dex.weight";
    let (dc, dg) =
        (p.cpu.load_weight(&dex_view(&file, dname)).unwrap(), p.gpu.load_weight(&dex_view(&file, dname)).unwrap());
    // Worst measured on lavapipe: 2.6e-15 (rms_norm; 2026-11-27). The bound was 1e-7, which
    // row ops rounded to f16 passed; a doubled RMSNorm epsilon fails this one.
    let check = |name: &str, g: &[f32], c: &[f32]| {
        let e = nmse(g, c);
        eprintln!("{name}: nmse {e:.2e}");
        assert!(e <= ROW_OP_BOUND, "{name}: nmse {e:.3e} > {ROW_OP_BOUND:.0e}");
    };
    let xv: Vec<f32> = rng.normals(rows * cols).iter().map(|v| v * 3.0).collect();
    let yv = rng.normals(rows * cols);

    let (xc, xg) = p.tensor(rows, cols, &xv);
    let (mut oc, mut og) = p.tensor(rows, cols, &[]);
    // An epsilon that moves the result (rows' mean square ~9): a kernel that drops or
    // misreads it differs by far more than the bound.
    p.cpu.rms_norm(&xc, &nc, 1e-2, &mut oc);
    p.gpu.rms_norm(&xg, &ng, 1e-2, &mut og);
    let (g, c) = p.read(&oc, &og);
    check("rms_norm", &g, &c);

    let (mut xc, mut xg) = p.tensor(rows, cols, &xv);
    let (yc, yg) = p.tensor(rows, cols, &yv);
    p.cpu.add(&mut xc, &yc);
    p.gpu.add(&mut xg, &yg);
    p.cpu.add_bias(&mut xc, &bc);
    p.gpu.add_bias(&mut xg, &bg);
    let (g, c) = p.read(&xc, &xg);
    check("add + add_bias", &g, &c);

    let (mut xc, mut xg) = p.tensor(rows, cols, &xv);
    p.cpu.swiglu(&mut xc, &yc);
    p.gpu.swiglu(&mut xg, &yg);
    let (g, c) = p.read(&xc, &xg);
    check("swiglu", &g, &c);

    let (xc, xg) = p.tensor(rows, cols, &xv);
    let (mut lc, mut lg) = p.tensor(3, cols, &[]);
    p.cpu.copy_row(&xc, rows - 2, &mut lc, 1);
    p.gpu.copy_row(&xg, rows - 2, &mut lg, 1);
    let (g, c) = p.read(&lc, &lg);
    assert_eq!(g, c, "copy_row");
    assert_eq!(c[cols..2 * cols], xv[(rows - 2) * cols..(rows - 1) * cols], "copy_row lands in row 1");
    assert!(c[..cols].iter().chain(&c[2 * cols..]).all(|&v| v == 0.0), "copy_row touches only row 1");
    let (mut lc, mut lg) = p.tensor(4, cols, &[]);
    p.cpu.copy_rows(&xc, 1, &mut lc, 2, 2);
    p.gpu.copy_rows(&xg, 1, &mut lg, 2, 2);
    let (g, c) = p.read(&lc, &lg);
    assert_eq!(g, c, "copy_rows");
    assert_eq!(c[2 * cols..], xv[cols..3 * cols], "copy_rows lands in rows 2 and 3");
    assert!(c[..2 * cols].iter().all(|&v| v == 0.0), "copy_rows touches only rows 2 and 3");

    for (rope, pos0) in [
        (RopeSpec { n_rot: hd, freq_base: 10000.0, freq_scale: 1.0, freq_factors: None }, 0),
        (RopeSpec { n_rot: 32, freq_base: 500000.0, freq_scale: 0.5, freq_factors: Some(vec![1.5; 16]) }, 1500),
    ] {
        let (mut xc, mut xg) = p.tensor(rows, cols, &xv);
        p.cpu.rope(&mut xc, n_heads, hd, pos0, &rope);
        p.gpu.rope(&mut xg, n_heads, hd, pos0, &rope);
        let (g, c) = p.read(&xc, &xg);
        check(&format!("rope n_rot {} pos0 {pos0}", rope.n_rot), &g, &c);
    }

    let (mut xc, mut xg) = p.tensor(rows, cols, &xv);
    p.cpu.dex(&mut xc, &dc, 0.37, &[0, 3, 5], hd);
    p.gpu.dex(&mut xg, &dg, 0.37, &[0, 3, 5], hd);
    let (g, c) = p.read(&xc, &xg);
    check("dex", &g, &c);

    // DIFF V2's combine: the 6 heads of a row form 3 pairs; gates of both signs.
    let n_pairs = n_heads / 2;
    let gv: Vec<f32> = rng.normals(rows * n_pairs).iter().map(|v| v * 4.0).collect();
    let (xc, xg) = p.tensor(rows, cols, &xv);
    let (gc, gg) = p.tensor(rows, n_pairs, &gv);
    let (mut oc, mut og) = p.tensor(rows, n_pairs * hd, &[]);
    p.cpu.pair_combine(&xc, &gc, hd, &mut oc);
    p.gpu.pair_combine(&xg, &gg, hd, &mut og);
    let (g, c) = p.read(&oc, &og);
    check("pair_combine", &g, &c);
    // The CPU's against the definition, o_i = x_2i − sigmoid(g_i)·x_2i+1.
    for (r, (row, i)) in [(0, 0), (rows - 1, n_pairs - 1), (17, 1)].into_iter().enumerate() {
        let lambda = 1.0 / (1.0 + (-gv[row * n_pairs + i]).exp());
        for j in [0, hd / 2, hd - 1] {
            let want = xv[row * cols + 2 * i * hd + j] - lambda * xv[row * cols + (2 * i + 1) * hd + j];
            let got = c[row * n_pairs * hd + i * hd + j];
            assert!((got - want).abs() <= 1e-5 * want.abs().max(1.0), "case {r}: pair_combine {got} vs {want}");
        }
    }
}

/// Runs `steps` (query rows per call) of attention on both backends over caches of types
/// kt/vt, checks each step's GPU output against the CPU's (nmse within the bound for the
/// cache types; `None`: the caller checks) and returns both outputs, concatenated.
fn attention_case(
    p: &mut Pair,
    rng: &mut Rng,
    spec: &AttentionSpec,
    kt: CacheFormat,
    vt: CacheFormat,
    steps: &[usize],
    check: bool,
) -> (Vec<f32>, Vec<f32>) {
    attention_case_rope(p, rng, spec, (kt, vt), steps, check, None)
}

/// [`attention_case`], with `rope` given to the attention step (RoPE on Q and K first; the
/// rotated Q and K rows compared too).
fn attention_case_rope(
    p: &mut Pair,
    rng: &mut Rng,
    spec: &AttentionSpec,
    (kt, vt): (CacheFormat, CacheFormat),
    steps: &[usize],
    check: bool,
    rope: Option<&RopeSpec>,
) -> (Vec<f32>, Vec<f32>) {
    let (h, hkv, hd) = (spec.n_heads, spec.n_kv_heads, spec.head_dim);
    let n_ctx = steps.iter().sum::<usize>() + 3;
    let kv = KvCacheSpec { n_layers: 2, n_ctx, n_seqs: 2, kv_dim: hkv * hd, head_dim: hd, k_type: kt, v_type: vt };
    let mut cc = p.cpu.new_kv_cache(&kv).unwrap();
    let mut cg = p.gpu.new_kv_cache(&kv).unwrap();
    let pages = scattered(&kv);
    // Sink 0 of slot 1: the slot and the sink are numbered apart.
    let seq = SeqPages { pages: &pages, slot: 1, sink: 0 };
    let rows_total = kv.n_pages() * PAGE;
    let mut pos0 = 0;
    // f32 and the absmax types (both backends quantize the same f32 rows into the same
    // bytes, checked below, so the dequantized K/V are bit-identical) and f16 (the same
    // round-to-nearest-even): only the order of the f32 sums differs. Worst measured on
    // lavapipe 2.0e-12 (q4c/q4c, sub-norm; 2026-11-27); the bounds were 1e-6 (f16) and 1e-7.
    let bound = 2e-10;
    let (mut cpu_out, mut gpu_out) = (Vec::new(), Vec::new());
    for &n in steps {
        let qv: Vec<f32> = rng.normals(n * h * hd).iter().map(|v| v * 2.0).collect();
        let kvv = rng.normals(n * hkv * hd);
        let vv = rng.normals(n * hkv * hd);
        let (mut qc, mut qg) = p.tensor(n, h * hd, &qv);
        let (mut kc, mut kg) = p.tensor(n, hkv * hd, &kvv);
        let (vc, vg) = p.tensor(n, hkv * hd, &vv);
        let (mut oc, mut og) = p.tensor(n, h * hd, &[]);
        let span = [SeqSpan::whole(seq, n, pos0, spec)];
        p.cpu.attention(&mut qc, &mut kc, &vc, &mut cc, 1, &span, rope, None, &mut oc);
        p.gpu.attention(&mut qg, &mut kg, &vg, &mut cg, 1, &span, rope, None, &mut og);
        if rope.is_some() {
            for (what, (g, c)) in [("Q", p.read(&qc, &qg)), ("K", p.read(&kc, &kg))] {
                // The same f32 arithmetic on the same table: the same bits on lavapipe, a
                // rounding apart where a compiler fuses a·cos − b·sin (NMSE 1.05e-15 on an
                // H200).
                let e = nmse(&g, &c);
                assert!(e <= 1e-13, "attention's rotated {what} rows {n} at {pos0}: nmse {e:.3e}");
            }
        }
        let (g, c) = p.read(&oc, &og);
        let e = nmse(&g, &c);
        cpu_out.extend_from_slice(&c);
        gpu_out.extend_from_slice(&g);
        let kind = match &spec.kind {
            AttentionKind::Standard => "standard".to_string(),
            AttentionKind::PairedHeads => "paired (V2)".to_string(),
            AttentionKind::Differential { sub_norm, .. } => format!("differential(sub-norm {})", sub_norm.is_some()),
        };
        let lq = match &spec.logit_quant {
            Some(l) => format!(" logits {}-bit {:?}", l.bits, l.scale),
            None => String::new(),
        };
        eprintln!("attention {kind} H={h} Hkv={hkv} hd={hd} K {kt} V {vt}{lq} rows {n} at {pos0}: nmse {e:.2e}");
        assert!(!check || e <= bound, "attention {kind} rows {n} at {pos0}: nmse {e:.3e} > {bound:.0e}");
        // What the GPU stored is the CPU's bytes, on the same pages: block rows each padded
        // to a word, a per-channel layer's groups, windows and sinks as they are.
        for (ty, is_v) in [(kt, false), (vt, true)] {
            let cpu = if is_v { &cc.v[1] } else { &cc.k[1] }.stored_bytes();
            let got = p.gpu.read_kv_buffer(&cg, 1, is_v).unwrap();
            let which = if is_v { "V" } else { "K" };
            match ty.layout() {
                // f16 rounding on the GPU is pack2x16float's (checked through attention).
                CacheLayout::F32 | CacheLayout::F16 => {}
                CacheLayout::Channel(_) => {
                    assert_same_bytes(&got, &cpu, &format!("{ty} {which} cache after rows {pos0}..{}", pos0 + n))
                }
                CacheLayout::Absmax(_) | CacheLayout::Rotated(_) => {
                    let (crb, grb) = (cpu.len() / rows_total, got.len() / rows_total);
                    assert_eq!(grb, crb.next_multiple_of(4));
                    for r in 0..rows_total {
                        let row = &got[r * grb..(r + 1) * grb];
                        assert_eq!(&row[..crb], &cpu[r * crb..(r + 1) * crb], "{ty} {which} cache row {r}: bytes");
                        assert!(row[crb..].iter().all(|&b| b == 0), "{ty} {which} cache row {r}: padding");
                    }
                }
            }
        }
        pos0 += n;
    }
    (cpu_out, gpu_out)
}

/// The pages of a sequence in the last slot of `kv`: the cache's last pages in reverse
/// order, so that each page is a run of its own and no position is at its own row.
fn scattered(kv: &KvCacheSpec) -> Vec<u32> {
    (0..kv.n_pages() as u32).rev().take(pages_for(kv.n_ctx)).collect()
}

/// `got == want`, else a failure naming the first differing byte and the counts.
fn assert_same_bytes(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: {} bytes, expected {}", got.len(), want.len());
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        let n = got.iter().zip(want).filter(|(a, b)| a != b).count();
        panic!("{what}: {n} of {} bytes differ, the first at byte {i} ({} vs {})", got.len(), got[i], want[i]);
    }
}

/// Standard attention of `h` query and `hkv` KV heads of `hd`, scale hd^−½.
fn standard_spec(h: usize, hkv: usize, hd: usize) -> AttentionSpec {
    AttentionSpec {
        kind: AttentionKind::Standard,
        n_heads: h,
        n_kv_heads: hkv,
        head_dim: hd,
        scale: (hd as f32).powf(-0.5),
        rms_eps: 1e-5,
        logit_quant: None,
    }
}

#[test]
fn attention_standard_and_differential() {
    let test = "attention_standard_and_differential";
    let Some(gpu) = gpu(test, false, None) else { return };
    let mut p = Pair { cpu: ggml_cpu(), gpu };
    let mut rng = Rng::new(5);
    // Prefill chunks (odd sizes, crossing the 32-key tiles), then single-token decode steps;
    // the last decodes over 300 keys, which the decode step splits into 19 chunks of one
    // 16-key tile each (flash-decoding) that its combine step merges.
    let steps = [37, 1, 1, 29, 1, 230, 1];
    for (h, hkv, hd) in [(6, 2, 64), (4, 4, 32), (8, 2, 128)] {
        let std = standard_spec(h, hkv, hd);
        let sub = Some(rng.normals(2 * hd).iter().map(|v| 1.0 + 0.1 * v).collect());
        for kind in [
            AttentionKind::Standard,
            AttentionKind::Differential { lambda: 0.31, lambda_init: 0.2, sub_norm: None },
            AttentionKind::Differential { lambda: 0.8, lambda_init: 0.62, sub_norm: sub },
        ] {
            let spec = AttentionSpec { kind, ..std.clone() };
            attention_case(&mut p, &mut rng, &spec, CacheFormat::F32, CacheFormat::F32, &steps, true);
        }
        let diff = AttentionSpec {
            kind: AttentionKind::Differential { lambda: 0.5, lambda_init: 0.35, sub_norm: None },
            ..std.clone()
        };
        attention_case(&mut p, &mut rng, &diff, CacheFormat::F16, CacheFormat::F16, &steps, true);
        attention_case(&mut p, &mut rng, &std, CacheFormat::F16, CacheFormat::F32, &steps, true);
    }
}

/// Every quantized cache type (absmax, rotated, per-channel), alone and mixed with f16 and
/// with each other: the GPU writes the CPU's bytes and its attention matches the CPU
/// backend's over the same cache types. The steps complete per-channel groups mid-batch and
/// leave rows in their window; shapes include a row of an odd number of blocks (padded on
/// the GPU), head_dim 16 (heads sharing blocks), and head_dim 48 (rotated in blocks of 16).
/// Types a shape's rows cannot hold are skipped (KvCacheSpec::check).
/// The decode step with few workgroups a row (`--gpu-tune attn=N`), so that a workgroup's
/// chunk holds several 64-key tiles (its online softmax across tiles) and the combine step
/// merges chunks of several tiles: all in one chunk, and a few chunks.
#[test]
fn decode_attention_multi_tile_chunks() {
    let test = "decode_attention_multi_tile_chunks";
    for workgroups in [4, 16] {
        let tune = GpuTune { attn_workgroups: Some(workgroups), ..Default::default() };
        let Some(gpu) = gpu_with(test, GpuOptions { f16: Some(false), tune, ..Default::default() }) else { return };
        let mut p = Pair { cpu: ggml_cpu(), gpu };
        let mut rng = Rng::new(31);
        let std = standard_spec(4, 2, 64);
        let diff = AttentionSpec {
            kind: AttentionKind::Differential { lambda: 0.4, lambda_init: 0.3, sub_norm: None },
            ..std.clone()
        };
        for spec in [&std, &diff] {
            attention_case(&mut p, &mut rng, spec, CacheFormat::F32, CacheFormat::F32, &[150, 1, 170, 1], true);
            attention_case(&mut p, &mut rng, spec, CacheFormat::F16, CacheFormat::Q8r, &[150, 1, 170, 1], true);
        }
    }
}

/// RoPE with the cache write (one kernel into plain caches, with fusion on) against the
/// CPU's RoPE then attention: every plain cache pair, a quantized pair (the separate RoPE
/// dispatches), K caches of keys before RoPE (q4c, q3c, q2c: stored unrotated, rotated by the K
/// reader), partial rotation with frequency factors, prefill and decode rows; and fusion
/// off. The rotated Q and K rows must match too (the fused kernel writes K back; K stored
/// before RoPE stays unrotated on both).
#[test]
fn rope_attention_matches_cpu() {
    let test = "rope_attention_matches_cpu";
    for fuse in [true, false] {
        let tune = GpuTune { fuse: Some(fuse), ..Default::default() };
        let Some(gpu) = gpu_with(test, GpuOptions { f16: Some(false), tune, ..Default::default() }) else { return };
        let mut p = Pair { cpu: ggml_cpu(), gpu };
        let mut rng = Rng::new(23);
        let ropes = [
            RopeSpec { n_rot: 64, freq_base: 10000.0, freq_scale: 1.0, freq_factors: None },
            RopeSpec { n_rot: 32, freq_base: 500000.0, freq_scale: 0.5, freq_factors: Some(vec![1.5; 16]) },
        ];
        let spec = standard_spec(6, 2, 64);
        for (kt, vt) in [
            (CacheFormat::F16, CacheFormat::F16),
            (CacheFormat::F32, CacheFormat::F32),
            (CacheFormat::F16, CacheFormat::F32),
            (CacheFormat::Q8c, CacheFormat::Q4r),
            (CacheFormat::Q4c, CacheFormat::Q4r),
            (CacheFormat::Q3c, CacheFormat::Q3r),
            (CacheFormat::Q2c, CacheFormat::F16),
        ] {
            for rope in &ropes {
                eprintln!("{test}: fuse {fuse}, K {kt} V {vt}, n_rot {}", rope.n_rot);
                attention_case_rope(&mut p, &mut rng, &spec, (kt, vt), &[19, 1, 40, 1], true, Some(rope));
            }
        }
    }
}

/// DIFF V2's attention with its pair combine (merged into the combine step where V is not
/// rotated; separately for a rotated V) against the CPU's attention then pair combine.
#[test]
fn rope_attention_pairs_matches_cpu() {
    let test = "rope_attention_pairs_matches_cpu";
    let Some(gpu) = gpu(test, false, None) else { return };
    let mut p = Pair { cpu: ggml_cpu(), gpu };
    let mut rng = Rng::new(29);
    let (h, hkv, hd) = (8, 2, 64);
    let spec = AttentionSpec { kind: AttentionKind::PairedHeads, ..standard_spec(h, hkv, hd) };
    let rope = RopeSpec { n_rot: hd, freq_base: 10000.0, freq_scale: 1.0, freq_factors: None };
    for (kt, vt) in
        [(CacheFormat::F16, CacheFormat::F16), (CacheFormat::Q8, CacheFormat::Q6), (CacheFormat::Q8c, CacheFormat::Q4r)]
    {
        let kv =
            KvCacheSpec { n_layers: 1, n_ctx: 80, n_seqs: 1, kv_dim: hkv * hd, head_dim: hd, k_type: kt, v_type: vt };
        let mut cc = p.cpu.new_kv_cache(&kv).unwrap();
        let mut cg = p.gpu.new_kv_cache(&kv).unwrap();
        let pages = scattered(&kv);
        let seq = SeqPages { pages: &pages, slot: 0, sink: 0 };
        let mut pos0 = 0;
        for n in [23usize, 1, 30, 1] {
            let (mut qc, mut qg) = p.tensor(n, h * hd, &rng.normals(n * h * hd));
            let (mut kc, mut kg) = p.tensor(n, hkv * hd, &rng.normals(n * hkv * hd));
            let (vc, vg) = p.tensor(n, hkv * hd, &rng.normals(n * hkv * hd));
            let gates: Vec<f32> = rng.normals(n * h / 2).iter().map(|v| 3.0 * v).collect();
            let (gc, gg) = p.tensor(n, h / 2, &gates);
            let (mut ac, mut ag) = p.tensor(n, h * hd, &[]);
            let (mut oc, mut og) = p.tensor(n, h / 2 * hd, &[]);
            let span = [SeqSpan::whole(seq, n, pos0, &spec)];
            p.cpu.attention(&mut qc, &mut kc, &vc, &mut cc, 0, &span, Some(&rope), Some((&gc, &mut oc)), &mut ac);
            p.gpu.attention(&mut qg, &mut kg, &vg, &mut cg, 0, &span, Some(&rope), Some((&gg, &mut og)), &mut ag);
            let (g, c) = p.read(&oc, &og);
            let e = nmse(&g, &c);
            eprintln!("{test}: K {kt} V {vt} rows {n} at {pos0}: nmse {e:.2e}");
            // Measured ≤ 1.9e-13 (lavapipe): f32 sums in another order.
            assert!(e <= 1e-11, "pairs K {kt} V {vt} rows {n} at {pos0}: nmse {e:.3e}");
            pos0 += n;
        }
    }
}

#[test]
fn attention_quantized_caches() {
    use CacheFormat::*;
    let test = "attention_quantized_caches";
    let Some(gpu) = gpu(test, false, None) else { return };
    let mut p = Pair { cpu: ggml_cpu(), gpu };
    let mut rng = Rng::new(9);
    let steps = [37, 1, 1, 29, 1];
    let pairs = [
        (Q8, Q8),
        (Q6, Q6),
        (Q4, Q4),
        (Q8, F16),
        (F16, Q4),
        (Q8r, Q8r),
        (Q6r, Q6r),
        (Q4r, Q4r),
        (Q8c, Q8c),
        (Q6c, Q6c),
        (Q4c, Q4c),
        (Q4c, Q4r),
        (Q8c, F16),
        (F16, Q6r),
        (Q4r, Q6c),
        (Q3c, Q3r),
        (Q2c, Q2r),
        (Q3r, Q2c),
    ];
    for (h, hkv, hd) in [(6, 2, 64), (8, 2, 128), (6, 6, 16), (4, 2, 48), (4, 4, 48)] {
        let std = standard_spec(h, hkv, hd);
        let sub = Some(rng.normals(2 * hd).iter().map(|v| 1.0 + 0.1 * v).collect());
        let diff = AttentionSpec {
            kind: AttentionKind::Differential { lambda: 0.6, lambda_init: 0.3, sub_norm: sub },
            ..std.clone()
        };
        for (kt, vt) in pairs {
            let kv = KvCacheSpec {
                n_layers: 1,
                n_ctx: 1,
                n_seqs: 1,
                kv_dim: hkv * hd,
                head_dim: hd,
                k_type: kt,
                v_type: vt,
            };
            if kv.check().is_err() {
                continue;
            }
            attention_case(&mut p, &mut rng, &std, kt, vt, &steps, true);
            attention_case(&mut p, &mut rng, &diff, kt, vt, &steps, true);
        }
    }
}

/// Attention-logit quantization at 8, 6 and 4 bits with every scale source (per tensor, per
/// head, per row, static), standard and differential, over f32, q8 and mixed q4/q6 caches,
/// prefill and decode: the GPU matches the CPU backend, and the quantization visibly changes
/// the output (so agreement is not that of two unquantized runs).
#[test]
fn attention_quantized_logits() {
    use duet_runtime::backend::{LogitQuant, LogitScale};
    let test = "attention_quantized_logits";
    let Some(gpu) = gpu(test, false, None) else { return };
    let mut p = Pair { cpu: ggml_cpu(), gpu };
    let mut rng = Rng::new(17);
    let steps = [37, 1, 29, 1];
    let (h, hkv, hd) = (6, 2, 64);
    let std = standard_spec(h, hkv, hd);
    let diff = AttentionSpec {
        kind: AttentionKind::Differential { lambda: 0.6, lambda_init: 0.3, sub_norm: None },
        ..std.clone()
    };
    // Static absmax below the largest logits (about 6), so clamping is exercised too.
    let statics: Vec<f32> = (0..h).map(|i| 1.5 + 0.5 * i as f32).collect();
    let scales = [LogitScale::Tensor, LogitScale::Head, LogitScale::Row, LogitScale::Static(statics)];
    for (kt, vt) in
        [(CacheFormat::F32, CacheFormat::F32), (CacheFormat::Q8, CacheFormat::Q8), (CacheFormat::Q4, CacheFormat::Q6)]
    {
        for base in [&std, &diff] {
            for bits in [8, 6, 4] {
                for scale in &scales {
                    let spec =
                        AttentionSpec { logit_quant: Some(LogitQuant { bits, scale: scale.clone() }), ..base.clone() };
                    let data = rng.clone();
                    let (cpu, gpu) = attention_case(&mut p, &mut rng, &spec, kt, vt, &steps, false);
                    let (plain, _) = attention_case(&mut p, &mut data.clone(), base, kt, vt, &steps, true);
                    let (e, effect) = (nmse(&gpu, &cpu), nmse(&cpu, &plain));
                    // A logit within the backends' difference of a step boundary rounds to
                    // either side, moving by one step. Over an f32 cache the logits agree to
                    // ~1e-7 and flips are rare; over a quantized K the CPU rounds the query to
                    // i16 (~1e-5 per logit), so about 12·2·1e-5/step of the quantization's own
                    // nmse comes back as disagreement (measured ≤ 5%). A fifth of that effect
                    // (and ≤ 1e-6 where it is small) still fails a missing or wrong scale,
                    // which disagrees by about the whole effect.
                    let bound = (effect / 5.0).max(1e-6);
                    eprintln!(
                        "  {bits}-bit {scale:?}: GPU vs CPU nmse {e:.2e} (bound {bound:.1e}); \
                         vs full-precision logits {effect:.2e}"
                    );
                    assert!(effect > 1e-5, "{bits}-bit {scale:?} logits changed nothing ({effect:.2e})");
                    assert!(e <= bound, "{bits}-bit {scale:?} K {kt} V {vt}: GPU vs CPU nmse {e:.2e} > {bound:.1e}");
                }
            }
        }
    }
}

/// The GPU's absmax K/V write on edge rows, byte for byte against the CPU's quantize_row:
/// exact rounding ties (halves away from zero), an all-zero block, scales that are f16
/// subnormals, f32 subnormals, and scales that overflow f16; rows of an odd block count.
#[test]
fn absmax_cache_write_edge_rows() {
    let test = "absmax_cache_write_edge_rows";
    let Some(mut g) = gpu(test, false, None) else { return };
    let mut rng = Rng::new(13);
    let (h, hkv, hd) = (4, 2, 48);
    let kv_dim = hkv * hd; // 3 blocks
    let spec = AttentionSpec {
        kind: AttentionKind::Standard,
        n_heads: h,
        n_kv_heads: hkv,
        head_dim: hd,
        scale: 0.1,
        rms_eps: 1e-5,
        logit_quant: None,
    };
    for ty in [CacheFormat::Q8, CacheFormat::Q6, CacheFormat::Q4] {
        let CacheLayout::Absmax(fmt) = ty.layout() else { unreachable!("absmax types") };
        let qmax = fmt.qmax();
        // Block of ties: qmax·d, then (k + ½)·d, d = 0.25 (exact in f16, 1/d exact).
        let ties: Vec<f32> = (0..32)
            .map(|i| if i == 0 { qmax as f32 * 0.25 } else { ((i % (2 * qmax)) - qmax) as f32 * 0.25 + 0.125 })
            .collect();
        let mut rows: Vec<Vec<f32>> = Vec::new();
        let scaled = |rng: &mut Rng, s: f32| rng.normals(kv_dim).iter().map(|v| v * s).collect::<Vec<f32>>();
        rows.push([ties.clone(), vec![0.0; 32], ties.iter().map(|v| -v).collect()].concat());
        rows.push(scaled(&mut rng, 1e-6));
        rows.push(scaled(&mut rng, 1e-38));
        rows.push(scaled(&mut rng, 3e5));
        rows.push(scaled(&mut rng, 1.0));
        let n = rows.len();
        let kvv: Vec<f32> = rows.concat();
        let kv = KvCacheSpec { n_layers: 1, n_ctx: n, n_seqs: 1, kv_dim, head_dim: hd, k_type: ty, v_type: ty };
        let mut cache = g.new_kv_cache(&kv).unwrap();
        let pages: Vec<u32> = (0..pages_for(n) as u32).collect();
        let mut qt = g.new_tensor(n, h * hd);
        g.upload(&qt, &vec![0.0; n * h * hd]);
        let mut kt = g.new_tensor(n, kv_dim);
        g.upload(&kt, &kvv);
        let vt = g.new_tensor(n, kv_dim);
        g.upload(&vt, &kvv);
        let mut out = g.new_tensor(n, h * hd);
        let span = [SeqSpan::whole(SeqPages { pages: &pages, slot: 0, sink: 0 }, n, 0, &spec)];
        g.attention(&mut qt, &mut kt, &vt, &mut cache, 0, &span, None, None, &mut out);
        for is_v in [false, true] {
            let got = g.read_kv_rows(&cache, 0, is_v, 0..n).unwrap();
            let rb = got.len() / n;
            let mut want = vec![0u8; fmt.bytes(kv_dim)];
            for (r, x) in rows.iter().enumerate() {
                fmt.quantize_row(x, &mut want);
                let row = &got[r * rb..r * rb + want.len()];
                let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
                if row != &want[..] && amax / (qmax as f32) < f32::MIN_POSITIVE {
                    // The step absmax/qmax is an f32 subnormal: WGSL lets a GPU flush it to
                    // zero (NVIDIA's Vulkan driver does), and then it writes the zero row's bytes.
                    fmt.quantize_row(&vec![0.0; x.len()], &mut want);
                }
                assert_eq!(row, &want[..], "{ty} row {r}");
                assert!(got[r * rb + want.len()..(r + 1) * rb].iter().all(|&b| b == 0), "{ty} row {r}: padding");
            }
        }
        eprintln!("{ty}: {n} edge rows of {kv_dim} values written byte for byte as the CPU");
    }
}

/// The rotated and per-channel K/V writes on edge rows, byte for byte against the CPU
/// backend's cache: an all-zero block, values whose scales and steps are f16 subnormals,
/// large values, values past f16's range (a per-channel column holding ±inf decodes as
/// NaN on both), a constant channel (step 0) and a channel with one outlier row, written in
/// a batch that completes a group of 32 and leaves 9 rows in the window, then in single
/// rows that complete the next group. Position 0 (a per-channel cache's sink, left out of
/// group 0's ranges) holds values far outside the other rows' ranges both ways, whose
/// codes clamp to 0 and to the top.
#[test]
fn rotated_and_channel_cache_write_edge_rows() {
    use CacheFormat::*;
    let test = "rotated_and_channel_cache_write_edge_rows";
    let Some(gpu) = gpu(test, false, None) else { return };
    let mut p = Pair { cpu: ggml_cpu(), gpu };
    let mut rng = Rng::new(21);
    let (h, hkv, hd) = (4, 2, 64);
    let kv_dim = hkv * hd;
    let spec = standard_spec(h, hkv, hd);
    let n = 64;
    let mut rows: Vec<Vec<f32>> = (0..n).map(|_| rng.normals(kv_dim)).collect();
    rows[0][..64].fill(0.0);
    for (c, v) in [(64, 300.0), (65, -300.0), (66, 3e4), (67, -5e3)] {
        rows[0][c] = v;
    }
    rows[1] = rng.normals(kv_dim).iter().map(|v| v * 1e-6).collect();
    rows[2] = rng.normals(kv_dim).iter().map(|v| v * 3e4).collect();
    rows[3] = rng.normals(kv_dim).iter().map(|v| v * 1e-3).collect();
    rows[4] = rng.normals(kv_dim).iter().map(|v| v * 1e4).collect();
    // Subnormal values beside normal ones (a GPU may flush them): the GPU still writes the
    // CPU's bytes.
    rows[6] = rng.normals(kv_dim).iter().map(|v| v * 1e-3).collect();
    for (c, v) in [(3, -1e-40), (4, 1e-40), (70, -3e-39), (71, f32::from_bits(1))] {
        rows[6][c] = v;
    }
    for (r, row) in rows.iter_mut().enumerate() {
        row[5] = 2.5;
        row[9] = if r == 17 { 900.0 } else { 0.125 * (r % 3) as f32 };
    }
    for ty in [Q8r, Q6r, Q4r, Q3r, Q2r, Q8c, Q6c, Q4c, Q3c, Q2c] {
        let kv = KvCacheSpec { n_layers: 1, n_ctx: n, n_seqs: 1, kv_dim, head_dim: hd, k_type: ty, v_type: ty };
        let mut cc = p.cpu.new_kv_cache(&kv).unwrap();
        let mut cg = p.gpu.new_kv_cache(&kv).unwrap();
        // Two pages, the second position's first.
        let pages = [1, 0];
        let seq = SeqPages { pages: &pages, slot: 0, sink: 0 };
        let mut pos0 = 0;
        for batch in [41].into_iter().chain(std::iter::repeat_n(1, n - 41)) {
            let vals = rows[pos0..pos0 + batch].concat();
            let (mut qc, mut qg) = p.tensor(batch, h * hd, &vec![0.5; batch * h * hd]);
            let (mut kc, mut kg) = p.tensor(batch, kv_dim, &vals);
            let (vc, vg) = p.tensor(batch, kv_dim, &vals);
            let (mut oc, mut og) = p.tensor(batch, h * hd, &[]);
            let span = [SeqSpan::whole(seq, batch, pos0, &spec)];
            p.cpu.attention(&mut qc, &mut kc, &vc, &mut cc, 0, &span, None, None, &mut oc);
            p.gpu.attention(&mut qg, &mut kg, &vg, &mut cg, 0, &span, None, None, &mut og);
            pos0 += batch;
            if batch > 1 || pos0 == n {
                for is_v in [false, true] {
                    let cpu = if is_v { &cc.v[0] } else { &cc.k[0] }.stored_bytes();
                    let got = p.gpu.read_kv_buffer(&cg, 0, is_v).unwrap();
                    if matches!(ty.layout(), CacheLayout::Channel(_)) {
                        assert_same_bytes(&got, &cpu, &format!("{ty} after {pos0} rows"));
                    } else {
                        let (crb, grb) = (cpu.len() / n, got.len() / n);
                        for r in 0..n {
                            assert_eq!(&got[r * grb..r * grb + crb], &cpu[r * crb..(r + 1) * crb], "{ty} row {r}");
                        }
                    }
                }
            }
        }
        eprintln!("{ty}: {n} edge rows of {kv_dim} values written byte for byte as the CPU");
    }
}

/// Logits quantized per head over a K cache of keys before RoPE: the GPU's absmax pass
/// reads K through the same rotating reader as the attend step, and matches the CPU's.
#[test]
fn quantized_logits_over_keys_before_rope() {
    use duet_runtime::backend::{LogitQuant, LogitScale};
    let test = "quantized_logits_over_keys_before_rope";
    let Some(gpu) = gpu(test, false, None) else { return };
    let mut p = Pair { cpu: ggml_cpu(), gpu };
    let mut rng = Rng::new(37);
    let rope = RopeSpec { n_rot: 64, freq_base: 10000.0, freq_scale: 1.0, freq_factors: None };
    let base = standard_spec(6, 2, 64);
    for scale in [LogitScale::Head, LogitScale::Tensor] {
        let spec = AttentionSpec { logit_quant: Some(LogitQuant { bits: 6, scale: scale.clone() }), ..base.clone() };
        let data = rng.clone();
        let kv = (CacheFormat::Q3c, CacheFormat::Q3r);
        let (cpu, gpu) = attention_case_rope(&mut p, &mut rng, &spec, kv, &[37, 1, 29, 1], false, Some(&rope));
        let (plain, _) = attention_case_rope(&mut p, &mut data.clone(), &base, kv, &[37, 1, 29, 1], true, Some(&rope));
        let (e, effect) = (nmse(&gpu, &cpu), nmse(&cpu, &plain));
        // As attention_quantized_logits: a logit within the backends' difference of a step
        // boundary rounds either way; a missing rotation in the absmax pass disagrees by
        // about the whole effect.
        let bound = (effect / 5.0).max(1e-6);
        eprintln!(
            "{test}: {scale:?}: GPU vs CPU nmse {e:.2e} (bound {bound:.1e}); vs full-precision logits {effect:.2e}"
        );
        assert!(effect > 1e-5, "6-bit {scale:?} logits changed nothing ({effect:.2e})");
        assert!(e <= bound, "6-bit {scale:?}: GPU vs CPU nmse {e:.2e} > {bound:.1e}");
    }
}
