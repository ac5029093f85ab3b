//! Byte-level quantize/dequantize of whole rows for every supported type, with the same
//! choice of algorithm llama-quantize makes (`ggml_quantize_chunk`).

use crate::GgmlType;
use crate::blocks::{BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K, BlockQ8_0, BlockQ8K};
use crate::{fp, kquants, legacy};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    #[error("cannot quantize to or from {0} (supported: F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K)")]
    Unsupported(GgmlType),
    #[error("a row of {n_per_row} elements is not a whole number of {ty} blocks ({block} elements each)")]
    RowNotBlockAligned { ty: GgmlType, n_per_row: usize, block: usize },
    #[error("{values} values do not make whole rows of {n_per_row}")]
    PartialRow { values: usize, n_per_row: usize },
    #[error("destination holds {got} bytes, {ty} needs {want}")]
    WrongDestinationSize { ty: GgmlType, got: usize, want: usize },
    #[error("importance matrix has {got} entries, a row has {want}")]
    ImatrixLength { got: usize, want: usize },
    #[error("value {value} at row {row}, column {col} is not finite (the weights hold NaN or infinite values)")]
    NonFinite { row: usize, col: usize, value: String },
}

/// Bytes taken by `n` elements of `ty`, if `n` is a whole number of blocks.
pub fn row_bytes(ty: GgmlType, n: usize) -> Option<usize> {
    ty.bytes_for(n as u64).and_then(|b| usize::try_from(b).ok())
}

fn check(ty: GgmlType, src_len: usize, n_per_row: usize, dst_len: usize) -> Result<(), QuantError> {
    // Q8_K is an activation format: ggml never writes it to files, and neither do we.
    if !ty.is_supported() || ty == GgmlType::Q8_K {
        return Err(QuantError::Unsupported(ty));
    }
    if n_per_row == 0 || !n_per_row.is_multiple_of(ty.block_size()) {
        return Err(QuantError::RowNotBlockAligned { ty, n_per_row, block: ty.block_size() });
    }
    if !src_len.is_multiple_of(n_per_row) {
        return Err(QuantError::PartialRow { values: src_len, n_per_row });
    }
    let want = src_len / ty.block_size() * ty.type_size();
    if dst_len != want {
        return Err(QuantError::WrongDestinationSize { ty, got: dst_len, want });
    }
    Ok(())
}

fn blocks_mut<B: crate::blocks::WeightBlock>(dst: &mut [u8]) -> &mut [B] {
    crate::blocks::as_blocks_mut(dst).expect("destination size was checked")
}

/// Quantizes rows of `n_per_row` values into `dst`, exactly as ggml's reference quantizers
/// (`quantize_row_*_ref`, or f32→f16/bf16 with round-to-nearest-even) do.
pub fn quantize(ty: GgmlType, src: &[f32], n_per_row: usize, dst: &mut [u8]) -> Result<(), QuantError> {
    check(ty, src.len(), n_per_row, dst.len())?;
    match ty {
        GgmlType::F32 => dst.copy_from_slice(bytemuck::cast_slice(src)),
        GgmlType::F16 => fp::f32_to_f16_row(src, dst),
        GgmlType::BF16 => fp::f32_to_bf16_row(src, dst),
        GgmlType::Q4_0 => legacy::quantize_row_q4_0(src, blocks_mut::<BlockQ4_0>(dst)),
        GgmlType::Q4_1 => legacy::quantize_row_q4_1(src, blocks_mut::<BlockQ4_1>(dst)),
        GgmlType::Q5_0 => legacy::quantize_row_q5_0(src, blocks_mut::<BlockQ5_0>(dst)),
        GgmlType::Q5_1 => legacy::quantize_row_q5_1(src, blocks_mut::<BlockQ5_1>(dst)),
        GgmlType::Q8_0 => legacy::quantize_row_q8_0(src, blocks_mut::<BlockQ8_0>(dst)),
        GgmlType::Q4_K => kquants::quantize_row_q4_k(src, blocks_mut::<BlockQ4K>(dst)),
        GgmlType::Q5_K => kquants::quantize_row_q5_k(src, blocks_mut::<BlockQ5K>(dst)),
        GgmlType::Q6_K => kquants::quantize_row_q6_k(src, blocks_mut::<BlockQ6K>(dst)),
        _ => return Err(QuantError::Unsupported(ty)),
    }
    Ok(())
}

