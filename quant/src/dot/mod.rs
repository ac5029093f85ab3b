//! CPU dot products between one weight row (in its GGUF block format) and one activation
//! row, as a matmul needs them.
//!
//! Like ggml, integer formats are multiplied against activations quantized to an 8-bit
//! format of the same block size ([`act_type`]): Q4_0/Q5_0/Q8_0 against Q8_0, Q4_1/Q5_1
//! against Q8_1, the K-quants against Q8_K. Float weights (F32/F16/BF16) are multiplied
//! against f32 activations. [`dot_f32`] multiplies any supported type against plain f32
//! (dequantizing block by block) for exact reference work.
//!
//! [`Kernels`] is a table of function pointers; [`kernels`] picks the fastest set this CPU
//! supports once, at first use. [`scalar`] is the reference every SIMD set is tested
//! against.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "aarch64")]
mod neon;
pub mod scalar;
#[cfg(test)]
mod tests;

use std::sync::OnceLock;

use crate::GgmlType;
use crate::blocks::{
    BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K, BlockQ8_0, BlockQ8_1, BlockQ8K, F16Bytes,
    QK, QK_K, as_blocks,
};

/// One set of dot kernels. Every function takes whole blocks: both sides describe the same
/// number of elements.
#[derive(Clone, Copy)]
pub struct Kernels {
    /// "scalar", "avx2", "neon" or "neon+dotprod".
    pub name: &'static str,
    pub q4_0: fn(&[BlockQ4_0], &[BlockQ8_0]) -> f32,
    pub q4_1: fn(&[BlockQ4_1], &[BlockQ8_1]) -> f32,
    pub q5_0: fn(&[BlockQ5_0], &[BlockQ8_0]) -> f32,
    pub q5_1: fn(&[BlockQ5_1], &[BlockQ8_1]) -> f32,
    pub q8_0: fn(&[BlockQ8_0], &[BlockQ8_0]) -> f32,
    pub q4_k: fn(&[BlockQ4K], &[BlockQ8K]) -> f32,
    pub q5_k: fn(&[BlockQ5K], &[BlockQ8K]) -> f32,
    pub q6_k: fn(&[BlockQ6K], &[BlockQ8K]) -> f32,
    pub f32: fn(&[f32], &[f32]) -> f32,
    /// Little-endian f16 weights against f32 activations.
    pub f16: fn(&[u8], &[f32]) -> f32,
    /// Little-endian bf16 weights against f32 activations.
    pub bf16: fn(&[u8], &[f32]) -> f32,
}

static CHOSEN: OnceLock<Kernels> = OnceLock::new();

/// The kernel set of this process: the fastest this CPU supports, or the scalar one after
/// [`use_scalar_kernels`] (decided once, at first use).
pub fn kernels() -> &'static Kernels {
    CHOSEN.get_or_init(|| simd_kernels().unwrap_or(scalar::KERNELS))
}

/// Makes [`kernels`] the scalar reference set for the rest of the process (a program's
/// choice, e.g. to compare against the SIMD kernels). Refused once kernels were used.
pub fn use_scalar_kernels() -> Result<(), &'static str> {
    CHOSEN.set(scalar::KERNELS).or_else(|_| {
        if kernels().name == scalar::KERNELS.name { Ok(()) } else { Err("the dot kernels were chosen before") }
    })
}

/// The SIMD kernel set for this CPU, if it has one.
pub fn simd_kernels() -> Option<Kernels> {
    #[cfg(target_arch = "x86_64")]
    {
        avx2::kernels()
    }
    #[cfg(target_arch = "aarch64")]
    {
        neon::kernels()
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        None
    }
}

/// The activation format a weight type's integer dot product uses (ggml's `vec_dot_type`),
/// or `F32` for float weights.
pub fn act_type(weight: GgmlType) -> GgmlType {
    match weight {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => GgmlType::Q8_0,
        GgmlType::Q4_1 | GgmlType::Q5_1 => GgmlType::Q8_1,
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => GgmlType::Q8_K,
        _ => GgmlType::F32,
    }
}

/// An activation row quantized for one [`act_type`].
#[derive(Clone, Debug)]
pub enum ActRow {
    Q8_0(Vec<BlockQ8_0>),
    Q8_1(Vec<BlockQ8_1>),
    Q8K(Vec<BlockQ8K>),
    F32(Vec<f32>),
}

