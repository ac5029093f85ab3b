//! One tensor's rows quantized by several threads, each over its own contiguous range of
//! rows, straight into the output bytes.
//!
//! A matrix read from a GGUF or a checkpoint (its rows in order, or RoPE-permuted) is never
//! held in f32: each thread dequantizes a few source rows at a time into a small buffer that
//! stays in cache and quantizes them at once. A whole-tensor f32 copy (262 MB for a 1.1B
//! model's embedding) cost more than the arithmetic: the kernel zeroed fresh pages for it
//! on every tensor, and the page faults took most of a re-quantization's time.

use std::ops::Range;

use duet_quant::{GgmlType, QuantError};

/// f32 values per thread-local buffer of source rows (256 KiB: well inside L2).
const CHUNK_VALUES: usize = 1 << 16;

/// Quantizes `values` (rows of `n_per_row`) to `ty` into `dst` (exactly the output's size);
/// `imatrix` (one weight per column) selects the importance-weighted quantizers.
pub fn quantize_rows(
    values: &[f32],
    n_per_row: usize,
    ty: GgmlType,
    imatrix: Option<&[f32]>,
    threads: usize,
    dst: &mut [u8],
) -> Result<(), QuantError> {
    let rows = values.len() / n_per_row.max(1);
    par_rows(rows, threads, dst, &|r: Range<usize>, out: &mut [u8]| {
        quantize(ty, &values[r.start * n_per_row..r.end * n_per_row], n_per_row, r.start, imatrix, out)
    })
}

/// Quantizes the rows of `raw` (a tensor of type `src_ty`, rows of `n_per_row`) to `ty`
/// into `dst`, output row r from source row `source_row(r)`, dequantizing a few rows at a
/// time in each thread.
#[allow(clippy::too_many_arguments)]
pub fn requantize_rows(
    raw: &[u8],
    src_ty: GgmlType,
    n_per_row: usize,
    source_row: &(dyn Fn(usize) -> usize + Sync),
    ty: GgmlType,
    imatrix: Option<&[f32]>,
    threads: usize,
    dst: &mut [u8],
) -> Result<(), QuantError> {
    let src_row = duet_quant::row_bytes(src_ty, n_per_row).ok_or(QuantError::RowNotBlockAligned {
        ty: src_ty,
        n_per_row,
        block: src_ty.block_size(),
    })?;
    let rows = raw.len() / src_row.max(1);
    let out_row = dst.len() / rows.max(1);
    let chunk = (CHUNK_VALUES / n_per_row.max(1)).max(1);
    par_rows(rows, threads, dst, &|r: Range<usize>, out: &mut [u8]| {
        let mut scratch = vec![0f32; chunk.min(r.len()) * n_per_row];
        for r0 in r.clone().step_by(chunk) {
            let n = chunk.min(r.end - r0);
            for (i, x) in scratch[..n * n_per_row].chunks_exact_mut(n_per_row).enumerate() {
                let s = source_row(r0 + i);
                if s >= rows {
                    return Err(QuantError::WrongDestinationSize {
                        ty: src_ty,
                        got: raw.len(),
                        want: (s + 1) * src_row,
                    });
                }
                duet_quant::dequantize(src_ty, &raw[s * src_row..(s + 1) * src_row], x)?;
            }
            let o = (r0 - r.start) * out_row;
            quantize(ty, &scratch[..n * n_per_row], n_per_row, r0, imatrix, &mut out[o..o + n * out_row])?;
        }
        Ok(())
    })
}

/// Quantizes rows `first_row..` (`x`), refusing a value that is not finite (a checkpoint's
/// NaN or infinity would otherwise become a silently broken model).
fn quantize(
    ty: GgmlType,
    x: &[f32],
    n_per_row: usize,
    first_row: usize,
    imatrix: Option<&[f32]>,
    out: &mut [u8],
) -> Result<(), QuantError> {
    if let Some(i) = x.iter().position(|v| !v.is_finite()) {
        let (row, col) = (first_row + i / n_per_row.max(1), i % n_per_row.max(1));
        return Err(QuantError::NonFinite { row, col, value: x[i].to_string() });
    }
    match imatrix {
        Some(im) => duet_quant::quantize_with_imatrix(ty, x, n_per_row, im, out),
        None => duet_quant::quantize(ty, x, n_per_row, out),
    }
}

