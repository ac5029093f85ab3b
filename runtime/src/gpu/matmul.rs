//! Weights on the GPU and the ops that read them: `out = x · Wᵀ` (a matrix-vector kernel
//! for one token, a tiled matrix-matrix kernel for more) and the embedding lookup. Each
//! kernel is dispatched once per row chunk of the weight (one chunk unless the weight is
//! larger than one binding).

use std::sync::Arc;

use duet_shaders::{EmbedParams, MM_TM, MM_TN, MV_WG, MatMulParams, MatVecParams, Op, WeightType};

use super::buffers::{GpuTensor, GpuWeight, upload_rows, weight_type};
use super::{GpuBackend, grid};
use crate::backend::WeightView;
use crate::error::RuntimeError;

pub fn load_weight(b: &mut GpuBackend, w: &WeightView<'_>) -> Result<GpuWeight, RuntimeError> {
    let Some(ty) = weight_type(w.ty) else {
        return Err(RuntimeError::Unsupported(format!(
            "tensor '{}' has type {}, which the GPU backend cannot compute with",
            w.name, w.ty
        )));
    };
    // Vectors (norms, biases) and the DEX matrix are read element-wise as f32.
    let as_f32 = w.rows == 1 || w.name.ends_with("attn_dex.weight");
    if as_f32 {
        let mut v = vec![0f32; w.rows * w.cols];
        duet_quant::dequantize(w.ty, w.data, &mut v)
            .map_err(|e| RuntimeError::BadModel(format!("tensor '{}': {e}", w.name)))?;
        let buf = b
            .ctx
            .checked(&format!("tensor '{}'", w.name), || b.alloc.init(&b.ctx, bytemuck::cast_slice(&v), w.name))?;
        return Ok(GpuWeight {
            ty: WeightType::F32,
            rows: w.rows,
            cols: w.cols,
            row_bytes: 4 * w.cols,
            chunks: vec![super::buffers::Chunk { row0: 0, rows: w.rows, buf }],
        });
    }
    let row_bytes = duet_quant::row_bytes(w.ty, w.cols)
        .ok_or_else(|| RuntimeError::BadModel(format!("tensor '{}': rows are not whole blocks", w.name)))?;
    if w.data.len() < row_bytes * w.rows {
        return Err(RuntimeError::BadModel(format!("tensor '{}' is shorter than its shape", w.name)));
    }
    let chunks = upload_rows(&b.ctx, &b.alloc, w.name, w.data, w.rows, row_bytes)?;
    b.prepare(&[Op::MatVec(ty), Op::MatMul(ty), Op::Embed(ty)])?;
    Ok(GpuWeight { ty, rows: w.rows, cols: w.cols, row_bytes, chunks })
}

pub fn matmul(b: &mut GpuBackend, w: &GpuWeight, x: &GpuTensor, out: &mut GpuTensor) {
    assert_eq!(x.cols, w.cols, "matmul: activation width {} != weight row length {}", x.cols, w.cols);
    assert_eq!(out.cols, w.rows, "matmul: output width {} != weight rows {}", out.cols, w.rows);
    assert_eq!(out.rows, x.rows);
    let t = x.rows;
    for c in &w.chunks {
        if t == 1 {
            let tpr = b.ctx.mv_threads_per_row;
            let g = grid(c.rows, (MV_WG / tpr) as usize);
            let params = MatVecParams {
                n_rows: c.rows as u32,
                cols: w.cols as u32,
                row_bytes: w.row_bytes as u32,
                out_off: c.row0 as u32,
                grid_x: g.0,
                x_off: 0,
                o_base: 0,
                threads_per_row: tpr,
            };
            b.run(Op::MatVec(w.ty), &params, &[&c.buf, &x.buf, &out.buf], g);
        } else {
            let g = (c.rows.div_ceil(MM_TM as usize) as u32, t.div_ceil(MM_TN as usize) as u32);
            let params = MatMulParams {
                n_rows: c.rows as u32,
                cols: w.cols as u32,
                row_bytes: w.row_bytes as u32,
                out_off: c.row0 as u32,
                grid_x: g.0,
                t_rows: t as u32,
                x_stride: x.cols as u32,
                o_stride: out.cols as u32,
            };
            b.run(Op::MatMul(w.ty), &params, &[&c.buf, &x.buf, &out.buf], g);
        }
    }
}

pub fn embed(b: &mut GpuBackend, table: &GpuWeight, tokens: &[u32], out: &mut GpuTensor) {
    assert_eq!(out.cols, table.cols);
    assert!(tokens.len() <= out.rows, "embed: {} tokens into {} rows", tokens.len(), out.rows);
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= table.rows) {
        panic!("token id {bad} is outside the vocabulary ({} tokens)", table.rows);
    }
    if tokens.is_empty() {
        return;
    }
    if b.ids_pending {
        // The ids buffer is still to be read by recorded work: run that first.
        b.rec.submit(&b.ctx, &b.alloc, None);
    }
    let bytes = (tokens.len() * 4) as u64;
    if b.ids.size < bytes {
        b.ids = b.alloc.storage(&b.ctx, bytes.next_power_of_two(), "token ids");
    }
    b.ctx.queue.write_buffer(&b.ids.buffer, 0, bytemuck::cast_slice(tokens));
    b.ids_pending = true;
    let ids = Arc::clone(&b.ids);
    for c in &table.chunks {
        let g = grid(tokens.len(), 1);
        let params = EmbedParams {
            n_tokens: tokens.len() as u32,
            cols: table.cols as u32,
            row_bytes: table.row_bytes as u32,
            row0: c.row0 as u32,
            n_rows: c.rows as u32,
            grid_x: g.0,
        };
        b.run(Op::Embed(table.ty), &params, &[&c.buf, &ids, &out.buf], g);
    }
}
