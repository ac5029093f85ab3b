//! [`make_qkx_quants`](crate::search::make_qkx_quants) for the eight 32-value sub-blocks of a
//! K-quant super-block at once: sub-block j runs in lane j.
//!
//! The search cannot be split across its candidate scales (each improvement moves the
//! minimum that the next candidates start from), but the eight sub-blocks are independent.
//! Every lane performs exactly the scalar search's operations in its order — the same sums
//! over the values, no fused multiply-add, the data-dependent branches as per-lane selects
//! — so the results are bit-identical while the compiler runs the lanes as one vector. The
//! scalar search was most of a Q4_K_M conversion (llama-quantize's own is scalar too).

use crate::rounding::nearest_int;

/// Sub-blocks per super-block: the lanes.
const G: usize = 8;
/// Values per sub-block.
const N: usize = 32;

/// The search on each sub-block j of `x` (256 values, sub-block j is `x[32j..32j + 32]`)
/// with its `weights`: the levels into `l` (256) and `(scales, the_mins)` per sub-block,
/// exactly as eight calls of `make_qkx_quants` with the same arguments return them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn make_qkx_quants_x8(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> ([f32; G], [f32; G]) {
    assert!(x.len() == G * N && weights.len() == G * N && l.len() == G * N, "one super-block of 256 values");
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked above).
        return unsafe { x8_avx2(nmax, x, weights, l, rmin, rdelta, nstep) };
    }
    x8_inline(nmax, x, weights, l, rmin, rdelta, nstep)
}

/// The same code compiled with AVX2 (one 8-lane vector per step, integer min/max for the
/// clamps). FMA stays off: Rust never contracts a·b + c.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn x8_avx2(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> ([f32; G], [f32; G]) {
    x8_inline(nmax, x, weights, l, rmin, rdelta, nstep)
}

type Lanes = [f32; G];

