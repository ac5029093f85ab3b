//! Weights on the GPU and the ops that read them: `out = x · Wᵀ` (the matvec kernel once per
//! token for up to [`MATVEC_TOKENS`] tokens, a tiled matrix-matrix kernel for more) and the
//! embedding lookup. Each kernel is
//! dispatched once per row chunk of the weight (one chunk unless the weight is larger than
//! one binding). Weights loaded as a group (q, k, v; gate, up) share one buffer, so that
//! one matvec reads them all: the split and SwiGLU epilogues. The residual add rides in the
//! epilogue of both kernels.

use std::sync::Arc;

use duet_shaders::{EmbedParams, GgmlType, MM_TM, MM_TN, MV_MAX_SPLIT, MatMulParams, MatVecParams, MvEpilogue, Op};

use super::buffers::{Buf, Chunk, GpuTensor, GpuWeight, WEIGHT_PAD, group_layout, upload_rows, weight_type};
use super::{GpuBackend, grid};
use crate::backend::{Normed, WeightRole, WeightView};
use crate::error::RuntimeError;

/// Tokens up to which a product runs the matvec once per token (`--gpu-tune mvtok=N`):
/// several sequences' decode steps. The tiled matmul's workgroups each walk a whole 64 × 64
/// tile's dot products, so a product of a few tokens leaves most of a GPU idle: on an H200
/// a step of 2 to 4 sequences took ~108 ms with it, against ~1.8 ms for one token through
/// the matvec (gpu-h200-2026-11-27-a680bc0.md). llama.cpp's Vulkan backend likewise runs
/// its matvec for up to 8 columns.
pub const MATVEC_TOKENS: usize = 8;

/// Whether a product of `tokens` rows of `cols` runs the matvec (once per token): one
/// token, or a few whose rows start on whole vec4s (the matvec reads activations so).
fn by_token(b: &GpuBackend, tokens: usize, cols: usize) -> bool {
    tokens == 1 || (tokens <= b.ctx.matvec_tokens && cols.is_multiple_of(4))
}

/// The prefill product's kernel for weights of `ty`: on cooperative matrices where the
/// context runs them, else the tiled matmul; and the tokens of its tiles (its weight rows:
/// MM_TM).
fn prefill_op(b: &GpuBackend, ty: GgmlType) -> (Op, usize) {
    if b.ctx.coop {
        let wide = b.ctx.coop_wide;
        (Op::MatMulCoop { ty, wide }, duet_shaders::coop_tile_tokens(wide) as usize)
    } else {
        (Op::MatMul(ty), MM_TN as usize)
    }
}

/// The weight type the kernels read `w` as, and its row bytes; an error naming the tensor
/// when the GPU cannot compute with it.
fn kernel_type(w: &WeightView<'_>) -> Result<(GgmlType, usize), RuntimeError> {
    let Some(ty) = weight_type(w.ty) else {
        return Err(RuntimeError::Unsupported(format!(
            "tensor '{}' has type {}, which the GPU backend cannot compute with",
            w.name, w.ty
        )));
    };
    let row_bytes = duet_quant::row_bytes(w.ty, w.cols)
        .ok_or_else(|| RuntimeError::BadModel(format!("tensor '{}': rows are not whole blocks", w.name)))?;
    if w.data.len() < row_bytes * w.rows {
        return Err(RuntimeError::BadModel(format!("tensor '{}' is shorter than its shape", w.name)));
    }
    Ok((ty, row_bytes))
}

/// The matrix kernels of `ty` that a model can dispatch with a weight loaded alone or (`group`)
/// in a group, compiled now rather than at the first token: the matmul and the store, add and
/// normed store matvecs (and the embedding) for one alone; the split and SwiGLU matvecs with
/// and without a folded norm for a group.
fn prepare_matrix_ops(b: &mut GpuBackend, ty: GgmlType, group: bool) -> Result<(), RuntimeError> {
    let shape = b.ctx.mv_shape;
    let mv = |epi, norm| Op::MatVec { ty, epi, shape, norm };
    let mut ops = vec![prefill_op(b, ty).0, mv(MvEpilogue::Store, false), mv(MvEpilogue::Store, true)];
    if group {
        for epi in [MvEpilogue::Split, MvEpilogue::SwiGlu] {
            ops.extend([mv(epi, false), mv(epi, true)]);
        }
    } else {
        ops.extend([Op::Embed(ty), mv(MvEpilogue::Add, false)]);
    }
    b.prepare(&ops)
}