/// Quantizes a range of rows into their output bytes.
type RowsFn<'a> = dyn Fn(Range<usize>, &mut [u8]) -> Result<(), QuantError> + Sync + 'a;

/// Splits `rows` (and `dst`, `dst.len() / rows` bytes each) into one contiguous range per
/// thread and runs `f` on each; the first error wins.
fn par_rows(rows: usize, threads: usize, dst: &mut [u8], f: &RowsFn) -> Result<(), QuantError> {
    if rows == 0 {
        return f(0..0, dst);
    }
    let out_row = dst.len() / rows;
    // Small tensors (norms, biases) are not worth a thread.
    let threads = threads.min(rows.div_ceil(16)).max(1);
    let per = rows.div_ceil(threads);
    if threads == 1 {
        return f(0..rows, dst);
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = dst
            .chunks_mut(per * out_row)
            .enumerate()
            .map(|(i, out)| {
                let r = i * per..(i * per + per).min(rows);
                s.spawn(move || f(r, out))
            })
            .collect();
        let results: Vec<_> =
            handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect();
        results.into_iter().collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Re-quantizing in chunks per thread gives the bytes of dequantizing the whole tensor
    /// and quantizing it on one thread, for any thread count and a chunk that does not
    /// divide the rows.
    #[test]
    fn requantize_equals_whole_tensor_dequantize_then_quantize() {
        let (rows, n) = (37, 96 * 32); // 96·32 values per row: chunks of 21 rows, a short last one
        let x: Vec<f32> = (0..rows * n).map(|i| ((i as f32 * 0.618).sin() * 3.0) + (i % 7) as f32 * 0.1).collect();
        let f16_row = duet_quant::row_bytes(GgmlType::F16, n).unwrap();
        let mut raw = vec![0u8; rows * f16_row];
        duet_quant::quantize(GgmlType::F16, &x, n, &mut raw).unwrap();
        for ty in [GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K] {
            let out_row = duet_quant::row_bytes(ty, n).unwrap();
            let mut whole = vec![0f32; rows * n];
            duet_quant::dequantize(GgmlType::F16, &raw, &mut whole).unwrap();
            let mut want = vec![0u8; rows * out_row];
            duet_quant::quantize(ty, &whole, n, &mut want).unwrap();
            for threads in [1, 2, 3] {
                let mut got = vec![0u8; rows * out_row];
                requantize_rows(&raw, GgmlType::F16, n, &|r| r, ty, None, threads, &mut got).unwrap();
                assert!(got == want, "{ty}, {threads} threads: bytes differ");
                let mut got = vec![0u8; rows * out_row];
                quantize_rows(&whole, n, ty, None, threads, &mut got).unwrap();
                assert!(got == want, "{ty}, {threads} threads, from f32: bytes differ");
            }
        }
    }

    /// With a row order, output row r is source row order(r), exactly.
    #[test]
    fn requantize_reads_rows_in_the_given_order() {
        let (rows, n) = (24, 64);
        let x: Vec<f32> = (0..rows * n).map(|i| (i as f32 * 0.37).cos()).collect();
        let mut raw = vec![0u8; rows * duet_quant::row_bytes(GgmlType::F32, n).unwrap()];
        duet_quant::quantize(GgmlType::F32, &x, n, &mut raw).unwrap();
        let reversed: Vec<f32> = x.chunks_exact(n).rev().flatten().copied().collect();
        let out_row = duet_quant::row_bytes(GgmlType::Q8_0, n).unwrap();
        let mut want = vec![0u8; rows * out_row];
        duet_quant::quantize(GgmlType::Q8_0, &reversed, n, &mut want).unwrap();
        let mut got = vec![0u8; rows * out_row];
        requantize_rows(&raw, GgmlType::F32, n, &|r| rows - 1 - r, GgmlType::Q8_0, None, 2, &mut got).unwrap();
        assert!(got == want);
    }

    /// A source whose rows are not whole blocks is an error, not a panic.
    #[test]
    fn misaligned_source_rows_are_refused() {
        let raw = vec![0u8; 100];
        let mut dst = vec![0u8; 34];
        let e = requantize_rows(&raw, GgmlType::Q8_0, 40, &|r| r, GgmlType::Q8_0, None, 2, &mut dst).unwrap_err();
        assert!(matches!(e, QuantError::RowNotBlockAligned { .. }), "{e:?}");
    }
}
