//! Every packed kernel set against the scalar per-row reference ([`crate::dot::scalar`]).
//!
//! Bounds, for every type: the integer parts are exact (or rounded once on conversion, like
//! a float operation: see the module docs of `gemm`), so the packed result differs from the
//! scalar one only by float rounding of the per-block (per-sub-block for the K-quants) terms,
//! summed in another order and grouping. With u = 2⁻²⁴, n = the number of block terms
//! of a row (blocks × sub-blocks: 1 per block for the 32-element formats and F16/BF16 column
//! blocks of 16, 8 for Q4_K/Q5_K, 16 for Q6_K) and S = Σᵢ (|scale part of wᵢ| + |min part of
//! wᵢ|)·|xᵢ| over the dequantized operands, both results lie within (n + 4)·u·S of the exact
//! sum, hence
//!
//!     |packed − scalar| ≤ 2·(n + 4)·u·S        (`bound` below)
//!
//! and `integer_parts_are_exact` checks the exactness directly: with all scales ±1 and small
//! integer activations every float operation is exact, and packed == scalar bit for bit.
//!
//! One file (~790 lines) because its tests share the bound derived above and its fixtures.

use std::ops::Range;

use super::*;
use crate::GgmlType;
use crate::blocks::{BlockQ8_0, F16Bytes, QK, QK_K};
use crate::dot::{ActRow, scalar};
use crate::legacy::test_util::normal;

fn par_threads(n: usize, f: &(dyn Fn(Range<usize>) + Sync)) {
    // Exercise the parallel path: split into 3 ranges on scoped threads.
    let step = n.div_ceil(3).max(1);
    std::thread::scope(|s| {
        for start in (0..n).step_by(step) {
            s.spawn(move || f(start..(start + step).min(n)));
        }
    });
}

fn quantize_matrix(ty: GgmlType, w: &[f32], cols: usize) -> Vec<u8> {
    let mut out = vec![0u8; crate::row_bytes(ty, cols).unwrap() * (w.len() / cols)];
    crate::quantize(ty, w, cols, &mut out).unwrap();
    out
}

/// Scalar per-row reference, `out[t·rows + r]`.
fn reference(ty: GgmlType, wb: &[u8], rows: usize, cols: usize, x: &[f32], n_tok: usize) -> Vec<f32> {
    let rb = crate::row_bytes(ty, cols).unwrap();
    let acts: Vec<ActRow> = (0..n_tok).map(|t| ActRow::quantize_for(ty, &x[t * cols..(t + 1) * cols])).collect();
    let mut out = vec![0f32; n_tok * rows];
    for t in 0..n_tok {
        for r in 0..rows {
            out[t * rows + r] = scalar::KERNELS.vec_dot(ty, &wb[r * rb..(r + 1) * rb], &acts[t]).unwrap();
        }
    }
    out
}

fn dequantized_act(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    match ActRow::quantize_for(ty, x) {
        ActRow::Q8_0(b) => crate::legacy::dequantize_row_q8_0(&b, &mut out),
        ActRow::Q8_1(b) => {
            let b: Vec<BlockQ8_0> = b.iter().map(|b| BlockQ8_0 { d: b.d, qs: b.qs }).collect();
            crate::legacy::dequantize_row_q8_0(&b, &mut out)
        }
        ActRow::Q8K(b) => crate::kquants::dequantize_row_q8_k(&b, &mut out),
        ActRow::F32(v) => out.copy_from_slice(&v),
    }
    out
}

/// Byte ranges of (scale, min) fields in a block of the min formats.
fn min_fields(ty: GgmlType) -> Option<(Range<usize>, Range<usize>)> {
    match ty {
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => Some((0..2, 2..4)),
        _ => None,
    }
}

/// Σᵢ (|scale part| + |min part|)·|x̂ᵢ| per (token, row): the S of the module docs.
fn magnitude(ty: GgmlType, wb: &[u8], rows: usize, cols: usize, x: &[f32], n_tok: usize) -> Vec<f64> {
    let rb = crate::row_bytes(ty, cols).unwrap();
    let ts = ty.type_size();
    let dequant = |bytes: &[u8]| {
        let mut v = vec![0f32; cols];
        crate::dequantize(ty, bytes, &mut v).unwrap();
        v
    };
    let parts: Vec<[Vec<f32>; 2]> = (0..rows)
        .map(|r| {
            let row = &wb[r * rb..(r + 1) * rb];
            match min_fields(ty) {
                None => [dequant(row), vec![0.0; cols]],
                Some((scale, min)) => {
                    let zeroed = |field: &Range<usize>| {
                        let mut b = row.to_vec();
                        for blk in b.chunks_exact_mut(ts) {
                            blk[field.clone()].fill(0);
                        }
                        dequant(&b)
                    };
                    [zeroed(&min), zeroed(&scale)]
                }
            }
        })
        .collect();
    let xd: Vec<Vec<f32>> = (0..n_tok).map(|t| dequantized_act(ty, &x[t * cols..(t + 1) * cols])).collect();
    let mut out = vec![0f64; n_tok * rows];
    for t in 0..n_tok {
        for r in 0..rows {
            out[t * rows + r] = (0..cols)
                .map(|i| (parts[r][0][i].abs() as f64 + parts[r][1][i].abs() as f64) * xd[t][i].abs() as f64)
                .sum();
        }
    }
    out
}

