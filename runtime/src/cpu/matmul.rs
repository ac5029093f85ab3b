//! `out = x · Wᵀ` with W in any GGUF type, multi-threaded.
//!
//! As in ggml, activations are first quantized to the 8-bit format the weight type's integer
//! dot product wants (Q8_0, Q8_1 or Q8_K; f32 for float weights), once per activation
//! tensor and reused by every matmul that reads the same tensor (q, k, v; gate, up).
//!
//! By default ([`ActPrecision::Q8x2`]) each activation is quantized at two levels: the Q8
//! row, then that row's rounding error on a grid 128 times finer ([`second_level`]); a matmul
//! sums the products of both (the packed 32-element kernels add the two levels' integer sums
//! first). The activation error drops ~128-fold, which takes the whole-model agreement with an
//! f32 reference from ggml's level (SmolLM2: top-1 ~94%, KL ~0.012) to ~99.8% / 1e-4, at twice
//! the multiply work (decode reads the weights once either way: both levels ride in one token
//! tile). [`ActPrecision::Q8`] is ggml's arithmetic exactly.
//!
//! Matrices of the common types are repacked at load into interleaved 16-row groups
//! ([`duet_quant::gemm`]); their matmul is split over the pool by groups of rows, each group
//! applied to all tokens in tiles of up to 8 tokens while its weights are hot in cache.
//! Other types (and `KernelChoice::gemm` "off") use the per-row dot kernels: work is split over weight
//! rows; each chunk of rows is applied to every token.

use duet_quant::GgmlType;
use duet_quant::dot::{ActRow, Kernels, act_type};
use duet_quant::gemm::{ActKind, GROUP, GemmKernels, PackedMatrix, QActs};

use super::gemm_choice::GemmChoice;
use duet_quant::second_level;

use super::SharedMut;
use super::pool::ThreadPool;
use super::tensor::{CpuTensor, CpuWeight};

/// How activations are quantized for the integer dot products.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ActPrecision {
    /// ggml's single Q8 quantization (llama.cpp's arithmetic).
    Q8,
    /// Q8 plus its rounding error on a grid 128 times finer (see the module docs).
    #[default]
    Q8x2,
    /// Q8x2 for products of at most [`TWO_LEVEL_FREE_ROWS`] activation rows (decoding one or a
    /// few streams; also a prompt's single-row output head and its last layer's feed-forward
    /// block, which runs on the last row only), where the weights' reading, not
    /// the multiplies, sets the time; Q8 for larger batches (prompts), whose time is the
    /// multiplies that a second level would double. Prompts then run at ggml's speed, but
    /// their K/V carry ggml's error into every later token (SmolLM2: decoded tokens' KL 50×
    /// that of Q8x2, 4× below Q8's; tests/smollm2.rs), hence not the default.
    Auto,
}

/// Rows whose two levels fit one AVX-512 token tile (8 columns): up to here the second level
/// reuses the unpacked weights of the first and costs decode almost nothing. (AVX2's tiles of
/// 4 take them in two, unpacking the weights twice but still reading them from memory once.)
pub const TWO_LEVEL_FREE_ROWS: usize = 4;

impl ActPrecision {
    /// Whether a product of `rows` activation rows uses the second level.
    pub fn two_level(self, rows: usize) -> bool {
        match self {
            ActPrecision::Q8 => false,
            ActPrecision::Q8x2 => true,
            ActPrecision::Auto => rows <= TWO_LEVEL_FREE_ROWS,
        }
    }
}

/// Tokens per two-level packed matmul call (see [`matmul_packed`]).
const TWO_LEVEL_CHUNK: usize = 64;

/// What a [`PackedActs`] slot holds: (tensor version, kind, tokens of the tensor, first token,
/// two-level).
type PackedKey = (u64, ActKind, usize, usize, bool);

/// One chunk's packed activations and the key of what they hold (None: nothing yet).
struct PackedActs {
    key: Option<PackedKey>,
    acts: QActs,
}