pub fn load_weight(b: &mut GpuBackend, w: &WeightView<'_>) -> Result<GpuWeight, RuntimeError> {
    // Vectors (norms, biases) and the DEX matrix are read element-wise as f32.
    let as_f32 = matches!(w.role, WeightRole::Vector | WeightRole::HeadMatrix);
    if as_f32 {
        weight_type(w.ty).ok_or_else(|| {
            RuntimeError::Unsupported(format!(
                "tensor '{}' has type {}, which the GPU backend cannot compute with",
                w.name, w.ty
            ))
        })?;
        let mut v = vec![0f32; w.rows * w.cols];
        duet_quant::dequantize(w.ty, w.data, &mut v)
            .map_err(|e| RuntimeError::BadModel(format!("tensor '{}': {e}", w.name)))?;
        let buf = b
            .ctx
            .checked(&format!("tensor '{}'", w.name), || b.alloc.init(&b.ctx, bytemuck::cast_slice(&v), w.name))?;
        return Ok(GpuWeight {
            ty: GgmlType::F32,
            rows: w.rows,
            cols: w.cols,
            row_bytes: 4 * w.cols,
            chunks: vec![Chunk { row0: 0, rows: w.rows, buf, w_off: 0 }],
        });
    }
    let (ty, row_bytes) = kernel_type(w)?;
    let chunks = upload_rows(&b.ctx, &b.alloc, w.name, w.data, w.rows, row_bytes)?;
    prepare_matrix_ops(b, ty, false)?;
    Ok(GpuWeight { ty, rows: w.rows, cols: w.cols, row_bytes, chunks })
}

/// Weights read by the same input: those that are matrices of one type and row length
/// share one buffer (when they fit one binding together), the others are loaded alone, as
/// [`load_weight`] (DIFF V2's λ, kept in F32 by the converter, beside quantized q/k/v).
pub fn load_weight_group(b: &mut GpuBackend, ws: &[WeightView<'_>]) -> Result<Vec<GpuWeight>, RuntimeError> {
    let kinds: Vec<(GgmlType, usize)> = ws.iter().map(kernel_type).collect::<Result<_, _>>()?;
    let mut out: Vec<Option<GpuWeight>> = ws.iter().map(|_| None).collect();
    for i in 0..ws.len() {
        if out[i].is_some() {
            continue;
        }
        // The members of i's kind: matrices of its type and row length.
        let members: Vec<usize> = (i..ws.len())
            .filter(|&j| out[j].is_none() && kinds[j] == kinds[i] && ws[j].cols == ws[i].cols && ws[j].rows > 1)
            .collect();
        let sizes: Vec<usize> = members.iter().map(|&j| ws[j].rows * kinds[j].1).collect();
        let layout = group_layout(&sizes, b.ctx.max_chunk_bytes).filter(|_| members.len() > 1);
        let Some((offsets, size)) = layout else {
            out[i] = Some(load_weight(b, &ws[i])?);
            continue;
        };
        let parts: Vec<(usize, &[u8])> =
            members.iter().zip(&offsets).zip(&sizes).map(|((&j, &o), &n)| (o, &ws[j].data[..n])).collect();
        let label = members.iter().map(|&j| ws[j].name).collect::<Vec<_>>().join("+");
        let buf = b.ctx.checked(&format!("tensors {label}"), || b.alloc.init_parts(&b.ctx, size, &parts, &label))?;
        debug_assert!(size as usize >= offsets.last().copied().unwrap_or(0) + WEIGHT_PAD);
        let (ty, row_bytes) = kinds[i];
        prepare_matrix_ops(b, ty, true)?;
        for (&j, &w_off) in members.iter().zip(&offsets) {
            let w = &ws[j];
            let chunks = vec![Chunk { row0: 0, rows: w.rows, buf: Arc::clone(&buf), w_off }];
            out[j] = Some(GpuWeight { ty, rows: w.rows, cols: w.cols, row_bytes, chunks });
        }
    }
    Ok(out.into_iter().map(|w| w.expect("every weight loaded")).collect())
}

/// One matrix of a matvec dispatch: its rows, its first byte in the weight buffer, and the
/// output its rows go to.
struct MvMat<'a> {
    rows: usize,
    w_off: usize,
    out: &'a Arc<Buf>,
}

