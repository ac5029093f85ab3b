//! aarch64 NEON dot kernels.
//!
//! Two kernel sets share one source:
//! * `"neon+dotprod"`: the integer kernels multiply with `SDOT` (FEAT_DotProd, Armv8.2+:
//!   Cortex-A55/A76 and later, Neoverse, Apple M1+), picked when the CPU reports `dotprod`.
//! * `"neon"`: baseline Armv8.0 Advanced SIMD (Cortex-A53/A72, e.g. Raspberry Pi 3/4), where
//!   the same kernels multiply with `SMULL` + `SADALP` ([`idot`]).
//!
//! The float kernels are the same in both sets. f16 weights are widened with `FCVTL`, which is
//! part of baseline AArch64 Advanced SIMD (half↔single conversion does not need FEAT_FP16, the
//! `fp16` feature, which adds half-precision *arithmetic*), so no run-time check is needed for it.
//!
//! As in [`super::avx2`], the integer work of every block is exact; only the order of float
//! accumulation differs from [`super::scalar`].
//!
//! Why the integer kernels are generic over `const SDOT: bool` and `#[inline(always)]`:
//! `vdotq_s32` is still unstable in Rust, so `SDOT` is emitted with `asm!`, and the assembler
//! accepts it only inside a function compiled with `dotprod` enabled. The kernels therefore must
//! be inlined, at every optimisation level, into the `#[target_feature(enable = "neon,dotprod")]`
//! entry points in [`entry`]; `#[inline(always)]` (which cannot be combined with
//! `#[target_feature]`) guarantees that, and a mistake is a compile error, never a wrong result.

mod float;
mod kquants;
mod legacy;

use std::arch::aarch64::*;
use std::arch::asm;

use super::Kernels;
use crate::blocks::F16Bytes;

pub fn kernels() -> Option<Kernels> {
    // Byte loads are reinterpreted as little-endian u16/u32 lanes; aarch64_be would need swaps.
    if cfg!(target_endian = "big") || !std::arch::is_aarch64_feature_detected!("neon") {
        return None;
    }
    if std::arch::is_aarch64_feature_detected!("dotprod") { Some(DOTPROD) } else { Some(PLAIN) }
}

/// Every NEON kernel set this CPU can run, so tests can check the `SMULL` path on a CPU that
/// would pick `SDOT`.
#[cfg(test)]
pub(super) fn paths() -> Vec<Kernels> {
    let mut v = Vec::new();
    if kernels().is_some() {
        v.push(PLAIN);
        if std::arch::is_aarch64_feature_detected!("dotprod") {
            v.push(DOTPROD);
        }
    }
    v
}

/// Builds a [`Kernels`] table whose integer entries are the `$path` module's entry points.
macro_rules! table {
    ($name:literal, $path:ident) => {
        Kernels {
            name: $name,
            // SAFETY: `kernels()` hands this table out only when the CPU has the features the
            // entry points are compiled for.
            q4_0: |w, a| unsafe { entry::$path::q4_0(w, a) },
            q4_1: |w, a| unsafe { entry::$path::q4_1(w, a) },
            q5_0: |w, a| unsafe { entry::$path::q5_0(w, a) },
            q5_1: |w, a| unsafe { entry::$path::q5_1(w, a) },
            q8_0: |w, a| unsafe { entry::$path::q8_0(w, a) },
            q4_k: |w, a| unsafe { entry::$path::q4_k(w, a) },
            q5_k: |w, a| unsafe { entry::$path::q5_k(w, a) },
            q6_k: |w, a| unsafe { entry::$path::q6_k(w, a) },
            f32: |w, x| unsafe { float::dot_f32(w, x) },
            f16: |w, x| unsafe { float::dot_f16(w, x) },
            bf16: |w, x| unsafe { float::dot_bf16(w, x) },
        }
    };
}

const PLAIN: Kernels = table!("neon", plain);
const DOTPROD: Kernels = table!("neon+dotprod", dotprod);