impl ActRow {
    /// Quantizes `x` in the format `weight` rows multiply against. `x.len()` must be a
    /// multiple of the weight type's block size.
    pub fn quantize_for(weight: GgmlType, x: &[f32]) -> ActRow {
        let mut row = ActRow::empty_for(weight);
        row.requantize(x);
        row
    }

    /// An empty row of the right variant, for reuse with [`ActRow::requantize`].
    pub fn empty_for(weight: GgmlType) -> ActRow {
        match act_type(weight) {
            GgmlType::Q8_0 => ActRow::Q8_0(Vec::new()),
            GgmlType::Q8_1 => ActRow::Q8_1(Vec::new()),
            GgmlType::Q8_K => ActRow::Q8K(Vec::new()),
            _ => ActRow::F32(Vec::new()),
        }
    }

    /// Re-fills this row from `x`, reusing its allocation.
    pub fn requantize(&mut self, x: &[f32]) {
        match self {
            ActRow::Q8_0(b) => {
                b.resize(x.len() / QK, BlockQ8_0::default());
                crate::legacy::quantize_row_q8_0(x, b);
            }
            ActRow::Q8_1(b) => {
                b.resize(x.len() / QK, BlockQ8_1::default());
                crate::legacy::quantize_row_q8_1(x, b);
            }
            ActRow::Q8K(b) => {
                b.resize(x.len() / QK_K, BlockQ8K::default());
                crate::kquants::quantize_row_q8_k(x, b);
            }
            ActRow::F32(v) => {
                v.clear();
                v.extend_from_slice(x);
            }
        }
    }

    /// The second level of this row as a quantization of `x` ([`crate::second_level`]): `lo`
    /// gets each block's rounding error on the grid d/128, stored with the block's *first*-level
    /// scale `d`, so that `vec_dot(w, lo) / second_level::RATIO` is the second level's product
    /// (the division is exact, a power of two) and `vec_dot(w, self)` plus that is the product
    /// with ~16-bit activations. F32 rows have no rounding error: `lo` is zeros.
    pub fn second_level_into(&self, x: &[f32], lo: &mut ActRow) {
        use crate::second_level::quantize_block;
        match (self, lo) {
            (ActRow::Q8_0(hi), ActRow::Q8_0(lo)) => {
                lo.resize(hi.len(), BlockQ8_0::default());
                for ((h, l), x) in hi.iter().zip(lo.iter_mut()).zip(x.chunks_exact(QK)) {
                    quantize_block(x, h.d.get(), &h.qs, &mut l.qs);
                    l.d = h.d;
                }
            }
            (ActRow::Q8_1(hi), ActRow::Q8_1(lo)) => {
                lo.resize(hi.len(), BlockQ8_1::default());
                for ((h, l), x) in hi.iter().zip(lo.iter_mut()).zip(x.chunks_exact(QK)) {
                    let sum = quantize_block(x, h.d.get(), &h.qs, &mut l.qs);
                    l.d = h.d;
                    l.s = F16Bytes::from_f32(h.d.get() * sum as f32);
                }
            }
            (ActRow::Q8K(hi), ActRow::Q8K(lo)) => {
                lo.resize(hi.len(), BlockQ8K::default());
                for ((h, l), x) in hi.iter().zip(lo.iter_mut()).zip(x.chunks_exact(QK_K)) {
                    quantize_block(x, h.d, &h.qs, &mut l.qs);
                    l.d = h.d;
                    l.bsums = crate::kquants::q8_k_bsums(&l.qs);
                }
            }
            (ActRow::F32(hi), lo) => *lo = ActRow::F32(vec![0.0; hi.len()]),
            (hi, lo) => {
                // `lo` of another format: start it over in this row's.
                *lo = match hi {
                    ActRow::Q8_0(_) => ActRow::Q8_0(Vec::new()),
                    ActRow::Q8_1(_) => ActRow::Q8_1(Vec::new()),
                    _ => ActRow::Q8K(Vec::new()),
                };
                hi.second_level_into(x, lo);
            }
        }
    }
}