/// A matvec's tokens: their activations (`tokens` rows of `x`, `x_stride4` vec4s apart),
/// and the RMSNorm (weight, epsilon) to fold in, if any.
#[derive(Clone, Copy)]
struct MvIn<'a> {
    x: &'a Arc<Buf>,
    norm: Option<(&'a Arc<Buf>, f32)>,
    tokens: usize,
    x_stride4: usize,
}

impl<'a> MvIn<'a> {
    /// The rows of `x` (one, or several of whole vec4s: [`by_token`]).
    fn of(x: &'a GpuTensor, norm: Option<(&'a Arc<Buf>, f32)>) -> MvIn<'a> {
        MvIn { x: &x.buf, norm, tokens: x.rows, x_stride4: x.cols / 4 }
    }
}

/// One matvec dispatch over `mats` (all in `w_buf`, of `w`'s type and row length; for
/// SwiGLU the gate then the up matrix, for split up to four), the tokens in `x`; a token's
/// outputs start `out_stride` after the previous token's (store and add; split and SwiGLU
/// outputs are whole matrices, `rows` apart).
#[allow(clippy::too_many_arguments)]
fn matvec(
    b: &mut GpuBackend,
    w: &GpuWeight,
    w_buf: &Arc<Buf>,
    epi: MvEpilogue,
    mats: &[MvMat],
    out_off: usize,
    out_stride: usize,
    x: MvIn,
) {
    let shape = b.ctx.mv_shape;
    matvec_shaped(b, shape, w, w_buf, epi, mats, out_off, out_stride, x)
}

/// [`matvec`] in workgroups of `shape` (the kernel sweep's; its `subgroups` the context's).
#[allow(clippy::too_many_arguments)]
fn matvec_shaped(
    b: &mut GpuBackend,
    shape: duet_shaders::MvShape,
    w: &GpuWeight,
    w_buf: &Arc<Buf>,
    epi: MvEpilogue,
    mats: &[MvMat],
    out_off: usize,
    out_stride: usize,
    x: MvIn,
) {
    assert!(x.tokens == 1 || 4 * x.x_stride4 == w.cols, "matvec: several tokens need rows of whole vec4s");
    let per_wg = shape.rows as usize;
    // Workgroups of each matrix (SwiGLU: the gate's alone, each reads its up row too).
    let jobs = if epi == MvEpilogue::Split { mats.len() } else { 1 };
    let mut first = [u32::MAX; MV_MAX_SPLIT];
    let mut total = 0usize;
    for (i, m) in mats.iter().take(jobs).enumerate() {
        first[i] = total as u32;
        total += m.rows.div_ceil(per_wg);
    }
    // Several tokens: interleaved along x (the same rows' workgroups side by side), or one
    // token per z.
    let interleave = x.tokens > 1 && b.ctx.matvec_interleave;
    let g = if interleave { grid(total * x.tokens, 1) } else { grid(total, 1) };
    let at = |i: usize| mats.get(i).map_or((0, 0), |m| (m.rows as u32, m.w_off as u32));
    let (rows0, woff0) = at(0);
    let (rows1, woff1) = at(1);
    let (rows2, woff2) = at(2);
    let (rows3, woff3) = at(3);
    let params = MatVecParams {
        cols: w.cols as u32,
        row_bytes: w.row_bytes as u32,
        grid_x: g.0,
        x_stride4: x.x_stride4 as u32,
        out_off: out_off as u32,
        out_stride: out_stride as u32,
        rows0,
        woff0,
        rows1,
        woff1,
        wg1: first[1],
        rows2,
        woff2,
        wg2: first[2],
        rows3,
        woff3,
        wg3: first[3],
        eps: x.norm.map_or(0.0, |n| n.1),
        tok_x: if interleave { x.tokens as u32 } else { 0 },
    };
    // (Each token's workgroups read the weights; the profile counts them once.)
    let weight_bytes = mats.iter().map(|m| (m.rows * w.row_bytes) as u64).sum();
    let op = Op::MatVec { ty: w.ty, epi, shape, norm: x.norm.is_some() };
    let mut bufs: Vec<&Arc<Buf>> = vec![w_buf, x.x];
    let dummies = b.split_dummies();
    if epi == MvEpilogue::Split {
        bufs.extend((0..MV_MAX_SPLIT).map(|i| mats.get(i).map_or_else(|| &dummies[i - 1], |m| m.out)));
    } else {
        bufs.push(mats[0].out);
    }
    if let Some((g_buf, _)) = x.norm {
        bufs.push(g_buf);
    }
    let z = if interleave { 1 } else { x.tokens as u32 };
    b.run_weighted(op, &params, &bufs, (g.0, g.1, z), weight_bytes);
}

