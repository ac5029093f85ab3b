//! The float weights' tiles: F16 and BF16 against f32 activations.

// Accumulator arrays, token pointers and results are parallel arrays indexed by token.
#![allow(clippy::needless_range_loop)]

use super::{Arch, Kern, at, slices, toks};
use super::super::{PackedMatrix, QActs};

#[inline(always)]
pub(in crate::gemm) unsafe fn tile_float<A: Arch, const N: usize, const BF: bool>(
    w: &PackedMatrix,
    a: &QActs,
    g: usize,
    t0: usize,
    out: *mut f32,
    ld: usize,
) {
    let (bulk, _) = w.group(g);
    let nb = w.nb;
    let tk = toks::<N>(a, t0);
    // SAFETY: pointers stay inside the group and the token segments.
    unsafe {
        slices::<A, N>(w, a.pairs, g, t0, out, ld, |r0| {
            let load = |p| if BF { A::load_bf16(p) } else { A::load_f16(p) };
            if N == 1 {
                // One token: four chains hide the FMA latency.
                let mut acc = [A::zero_f(); 4];
                for b in 0..nb {
                    for k in 0..16 {
                        let wv = load(at(bulk, 512 * b + 32 * k + 2 * r0));
                        acc[k % 4] = A::fmadd(wv, A::bcast_f32(at(tk[0], 4 * (16 * b + k))), acc[k % 4]);
                    }
                }
                let s = A::add_f(A::add_f(acc[0], acc[1]), A::add_f(acc[2], acc[3]));
                std::array::from_fn(|_| s)
            } else {
                let mut acc = [A::zero_f(); N];
                for b in 0..nb {
                    for k in 0..16 {
                        let wv = load(at(bulk, 512 * b + 32 * k + 2 * r0));
                        for t in 0..N {
                            acc[t] = A::fmadd(wv, A::bcast_f32(at(tk[t], 4 * (16 * b + k))), acc[t]);
                        }
                    }
                }
                acc
            }
        })
    }
}

pub(in crate::gemm) struct F16;
pub(in crate::gemm) struct BF16;
impl Kern for F16 {
    const MAX_N: usize = 8;
    #[inline(always)]
    unsafe fn tile<A: Arch, const N: usize>(
        w: &PackedMatrix,
        a: &QActs,
        g: usize,
        t0: usize,
        out: *mut f32,
        ld: usize,
    ) {
        unsafe { tile_float::<A, N, false>(w, a, g, t0, out, ld) }
    }
}
impl Kern for BF16 {
    const MAX_N: usize = 8;
    #[inline(always)]
    unsafe fn tile<A: Arch, const N: usize>(
        w: &PackedMatrix,
        a: &QActs,
        g: usize,
        t0: usize,
        out: *mut f32,
        ld: usize,
    ) {
        unsafe { tile_float::<A, N, true>(w, a, g, t0, out, ld) }
    }
}
