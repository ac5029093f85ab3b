//! ggml's scale searches (`make_qx_quants`, `make_qkx2/3_quants`, `make_qp_quants`).
//!
//! These are the heart of the K-quants and of every importance-weighted quantizer. They are
//! ported expression by expression: float operations are evaluated in the same order as the
//! C code (`w*x*l` is `(w*x)*l`), integer results are narrowed the way C narrows them, and
//! ties round to even through [`nearest_int`]. Change nothing here without re-running the
//! golden tests against ggml.

use crate::legacy::signed_absmax;
use crate::rounding::nearest_int;

/// Below this magnitude a group counts as all zero (ggml's `GROUP_MAX_EPS`).
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// Symmetric quantization of `x` to integers in −nmax..nmax−1, stored in `l` offset by
/// +nmax. Returns the scale. `rmse_type` picks the error weights when `qw` is `None`
/// (1: x², 2: 1, 3: |x|, else √|x|); 0 skips the search, a negative value stops after the
/// first refinement. Port of `make_qx_quants`.
pub(crate) fn make_qx_quants(nmax: i32, x: &[f32], l: &mut [i8], rmse_type: i32, qw: Option<&[f32]>) -> f32 {
    let n = x.len();
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        l[..n].fill(0);
        return 0.0;
    }
    let nmax_f = nmax as f32;
    let mut iscale = -nmax_f / max;
    if rmse_type == 0 {
        for i in 0..n {
            let li = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
            l[i] = (nmax + li) as i8;
        }
        return 1.0 / iscale;
    }
    let return_early = rmse_type < 0;
    let rmse_type = rmse_type.abs();
    let weight = |i: usize| -> f32 {
        match qw {
            Some(q) => q[i],
            None => match rmse_type {
                1 => x[i] * x[i],
                2 => 1.0,
                3 => x[i].abs(),
                _ => x[i].abs().sqrt(),
            },
        }
    };
    if !return_early && n <= SEARCH_MAX_N {
        return search_by_lanes(nmax, max, x, l, &weight);
    }
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let li = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l[i] = (li + nmax) as i8;
        let w = weight(i);
        let lf = li as f32;
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    if return_early {
        return if suml2 > 0.0 { 0.5 * (scale + 1.0 / iscale) } else { 1.0 / iscale };
    }
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax_f + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for (i, &xi) in x.iter().enumerate() {
            let lf = nearest_int(iscale * xi).clamp(-nmax, nmax - 1) as f32;
            let w = weight(i);
            sumlx += w * xi * lf;
            suml2 += w * lf * lf;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                let li = nearest_int(iscale * x[i]);
                l[i] = (nmax + li.clamp(-nmax, nmax - 1)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Groups up to this size take [`search_by_lanes`] (ggml calls the search on 16 or
/// 32 values).
const SEARCH_MAX_N: usize = 64;
/// The first scale −nmax/max and the 18 candidates of the search, padded to whole 8-wide
/// vectors.
const LANES: usize = 24;
/// The lane of the first scale (the candidates take lanes 0..18 in the scalar loop's order).
const FIRST: usize = 18;

/// `make_qx_quants` after its trivial cases: the first scale −nmax/max and the 18 candidates
/// `−(nmax + 0.1·is)/max`, is = −9..9 but 0, each in its own lane. Every lane accumulates
/// its sums over the values in the scalar loop's order with the same operations (no fused
/// multiply-add, no reassociation), so the sums are bit-identical while the compiler runs the
/// lanes as vectors (the scalar search was 87 % of a Q6_K conversion). The candidates are
/// then compared in the scalar loop's order, and the levels of the last improvement (or of
/// the first scale) are written.
fn search_by_lanes(nmax: i32, max: f32, x: &[f32], l: &mut [i8], weight: &dyn Fn(usize) -> f32) -> f32 {
    let n = x.len();
    let nmax_f = nmax as f32;
    let mut iscales = [0f32; LANES];
    for (c, is) in (-9..=9).filter(|&is| is != 0).enumerate() {
        iscales[c] = -(nmax_f + 0.1 * is as f32) / max;
    }
    iscales[FIRST] = -nmax_f / max;
    let mut w = [0f32; SEARCH_MAX_N];
    for (i, wi) in w[..n].iter_mut().enumerate() {
        *wi = weight(i);
    }
    let (sumlx, suml2) = lane_sums(nmax, &iscales, x, &w[..n]);
    let mut scale = if suml2[FIRST] != 0.0 { sumlx[FIRST] / suml2[FIRST] } else { 0.0 };
    let mut best = scale * sumlx[FIRST];
    let mut chosen = iscales[FIRST];
    for c in 0..FIRST {
        if suml2[c] > 0.0 && sumlx[c] * sumlx[c] > best * suml2[c] {
            scale = sumlx[c] / suml2[c];
            best = scale * sumlx[c];
            chosen = iscales[c];
        }
    }
    for (li, &xi) in l.iter_mut().zip(x) {
        *li = (nmax + nearest_int(chosen * xi).clamp(-nmax, nmax - 1)) as i8;
    }
    scale
}

type LaneSums = ([f32; LANES], [f32; LANES]);

/// Per candidate lane: Σ (w·x)·l and Σ (w·l)·l over the values in order.
fn lane_sums(nmax: i32, iscales: &[f32; LANES], x: &[f32], w: &[f32]) -> LaneSums {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked above).
        return unsafe { lane_sums_avx2(nmax, iscales, x, w) };
    }
    lane_sums_inline(nmax, iscales, x, w)
}

/// The same loop compiled with AVX2 (8 lanes and integer min/max per instruction; the
/// baseline x86-64 build has neither). FMA stays off: Rust never contracts a·b + c.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn lane_sums_avx2(nmax: i32, iscales: &[f32; LANES], x: &[f32], w: &[f32]) -> LaneSums {
    lane_sums_inline(nmax, iscales, x, w)
}

