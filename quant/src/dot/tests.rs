//! Every SIMD kernel against the scalar reference, and the scalar reference against a
//! plain f32 dot of the dequantized operands.

use super::*;
use crate::legacy::test_util::normal;

/// Weight types with an integer or float dot kernel: F32 and every weight type.
fn types() -> impl Iterator<Item = GgmlType> {
    std::iter::once(GgmlType::F32).chain(GgmlType::WEIGHT_TYPES)
}

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
        duet_test_support::cpu_lacks(
            "simd_matches_scalar",
            &["avx2", "fma", "f16c"],
            "this CPU has no AVX2/NEON kernel set",
        );
        return;
    };
    let scalar = scalar::KERNELS;
    for ty in types() {
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
    for ty in types() {
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

/// Every SIMD kernel set this CPU can run: on aarch64 the baseline NEON set and, when the CPU
/// has `dotprod`, the SDOT set too (`simd_kernels` picks only one of them); elsewhere the one
/// `simd_kernels` returns.
fn simd_paths() -> Vec<Kernels> {
    #[cfg(target_arch = "aarch64")]
    return neon::paths();
    #[cfg(not(target_arch = "aarch64"))]
    simd_kernels().into_iter().collect()
}

#[test]
fn every_simd_path_matches_scalar_for_every_type_and_length() {
    let paths = simd_paths();
    if paths.is_empty() {
        duet_test_support::cpu_lacks(
            "every_simd_path_matches_scalar",
            &["avx2", "fma", "f16c"],
            "this CPU has no AVX2/NEON kernel set",
        );
    }
    let scalar = scalar::KERNELS;
    for simd in &paths {
        for ty in types() {
            for (case, n) in lengths(ty).into_iter().enumerate() {
                let w = quantized_weights(ty, &normal(n, 500 + case as u64));
                let act = ActRow::quantize_for(ty, &normal(n, 600 + case as u64));
                let a = scalar.vec_dot(ty, &w, &act).unwrap();
                let b = simd.vec_dot(ty, &w, &act).unwrap();
                let mut wd = vec![0.0; n];
                crate::dequantize(ty, &w, &mut wd).unwrap();
                let bound = 1e-5 * sum_abs(&wd, &dequantized_act(&act)) + 1e-6;
                assert!((a - b).abs() <= bound, "{ty} n={n}: scalar {a} vs {} {b} (bound {bound})", simd.name);
            }
        }
    }
}

use crate::blocks::F16Bytes;

/// xorshift64: deterministic bytes for the block-level tests below.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn byte(&mut self) -> u8 {
        (self.next() >> 56) as u8
    }
    /// A block scale of either sign: usually in [2^-7, 2^-4), one time in eight an f16
    /// subnormal (the conversion of those must not flush them to zero).
    fn scale(&mut self) -> F16Bytes {
        let r = self.next();
        let sign = if r & 1 == 0 { 1.0 } else { -1.0 };
        if (r >> 1).is_multiple_of(8) {
            let mantissa = ((r >> 8) & 0x3ff) as u16 | 1;
            return F16Bytes((mantissa | if sign < 0.0 { 0x8000 } else { 0 }).to_le_bytes());
        }
        let frac = ((r >> 16) & 0xffff) as f32 / 65536.0;
        F16Bytes::from_f32(sign * (1.0 + frac) * (2.0f32).powi(-7 + ((r >> 4) % 3) as i32))
    }
}

/// How the quantized fields of a test block are filled.
#[derive(Clone, Copy, Debug)]
enum Fill {
    /// Any valid bytes (activations: ±127 with random signs).
    Random,
    /// Every level at its maximum (activations: all +127).
    High,
    /// Every level at its minimum (activations: all −127).
    Low,
}

