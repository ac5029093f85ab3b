//! `out = x · Wᵀ` with W in any GGUF type, multi-threaded.
//!
//! As in ggml, activations are first quantized to the 8-bit format the weight type's integer
//! dot product wants (Q8_0, Q8_1 or Q8_K; f32 for float weights), once per activation
//! tensor and reused by every matmul that reads the same tensor (q, k, v; gate, up).
//!
//! Matrices of the common types are repacked at load into interleaved 16-row groups
//! ([`duet_quant::gemm`]); their matmul is split over the pool by groups of rows, each group
//! applied to all tokens in tiles of up to 8 tokens while its weights are hot in cache.
//! Other types (and `DUET_GEMM=off`) use the per-row dot kernels: work is split over weight
//! rows; each chunk of rows is applied to every token.

use duet_quant::GgmlType;
use duet_quant::dot::{ActRow, Kernels, act_type};
use duet_quant::gemm::{ActKind, GROUP, GemmKernels, PackedMatrix, QActs};

use super::pool::ThreadPool;
use super::tensor::{CpuTensor, CpuWeight};

/// Quantized activations of one tensor version, for the per-row and the packed kernels.
#[derive(Default)]
pub struct ActCache {
    key: Option<(u64, GgmlType, usize)>,
    rows: Vec<ActRow>,
    packed_key: Option<(u64, ActKind, usize)>,
    packed: Vec<QActs>,
}

/// A raw pointer that may be shared between threads because every thread writes disjoint
/// elements.
#[derive(Clone, Copy)]
struct SharedMut(*mut f32);
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}

impl SharedMut {
    fn get(self) -> *mut f32 {
        self.0
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
    gk: Option<&GemmKernels>,
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
        return matmul_packed(pool, gk, p, x, out, acts);
    }
    let t_rows = x.rows;
    let a_ty = act_type(w.ty);
    let key = (x.version, a_ty, t_rows);
    if acts.key != Some(key) {
        if acts.key.map(|k| k.1) != Some(a_ty) {
            acts.rows.clear();
        }
        acts.rows.resize_with(t_rows, || ActRow::empty_for(w.ty));
        let rows_ptr = acts.rows.as_mut_ptr() as usize;
        let cols = x.cols;
        let xv = x.view();
        pool.for_chunks(t_rows, 1, &|range| {
            for t in range {
                // SAFETY: each t is handed to exactly one thread.
                let row = unsafe { &mut *(rows_ptr as *mut ActRow).add(t) };
                row.requantize(&xv[t * cols..(t + 1) * cols]);
            }
        });
        acts.key = Some(key);
    }
    let n = w.rows;
    let row_bytes = w.row_bytes();
    let wb = w.bytes();
    let outp = SharedMut(out.view_mut().as_mut_ptr());
    let acts_rows = &acts.rows;
    let ty = w.ty;
    pool.for_chunks(n, rows_per_chunk(n, pool.n_threads()), &|range| {
        for r in range {
            let wrow = &wb[r * row_bytes..(r + 1) * row_bytes];
            for (t, act) in acts_rows.iter().enumerate() {
                let v = k.vec_dot(ty, wrow, act).expect("weight and activation types match");
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
    let key = (x.version, kind, x.rows);
    if acts.packed_key != Some(key) {
        let slot = match acts.packed.iter().position(|a| a.kind() == kind) {
            Some(i) => i,
            None => {
                acts.packed.push(QActs::new(kind));
                acts.packed.len() - 1
            }
        };
        let par = |n: usize, f: &(dyn Fn(std::ops::Range<usize>) + Sync)| pool.for_chunks(n, 1, f);
        acts.packed[slot].quantize(x.view(), x.rows, x.cols, &par);
        acts.packed_key = Some(key);
    }
    let qa = acts.packed.iter().find(|a| a.kind() == kind).expect("quantized above");
    let groups = w.groups();
    // Enough chunks per thread to balance a busy machine; whole groups of 16 rows each.
    let chunk = (groups / (pool.n_threads() * 6)).max(1);
    let ld = out.cols;
    let outp = SharedMut(out.view_mut().as_mut_ptr());
    debug_assert!(groups * GROUP >= w.rows());
    pool.for_chunks(groups, chunk, &|range| {
        // SAFETY: `out` is x.rows × ld (ld = w.rows) and this chunk's groups own their rows
        // for every token; chunks are disjoint.
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
        let Some(gk) = duet_quant::gemm::gemm_kernels() else {
            eprintln!("SKIPPED packed_matmul_matches_per_row_kernels: no packed kernel set on this CPU");
            return;
        };
        let pool = ThreadPool::new(3);
        let mut cache = ActCache::default();
        let types = [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::F16,
            GgmlType::BF16,
        ];
        for n_tok in [1, 7, 19] {
            let x = acts(n_tok, 512, n_tok as u32);
            for (i, ty) in types.into_iter().enumerate() {
                let w = weight(ty, 83, 512, i as u32);
                let mut packed = CpuTensor::new(n_tok, 83);
                let mut reference = CpuTensor::new(n_tok, 83);
                matmul(&pool, kernels(), Some(gk), &w, &x, &mut packed, &mut cache);
                assert!(w.packed.get().is_some_and(|p| p.is_some()), "{ty} was not packed");
                matmul(&pool, kernels(), None, &w, &x, &mut reference, &mut cache);
                let scale = reference.view().iter().fold(0f32, |m, v| m.max(v.abs()));
                for (j, (a, b)) in packed.view().iter().zip(reference.view()).enumerate() {
                    assert!((a - b).abs() <= 1e-5 * scale.max(1.0), "{ty} tokens={n_tok} [{j}]: {a} vs {b}");
                }
            }
        }
    }
}