/// `out = x · wᵀ` for one token (`x` 1 × cols) in workgroups of `shape`: the kernel sweep
/// times each shape on one backend.
pub(super) fn matvec_store_shaped(
    b: &mut GpuBackend,
    shape: duet_shaders::MvShape,
    w: &GpuWeight,
    x: &GpuTensor,
    out: &GpuTensor,
) {
    assert!(shape.subgroups == b.ctx.mv_shape.subgroups, "the context decides subgroups");
    for c in &w.chunks {
        let mat = MvMat { rows: c.rows, w_off: c.w_off, out: &out.buf };
        matvec_shaped(b, shape, w, &c.buf, MvEpilogue::Store, &[mat], c.row0, out.cols, MvIn::of(x, None));
    }
}

/// `out (+)= x · wᵀ` over every chunk of `w`: the matvec for a few tokens ([`by_token`]),
/// else the tiled matmul; `accumulate` adds into `out` (the residual add).
fn product(b: &mut GpuBackend, w: &GpuWeight, x: &GpuTensor, out: &mut GpuTensor, accumulate: bool) {
    assert_eq!(x.cols, w.cols, "matmul: activation width {} != weight row length {}", x.cols, w.cols);
    assert_eq!(out.cols, w.rows, "matmul: output width {} != weight rows {}", out.cols, w.rows);
    assert_eq!(out.rows, x.rows);
    let t = x.rows;
    let epi = if accumulate { MvEpilogue::Add } else { MvEpilogue::Store };
    for c in &w.chunks {
        if by_token(b, t, x.cols) {
            let mat = MvMat { rows: c.rows, w_off: c.w_off, out: &out.buf };
            matvec(b, w, &c.buf, epi, &[mat], c.row0, out.cols, MvIn::of(x, None));
        } else {
            let (op, tile_tokens) = prefill_op(b, w.ty);
            let g = (c.rows.div_ceil(MM_TM as usize) as u32, t.div_ceil(tile_tokens) as u32);
            let params = MatMulParams {
                n_rows: c.rows as u32,
                cols: w.cols as u32,
                row_bytes: w.row_bytes as u32,
                out_off: c.row0 as u32,
                grid_x: g.0,
                t_rows: t as u32,
                x_stride: x.cols as u32,
                o_stride: out.cols as u32,
                w_off: c.w_off as u32,
                accumulate: u32::from(accumulate),
            };
            let bytes = (c.rows * w.row_bytes) as u64;
            b.run_weighted(op, &params, &[&c.buf, &x.buf, &out.buf], (g.0, g.1, 1), bytes);
        }
    }
}

pub fn matmul(b: &mut GpuBackend, w: &GpuWeight, x: &GpuTensor, out: &mut GpuTensor) {
    product(b, w, x, out, false)
}