#[inline(always)]
fn lane_sums_inline(nmax: i32, iscales: &[f32; LANES], x: &[f32], w: &[f32]) -> LaneSums {
    let mut sumlx = [0f32; LANES];
    let mut suml2 = [0f32; LANES];
    for (&xi, &wi) in x.iter().zip(w) {
        let wx = wi * xi; // the scalar loop's w * xi * lf is (w * xi) * lf
        for c in 0..LANES {
            let lf = nearest_int(iscales[c] * xi).clamp(-nmax, nmax - 1) as f32;
            sumlx[c] += wx * lf;
            suml2[c] += wi * lf * lf;
        }
    }
    (sumlx, suml2)
}

/// Asymmetric quantization of `x` to 0..=nmax with a scale and a non-positive minimum, by a
/// weighted least-squares search over `nstep + 1` candidate scales. `weights` of `None` means
/// x² (ggml's `make_qkx3_quants`); ggml's `make_qkx2_quants` is the same search with
/// explicit weights. Both are only ever called with `use_mad = false`, so squared error is
/// hard-wired. Returns `(scale, the_min)` where `the_min` is −min ≥ 0.
#[allow(clippy::too_many_arguments)]
pub(crate) fn make_qkx_quants(
    nmax: i32,
    x: &[f32],
    weights: Option<&[f32]>,
    l: &mut [u8],
    laux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (f32, f32) {
    let n = x.len();
    let w = |i: usize| -> f32 {
        match weights {
            Some(w) => w[i],
            None => x[i] * x[i],
        }
    };
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = w(0);
    let mut sum_x = sum_w * x[0];
    for (i, &xi) in x.iter().enumerate().skip(1) {
        if xi < min {
            min = xi;
        }
        if xi > max {
            max = xi;
        }
        let wi = w(i);
        sum_w += wi;
        sum_x += wi * xi;
    }
    if min > 0.0 {
        min = 0.0;
    }
    // ggml's qkx2 tests `max == min`, qkx3 `max <= min`: the same for every non-NaN input.
    if max <= min {
        l[..n].fill(0);
        return (0.0, -min);
    }
    let nmax_f = nmax as f32;
    let mut iscale = nmax_f / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let li = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = li as u8;
        let diff = scale * l[i] as f32 + min - x[i];
        best_error += w(i) * (diff * diff);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax_f) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let li = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = li as u8;
            let wi = w(i);
            let lf = li as f32;
            sum_l += wi * lf;
            sum_l2 += wi * lf * lf;
            sum_xl += wi * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += w(i) * (diff * diff);
            }
            if cur_error < best_error {
                l[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// `make_qkx3_quants`: [`make_qkx_quants`] with optional weights (default x²).
#[allow(clippy::too_many_arguments)]
pub(crate) fn make_qkx3_quants(
    nmax: i32,
    x: &[f32],
    weights: Option<&[f32]>,
    l: &mut [u8],
    laux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (f32, f32) {
    make_qkx_quants(nmax, x, weights, l, laux, rmin, rdelta, nstep)
}

/// Quantizes non-negative values (the sub-block scales and mins of Q4_K/Q5_K) to 0..=nmax,
/// weighted by `qw`. Port of `make_qp_quants`; `l` keeps C's `uint8_t` narrowing.
pub(crate) fn make_qp_quants(nmax: i32, x: &[f32], l: &mut [u8], qw: &[f32]) -> f32 {
    let n = x.len();
    let mut max = 0.0f32;
    for &v in x {
        max = if max > v { max } else { v };
    }
    if max < GROUP_MAX_EPS {
        l[..n].fill(0);
        return 0.0;
    }
    let nmax_f = nmax as f32;
    let mut iscale = nmax_f / max;
    for i in 0..n {
        l[i] = nearest_int(iscale * x[i]) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best_mse = 0.0f32;
    for i in 0..n {
        let diff = x[i] - scale * l[i] as f32;
        best_mse += qw[i] * diff * diff;
    }
    for is in -4..=4 {
        if is == 0 {
            continue;
        }
        let iscale_is = (0.1 * is as f32 + nmax_f) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0.0f32;
        for i in 0..n {
            let li = nearest_int(iscale_is * x[i]).min(nmax);
            let diff = x[i] - scale_is * li as f32;
            mse += qw[i] * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let li = nearest_int(iscale * x[i]).min(nmax);
        l[i] = li as u8;
        let lf = l[i] as f32;
        sumlx += qw[i] * x[i] * lf;
        suml2 += qw[i] * lf * lf;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..n {
            let w = qw[i];
            let li = l[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            let mut sl2 = suml2 - w * li * li;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = nearest_int(x[i] * sl2 / slx).min(nmax);
                if new_l != l[i] as i32 {
                    let nl = new_l as f32;
                    slx += w * x[i] * nl;
                    sl2 += w * nl * nl;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l[i] = new_l as u8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}
