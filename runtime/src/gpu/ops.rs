//! The row-wise and element-wise ops: RMSNorm, RoPE, SwiGLU, residual add and bias, row
//! copy, DEX, DIFF V2's pair combine.

use std::sync::Arc;

use duet_shaders::{
    AddParams, CopyRowParams, DEX_MAX_HEAD_DIM, DexParams, EW_WG, Op, PairCombineParams, RmsNormParams, RopeParams,
    SwiGluParams,
};

use super::buffers::{Buf, GpuTensor, GpuWeight};
use super::{GpuBackend, grid};
use crate::backend::RopeSpec;

pub fn rms_norm(b: &mut GpuBackend, x: &GpuTensor, weight: &GpuWeight, eps: f32, out: &mut GpuTensor) {
    assert_eq!(weight.cols, x.cols);
    let g = grid(x.rows, 1);
    let params = RmsNormParams { rows: x.rows as u32, cols: x.cols as u32, eps, grid_x: g.0 };
    b.run(Op::RmsNorm, &params, &[&x.buf, weight.single(), &out.buf], g);
}

/// x[i] += y[i % y_len] over x's rows in use.
pub fn add(b: &mut GpuBackend, x: &mut GpuTensor, y: &Arc<Buf>, y_len: usize) {
    let n = x.rows * x.cols;
    let g = grid(n, EW_WG as usize);
    let params = AddParams { n: n as u32, y_len: y_len as u32, grid_x: g.0 };
    b.run(Op::Add, &params, &[y, &x.buf], g);
}

pub fn swiglu(b: &mut GpuBackend, gate: &mut GpuTensor, up: &GpuTensor) {
    let n = gate.rows * gate.cols;
    let g = grid(n, EW_WG as usize);
    b.run(Op::SwiGlu, &SwiGluParams { n: n as u32, grid_x: g.0 }, &[&up.buf, &gate.buf], g);
}

pub fn copy_rows(b: &mut GpuBackend, x: &GpuTensor, src_row: usize, out: &mut GpuTensor, dst_row: usize, rows: usize) {
    let cols = x.cols;
    assert!(
        out.cols == cols && dst_row + rows <= out.cap_rows && src_row + rows <= x.cap_rows,
        "copy_rows into rows of another width or past a tensor"
    );
    // Consecutive rows are consecutive values: one copy of rows·cols of them.
    let n = rows * cols;
    let g = grid(n, EW_WG as usize);
    let params = CopyRowParams { n: n as u32, src: (src_row * cols) as u32, dst: (dst_row * cols) as u32, grid_x: g.0 };
    b.run(Op::CopyRow, &params, &[&x.buf, &out.buf], g);
}

pub fn rope(b: &mut GpuBackend, x: &mut GpuTensor, n_heads: usize, head_dim: usize, pos0: usize, rope: &RopeSpec) {
    let n_pairs = rope.n_rot / 2;
    let table = b.rope_table(rope, pos0 + x.rows);
    let n = x.rows * n_heads * n_pairs;
    let g = grid(n, EW_WG as usize);
    let params = RopeParams {
        rows: x.rows as u32,
        cols: x.cols as u32,
        n_heads: n_heads as u32,
        head_dim: head_dim as u32,
        n_pairs: n_pairs as u32,
        pos0: pos0 as u32,
        grid_x: g.0,
    };
    b.run(Op::Rope, &params, &[&table, &x.buf], g);
}

pub fn dex(b: &mut GpuBackend, x: &mut GpuTensor, w_d: &GpuWeight, lambda: f32, heads: &[usize], head_dim: usize) {
    assert!(head_dim <= DEX_MAX_HEAD_DIM as usize, "DEX on the GPU supports head_dim up to {DEX_MAX_HEAD_DIM}");
    let n_heads = x.cols / head_dim;
    assert!(n_heads <= 256, "DEX on the GPU supports up to 256 heads");
    let mut mask = [[0u32; 4]; 2];
    for &h in heads {
        mask[h / 128][(h / 32) % 4] |= 1 << (h % 32);
    }
    let g = grid(x.rows * n_heads, 1);
    let params = DexParams {
        rows: x.rows as u32,
        cols: x.cols as u32,
        n_heads: n_heads as u32,
        head_dim: head_dim as u32,
        lambda,
        grid_x: g.0,
        mask,
        ..Default::default()
    };
    b.run(Op::Dex, &params, &[w_d.single(), &x.buf], g);
}

pub fn pair_combine(b: &mut GpuBackend, att: &GpuTensor, gate: &GpuTensor, head_dim: usize, out: &mut GpuTensor) {
    let n_pairs = gate.cols;
    assert!(
        att.cols == 2 * n_pairs * head_dim && out.cols == n_pairs * head_dim && att.rows == gate.rows,
        "pair_combine: att ×{}, gate ×{}, out ×{} do not fit head_dim {head_dim}",
        att.cols,
        gate.cols,
        out.cols
    );
    let n = att.rows * n_pairs * head_dim;
    let g = grid(n, EW_WG as usize);
    let params =
        PairCombineParams { rows: att.rows as u32, n_pairs: n_pairs as u32, head_dim: head_dim as u32, grid_x: g.0 };
    b.run(Op::PairCombine, &params, &[&att.buf, &gate.buf, &out.buf], g);
}