/// Quantized activations of one tensor version, for the per-row and the packed kernels.
#[derive(Default)]
pub struct ActCache {
    pub precision: ActPrecision,
    key: Option<(u64, GgmlType, usize)>,
    rows: Vec<ActRow>,
    /// Second level of `rows` when the last product was two-level, else empty.
    lo: Vec<ActRow>,
    /// One slot per (kind, first token, two-level): a two-level prompt runs in chunks of
    /// [`TWO_LEVEL_CHUNK`] tokens, and every chunk stays quantized for the next matmul of the
    /// same tensor (q, k, v; gate, up). With one slot per kind, the second chunk evicted the
    /// first and each of those matmuls quantized its input again (of a 1.1B Q6_K prompt,
    /// activation quantization took 6.7% of the time). Slots stay allocated, as the runtime's
    /// other scratch tensors do: one per 64 tokens of the largest batch and activation kind,
    /// each sized for the widest input (~37 KiB a token at 5632 columns with both levels and
    /// room for the merged values: ~19 MiB for a 512-token batch, the default `-b`; the
    /// single-level path keeps a whole batch in one slot the same way).
    packed: Vec<PackedActs>,
}

impl ActCache {
    pub fn new(precision: ActPrecision) -> ActCache {
        ActCache { precision, ..ActCache::default() }
    }
}

/// Rows of W per work item: enough to amortise scheduling, small enough to balance.
fn rows_per_chunk(n_rows: usize, n_threads: usize) -> usize {
    (n_rows / (n_threads * 8)).clamp(4, 64)
}

/// Packs `w` for `gk` (in parallel on `pool`), or `None` if its type has no packed layout.
pub fn pack(pool: &ThreadPool, w: &CpuWeight) -> Option<PackedMatrix> {
    if w.rows < 2 || !duet_quant::gemm::packable(w.ty) {
        return None;
    }
    let par = |n: usize, f: &(dyn Fn(std::ops::Range<usize>) + Sync)| pool.for_chunks(n, 4, f);
    PackedMatrix::pack(w.ty, w.bytes(), w.rows, w.cols, &par).ok()
}

pub fn matmul(
    pool: &ThreadPool,
    k: &Kernels,
    gk: Option<&GemmChoice>,
    w: &CpuWeight,
    x: &CpuTensor,
    out: &mut CpuTensor,
    acts: &mut ActCache,
) {
    assert_eq!(x.cols, w.cols, "matmul: activation width {} != weight row length {}", x.cols, w.cols);
    assert_eq!(out.cols, w.rows, "matmul: output width {} != weight rows {}", out.cols, w.rows);
    assert_eq!(out.rows, x.rows);
    if let Some(gk) = gk
        && let Some(p) = w.packed.get_or_init(|| pack(pool, w))
    {
        return matmul_packed(pool, gk.for_product(p.ty(), x.rows), p, x, out, acts);
    }
    let t_rows = x.rows;
    let a_ty = act_type(w.ty);
    let two_level = acts.precision.two_level(t_rows) && a_ty != GgmlType::F32;
    let key = (x.version, a_ty, t_rows);
    if acts.key != Some(key) || acts.lo.is_empty() == two_level {
        if acts.key.map(|k| k.1) != Some(a_ty) {
            acts.rows.clear();
            acts.lo.clear();
        }
        acts.rows.resize_with(t_rows, || ActRow::empty_for(w.ty));
        if two_level {
            acts.lo.resize_with(t_rows, || ActRow::empty_for(w.ty));
        } else {
            acts.lo.clear();
        }
        let rows_ptr = acts.rows.as_mut_ptr() as usize;
        let lo_ptr = acts.lo.as_mut_ptr() as usize;
        let cols = x.cols;
        let xv = x.view();
        pool.for_chunks(t_rows, 1, &|range| {
            for t in range {
                // SAFETY: each t is handed to exactly one thread.
                let row = unsafe { &mut *(rows_ptr as *mut ActRow).add(t) };
                let xt = &xv[t * cols..(t + 1) * cols];
                row.requantize(xt);
                if two_level {
                    // SAFETY: as above; `lo` has t_rows rows when two_level.
                    row.second_level_into(xt, unsafe { &mut *(lo_ptr as *mut ActRow).add(t) });
                }
            }
        });
        acts.key = Some(key);
    }
    let n = w.rows;
    let row_bytes = w.row_bytes();
    let wb = w.bytes();
    let outp = SharedMut::new(out.view_mut().as_mut_ptr());
    let acts_rows = &acts.rows;
    let acts_lo = &acts.lo;
    let ty = w.ty;
    pool.for_chunks(n, rows_per_chunk(n, pool.n_threads()), &|range| {
        for r in range {
            let wrow = &wb[r * row_bytes..(r + 1) * row_bytes];
            for (t, act) in acts_rows.iter().enumerate() {
                let mut v = k.vec_dot(ty, wrow, act).expect("weight and activation types match");
                if let Some(lo) = acts_lo.get(t) {
                    // `lo` carries the first level's scales (ActRow::second_level_into).
                    v += k.vec_dot(ty, wrow, lo).expect("weight and activation types match") / second_level::RATIO;
                }
                // SAFETY: (t, r) pairs are disjoint between chunks.
                unsafe { *outp.get().add(t * n + r) = v };
            }
        }
    });
}