/// `out += x · wᵀ` in the products' epilogue (fused), or into `scratch` then an add.
pub fn matmul_add(b: &mut GpuBackend, w: &GpuWeight, x: &GpuTensor, scratch: &mut GpuTensor, out: &mut GpuTensor) {
    if b.ctx.fuse {
        product(b, w, x, out, true)
    } else {
        product(b, w, x, scratch, false);
        let n = out.rows * out.cols;
        super::ops::add(b, out, &Arc::clone(&scratch.buf), n);
    }
}

/// The single buffer `ws` share as one group, if one matvec can read them all.
fn shared_buffer<'a>(b: &GpuBackend, ws: &[&'a GpuWeight]) -> Option<&'a Arc<Buf>> {
    let first = ws.first()?;
    let buf = &first.chunks.first()?.buf;
    let shared = ws
        .iter()
        .all(|w| w.chunks.len() == 1 && w.chunks[0].buf.id == buf.id && w.ty == first.ty && w.cols == first.cols);
    (b.ctx.fuse && shared).then_some(buf)
}

/// `outs[i] = x · ws[i]ᵀ`: for a few tokens, one split matvec per set of weights that share
/// a group's buffer, one product for each other weight; for more tokens, one product each.
pub fn matmul_group(b: &mut GpuBackend, ws: &[&GpuWeight], x: &GpuTensor, outs: &mut [&mut GpuTensor]) {
    group_products(b, ws, None, x, outs)
}

/// Whether the RMSNorm of a few tokens with `weight` can be folded into the matvecs reading
/// them: fusion on, and rows of whole vec4s (the matvec reads the norm weight so).
fn norm_folds(b: &GpuBackend, n: &Normed<'_, GpuTensor, GpuWeight>) -> bool {
    b.ctx.fuse && n.x.cols.is_multiple_of(4) && by_token(b, n.x.rows, n.x.cols) && n.weight.chunks.len() == 1
}

/// [`matmul_group`] of RMSNorm(`n.x`): folded into the matvecs for a token, else the norm
/// into `n.xn` first.
pub fn norm_matmul_group(
    b: &mut GpuBackend,
    n: Normed<'_, GpuTensor, GpuWeight>,
    ws: &[&GpuWeight],
    outs: &mut [&mut GpuTensor],
) {
    if !norm_folds(b, &n) {
        super::ops::rms_norm(b, n.x, n.weight, n.eps, n.xn);
        return matmul_group(b, ws, n.xn, outs);
    }
    assert_eq!(n.weight.cols, n.x.cols, "norm_matmul_group: norm weight width");
    let g = Arc::clone(n.weight.single());
    group_products(b, ws, Some((&g, n.eps)), n.x, outs)
}

/// The products of [`matmul_group`] with the tokens `x` and a norm to fold in (which only
/// a product by token has).
fn group_products(
    b: &mut GpuBackend,
    ws: &[&GpuWeight],
    norm: Option<(&Arc<Buf>, f32)>,
    x: &GpuTensor,
    outs: &mut [&mut GpuTensor],
) {
    let input = MvIn::of(x, norm);
    assert_eq!(ws.len(), outs.len(), "matmul_group: {} weights, {} outputs", ws.len(), outs.len());
    let mut done = vec![false; ws.len()];
    for i in 0..ws.len() {
        if done[i] {
            continue;
        }
        let id = ws[i].chunks[0].buf.id;
        let set: Vec<usize> = (i..ws.len()).filter(|&j| !done[j] && ws[j].chunks[0].buf.id == id).collect();
        let members: Vec<&GpuWeight> = set.iter().map(|&j| ws[j]).collect();
        let fused = by_token(b, x.rows, x.cols) && set.len() > 1 && set.len() <= MV_MAX_SPLIT;
        match shared_buffer(b, &members).filter(|_| fused) {
            Some(buf) => {
                for &j in &set {
                    assert!(
                        x.cols == ws[j].cols && outs[j].cols == ws[j].rows && outs[j].rows == x.rows,
                        "matmul_group: shapes"
                    );
                }
                let buf = Arc::clone(buf);
                let mats: Vec<MvMat> = set
                    .iter()
                    .map(|&j| MvMat { rows: ws[j].rows, w_off: ws[j].chunks[0].w_off, out: &outs[j].buf })
                    .collect();
                matvec(b, ws[i], &buf, MvEpilogue::Split, &mats, 0, 0, input);
                for &j in &set {
                    done[j] = true;
                }
            }
            None if input.norm.is_some() => {
                // A weight of its own, the norm still folded: a store matvec per chunk.
                let (w, out) = (ws[i], &mut *outs[i]);
                assert!(x.cols == w.cols && out.cols == w.rows && out.rows == x.rows, "matmul_group: shapes");
                for c in &w.chunks {
                    let mat = MvMat { rows: c.rows, w_off: c.w_off, out: &out.buf };
                    matvec(b, w, &c.buf, MvEpilogue::Store, &[mat], c.row0, out.cols, input);
                }
                done[i] = true;
            }
            None => {
                matmul(b, ws[i], x, outs[i]);
                done[i] = true;
            }
        }
    }
}

