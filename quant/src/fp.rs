//! f16 and bf16 conversions with ggml's rounding.

use half::f16;

/// f32 → f16, round to nearest even, as ggml-base's `ggml_fp32_to_fp16_row` (what
/// `ggml_quantize_chunk`, hence llama-quantize, uses for F16) computes it.
#[inline]
pub fn f32_to_f16_bits(v: f32) -> u16 {
    // ggml's GGML_FP32_TO_FP16 in ggml-base is the software ggml_compute_fp32_to_fp16
    // (ggml/src/ggml-impl.h, llama.cpp 0c1e57098), which ends in
    // `(sign >> 16) | (shl1_w > 0xFF000000 ? 0x7E00 : nonsign)`: every NaN becomes sign|0x7E00.
    // half (like the F16C instruction) keeps the top payload bits instead (0x7FFFFFFF → 0x7FFF),
    // so NaNs are handled here. Everything else, subnormals and overflow to inf included,
    // already matched ggml bit for bit (quant/tests/golden.rs).
    if v.is_nan() {
        return ((v.to_bits() >> 16) as u16 & 0x8000) | 0x7E00;
    }
    f16::from_f32(v).to_bits()
}

#[inline]
pub fn f16_bits_to_f32(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

/// f32 → bf16 exactly as ggml's `ggml_compute_fp32_to_bf16`: round to nearest even, and a
/// NaN keeps its top bits with the quiet bit forced on.
#[inline]
pub fn f32_to_bf16_bits(v: f32) -> u16 {
    let u = v.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

#[inline]
pub fn bf16_bits_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// Writes `src` as little-endian f16 into `dst` (2 bytes per element).
pub fn f32_to_f16_row(src: &[f32], dst: &mut [u8]) {
    for (v, out) in src.iter().zip(dst.chunks_exact_mut(2)) {
        out.copy_from_slice(&f32_to_f16_bits(*v).to_le_bytes());
    }
}

/// Writes `src` as little-endian bf16 into `dst` (2 bytes per element).
pub fn f32_to_bf16_row(src: &[f32], dst: &mut [u8]) {
    for (v, out) in src.iter().zip(dst.chunks_exact_mut(2)) {
        out.copy_from_slice(&f32_to_bf16_bits(*v).to_le_bytes());
    }
}

pub fn f16_row_to_f32(src: &[u8], dst: &mut [f32]) {
    // f16 → f32 is exact, so half's vectorised slice conversion (F16C when the CPU has it,
    // detected once per call rather than per value) gives the scalar loop's values. It needs
    // the bytes 2-aligned and in the host's (little-endian) order.
    #[cfg(target_endian = "little")]
    if let Ok(h) = bytemuck::try_cast_slice::<u8, f16>(&src[..src.len() & !1]) {
        use half::slice::HalfFloatSliceExt;
        let n = h.len().min(dst.len());
        h[..n].convert_to_f32_slice(&mut dst[..n]);
        return;
    }
    for (b, out) in src.chunks_exact(2).zip(dst.iter_mut()) {
        *out = f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

pub fn bf16_row_to_f32(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src.chunks_exact(2).zip(dst.iter_mut()) {
        *out = bf16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even mantissa.
        assert_eq!(f32_to_bf16_bits(1.0 + 1.0 / 256.0), 0x3f80);
        assert_eq!(f32_to_bf16_bits(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(f32_to_bf16_bits(-2.5), 0xc020);
        assert_eq!(f32_to_bf16_bits(f32::INFINITY), 0x7f80);
        // NaN stays NaN and is quiet.
        let nan = f32_to_bf16_bits(f32::from_bits(0x7f80_0001));
        assert!(bf16_bits_to_f32(nan).is_nan());
        assert_eq!(nan & 0x40, 0x40);
    }

    #[test]
    fn f16_rounds_to_nearest_even() {
        // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10.
        assert_eq!(f32_to_f16_bits(1.0 + 1.0 / 2048.0), 0x3c00);
        assert_eq!(f32_to_f16_bits(1.0 + 3.0 / 2048.0), 0x3c02);
        assert_eq!(f32_to_f16_bits(65520.0), 0x7c00); // rounds up to infinity
        assert_eq!(f16_bits_to_f32(0x3555), 0.333_251_95);
    }
}