/// Block terms per row (see the module docs).
fn n_terms(ty: GgmlType, cols: usize) -> usize {
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => cols / 256 * 8,
        GgmlType::Q6_K => cols / 256 * 16,
        GgmlType::F16 | GgmlType::BF16 => cols,
        _ => cols / 32,
    }
}

fn run_packed(k: &GemmKernels, ty: GgmlType, wb: &[u8], rows: usize, cols: usize, x: &[f32], n_tok: usize) -> Vec<f32> {
    let packed = PackedMatrix::pack(ty, wb, rows, cols, &par_threads).unwrap();
    let mut acts = QActs::new(ActKind::for_weight(ty).unwrap());
    acts.quantize(x, n_tok, cols, &par_threads);
    let mut out = vec![f32::NAN; n_tok * rows];
    k.gemm(&packed, &acts, &mut out).unwrap();
    out
}

fn block_cols(ty: GgmlType) -> usize {
    layout(ty).unwrap().elems
}

#[test]
fn every_kernel_set_matches_the_scalar_reference() {
    let mut sets = available();
    sets.extend(variants());
    eprintln!("packed kernel sets on this CPU: {:?}", sets.iter().map(|k| k.name).collect::<Vec<_>>());
    // (rows, blocks per row, tokens): rows not a multiple of 16, 1, 2 and many blocks, and
    // token counts that exercise every tile size and remainder.
    let many = |ty: GgmlType| if block_cols(ty) == QK_K { 11 } else { 37 };
    for ty in GgmlType::WEIGHT_TYPES {
        let shapes = [
            (1, 1, 1),
            (7, 1, 3),
            (16, 2, 1),
            (17, 2, 5),
            (33, many(ty), 1),
            (33, many(ty), 8),
            (20, many(ty), 11),
            (48, 2, 17),
            (5, many(ty), 4),
            (16, 1, 2),
            (31, 2, 9),
        ];
        for (case, &(rows, nblk, n_tok)) in shapes.iter().enumerate() {
            let cols = nblk * block_cols(ty);
            let w = normal(rows * cols, 1000 + case as u64);
            let x: Vec<f32> = normal(n_tok * cols, 2000 + case as u64).iter().map(|v| 3.0 * v).collect();
            let wb = quantize_matrix(ty, &w, cols);
            let want = reference(ty, &wb, rows, cols, &x, n_tok);
            let mag = magnitude(ty, &wb, rows, cols, &x, n_tok);
            let u = f64::from(f32::EPSILON) / 2.0;
            let n = n_terms(ty, cols) as f64;
            for k in &sets {
                let got = run_packed(k, ty, &wb, rows, cols, &x, n_tok);
                for i in 0..n_tok * rows {
                    let bound = 2.0 * (n + 4.0) * u * mag[i] + 1e-30;
                    let diff = (got[i] as f64 - want[i] as f64).abs();
                    assert!(
                        diff <= bound,
                        "{} {ty} rows={rows} cols={cols} tokens={n_tok}: [t={} r={}] packed {} vs scalar {} \
                         (diff {diff:e}, bound {bound:e})",
                        k.name,
                        i / rows,
                        i % rows,
                        got[i],
                        want[i]
                    );
                }
            }
        }
    }
}

/// Tiny deterministic generator for the exactness test.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn byte(&mut self) -> u8 {
        (self.next() >> 32) as u8
    }
}

const ONE_F16: [u8; 2] = [0x00, 0x3c];

