//! Every SIMD kernel against the scalar reference, and the scalar reference against a
//! plain f32 dot of the dequantized operands.

use super::*;
use crate::legacy::test_util::normal;

/// Weight types with an integer or float dot kernel.
const TYPES: [GgmlType; 11] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
];

fn quantized_weights(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut w = vec![0u8; crate::row_bytes(ty, x.len()).unwrap()];
    crate::quantize(ty, x, x.len(), &mut w).unwrap();
    w
}

fn dequantized_act(act: &ActRow) -> Vec<f32> {
    match act {
        ActRow::Q8_0(b) => {
            let mut out = vec![0.0; b.len() * QK];
            crate::legacy::dequantize_row_q8_0(b, &mut out);
            out
        }
        ActRow::Q8_1(b) => {
            // Q8_1 dequantizes like Q8_0 (s is only a cached sum).
            let as_q8_0: Vec<BlockQ8_0> = b.iter().map(|b| BlockQ8_0 { d: b.d, qs: b.qs }).collect();
            dequantized_act(&ActRow::Q8_0(as_q8_0))
        }
        ActRow::Q8K(b) => {
            let mut out = vec![0.0; b.len() * QK_K];
            crate::kquants::dequantize_row_q8_k(b, &mut out);
            out
        }
        ActRow::F32(v) => v.clone(),
    }
}

/// Lengths of 1, 2 and many blocks (and odd element counts for the float types).
fn lengths(ty: GgmlType) -> Vec<usize> {
    let bs = ty.block_size().max(1);
    let mut v = vec![bs, 2 * bs, 37 * bs.min(256) / bs * bs, 11 * 256];
    if bs == 1 {
        v.extend([1, 7, 33, 1001]);
    }
    v.retain(|n| n % bs == 0 && *n > 0);
    v
}

/// Float summation order differs between kernels; the integer parts are exact. Bound the
/// difference by a small multiple of f32 epsilon times Σ|terms|.
fn sum_abs(w: &[f32], x: &[f32]) -> f32 {
    w.iter().zip(x).map(|(a, b)| (a * b).abs()).sum()
}

#[test]
fn simd_matches_scalar_for_every_type_and_length() {
    let Some(simd) = simd_kernels() else {
        eprintln!("SKIPPED simd_matches_scalar: this CPU has no AVX2/NEON kernel set");
        return;
    };
    let scalar = scalar::KERNELS;
    for ty in TYPES {
        for (case, n) in lengths(ty).into_iter().enumerate() {
            let w_f = normal(n, 100 + case as u64);
            let x = normal(n, 200 + case as u64);
            let w = quantized_weights(ty, &w_f);
            let act = ActRow::quantize_for(ty, &x);
            let a = scalar.vec_dot(ty, &w, &act).unwrap();
            let b = simd.vec_dot(ty, &w, &act).unwrap();
            let mut wd = vec![0.0; n];
            crate::dequantize(ty, &w, &mut wd).unwrap();
            let bound = 1e-5 * sum_abs(&wd, &dequantized_act(&act)) + 1e-6;
            assert!((a - b).abs() <= bound, "{ty} n={n}: scalar {a} vs {} {b} (bound {bound})", simd.name);
        }
    }
}

#[test]
fn scalar_kernels_equal_dot_of_dequantized_operands() {
    let k = scalar::KERNELS;
    for ty in TYPES {
        for (case, n) in lengths(ty).into_iter().enumerate() {
            let w_f = normal(n, 300 + case as u64);
            let x = normal(n, 400 + case as u64);
            let w = quantized_weights(ty, &w_f);
            let act = ActRow::quantize_for(ty, &x);
            let got = k.vec_dot(ty, &w, &act).unwrap();
            let mut wd = vec![0.0; n];
            crate::dequantize(ty, &w, &mut wd).unwrap();
            let xd = dequantized_act(&act);
            let want: f64 = wd.iter().zip(&xd).map(|(a, b)| *a as f64 * *b as f64).sum();
            // Q4_1/Q5_1 use Q8_1's f16-rounded sum for the minimum term, as ggml does.
            let rounding = if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) { 2e-3 } else { 1e-5 };
            let bound = rounding * sum_abs(&wd, &xd) + 1e-6;
            assert!((got as f64 - want).abs() <= bound as f64, "{ty} n={n}: {got} vs {want} (bound {bound})");
            // And the activation quantization itself costs little against exact f32.
            let exact = dot_f32(ty, &w, &x).unwrap();
            let act_bound = 0.02 * sum_abs(&wd, &x) + 1e-6;
            assert!((got - exact).abs() <= act_bound, "{ty} n={n}: {got} vs exact {exact}");
        }
    }
}

#[test]
fn rejects_mismatched_rows() {
    let k = kernels();
    let w = quantized_weights(GgmlType::Q4_0, &normal(64, 1));
    let act = ActRow::quantize_for(GgmlType::Q4_0, &normal(32, 2));
    assert!(matches!(k.vec_dot(GgmlType::Q4_0, &w, &act), Err(DotError::LengthMismatch { .. })));
    let act_k = ActRow::quantize_for(GgmlType::Q4_K, &normal(256, 2));
    let w64 = quantized_weights(GgmlType::Q4_0, &normal(256, 1));
    assert_eq!(k.vec_dot(GgmlType::Q4_0, &w64, &act_k), Err(DotError::WrongActivation(GgmlType::Q4_0)));
    assert_eq!(k.vec_dot(GgmlType::IQ2_XS, &w64, &act_k), Err(DotError::Unsupported(GgmlType::IQ2_XS)));
}