/// A row of `blocks` weight blocks of the integer type `ty`, levels per `fill`, scales from
/// [`Rng::scale`]. Q8_0 weights stay in ggml's range [−127, 127]; Q6_K's i8 scales use their
/// full range (ggml's quantizer can produce −128).
fn extreme_weights(ty: GgmlType, blocks: usize, fill: Fill, rng: &mut Rng) -> Vec<u8> {
    let mut w = vec![0u8; blocks * ty.type_size()];
    for b in w.iter_mut() {
        *b = match fill {
            Fill::Random => rng.byte(),
            Fill::High => 0xff,
            Fill::Low => 0x00,
        };
    }
    let q8 = |b: u8, fill: Fill| match fill {
        Fill::Random => (b as i8).max(-127),
        Fill::High => 127,
        Fill::Low => -127,
    };
    use crate::blocks::as_blocks_mut;
    match ty {
        GgmlType::Q4_0 => as_blocks_mut::<BlockQ4_0>(&mut w).unwrap().iter_mut().for_each(|b| b.d = rng.scale()),
        GgmlType::Q5_0 => as_blocks_mut::<BlockQ5_0>(&mut w).unwrap().iter_mut().for_each(|b| b.d = rng.scale()),
        GgmlType::Q4_1 => as_blocks_mut::<BlockQ4_1>(&mut w).unwrap().iter_mut().for_each(|b| {
            (b.d, b.m) = (rng.scale(), rng.scale());
        }),
        GgmlType::Q5_1 => as_blocks_mut::<BlockQ5_1>(&mut w).unwrap().iter_mut().for_each(|b| {
            (b.d, b.m) = (rng.scale(), rng.scale());
        }),
        GgmlType::Q8_0 => as_blocks_mut::<BlockQ8_0>(&mut w).unwrap().iter_mut().for_each(|b| {
            b.d = rng.scale();
            b.qs.iter_mut().for_each(|q| *q = q8(*q as u8, fill));
        }),
        GgmlType::Q4_K | GgmlType::Q5_K => {
            // Same header in both: d, dmin, then the 12 packed scale/min bytes. Fixed
            // (non-random) fills use the largest 6-bit scales and mins, 63.
            let size = ty.type_size();
            for b in w.chunks_exact_mut(size) {
                b[0..2].copy_from_slice(&rng.scale().0);
                b[2..4].copy_from_slice(&rng.scale().0);
                if !matches!(fill, Fill::Random) {
                    b[4..16].fill(0xff);
                }
            }
        }
        GgmlType::Q6_K => as_blocks_mut::<BlockQ6K>(&mut w).unwrap().iter_mut().for_each(|b| {
            b.d = rng.scale();
            match fill {
                Fill::Random => {}
                Fill::High => b.scales.fill(127),
                Fill::Low => b.scales.fill(-128),
            }
        }),
        _ => unreachable!("{ty} has no integer kernel"),
    }
    w
}

/// An activation row for `weight`'s integer kernel, every q8 at ±127 per `fill`, with `s` and
/// `bsums` consistent with the levels as the quantizers write them.
fn extreme_act(weight: GgmlType, blocks: usize, fill: Fill, rng: &mut Rng) -> ActRow {
    let q8 = |rng: &mut Rng| match fill {
        Fill::Random if rng.next() & 1 == 0 => 127i8,
        Fill::Random | Fill::Low => -127,
        Fill::High => 127,
    };
    match act_type(weight) {
        GgmlType::Q8_0 => ActRow::Q8_0(
            (0..blocks).map(|_| BlockQ8_0 { d: rng.scale(), qs: std::array::from_fn(|_| q8(rng)) }).collect(),
        ),
        GgmlType::Q8_1 => ActRow::Q8_1(
            (0..blocks)
                .map(|_| {
                    let (d, qs): (F16Bytes, [i8; QK]) = (rng.scale(), std::array::from_fn(|_| q8(rng)));
                    let sum: i32 = qs.iter().map(|&q| q as i32).sum();
                    BlockQ8_1 { d, s: F16Bytes::from_f32(d.get() * sum as f32), qs }
                })
                .collect(),
        ),
        GgmlType::Q8_K => ActRow::Q8K(
            (0..blocks)
                .map(|_| {
                    let qs: [i8; QK_K] = std::array::from_fn(|_| q8(rng));
                    let bsums = std::array::from_fn(|g| qs[16 * g..16 * g + 16].iter().map(|&q| q as i16).sum());
                    // Q8_K's scale is an f32 (about max|x|/127 for unit-sized inputs).
                    BlockQ8K { d: 0.005 + rng.byte() as f32 / 12800.0, qs, bsums }
                })
                .collect(),
        ),
        other => unreachable!("no integer activation format {other}"),
    }
}