/// Weight blocks with random quants, all f16 scales 1.0 and small sub-block scales/mins.
fn exact_weights(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let mut wb: Vec<u8> = (0..crate::row_bytes(ty, cols).unwrap() * rows).map(|_| rng.byte()).collect();
    match ty {
        GgmlType::F16 | GgmlType::BF16 => {
            for (i, v) in wb.chunks_exact_mut(2).enumerate() {
                let val = (rng.next() % 17) as f32 - 8.0 + (i % 2) as f32 * 0.0;
                let bits = if ty == GgmlType::F16 {
                    crate::fp::f32_to_f16_bits(val)
                } else {
                    crate::fp::f32_to_bf16_bits(val)
                };
                v.copy_from_slice(&bits.to_le_bytes());
            }
        }
        _ => {
            for blk in wb.chunks_exact_mut(ty.type_size()) {
                match ty {
                    GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => blk[0..2].copy_from_slice(&ONE_F16),
                    GgmlType::Q4_1 | GgmlType::Q5_1 => {
                        blk[0..2].copy_from_slice(&ONE_F16);
                        blk[2..4].copy_from_slice(&ONE_F16);
                    }
                    GgmlType::Q4_K | GgmlType::Q5_K => {
                        blk[0..2].copy_from_slice(&ONE_F16);
                        blk[2..4].copy_from_slice(&ONE_F16);
                        // Scales and mins in 0..=3 (the top bits of bytes 0..8 feed sub-blocks 4..8).
                        for b in &mut blk[4..12] {
                            *b &= 0x03;
                        }
                        for b in &mut blk[12..16] {
                            *b &= 0x33;
                        }
                    }
                    GgmlType::Q6_K => {
                        for b in &mut blk[192..208] {
                            *b = ((*b % 7) as i8 - 3) as u8;
                        }
                        blk[208..210].copy_from_slice(&ONE_F16);
                    }
                    _ => unreachable!(),
                }
            }
        }
    }
    wb
}

/// Integer activations in −127..=127 whose every 32- and 256-block reaches ±127, so every
/// activation scale is exactly ±1.
fn exact_acts(n: usize, rng: &mut Rng) -> Vec<f32> {
    let mut x: Vec<f32> = (0..n).map(|_| (rng.next() % 255) as f32 - 127.0).collect();
    for b in x.chunks_exact_mut(32) {
        b[(rng.next() % 32) as usize] = if rng.next().is_multiple_of(2) { 127.0 } else { -127.0 };
    }
    x
}

#[test]
fn integer_parts_are_exact() {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    for ty in GgmlType::WEIGHT_TYPES {
        // Column counts that keep every partial sum below 2^24 (see exact_weights).
        let cols = match ty {
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => 512,
            GgmlType::F16 | GgmlType::BF16 => 512,
            _ => 512,
        };
        for (rows, n_tok) in [(17, 1), (16, 4), (33, 9), (5, 3)] {
            let wb = exact_weights(ty, rows, cols, &mut rng);
            let x = exact_acts(n_tok * cols, &mut rng);
            let want = reference(ty, &wb, rows, cols, &x, n_tok);
            for k in available().iter().chain(&variants()) {
                let got = run_packed(k, ty, &wb, rows, cols, &x, n_tok);
                for i in 0..n_tok * rows {
                    assert!(
                        got[i] == want[i],
                        "{} {ty} rows={rows} tokens={n_tok} [{i}]: packed {} != scalar {}",
                        k.name,
                        got[i],
                        want[i]
                    );
                }
            }
        }
    }
}

/// Byte ranges of a block's quants (not its scales), and the byte that makes every level of
/// the block its largest magnitude.
fn quant_bytes(ty: GgmlType) -> (Range<usize>, u8) {
    match ty {
        GgmlType::Q4_0 => (2..18, 0xff),
        GgmlType::Q4_1 => (4..20, 0xff),
        GgmlType::Q5_0 => (2..22, 0xff),
        GgmlType::Q5_1 => (4..24, 0xff),
        GgmlType::Q8_0 => (2..34, 0x80),
        GgmlType::Q4_K => (16..144, 0xff),
        GgmlType::Q5_K => (16..176, 0xff),
        GgmlType::Q6_K => (0..192, 0xff),
        _ => unreachable!("{ty} has no integer quants"),
    }
}

/// Every quant at its largest level against activations at their extremes (+127 everywhere,
/// and −128 for Q8_K / −127 for Q8_0 everywhere): the largest sums any 16-bit partial of the
/// AVX2 kernels can hold (see `kernels::IAcc`), so an overflow there shows as a wrong result.
#[test]
fn extreme_levels_sum_exactly() {
    let mut rng = Rng(0x0dd_ba11);
    let cols = 512;
    for ty in GgmlType::WEIGHT_TYPES {
        if matches!(ty, GgmlType::F16 | GgmlType::BF16) {
            continue;
        }
        let (quants, max) = quant_bytes(ty);
        let mut wb = exact_weights(ty, 16, cols, &mut rng);
        for blk in wb.chunks_exact_mut(ty.type_size()) {
            blk[quants.clone()].fill(max);
        }
        for sign in [1.0f32, -1.0] {
            let x = vec![sign; 3 * cols];
            let want = reference(ty, &wb, 16, cols, &x, 3);
            for k in available().iter().chain(&variants()) {
                assert_eq!(run_packed(k, ty, &wb, 16, cols, &x, 3), want, "{} {ty} activations {sign}", k.name);
            }
        }
    }
}

