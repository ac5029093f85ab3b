//! `out = x · Wᵀ` with W in any GGUF type, multi-threaded.
//!
//! As in ggml, activations are first quantized to the 8-bit format the weight type's integer
//! dot product wants (Q8_0, Q8_1 or Q8_K; f32 for float weights), once per activation
//! tensor and reused by every matmul that reads the same tensor (q, k, v; gate, up). Work is
//! split over weight rows; each chunk of rows is applied to every token while it is hot in
//! cache, so prompt processing reads each weight once per chunk of tokens.

use duet_quant::GgmlType;
use duet_quant::dot::{ActRow, Kernels, act_type};

use super::pool::ThreadPool;
use super::tensor::{CpuTensor, CpuWeight};

/// Quantized activations of one tensor version for one activation type.
#[derive(Default)]
pub struct ActCache {
    key: Option<(u64, GgmlType, usize)>,
    rows: Vec<ActRow>,
}

/// A raw pointer that may be shared between threads because every thread writes disjoint
/// elements.
#[derive(Clone, Copy)]
struct SharedMut(*mut f32);
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}

/// Rows of W per work item: enough to amortise scheduling, small enough to balance.
fn rows_per_chunk(n_rows: usize, n_threads: usize) -> usize {
    (n_rows / (n_threads * 8)).clamp(4, 64)
}

pub fn matmul(pool: &ThreadPool, k: &Kernels, w: &CpuWeight, x: &CpuTensor, out: &mut CpuTensor, acts: &mut ActCache) {
    assert_eq!(x.cols, w.cols, "matmul: activation width {} != weight row length {}", x.cols, w.cols);
    assert_eq!(out.cols, w.rows, "matmul: output width {} != weight rows {}", out.cols, w.rows);
    assert_eq!(out.rows, x.rows);
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
        let outp = outp;
        for r in range {
            let wrow = &wb[r * row_bytes..(r + 1) * row_bytes];
            for (t, act) in acts_rows.iter().enumerate() {
                let v = k.vec_dot(ty, wrow, act).expect("weight and activation types match");
                // SAFETY: (t, r) pairs are disjoint between chunks.
                unsafe { *outp.0.add(t * n + r) = v };
            }
        }
    });
}