/// The integer kernels at the edges of their input ranges: levels at their extremes (or random
/// bytes) against activations of ±127, every combination, 1, 2, 3 and 37 blocks. Integer
/// overflow or saturation anywhere in a SIMD kernel shows up here as a large error.
#[test]
fn simd_matches_scalar_at_extreme_levels() {
    let paths = simd_paths();
    if paths.is_empty() {
        duet_test_support::cpu_lacks(
            "simd_matches_scalar_at_extreme_levels",
            &["avx2", "fma", "f16c"],
            "this CPU has no AVX2/NEON kernel set",
        );
    }
    let scalar = scalar::KERNELS;
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    let fills = [Fill::Random, Fill::High, Fill::Low];
    for ty in types().filter(|t| act_type(*t) != GgmlType::F32) {
        for (w_fill, a_fill) in fills.into_iter().flat_map(|w| fills.map(|a| (w, a))) {
            for blocks in [1, 2, 3, 37] {
                let w = extreme_weights(ty, blocks, w_fill, &mut rng);
                let act = extreme_act(ty, blocks, a_fill, &mut rng);
                let want = scalar.vec_dot(ty, &w, &act).unwrap();
                let mut wd = vec![0.0; blocks * ty.block_size()];
                crate::dequantize(ty, &w, &mut wd).unwrap();
                let bound = 1e-5 * sum_abs(&wd, &dequantized_act(&act)) + 1e-6;
                for simd in &paths {
                    let got = simd.vec_dot(ty, &w, &act).unwrap();
                    assert!(
                        (got - want).abs() <= bound,
                        "{ty} {blocks} blocks, weights {w_fill:?}, act {a_fill:?}: scalar {want} vs {} {got} (bound {bound})",
                        simd.name
                    );
                }
            }
        }
    }
}

/// The f16 and bf16 kernels over every finite bit pattern (subnormals, ±0, the largest
/// finite values), one exponent at a time so the terms of one dot have similar magnitudes and a
/// wrongly converted value cannot hide behind larger ones. Activations are ±2^-exponent, so the
/// products stay near 1. Lengths are not multiples of 8 or 16, to reach every tail.
#[test]
fn simd_f16_and_bf16_match_scalar_for_every_finite_value() {
    let paths = simd_paths();
    if paths.is_empty() {
        duet_test_support::cpu_lacks(
            "simd_f16_and_bf16_match_scalar",
            &["avx2", "fma", "f16c"],
            "this CPU has no AVX2/NEON kernel set",
        );
    }
    let scalar = scalar::KERNELS;
    let mut rng = Rng(0xfeed_f00d_dead_beef);
    // (type, mantissa bits, exponent bias, largest finite biased exponent)
    for (ty, mbits, bias, max_exp) in [(GgmlType::F16, 10u32, 15i32, 30u32), (GgmlType::BF16, 7, 127, 254)] {
        for e in 0..=max_exp {
            let mut w = Vec::new();
            for sign in [0u16, 0x8000] {
                for m in 0..1u16 << mbits {
                    w.extend_from_slice(&(sign | (e << mbits) as u16 | m).to_le_bytes());
                }
            }
            let n = w.len() / 2 - 3;
            w.truncate(2 * n);
            // Subnormals (e = 0) share the scale of e = 1.
            let x_scale = (2.0f32).powi(bias - e.max(1) as i32);
            let x: Vec<f32> = (0..n).map(|_| if rng.next() & 1 == 0 { x_scale } else { -x_scale }).collect();
            let act = ActRow::F32(x);
            let want = scalar.vec_dot(ty, &w, &act).unwrap();
            let mut wd = vec![0.0; n];
            crate::dequantize(ty, &w, &mut wd).unwrap();
            let ActRow::F32(x) = &act else { unreachable!() };
            let bound = 1e-5 * sum_abs(&wd, x) + 1e-6;
            for simd in &paths {
                let got = simd.vec_dot(ty, &w, &act).unwrap();
                assert!(
                    (got - want).abs() <= bound,
                    "{ty} exponent {e}: scalar {want} vs {} {got} (bound {bound})",
                    simd.name
                );
            }
        }
    }
}