/// Two-level pair kernels at their largest products, checked against the per-row reference
/// (first level + second level / 128) in tiles of every size (17 tokens: 34 rows), both
/// signs, with activations at the absmax (±1) then half a first-level step off the grid
/// (|q1| ≈ 127, |q2| ≈ 64):
/// * Q6_K: (0 − 32)·(−128) against merged activations |128·q1 + q2| ≈ 16 200 (the 16-bit
///   form's i16 near its limit);
/// * Q4_K: 15 × scale 63 everywhere, the widest sums of AVX2's scaled partials
///   (q4k_scaled's bound, four sub-blocks ≈ 1.98·10⁹ < 2³¹).
#[test]
fn pairs_hold_their_largest_sums() {
    let (rows, cols, n_tok) = (16, 512, 17);
    // Q6_K: ql = qh = 0 (level 0), scales −128, d = 1.
    let mut q6 = vec![0u8; GgmlType::Q6_K.type_size()];
    q6[192..208].fill(0x80);
    q6[208..210].copy_from_slice(&F16Bytes::from_f32(1.0).0);
    // Q4_K: d = 1, dmin = 0, every 6-bit scale 63 and min 0, every quant 15.
    let mut q4 = vec![0u8; GgmlType::Q4_K.type_size()];
    q4[0..2].copy_from_slice(&F16Bytes::from_f32(1.0).0);
    q4[4..8].fill(0xff);
    q4[12..16].fill(0x0f);
    q4[16..144].fill(0xff);
    for (ty, block) in [(GgmlType::Q6_K, q6), (GgmlType::Q4_K, q4)] {
        let wb: Vec<u8> = block.repeat(rows * cols / QK_K);
        let x: Vec<f32> = (0..n_tok * cols)
            .map(|i| {
                let sign = if (i / cols) % 2 == 0 { 1.0 } else { -1.0 };
                sign * if i % QK_K == 0 { 1.0 } else { 126.5 / 127.0 }
            })
            .collect();
        let mut acts = QActs::new(ActKind::Q8K);
        acts.quantize_two_level(&x, n_tok, cols, &par_threads);
        let packed = PackedMatrix::pack(ty, &wb, rows, cols, &par_threads).unwrap();
        let row = &wb[..crate::row_bytes(ty, cols).unwrap()];
        for k in available().into_iter().chain(variants()) {
            let mut out = vec![f32::NAN; n_tok * rows];
            k.gemm(&packed, &acts, &mut out).unwrap();
            for t in 0..n_tok {
                let xt = &x[t * cols..(t + 1) * cols];
                let hi = ActRow::quantize_for(ty, xt);
                let mut lo = ActRow::empty_for(ty);
                hi.second_level_into(xt, &mut lo);
                let want = scalar::KERNELS.vec_dot(ty, row, &hi).unwrap() as f64
                    + scalar::KERNELS.vec_dot(ty, row, &lo).unwrap() as f64 / crate::second_level::RATIO as f64;
                for r in 0..rows {
                    let got = out[t * rows + r] as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * want.abs(),
                        "{ty} {} token {t} row {r}: {got} vs {want}",
                        k.name
                    );
                }
            }
        }
    }
}

#[test]
fn activation_quantization_is_the_reference() {
    let x = normal(4 * 512, 77);
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q4_K] {
        let mut acts = QActs::new(ActKind::for_weight(ty).unwrap());
        acts.quantize(&x, 4, 512, &serial);
        for t in 0..4 {
            let seg = acts.tok(t);
            // SAFETY: 512 qs bytes and the d array lie inside the token segment.
            let qs = unsafe { std::slice::from_raw_parts(seg as *const i8, 512) };
            let d = |b: usize| unsafe { (seg.add(acts.d_off + 4 * b) as *const f32).read_unaligned() };
            match ActRow::quantize_for(ty, &x[t * 512..(t + 1) * 512]) {
                ActRow::Q8_0(b) => {
                    for (i, blk) in b.iter().enumerate() {
                        assert_eq!(&qs[32 * i..32 * i + 32], &blk.qs);
                        assert_eq!(d(i).to_bits(), blk.d.get().to_bits());
                    }
                }
                ActRow::Q8_1(b) => {
                    for (i, blk) in b.iter().enumerate() {
                        assert_eq!(&qs[32 * i..32 * i + 32], &blk.qs);
                        assert_eq!(d(i).to_bits(), blk.d.get().to_bits());
                    }
                }
                ActRow::Q8K(b) => {
                    for (i, blk) in b.iter().enumerate() {
                        assert_eq!(&qs[256 * i..256 * i + 256], &blk.qs);
                        assert_eq!(d(i).to_bits(), blk.d.to_bits());
                    }
                }
                ActRow::F32(_) => unreachable!(),
            }
        }
    }
}