/// The integer kernels instantiated once per path, each inside a function whose target features
/// match the instructions it contains.
mod entry {
    macro_rules! entries {
        ($features:literal, $sdot:literal) => {
            use super::super::{kquants, legacy};
            use crate::blocks::{
                BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K, BlockQ8_0, BlockQ8_1, BlockQ8K,
            };
            entries!(@ $features, $sdot,
                q4_0 legacy BlockQ4_0 BlockQ8_0, q4_1 legacy BlockQ4_1 BlockQ8_1,
                q5_0 legacy BlockQ5_0 BlockQ8_0, q5_1 legacy BlockQ5_1 BlockQ8_1,
                q8_0 legacy BlockQ8_0 BlockQ8_0, q4_k kquants BlockQ4K BlockQ8K,
                q5_k kquants BlockQ5K BlockQ8K, q6_k kquants BlockQ6K BlockQ8K);
        };
        (@ $features:literal, $sdot:literal, $($f:ident $m:ident $w:ident $a:ident),*) => {$(
            #[target_feature(enable = $features)]
            pub(in super::super) fn $f(w: &[$w], a: &[$a]) -> f32 {
                $m::$f::<$sdot>(w, a)
            }
        )*};
    }
    pub(super) mod plain {
        entries!("neon", false);
    }
    pub(super) mod dotprod {
        entries!("neon,dotprod", true);
    }
}

/// `acc` plus the 16 products `a[i]·b[i]`, summed into four i32 lanes. Which products land in
/// which lane differs between the two paths, so callers only ever use the sum of all lanes (or
/// scale all lanes alike). Exact for every i8 input:
/// * `SDOT` adds four i8·i8 products straight into each i32 lane;
/// * otherwise `SMULL` forms i16 products (|a·b| ≤ 128·128 = 16384 < 2^15, so even −128·−128
///   fits) and `SADALP` adds adjacent pairs of them into the i32 lanes, so no sum is ever
///   formed in 16 bits.
#[inline(always)]
fn idot<const SDOT: bool>(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    if SDOT {
        let mut acc = acc;
        // SAFETY: pure register arithmetic. `SDOT` is only instantiated (SDOT = true) inside
        // the `dotprod` entry points, which the assembler checks and `kernels()` guards.
        unsafe {
            asm!("sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b", acc = inout(vreg) acc, a = in(vreg) a, b = in(vreg) b,
                 options(pure, nomem, nostack, preserves_flags));
        }
        acc
    } else {
        // SAFETY: baseline NEON (checked by `kernels()`), register operands only.
        unsafe {
            let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
            let hi = vmull_high_s8(a, b);
            vpadalq_s16(vpadalq_s16(acc, lo), hi)
        }
    }
}

/// 16 bytes of `s` starting at `at`. The slice index is bounds-checked (and folds away for the
/// constant offsets the kernels use), so the load itself is always in bounds.
#[inline(always)]
fn ld_u8(s: &[u8], at: usize) -> uint8x16_t {
    let s = &s[at..at + 16];
    // SAFETY: `s` holds exactly 16 readable bytes; `vld1q_u8` has no alignment requirement.
    unsafe { vld1q_u8(s.as_ptr()) }
}

/// As [`ld_u8`], for signed bytes.
#[inline(always)]
fn ld_i8(s: &[i8], at: usize) -> int8x16_t {
    let s = &s[at..at + 16];
    // SAFETY: as in `ld_u8`.
    unsafe { vld1q_s8(s.as_ptr()) }
}

/// Reinterprets unsigned levels as signed bytes (every level the kernels build is < 128, or is
/// already a two's-complement signed value).
#[inline(always)]
fn as_i8(v: uint8x16_t) -> int8x16_t {
    // SAFETY: a bit cast between register types.
    unsafe { vreinterpretq_s8_u8(v) }
}

/// A block's f16 scale as f32, by a scalar `FCVT` (baseline AArch64 FP; exact for every f16,
/// subnormals included). `F16Bytes::get` would go through `half`, whose aarch64 conversion is an
/// out-of-line call behind a run-time `fp16` check: in these loops every such call would also
/// force the vector accumulators to be spilled, since only the low halves of v8–v15 survive it.
#[inline(always)]
fn f16(h: F16Bytes) -> f32 {
    // The bits travel as the low half of an f32 in a vector register, which `FCVT` reads as
    // `Hn` (in practice the compiler loads the two bytes straight into `Hn`).
    let bits = f32::from_bits(u16::from_le_bytes(h.0) as u32);
    let out: f32;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("fcvt {out:s}, {bits:h}", bits = in(vreg) bits, out = lateout(vreg) out,
             options(pure, nomem, nostack, preserves_flags));
    }
    out
}