/// Errors from the byte-level dot entry points.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DotError {
    #[error("no CPU dot product for weight type {0}")]
    Unsupported(GgmlType),
    #[error("{ty} weight row of {bytes} bytes does not match an activation row of {elems} elements")]
    LengthMismatch { ty: GgmlType, bytes: usize, elems: usize },
    #[error("activation row is in the wrong format for {0} weights")]
    WrongActivation(GgmlType),
}

impl Kernels {
    /// Dot product of one weight row (`ty` blocks as bytes) with a quantized activation row.
    pub fn vec_dot(&self, ty: GgmlType, w: &[u8], act: &ActRow) -> Result<f32, DotError> {
        let elems = match act {
            ActRow::Q8_0(b) => b.len() * QK,
            ActRow::Q8_1(b) => b.len() * QK,
            ActRow::Q8K(b) => b.len() * QK_K,
            ActRow::F32(v) => v.len(),
        };
        let mismatch = || DotError::LengthMismatch { ty, bytes: w.len(), elems };
        if !ty.is_supported() || ty == GgmlType::Q8_K {
            return Err(DotError::Unsupported(ty));
        }
        if ty.bytes_for(elems as u64) != Some(w.len() as u64) {
            return Err(mismatch());
        }
        let wrong = || DotError::WrongActivation(ty);
        Ok(match (ty, act) {
            (GgmlType::Q4_0, ActRow::Q8_0(a)) => (self.q4_0)(blocks(w), a),
            (GgmlType::Q5_0, ActRow::Q8_0(a)) => (self.q5_0)(blocks(w), a),
            (GgmlType::Q8_0, ActRow::Q8_0(a)) => (self.q8_0)(blocks(w), a),
            (GgmlType::Q4_1, ActRow::Q8_1(a)) => (self.q4_1)(blocks(w), a),
            (GgmlType::Q5_1, ActRow::Q8_1(a)) => (self.q5_1)(blocks(w), a),
            (GgmlType::Q4_K, ActRow::Q8K(a)) => (self.q4_k)(blocks(w), a),
            (GgmlType::Q5_K, ActRow::Q8K(a)) => (self.q5_k)(blocks(w), a),
            (GgmlType::Q6_K, ActRow::Q8K(a)) => (self.q6_k)(blocks(w), a),
            (GgmlType::F32, ActRow::F32(a)) => (self.f32)(bytemuck::cast_slice(w), a),
            (GgmlType::F16, ActRow::F32(a)) => (self.f16)(w, a),
            (GgmlType::BF16, ActRow::F32(a)) => (self.bf16)(w, a),
            _ => return Err(wrong()),
        })
    }
}

/// Views checked weight bytes as blocks. Callers have already matched the length.
fn blocks<B: crate::blocks::WeightBlock>(w: &[u8]) -> &[B] {
    as_blocks(w).expect("length was checked against the block size")
}

/// Dot product of one weight row of any supported type with plain f32 values, dequantizing
/// one block at a time (no activation quantization: the exact reference).
pub fn dot_f32(ty: GgmlType, w: &[u8], x: &[f32]) -> Result<f32, DotError> {
    if !ty.is_supported() {
        return Err(DotError::Unsupported(ty));
    }
    if ty.bytes_for(x.len() as u64) != Some(w.len() as u64) {
        return Err(DotError::LengthMismatch { ty, bytes: w.len(), elems: x.len() });
    }
    if ty == GgmlType::F32 {
        // F32 rows in a GGUF are 4-byte aligned; fall back to a copy for odd slices.
        return Ok(match bytemuck::try_cast_slice::<u8, f32>(w) {
            Ok(v) => (kernels().f32)(v, x),
            Err(_) => (kernels().f32)(&bytemuck::pod_collect_to_vec::<u8, f32>(w), x),
        });
    }
    // Every supported block size divides 256: dequantize 256 elements at a time into a
    // stack buffer.
    const CHUNK: usize = 256;
    let chunk_bytes = ty.type_size() * CHUNK / ty.block_size();
    let mut buf = [0f32; CHUNK];
    let mut sum = 0.0f32;
    for (wc, xc) in w.chunks(chunk_bytes).zip(x.chunks(CHUNK)) {
        let out = &mut buf[..xc.len()];
        crate::dequantize(ty, wc, out).map_err(|_| DotError::Unsupported(ty))?;
        sum += (kernels().f32)(out, xc);
    }
    Ok(sum)
}