#[test]
fn group_ranges_write_only_their_rows() {
    let (ty, rows, cols, n_tok) = (GgmlType::Q4_0, 40, 64, 3);
    let wb = quantize_matrix(ty, &normal(rows * cols, 5), cols);
    let packed = PackedMatrix::pack(ty, &wb, rows, cols, &serial).unwrap();
    let mut acts = QActs::new(ActKind::Q8_0);
    acts.quantize(&normal(n_tok * cols, 6), n_tok, cols, &serial);
    let ld = rows + 3;
    for k in &available() {
        let mut out = vec![f32::NAN; n_tok * ld];
        // Group 1 only: rows 16..32.
        // SAFETY: `out` holds n_tok·ld values and is exclusively ours.
        unsafe { k.gemm_groups(&packed, &acts, 1..2, out.as_mut_ptr(), ld).unwrap() };
        for t in 0..n_tok {
            for r in 0..ld {
                assert_eq!(!out[t * ld + r].is_nan(), (16..32).contains(&r), "{} t={t} r={r}", k.name);
            }
        }
    }
}

#[test]
fn rejects_mismatched_inputs() {
    let wb = quantize_matrix(GgmlType::Q4_0, &normal(16 * 64, 1), 64);
    assert!(PackedMatrix::pack(GgmlType::Q4_0, &wb, 16, 32, &serial).is_err());
    assert!(PackedMatrix::pack(GgmlType::Q4_0, &wb[1..], 16, 64, &serial).is_err());
    assert!(matches!(PackedMatrix::pack(GgmlType::F32, &wb, 1, 1, &serial), Err(PackError::Unsupported(_))));
    let packed = PackedMatrix::pack(GgmlType::Q4_0, &wb, 16, 64, &serial).unwrap();
    let mut acts = QActs::new(ActKind::Q8K);
    acts.quantize(&normal(256, 2), 1, 256, &serial);
    let k = available().pop().unwrap();
    let mut out = vec![0f32; 16];
    assert!(matches!(k.gemm(&packed, &acts, &mut out), Err(GemmError::WrongActivation { .. })));
    let mut acts = QActs::new(ActKind::Q8_0);
    acts.quantize(&normal(32, 2), 1, 32, &serial);
    assert!(matches!(k.gemm(&packed, &acts, &mut out), Err(GemmError::Width { .. })));
    acts.quantize(&normal(128, 2), 2, 64, &serial);
    assert!(matches!(k.gemm(&packed, &acts, &mut out), Err(GemmError::Output { .. })));
}

/// Inputs that stress the quantizers: ties after scaling, zeros, tiny and huge magnitudes,
/// subnormals, infinities and NaNs.
fn nasty_blocks(n: usize, rng: &mut Rng) -> Vec<Vec<f32>> {
    let mut v = Vec::new();
    for case in 0..40 {
        let mut x: Vec<f32> = normal(n, 9000 + case).iter().map(|a| a * 10f32.powi((case % 9) as i32 - 4)).collect();
        match case % 10 {
            0 => x.fill(0.0),
            1 => {
                // Scale 2^k exactly (amax = 127·2^k) and values (m + ½)·2^k: exact ties.
                let k = (case as i32 % 7) - 3;
                for (i, e) in x.iter_mut().enumerate() {
                    *e = ((i as i32 % 255) - 127) as f32 * 2f32.powi(k)
                        + if i % 3 == 0 { 0.5 * 2f32.powi(k) } else { 0.0 };
                }
                x[0] = 127.0 * 2f32.powi(k);
            }
            2 => x[(rng.next() % n as u64) as usize] = f32::NAN,
            3 => x[(rng.next() % n as u64) as usize] = f32::INFINITY,
            4 => x[(rng.next() % n as u64) as usize] = f32::NEG_INFINITY,
            5 => x.iter_mut().for_each(|e| *e *= 1e-40), // subnormal
            6 => x.iter_mut().for_each(|e| *e *= 1e30),
            7 => {
                // Ties between +amax and −amax: the first one wins in Q8_K.
                let a = 3.5;
                x[(rng.next() % n as u64) as usize] = -a;
                x[(rng.next() % n as u64) as usize] = a;
            }
            8 => x.iter_mut().for_each(|e| *e = -e.abs()),
            _ => {}
        }
        v.push(x);
    }
    v
}