/// Quantizes rows with an importance matrix (`imatrix.len() == n_per_row`: one weight per
/// input column), as ggml's `quantize_*(…, quant_weights)` does. Types that ignore it in
/// ggml (Q8_0 and the float types) ignore it here.
pub fn quantize_with_imatrix(
    ty: GgmlType,
    src: &[f32],
    n_per_row: usize,
    imatrix: &[f32],
    dst: &mut [u8],
) -> Result<(), QuantError> {
    check(ty, src.len(), n_per_row, dst.len())?;
    if imatrix.len() != n_per_row {
        return Err(QuantError::ImatrixLength { got: imatrix.len(), want: n_per_row });
    }
    let row_len = row_bytes(ty, n_per_row).expect("checked");
    for (x, out) in src.chunks_exact(n_per_row).zip(dst.chunks_exact_mut(row_len)) {
        match ty {
            GgmlType::Q4_0 => legacy::quantize_row_q4_0_imatrix(x, blocks_mut(out), imatrix),
            GgmlType::Q4_1 => legacy::quantize_row_q4_1_imatrix(x, blocks_mut(out), imatrix),
            GgmlType::Q5_0 => legacy::quantize_row_q5_0_imatrix(x, blocks_mut(out), imatrix),
            GgmlType::Q5_1 => legacy::quantize_row_q5_1_imatrix(x, blocks_mut(out), imatrix),
            GgmlType::Q4_K => kquants::quantize_row_q4_k_imatrix(x, blocks_mut(out), imatrix),
            GgmlType::Q5_K => kquants::quantize_row_q5_k_imatrix(x, blocks_mut(out), imatrix),
            GgmlType::Q6_K => kquants::quantize_row_q6_k_imatrix(x, blocks_mut(out), imatrix),
            _ => quantize(ty, x, n_per_row, out)?,
        }
    }
    Ok(())
}

/// Dequantizes `src` (whole blocks of `ty`) into `dst`.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    if !ty.is_supported() {
        return Err(QuantError::Unsupported(ty));
    }
    let want = row_bytes(ty, dst.len()).ok_or(QuantError::RowNotBlockAligned {
        ty,
        n_per_row: dst.len(),
        block: ty.block_size(),
    })?;
    if src.len() != want {
        return Err(QuantError::WrongDestinationSize { ty, got: src.len(), want });
    }
    fn blocks<B: crate::blocks::WeightBlock>(src: &[u8]) -> &[B] {
        crate::blocks::as_blocks(src).expect("source size was checked")
    }
    match ty {
        GgmlType::F32 => {
            for (b, out) in src.chunks_exact(4).zip(dst.iter_mut()) {
                *out = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => fp::f16_row_to_f32(src, dst),
        GgmlType::BF16 => fp::bf16_row_to_f32(src, dst),
        GgmlType::Q4_0 => legacy::dequantize_row_q4_0(blocks(src), dst),
        GgmlType::Q4_1 => legacy::dequantize_row_q4_1(blocks(src), dst),
        GgmlType::Q5_0 => legacy::dequantize_row_q5_0(blocks(src), dst),
        GgmlType::Q5_1 => legacy::dequantize_row_q5_1(blocks(src), dst),
        GgmlType::Q8_0 => legacy::dequantize_row_q8_0(blocks(src), dst),
        GgmlType::Q4_K => kquants::dequantize_row_q4_k(blocks(src), dst),
        GgmlType::Q5_K => kquants::dequantize_row_q5_k(blocks(src), dst),
        GgmlType::Q6_K => kquants::dequantize_row_q6_k(blocks(src), dst),
        GgmlType::Q8_K => {
            // Q8_K has natural alignment (f32 + i16 fields); copy to be safe with any slice.
            let b: Vec<BlockQ8K> = bytemuck::pod_collect_to_vec(src);
            kquants::dequantize_row_q8_k(&b, dst)
        }
        _ => return Err(QuantError::Unsupported(ty)),
    }
    Ok(())
}