#[inline(always)]
fn levels(iscale: &Lanes, x: &Lanes, min: &Lanes, nmax: i32) -> Lanes {
    let mut out = [0f32; G];
    for j in 0..G {
        out[j] = nearest_int(iscale[j] * (x[j] - min[j])).clamp(0, nmax) as f32;
    }
    out
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn x8_inline(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> ([f32; G], [f32; G]) {
    // Transposed: value i of every sub-block in one row of lanes.
    let mut xt = [[0f32; G]; N];
    let mut wt = [[0f32; G]; N];
    for j in 0..G {
        for i in 0..N {
            xt[i][j] = x[N * j + i];
            wt[i][j] = weights[N * j + i];
        }
    }
    let (mut min, mut max, mut sum_w) = (xt[0], xt[0], wt[0]);
    let mut sum_x = [0f32; G];
    for j in 0..G {
        sum_x[j] = sum_w[j] * xt[0][j];
    }
    for i in 1..N {
        for j in 0..G {
            let v = xt[i][j];
            min[j] = if v < min[j] { v } else { min[j] };
            max[j] = if v > max[j] { v } else { max[j] };
            sum_w[j] += wt[i][j];
            sum_x[j] += wt[i][j] * v;
        }
    }
    let mut flat = [false; G];
    for j in 0..G {
        min[j] = if min[j] > 0.0 { 0.0 } else { min[j] };
        flat[j] = max[j] <= min[j];
    }
    // What a flat sub-block returns, before the search below moves its (unused) minimum.
    let flat_min = min;
    let nmax_f = nmax as f32;
    // Flat lanes compute nonsense below and are answered at the end.
    let mut iscale = [0f32; G];
    let mut scale = [0f32; G];
    for j in 0..G {
        iscale[j] = nmax_f / (max[j] - min[j]);
        scale[j] = 1.0 / iscale[j];
    }
    let mut best_l = [[0f32; G]; N];
    let mut best_error = [0f32; G];
    for i in 0..N {
        best_l[i] = levels(&iscale, &xt[i], &min, nmax);
        for j in 0..G {
            let diff = scale[j] * best_l[i][j] + min[j] - xt[i][j];
            best_error[j] += wt[i][j] * (diff * diff);
        }
    }
    if nstep >= 1 {
        let mut cand = [[0f32; G]; N];
        for is in 0..=nstep {
            for j in 0..G {
                iscale[j] = (rmin + rdelta * is as f32 + nmax_f) / (max[j] - min[j]);
            }
            let (mut sum_l, mut sum_l2, mut sum_xl) = ([0f32; G], [0f32; G], [0f32; G]);
            for i in 0..N {
                cand[i] = levels(&iscale, &xt[i], &min, nmax);
                for j in 0..G {
                    let (wi, lf) = (wt[i][j], cand[i][j]);
                    sum_l[j] += wi * lf;
                    sum_l2[j] += wi * lf * lf;
                    sum_xl[j] += wi * lf * xt[i][j];
                }
            }
            let (mut this_scale, mut this_min, mut valid) = ([0f32; G], [0f32; G], [false; G]);
            for j in 0..G {
                let det = sum_w[j] * sum_l2[j] - sum_l[j] * sum_l[j];
                valid[j] = det > 0.0;
                let s = (sum_w[j] * sum_xl[j] - sum_x[j] * sum_l[j]) / det;
                let m = (sum_l2[j] * sum_x[j] - sum_l[j] * sum_xl[j]) / det;
                (this_scale[j], this_min[j]) = if m > 0.0 { (sum_xl[j] / sum_l2[j], 0.0) } else { (s, m) };
            }
            let mut cur_error = [0f32; G];
            for i in 0..N {
                for j in 0..G {
                    let diff = this_scale[j] * cand[i][j] + this_min[j] - xt[i][j];
                    cur_error[j] += wt[i][j] * (diff * diff);
                }
            }
            let mut better = [false; G];
            for j in 0..G {
                better[j] = valid[j] && cur_error[j] < best_error[j];
                if better[j] {
                    best_error[j] = cur_error[j];
                    scale[j] = this_scale[j];
                    min[j] = this_min[j];
                }
            }
            for i in 0..N {
                for j in 0..G {
                    best_l[i][j] = if better[j] { cand[i][j] } else { best_l[i][j] };
                }
            }
        }
    }
    let mut the_min = [0f32; G];
    for j in 0..G {
        for i in 0..N {
            l[N * j + i] = if flat[j] { 0 } else { best_l[i][j] as u8 };
        }
        (scale[j], the_min[j]) = if flat[j] { (0.0, -flat_min[j]) } else { (scale[j], -min[j]) };
    }
    (scale, the_min)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::make_qkx_quants;

    /// Eight sub-blocks: random ones, and the edges (all equal, all zero, all positive, one
    /// huge value, tiny values, a NaN).
    fn superblock(seed: u64, edge: usize) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        let mut x: Vec<f32> = (0..G * N).map(|_| next() * 3.0).collect();
        let g = &mut x[N * (edge % G)..N * (edge % G + 1)];
        match edge / G {
            0 => g.fill(1.25),
            1 => g.fill(0.0),
            2 => g.iter_mut().for_each(|v| *v = v.abs() + 0.5),
            3 => g[7] = 1e4,
            4 => g.iter_mut().for_each(|v| *v *= 1e-30),
            5 => g[3] = f32::NAN,
            _ => {}
        }
        x
    }

    #[test]
    fn eight_lanes_equal_eight_scalar_searches() {
        for case in 0..G * 7 * 4 {
            let x = superblock(case as u64, case % (G * 7));
            let av: f32 = (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32).sqrt();
            let w: Vec<f32> = x.iter().map(|v| av + v.abs()).collect();
            for (nmax, rmin, rdelta, nstep) in [
                (15, -1.0, 0.1, 20),
                (31, -0.5, 0.1, 15),
                (15, -0.9, 0.05, 36),
                (31, -0.9, 0.05, 36),
                (31, -1.0, 0.1, 0),
            ] {
                let mut l = vec![0u8; G * N];
                let (scales, mins) = make_qkx_quants_x8(nmax, &x, &w, &mut l, rmin, rdelta, nstep);
                for j in 0..G {
                    let (xs, ws) = (&x[N * j..N * (j + 1)], &w[N * j..N * (j + 1)]);
                    let (mut lj, mut laux) = ([0u8; N], [0u8; N]);
                    let (s, m) = make_qkx_quants(nmax, xs, Some(ws), &mut lj, &mut laux, rmin, rdelta, nstep);
                    let what = format!("case {case}, nmax {nmax}, nstep {nstep}, sub-block {j}");
                    assert_eq!((scales[j].to_bits(), mins[j].to_bits()), (s.to_bits(), m.to_bits()), "{what}");
                    assert_eq!(&l[N * j..N * (j + 1)], &lj[..], "{what}");
                }
            }
        }
    }
}