#[test]
fn simd_activation_quantizers_are_bit_exact() {
    let mut rng = Rng(0xfeed_5678_0000_0001);
    for x in nasty_blocks(QK, &mut rng) {
        let xb: &[f32; QK] = x.as_slice().try_into().unwrap();
        let got = quantize::q8_block(xb);
        let want = quantize::reference_q8(xb);
        assert_eq!(got.qs, want.qs, "{x:?}");
        assert_eq!(got.d, want.d, "{x:?}");
        assert_eq!(got.s, want.s, "{x:?}");
        assert_eq!(got.sum, want.sum, "{x:?}");
    }
    for x in nasty_blocks(QK_K, &mut rng) {
        let xb: &[f32; QK_K] = x.as_slice().try_into().unwrap();
        let got = quantize::q8_k_block(xb);
        let want = quantize::reference_q8_k(xb);
        assert_eq!(got.qs, want.qs, "{x:?}");
        assert_eq!(got.d.to_bits(), want.d.to_bits(), "{x:?}");
        assert_eq!(got.bsums, want.bsums, "{x:?}");
    }
    // The merged i16 activations of two-level pairs, at the levels' extremes too.
    for seed in 0..200u64 {
        let n = 16 * (1 + seed as usize % 20);
        let q: Vec<i8> =
            (0..2 * n).map(|_| if seed < 4 { [-127, 127, -128, 0][seed as usize] } else { rng.next() as i8 }).collect();
        let (q1, q2) = q.split_at(n);
        let (mut got, mut want) = (vec![0u8; 2 * n], vec![1u8; 2 * n]);
        quantize::merged(&mut got, q1, q2);
        quantize::reference_merged(&mut want, q1, q2);
        assert_eq!(got, want, "seed {seed}");
    }
    // Q8_K's bsums (the second level's), at the extremes too.
    for seed in 0..200u64 {
        let q: [i8; QK_K] =
            std::array::from_fn(|_| if seed < 4 { [-127, 127, -128, 0][seed as usize] } else { rng.next() as i8 });
        assert_eq!(quantize::q8_k_bsums(&q), crate::kquants::q8_k_bsums(&q), "seed {seed}");
    }
    // And many random blocks at many scales.
    for seed in 0..2000u64 {
        let s = 2f32.powi((seed % 40) as i32 - 20);
        let x: Vec<f32> = normal(QK_K, 50_000 + seed).iter().map(|v| v * s).collect();
        let xk: &[f32; QK_K] = x.as_slice().try_into().unwrap();
        let got = quantize::q8_k_block(xk);
        let want = quantize::reference_q8_k(xk);
        assert!(got.qs == want.qs && got.d.to_bits() == want.d.to_bits() && got.bsums == want.bsums, "seed {seed}");
        for c in x.chunks_exact(QK) {
            let xb: &[f32; QK] = c.try_into().unwrap();
            assert_eq!(quantize::q8_block(xb), quantize::reference_q8(xb), "seed {seed}");
        }
    }
}

/// Two-level activations: the packed pair sum equals the per-row `dot(w, hi) + dot(w, lo)`
/// (the bound above for each level, plus one rounding of the pair's sum: n + 5), the second
/// row is the first row's rounding error quantized again, and the result is far closer to the
/// exact product than single-level Q8.
#[test]
fn two_level_activations_recover_the_rounding_error() {
    let (rows, n_tok) = (33, 9);
    for ty in GgmlType::WEIGHT_TYPES.into_iter().filter(|&ty| ActKind::for_weight(ty) != Some(ActKind::F32)) {
        let cols = 2 * QK_K;
        let w = normal(rows * cols, 31);
        // A few large values per token, as real hidden states have: they set the block
        // scales, so single-level Q8 loses the small values around them.
        let mut x = normal(n_tok * cols, 32);
        for t in 0..n_tok {
            x[t * cols + 7 * t + 3] = 60.0;
        }
        let wb = quantize_matrix(ty, &w, cols);
        let rb = crate::row_bytes(ty, cols).unwrap();
        let mut wd = vec![0f32; rows * cols];
        crate::dequantize(ty, &wb, &mut wd).unwrap();

        let mut acts = QActs::new(ActKind::for_weight(ty).unwrap());
        acts.quantize_two_level(&x, n_tok, cols, &par_threads);
        assert_eq!((acts.n_tok(), acts.tokens()), (2 * n_tok, n_tok));
        let packed = PackedMatrix::pack(ty, &wb, rows, cols, &par_threads).unwrap();
        let mut sums = vec![f32::NAN; n_tok * rows];
        // The tuning variants too: their tiles of 3 must leave the pairs whole.
        for k in available().into_iter().chain(variants()) {
            k.gemm(&packed, &acts, &mut sums).unwrap();
            let single = run_packed(&k, ty, &wb, rows, cols, &x, n_tok);
            let (mut err1, mut err2) = (0f64, 0f64);
            for t in 0..n_tok {
                let xt = &x[t * cols..(t + 1) * cols];
                let hi = ActRow::quantize_for(ty, xt);
                let mut lo = ActRow::empty_for(ty);
                hi.second_level_into(xt, &mut lo);
                let residual: Vec<f32> = xt.iter().zip(dequantized_act(ty, xt)).map(|(x, h)| x - h).collect();
                let mag_hi = magnitude(ty, &wb, rows, cols, xt, 1);
                let mag_lo = magnitude(ty, &wb, rows, cols, &residual, 1);
                for r in 0..rows {
                    let row = &wb[r * rb..(r + 1) * rb];
                    let want = scalar::KERNELS.vec_dot(ty, row, &hi).unwrap() as f64
                        + scalar::KERNELS.vec_dot(ty, row, &lo).unwrap() as f64 / crate::second_level::RATIO as f64;
                    // The pair's sum in f32: one rounding more than the two rows.
                    let got = sums[t * rows + r] as f64;
                    let u = f64::from(f32::EPSILON) / 2.0;
                    let bound = 2.0 * (n_terms(ty, cols) as f64 + 5.0) * u * (mag_hi[r] + mag_lo[r]) + 1e-30;
                    assert!((got - want).abs() <= bound, "{} {ty} t={t} r={r}: {got} vs {want}", k.name);
                    let exact: f64 = (0..cols).map(|i| wd[r * cols + i] as f64 * xt[i] as f64).sum();
                    err1 += (single[t * rows + r] as f64 - exact).powi(2);
                    err2 += (got - exact).powi(2);
                }
            }
            // Second-level error is ~1/128 of the first (less the f32 rounding floor).
            assert!(err2 * 30.0 * 30.0 < err1, "{} {ty}: two-level error² {err2:e} vs single {err1:e}", k.name);
        }
    }
}