fn matmul_packed(
    pool: &ThreadPool,
    gk: &GemmKernels,
    w: &PackedMatrix,
    x: &CpuTensor,
    out: &mut CpuTensor,
    acts: &mut ActCache,
) {
    let kind = ActKind::for_weight(w.ty()).expect("packed types have an activation kind");
    let ld = out.cols;
    if !acts.precision.two_level(x.rows) || kind == ActKind::F32 {
        let qa = quantized(pool, acts, kind, x, 0, x.rows, false);
        run_groups(pool, gk, w, 0..w.groups(), qa, out.view_mut(), ld);
        return;
    }
    // Chunks of tokens keep a chunk's activations in L2 while every group of rows runs over
    // them: a pair's segments span ~13 KiB at 2048 columns (both levels, their sums, room for
    // the merged i16 values), ~5-9 KiB of it read. (Single-level batches, ~3.4 KiB a token,
    // run whole.)
    for t0 in (0..x.rows).step_by(TWO_LEVEL_CHUNK) {
        let n = TWO_LEVEL_CHUNK.min(x.rows - t0);
        let qa = quantized(pool, acts, kind, x, t0, n, true);
        if gk.reads_merged(w.ty()) {
            qa.add_merged(&par(pool));
        }
        run_groups(pool, gk, w, 0..w.groups(), qa, &mut out.view_mut()[t0 * ld..(t0 + n) * ld], ld);
    }
}

/// Tokens `t0..t0 + n` of `x` quantized for `kind` (two-level: 2·n rows, without the merged
/// activations that only some kernels read), reused while the tensor version and the range
/// stay the same (q, k and v read one normed tensor).
fn quantized<'a>(
    pool: &ThreadPool,
    acts: &'a mut ActCache,
    kind: ActKind,
    x: &CpuTensor,
    t0: usize,
    n: usize,
    two_level: bool,
) -> &'a mut QActs {
    let key = (x.version, kind, x.rows, t0, two_level);
    let same_slot = |p: &PackedActs| p.acts.kind() == kind && p.key.is_some_and(|k| k.3 == t0 && k.4 == two_level);
    let slot = match acts.packed.iter().position(same_slot) {
        Some(i) => i,
        None => {
            acts.packed.push(PackedActs { key: None, acts: QActs::new(kind) });
            acts.packed.len() - 1
        }
    };
    let p = &mut acts.packed[slot];
    if p.key != Some(key) {
        quantize(pool, &mut p.acts, &x.view()[t0 * x.cols..(t0 + n) * x.cols], n, x.cols, two_level);
        p.key = Some(key);
    }
    &mut p.acts
}

