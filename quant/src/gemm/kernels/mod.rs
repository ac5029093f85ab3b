//! The packed kernels, written once over [`Arch`], a small set of vector operations on
//! `LANES` rows at a time (16 for AVX-512, 8 for AVX2, 16 for the portable set). Each
//! instruction set implements [`Arch`] with `#[inline(always)]` methods and instantiates
//! [`drive`] inside a `#[target_feature]` entry point, so everything below compiles to straight
//! SIMD code for that set.
//!
//! A *tile* is one 16-row group × N tokens (N ≤ 8). The group is processed `LANES` rows (one
//! *slice*) at a time; for each block, the weight quants are unpacked once into registers and
//! multiplied against every token of the tile.
//!
//! * [`arch`]: [`Arch`] and [`Tuned`];
//! * [`drive`]: [`drive`] and the accumulators and prefetching every kernel uses;
//! * [`legacy`], [`float`]: the tiles of the 32-element and float formats (the K-quants'
//!   and Q8_0's are in `q4k_q5k.rs`, `q6k.rs` and `q8_0.rs`);
//! * `kernel_set!`: one instruction set's entry points.

mod arch;
mod drive;
mod float;
mod legacy;

pub(super) use super::q4k_q5k::{Q4K, Q5K};
pub(super) use super::q6k::Q6K;
pub(super) use super::q8_0::Q8_0;
pub(super) use arch::*;
pub(super) use drive::*;
pub(super) use float::*;
pub(super) use legacy::*;

/// Builds a [`super::GemmKernels`] whose entries run [`drive`] for each type inside entry
/// points carrying `attrs` (the `#[target_feature]` of the instruction set).
macro_rules! kernel_set {
    ($vis:vis $name:ident, $label:literal, $arch:ty, $fast:expr, [$(#[$attr:meta])*]) => {
        $vis mod $name {
            use super::*;
            $crate::gemm::kernels::kernel_set!(@entry [$(#[$attr])*] $arch, q4_0, Q4_0);
            $crate::gemm::kernels::kernel_set!(@entry [$(#[$attr])*] $arch, q4_1, Q4_1);
            $crate::gemm::kernels::kernel_set!(@entry [$(#[$attr])*] $arch, q5_0, Q5_0);
            $crate::gemm::kernels::kernel_set!(@entry [$(#[$attr])*] $arch, q5_1, Q5_1);
            $crate::gemm::kernels::kernel_set!(@entry [$(#[$attr])*] $arch, q8_0, Q8_0);
            $crate::gemm::kernels::kernel_set!(@entry [$(#[$attr])*] $arch, q4_k, Q4K);
            $crate::gemm::kernels::kernel_set!(@entry [$(#[$attr])*] $arch, q5_k, Q5K);
            $crate::gemm::kernels::kernel_set!(@entry [$(#[$attr])*] $arch, q6_k, Q6K);
            $crate::gemm::kernels::kernel_set!(@entry [$(#[$attr])*] $arch, f16, F16);
            $crate::gemm::kernels::kernel_set!(@entry [$(#[$attr])*] $arch, bf16, BF16);
            /// `Kern::reads_merged` of each type's kernel on this arch.
            fn reads_merged(ty: $crate::GgmlType) -> bool {
                use $crate::gemm::kernels::{Kern, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4K, Q5K, Q6K, F16, BF16};
                use $crate::GgmlType as T;
                match ty {
                    T::Q4_0 => Q4_0::reads_merged::<$arch>(),
                    T::Q4_1 => Q4_1::reads_merged::<$arch>(),
                    T::Q5_0 => Q5_0::reads_merged::<$arch>(),
                    T::Q5_1 => Q5_1::reads_merged::<$arch>(),
                    T::Q8_0 => Q8_0::reads_merged::<$arch>(),
                    T::Q4_K => Q4K::reads_merged::<$arch>(),
                    T::Q5_K => Q5K::reads_merged::<$arch>(),
                    T::Q6_K => Q6K::reads_merged::<$arch>(),
                    T::F16 => F16::reads_merged::<$arch>(),
                    T::BF16 => BF16::reads_merged::<$arch>(),
                    _ => false,
                }
            }
            pub(crate) const KERNELS: $crate::gemm::GemmKernels = $crate::gemm::GemmKernels {
                name: $label,
                reads_merged,
                q4_0,
                q4_1,
                q5_0,
                q5_1,
                q8_0,
                q4_k,
                q5_k,
                q6_k,
                f16,
                bf16,
                fast: $fast,
            };
        }
    };
    (@entry [$(#[$attr:meta])*] $arch:ty, $fn_name:ident, $kern:ident) => {
        /// # Safety
        /// See `GemmKernels::gemm_groups`; the CPU must have this set's features.
        $(#[$attr])*
        pub(crate) unsafe fn $fn_name(
            w: &$crate::gemm::PackedMatrix,
            a: &$crate::gemm::QActs,
            groups: std::ops::Range<usize>,
            out: *mut f32,
            ld: usize,
        ) {
            // SAFETY: forwarded.
            unsafe { $crate::gemm::kernels::drive::<$arch, $crate::gemm::kernels::$kern>(w, a, groups, out, ld) }
        }
    };
}
pub(super) use kernel_set;