/// Packed matrices of 4 MiB and more live in their own mapping: zeroed, their start on a
/// 2 MiB boundary and (Linux) their whole huge pages advised for THP, so that decode's stream
/// over them is not a TLB miss every 4 KiB; a clone is a copy.
#[test]
fn large_buffers_are_zeroed_and_huge_page_aligned() {
    let len = 5 * HUGE + 100;
    let mut b = AlignedBytes::zeroed(len);
    assert!(matches!(b.store, Store::Mapped(..)));
    assert_eq!(b.as_ptr() as usize % HUGE, 0);
    assert!(b.as_slice().iter().all(|&x| x == 0));
    // SAFETY: inside the buffer.
    unsafe { *b.as_mut_ptr().add(len - 1) = 7 };
    let c = b.clone();
    assert_eq!(c.as_slice(), b.as_slice());
    assert_ne!(c.as_ptr(), b.as_ptr());
    // The advice as the kernel records it. Not on aarch64: CI runs that build under qemu-user,
    // which accepts madvise without passing it on (and reports its own VmFlags).
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() {
        duet_test_support::machine_lacks(
            "large_buffers_are_zeroed_and_huge_page_aligned",
            "DUET_REQUIRE_THP",
            "this kernel has no transparent huge pages: the advice cannot be checked",
        );
    } else {
        // The mapping holding the first huge page carries the advice ("hg" in its VmFlags).
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("reading /proc/self/smaps");
        let at = b.as_ptr() as usize;
        let mut flags = None;
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ')
                && let Some((lo, hi)) = range.split_once('-')
                && let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                inside = lo <= at && at < hi;
            } else if inside && let Some(f) = line.strip_prefix("VmFlags:") {
                flags = Some(f.to_string());
            }
        }
        let flags = flags.expect("the buffer's mapping is in /proc/self/smaps");
        assert!(flags.split_whitespace().any(|f| f == "hg"), "VmFlags:{flags}");
    }
    let small = AlignedBytes::zeroed(1000);
    assert!(matches!(small.store, Store::Heap(_)));
    assert_eq!(small.as_ptr() as usize % 64, 0);
    assert!(small.as_slice().iter().all(|&x| x == 0));
}

/// A token's two-level product is the same bit for bit whether it comes in a batch (tiles of
/// 8 rows) or alone (a tile of 2), for every packed type and kernel set, tuning variants
/// included: a prompt then gives the logits of the same tokens decoded one by one (the
/// model tests hold the runtime to that within 1e-4). Pair tiles that merge two levels sum
/// terms above 2²⁴ in f32, which rounds: their order must not depend on the tile.
#[test]
fn a_token_is_multiplied_the_same_alone_and_in_a_batch() {
    let (rows, cols, n_tok) = (40, 512, 11);
    for ty in GgmlType::WEIGHT_TYPES.into_iter().filter(|&ty| packable(ty)) {
        let kind = ActKind::for_weight(ty).unwrap();
        let wb = quantize_matrix(ty, &normal(rows * cols, 3), cols);
        let packed = PackedMatrix::pack(ty, &wb, rows, cols, &par_threads).unwrap();
        let x = normal(n_tok * cols, 4);
        let mut batch = QActs::new(kind);
        batch.quantize_two_level(&x, n_tok, cols, &par_threads);
        for k in available().into_iter().chain(variants()) {
            let mut out = vec![0f32; n_tok * rows];
            k.gemm(&packed, &batch, &mut out).unwrap();
            for t in 0..n_tok {
                let mut one = QActs::new(kind);
                one.quantize_two_level(&x[t * cols..(t + 1) * cols], 1, cols, &par_threads);
                let mut alone = vec![0f32; rows];
                k.gemm(&packed, &one, &mut alone).unwrap();
                for r in 0..rows {
                    let (b, a) = (out[t * rows + r], alone[r]);
                    assert_eq!(b.to_bits(), a.to_bits(), "{ty} {} token {t} row {r}: batch {b} alone {a}", k.name);
                }
            }
        }
    }
}