/// `gate = silu(x · w_gateᵀ) · (x · w_upᵀ)`: one SwiGLU matvec for a few tokens when gate
/// and up share a group's buffer, else two products (the second into `up`) and the SwiGLU
/// kernel.
pub fn matmul_swiglu(
    b: &mut GpuBackend,
    w_gate: &GpuWeight,
    w_up: &GpuWeight,
    x: &GpuTensor,
    gate: &mut GpuTensor,
    up: &mut GpuTensor,
) {
    let fused = by_token(b, x.rows, x.cols) && w_gate.rows == w_up.rows;
    match shared_buffer(b, &[w_gate, w_up]).filter(|_| fused) {
        Some(buf) => swiglu_matvec(b, w_gate, w_up, &Arc::clone(buf), None, x, gate),
        None => {
            matmul(b, w_gate, x, gate);
            matmul(b, w_up, x, up);
            super::ops::swiglu(b, gate, up);
        }
    }
}

/// [`matmul_swiglu`] of RMSNorm(`n.x`): folded into the SwiGLU matvec for a few tokens whose
/// gate and up share a buffer, else the norm into `n.xn` first.
pub fn norm_matmul_swiglu(
    b: &mut GpuBackend,
    n: Normed<'_, GpuTensor, GpuWeight>,
    w_gate: &GpuWeight,
    w_up: &GpuWeight,
    gate: &mut GpuTensor,
    up: &mut GpuTensor,
) {
    let shared = if w_gate.rows == w_up.rows { shared_buffer(b, &[w_gate, w_up]).map(Arc::clone) } else { None };
    match shared.filter(|_| norm_folds(b, &n)) {
        Some(buf) => {
            let g = Arc::clone(n.weight.single());
            swiglu_matvec(b, w_gate, w_up, &buf, Some((&g, n.eps)), n.x, gate)
        }
        None => {
            super::ops::rms_norm(b, n.x, n.weight, n.eps, n.xn);
            matmul_swiglu(b, w_gate, w_up, n.xn, gate, up)
        }
    }
}

/// The SwiGLU matvec of gate and up in `buf` for the tokens `x` (and a norm to fold in)
/// into `gate`.
fn swiglu_matvec(
    b: &mut GpuBackend,
    w_gate: &GpuWeight,
    w_up: &GpuWeight,
    buf: &Arc<Buf>,
    norm: Option<(&Arc<Buf>, f32)>,
    x: &GpuTensor,
    gate: &mut GpuTensor,
) {
    assert!(x.cols == w_gate.cols && gate.cols == w_gate.rows && gate.rows == x.rows, "matmul_swiglu: shapes");
    let input = MvIn::of(x, norm);
    let mats = [
        MvMat { rows: w_gate.rows, w_off: w_gate.chunks[0].w_off, out: &gate.buf },
        MvMat { rows: w_up.rows, w_off: w_up.chunks[0].w_off, out: &gate.buf },
    ];
    matvec(b, w_gate, buf, MvEpilogue::SwiGlu, &mats, 0, 0, input);
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
            w_off: c.w_off as u32,
        };
        b.run(Op::Embed(table.ty), &params, &[&c.buf, &ids, &out.buf], g);
    }
}