/// `n` rows of `cols` values quantized into `a`: two-level without the merged activations
/// (added for the kernels that read them, [`QActs::add_merged`]), or single-level.
pub(super) fn quantize(pool: &ThreadPool, a: &mut QActs, xs: &[f32], n: usize, cols: usize, two_level: bool) {
    if two_level {
        a.quantize_two_level_unmerged(xs, n, cols, &par(pool));
    } else {
        a.quantize(xs, n, cols, &par(pool));
    }
}

/// The pool as the parallel for-loop `duet_quant` takes: one token (or pair) a chunk.
pub(super) fn par(pool: &ThreadPool) -> impl Fn(usize, &(dyn Fn(std::ops::Range<usize>) + Sync)) + '_ {
    |n, f| pool.for_chunks(n, 1, f)
}

/// `out[t·ld + r]` for every token of `qa` and the rows of `w`'s `groups`, split over the
/// pool by groups.
pub(super) fn run_groups(
    pool: &ThreadPool,
    gk: &GemmKernels,
    w: &PackedMatrix,
    groups: std::ops::Range<usize>,
    qa: &QActs,
    out: &mut [f32],
    ld: usize,
) {
    assert!(out.len() >= qa.tokens() * ld && ld >= w.rows() && groups.end <= w.groups());
    // Enough chunks per thread to balance a busy machine; whole groups of 16 rows each.
    let chunk = (groups.len() / (pool.n_threads() * 6)).max(1);
    let outp = SharedMut::new(out.as_mut_ptr());
    debug_assert!(w.groups() * GROUP >= w.rows());
    let first = groups.start;
    pool.for_chunks(groups.len(), chunk, &|range| {
        let range = first + range.start..first + range.end;
        // SAFETY: `out` holds qa.tokens() × ld (ld ≥ w.rows) and this chunk's groups own their
        // rows for every token; chunks are disjoint.
        unsafe { gk.gemm_groups(w, qa, range, outp.get(), ld) }.expect("packed matmul shapes match");
    });
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;

    use duet_quant::dot::kernels;

    use super::*;
    use crate::cpu::tensor::{Storage, fresh_version};

    fn weight(ty: GgmlType, rows: usize, cols: usize, seed: u32) -> CpuWeight {
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| {
                ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect();
        let mut bytes = vec![0u8; duet_quant::row_bytes(ty, cols).unwrap() * rows];
        duet_quant::quantize(ty, &w, cols, &mut bytes).unwrap();
        CpuWeight { ty, rows, cols, storage: Storage::Owned(bytes), f32_values: None, packed: OnceLock::new() }
    }

    fn acts(rows: usize, cols: usize, seed: u32) -> CpuTensor {
        let mut t = CpuTensor::new(rows, cols);
        for (i, v) in t.data.iter_mut().enumerate() {
            *v = ((i as u32 ^ seed).wrapping_mul(747_796_405) >> 9) as f32 / (1u32 << 23) as f32 - 0.5;
        }
        t.version = fresh_version();
        t
    }

    /// The packed path (split over a pool of 3 threads, activations cached across matmuls
    /// and kinds) against the per-row kernels, for every packable type.
    #[test]
    fn packed_matmul_matches_per_row_kernels() {
        let Some(choice) = GemmChoice::new() else {
            duet_test_support::cpu_lacks(
                "packed_matmul_matches_per_row_kernels",
                &["avx2", "fma", "f16c"],
                "no packed kernel set on this CPU",
            );
            return;
        };
        let pool = ThreadPool::new(3);
        // Every candidate of the timing (GemmChoice), each pinned in turn.
        for name in choice.candidate_names() {
            let mut gk = choice.clone();
            gk.pin(name).unwrap();
            for precision in [ActPrecision::Q8, ActPrecision::Q8x2] {
                let mut cache = ActCache { precision, ..ActCache::default() };
                packed_matches_per_row(&pool, &gk, &mut cache);
            }
        }
    }

    fn packed_matches_per_row(pool: &ThreadPool, gk: &GemmChoice, cache: &mut ActCache) {
        let types = GgmlType::WEIGHT_TYPES;
        // 70 tokens: two chunks of the two-level path.
        for n_tok in [1, 7, 19, 70] {
            let x = acts(n_tok, 512, n_tok as u32);
            for (i, ty) in types.into_iter().enumerate() {
                let w = weight(ty, 83, 512, i as u32);
                let mut packed = CpuTensor::new(n_tok, 83);
                let mut reference = CpuTensor::new(n_tok, 83);
                matmul(pool, kernels(), Some(gk), &w, &x, &mut packed, cache);
                assert!(w.packed.get().is_some_and(|p| p.is_some()), "{ty} was not packed");
                matmul(pool, kernels(), None, &w, &x, &mut reference, cache);
                let scale = reference.view().iter().fold(0f32, |m, v| m.max(v.abs()));
                for (j, (a, b)) in packed.view().iter().zip(reference.view()).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-5 * scale.max(1.0),
                        "{:?} {ty} tokens={n_tok} [{j}]: {a} vs {b}",
                        cache.precision
                    );
                }
            }
        }
    }

    /// Q8x2 against exact f64 products of the dequantized weights: its error is a small
    /// fraction of single Q8's, on activations with an outlier per token (real hidden states).
    #[test]
    fn two_level_activations_are_closer_to_exact() {
        let pool = ThreadPool::new(2);
        let gk = GemmChoice::new();
        let (n_tok, cols, rows) = (3, 512, 40);
        let mut x = acts(n_tok, cols, 9);
        for t in 0..n_tok {
            x.data[t * cols + 5 + t] = 40.0;
        }
        for ty in [GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0] {
            let w = weight(ty, rows, cols, 3);
            let mut wd = vec![0f32; rows * cols];
            duet_quant::dequantize(ty, w.bytes(), &mut wd).unwrap();
            let err = |precision: ActPrecision, gk: Option<&GemmChoice>| {
                let mut cache = ActCache { precision, ..ActCache::default() };
                let mut out = CpuTensor::new(n_tok, rows);
                matmul(&pool, kernels(), gk, &w, &x, &mut out, &mut cache);
                let mut e = 0f64;
                for t in 0..n_tok {
                    for r in 0..rows {
                        let exact: f64 = (0..cols).map(|i| wd[r * cols + i] as f64 * x.data[t * cols + i] as f64).sum();
                        e += (out.data[t * rows + r] as f64 - exact).powi(2);
                    }
                }
                e.sqrt()
            };
            for gk in [None, gk.as_ref()] {
                let (e1, e2) = (err(ActPrecision::Q8, gk), err(ActPrecision::Q8x2, gk));
                assert!(e2 * 30.0 < e1, "{ty} packed={}: Q8x2 error {e2:e} vs Q8 {e1:e}", gk.is_some());
            }
        }
    }

    /// Auto is Q8x2 bit for bit up to TWO_LEVEL_FREE_ROWS rows and Q8 above, on both paths.
    #[test]
    fn auto_uses_the_second_level_only_for_small_batches() {
        let pool = ThreadPool::new(2);
        let w = weight(GgmlType::Q4_K, 40, 512, 5);
        let choice = GemmChoice::new();
        for gk in [None, choice.as_ref()] {
            for (n_tok, same_as) in
                [(1, ActPrecision::Q8x2), (TWO_LEVEL_FREE_ROWS, ActPrecision::Q8x2), (5, ActPrecision::Q8)]
            {
                let x = acts(n_tok, 512, 11);
                let run = |precision| {
                    let mut cache = ActCache::new(precision);
                    let mut out = CpuTensor::new(n_tok, 40);
                    matmul(&pool, kernels(), gk, &w, &x, &mut out, &mut cache);
                    out.data
                };
                let (auto, x2, q8) = (run(ActPrecision::Auto), run(ActPrecision::Q8x2), run(ActPrecision::Q8));
                assert_ne!(x2, q8, "the two precisions must differ for this test to mean anything");
                let want = if same_as == ActPrecision::Q8x2 { &x2 } else { &q8 };
                assert_eq!(&auto, want, "{n_tok} tokens, packed={}", gk.is_some());
            }
        }
    }
}