/// Merged activations added after the fact ([`QActs::add_merged`]) are the bytes
/// `quantize_two_level` writes, and the kernels that read them (Q6_K everywhere, Q8_0 on plain
/// AVX2: `reads_merged`) give the same bits without them (their 8-bit forms): the runtime
/// adds them only for the kernels that read them.
#[test]
fn merged_activations_are_optional_and_the_same_when_added_later() {
    let (rows, cols, n_tok) = (40, 512, 9);
    for ty in [GgmlType::Q8_0, GgmlType::Q6_K] {
        let kind = ActKind::for_weight(ty).unwrap();
        let wb = quantize_matrix(ty, &normal(rows * cols, 5), cols);
        let packed = PackedMatrix::pack(ty, &wb, rows, cols, &par_threads).unwrap();
        let x = normal(n_tok * cols, 6);
        let mut full = QActs::new(kind);
        full.quantize_two_level(&x, n_tok, cols, &par_threads);
        let mut lean = QActs::new(kind);
        lean.quantize_two_level_unmerged(&x, n_tok, cols, &par_threads);
        assert!(full.has_merged() && !lean.has_merged(), "{ty}");
        for k in available().into_iter().chain(variants()) {
            let (mut a, mut b) = (vec![0f32; n_tok * rows], vec![0f32; n_tok * rows]);
            k.gemm(&packed, &full, &mut a).unwrap();
            k.gemm(&packed, &lean, &mut b).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "{ty} {}: with and without the merged activations", k.name);
        }
        lean.add_merged(&par_threads);
        assert!(lean.has_merged());
        let rows_bytes = full.n_tok() * full.stride;
        assert_eq!(full.buf.as_slice()[..rows_bytes], lean.buf.as_slice()[..rows_bytes], "{ty}");
    }
}

/// A set's tuning variants give its products bit for bit (single-level and two-level
/// activations, every tile size and remainder): the runtime picks among them per weight type
/// by timing alone ([`gemm_candidates`]), so the choice must never change a result.
#[test]
fn tuning_variants_give_their_sets_bits() {
    let (rows, cols) = (40, 512);
    let sets: Vec<GemmKernels> = available().into_iter().filter(|k| k.fast).collect();
    let mut compared = 0;
    for ty in GgmlType::WEIGHT_TYPES.into_iter().filter(|&ty| packable(ty)) {
        let kind = ActKind::for_weight(ty).unwrap();
        let wb = quantize_matrix(ty, &normal(rows * cols, 7), cols);
        let packed = PackedMatrix::pack(ty, &wb, rows, cols, &par_threads).unwrap();
        for n_tok in [1, 2, 3, 5, 8, 13] {
            let x: Vec<f32> = normal(n_tok * cols, 8 + n_tok as u64).iter().map(|v| 2.0 * v).collect();
            for two_level in [false, true] {
                let mut acts = QActs::new(kind);
                if two_level {
                    acts.quantize_two_level(&x, n_tok, cols, &par_threads);
                } else {
                    acts.quantize(&x, n_tok, cols, &par_threads);
                }
                for base in &sets {
                    let mut want = vec![0f32; n_tok * rows];
                    base.gemm(&packed, &acts, &mut want).unwrap();
                    for k in variants().iter().filter(|k| variant_of(k.name, base.name)) {
                        let mut got = vec![0f32; n_tok * rows];
                        k.gemm(&packed, &acts, &mut got).unwrap();
                        for i in 0..n_tok * rows {
                            assert_eq!(
                                got[i].to_bits(),
                                want[i].to_bits(),
                                "{ty} {} vs {}, {n_tok} tokens, two-level {two_level}: [{i}] {} vs {}",
                                k.name,
                                base.name,
                                got[i],
                                want[i]
                            );
                        }
                        compared += 1;
                    }
                }
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        assert!(compared > 0, "an AVX2 CPU has tuning variants to compare");
    }
    let _ = compared;
}

#[test]
fn variant_names_belong_to_their_set() {
    assert!(variant_of("avx2/n4c1,1", "avx2"));
    assert!(!variant_of("avx2+avxvnni/n4c1,1", "avx2"));
    assert!(!variant_of("avx2", "avx2"));
    assert!(variant_of("avx512vnni/n8c1,1", "avx512vnni"));
}
