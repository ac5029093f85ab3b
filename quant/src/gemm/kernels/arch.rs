//! [`Arch`]: the vector operations on `LANES` rows every kernel is written over, and
//! [`Tuned`], an arch with another tile size and chain count.

/// Vector operations on `LANES` rows. `V` holds one i32 lane (4 bytes) per row, `F` one f32.
///
/// # Safety
/// Pointer arguments must be valid for the bytes the method reads (documented per method);
/// no alignment is required.
pub(in crate::gemm) trait Arch {
    const LANES: usize;
    /// Largest token tile worth using (register budget).
    const NMAX: usize;
    /// Integer accumulation chains per token in tiles of 3 to 7 tokens (latency vs registers),
    /// for the 32-element formats and for the K-quants (which hold more accumulators).
    const CHAINS: usize;
    const CHAINS_K: usize;
    /// Whether [`Arch::dot_q8`] multiplies Q8_0's stored bytes (q + 128) as they are, so that
    /// the caller must subtract 128·Σa; otherwise it computes the signed product itself.
    const Q8_BIASED: bool;
    type V: Copy;
    type F: Copy;
    type W8: Copy;

    unsafe fn zero() -> Self::V;
    unsafe fn splat8(x: u8) -> Self::V;
    unsafe fn splat32(x: u32) -> Self::V;
    /// 4·LANES bytes.
    unsafe fn load(p: *const u8) -> Self::V;
    unsafe fn and(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn or(a: Self::V, b: Self::V) -> Self::V;
    /// Shifts of every 16-bit / 32-bit lane.
    unsafe fn srli16<const S: u32>(a: Self::V) -> Self::V;
    unsafe fn srli32<const S: u32>(a: Self::V) -> Self::V;
    unsafe fn slli32<const S: u32>(a: Self::V) -> Self::V;
    unsafe fn add32(a: Self::V, b: Self::V) -> Self::V;
    /// Byte `j` of every 32-bit lane, zero-extended.
    unsafe fn byte_lane(a: Self::V, j: u32) -> Self::V;
    /// Byte `j` of every 32-bit lane, zero-extended into both of its 16-bit halves (one
    /// shuffle: `x | x << 16` became a `vpmulld` by 0x10001).
    unsafe fn byte_lane_x2(a: Self::V, j: u32) -> Self::V;
    /// The i32 at `p` (4 bytes) in every lane.
    unsafe fn bcast_i32(p: *const u8) -> Self::V;
    /// `acc + Σ_{j<4} w.byte[j] (u8) · a[j] (i8)` per lane, `a` = 4 bytes broadcast. The
    /// caller guarantees that `w` bytes are below 64 (no i16 saturation on AVX2).
    unsafe fn dot(acc: Self::V, w: Self::V, a: *const u8) -> Self::V;
    /// Prepares Q8_0's stored bytes (q + 128) for [`Arch::dot_q8`].
    unsafe fn prep_q8(w: Self::V) -> Self::W8;
    /// `acc + Σ (q+128)·a` if `Q8_BIASED`, else `acc + Σ q·a`.
    unsafe fn dot_q8(acc: Self::V, w: Self::W8, a: *const u8) -> Self::V;
    /// `acc + w.lo16·a.lo16 + w.hi16·a.hi16` per lane (i16 × i16), `a` = 4 bytes broadcast.
    unsafe fn dot16(acc: Self::V, w: Self::V, a: *const u8) -> Self::V;
    /// `acc + a.lo16·b.lo16 + a.hi16·b.hi16` per lane (i16 × i16, both in registers).
    unsafe fn madd16(acc: Self::V, a: Self::V, b: Self::V) -> Self::V;
    /// a − b per 16-bit lane.
    unsafe fn sub16(a: Self::V, b: Self::V) -> Self::V;
    /// Adds 16 to byte i of `w` where bit i of the 4·LANES bits at `bits` is set (w's bytes
    /// are below 16).
    unsafe fn set_bit4(w: Self::V, bits: *const u8) -> Self::V;

    /// Whether [`Arch::dot`]'s products are better summed as 16-bit *partials* before they are
    /// widened: true where `dot` is two instructions (AVX2 without VNNI: `vpmaddubsw` into i16
    /// pairs, then `vpmaddwd` into i32), so that several dots share one widening. The caller
    /// bounds how many dots one partial holds so that no i16 lane overflows (see [`IAcc`]).
    const PARTIAL16: bool = false;
    /// A partial of one dot (`Σ w·a` in i16 pairs where `PARTIAL16`, else in i32 lanes).
    unsafe fn dot_part(w: Self::V, a: *const u8) -> Self::V {
        // SAFETY: forwarded.
        unsafe { Self::dot(Self::zero(), w, a) }
    }
    /// The sum of two partials.
    unsafe fn add_part(p: Self::V, q: Self::V) -> Self::V {
        // SAFETY: no memory access.
        unsafe { Self::add32(p, q) }
    }

    unsafe fn zero_f() -> Self::F;
    unsafe fn cvt(a: Self::V) -> Self::F;
    /// a·b + c.
    unsafe fn fmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// c − a·b.
    unsafe fn fnmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    unsafe fn mul(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn add_f(a: Self::F, b: Self::F) -> Self::F;
    /// The f32 at `p` in every lane.
    unsafe fn bcast_f32(p: *const u8) -> Self::F;
    /// LANES little-endian f16 / bf16 (2·LANES bytes) / i8 (LANES bytes) as f32.
    unsafe fn load_f16(p: *const u8) -> Self::F;
    unsafe fn load_bf16(p: *const u8) -> Self::F;
    unsafe fn load_i8f(p: *const u8) -> Self::F;
    /// Stores LANES f32.
    unsafe fn store(a: Self::F, p: *mut f32);
    /// Hints that the 64-byte line at `p` will be read soon. Any address: never faults.
    /// x86 asks for the line in L2, not L1 ([`super::drive::PREFETCH_BYTES`] says why).
    #[inline(always)]
    unsafe fn prefetch(_p: *const u8) {}
}

/// `A` with another tile size and chain count, for comparing tunings in one binary
/// ([`crate::gemm::variants`]). Only the x86 sets have such variants (the NEON kernels are
/// never timed, so they have nothing to choose among).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(in crate::gemm) struct Tuned<A, const NMAX: usize, const CHAINS: usize, const CHAINS_K: usize>(std::marker::PhantomData<A>);

macro_rules! delegate {
    ($( fn $name:ident $(<const $c:ident: u32>)? ($($arg:ident: $ty:ty),*) -> $ret:ty; )*) => {
        $(
            #[inline(always)]
            unsafe fn $name $(<const $c: u32>)? ($($arg: $ty),*) -> $ret {
                // SAFETY: forwarded.
                unsafe { A::$name $(::<$c>)? ($($arg),*) }
            }
        )*
    };
}

impl<A: Arch, const NMAX: usize, const CHAINS: usize, const CHAINS_K: usize> Arch for Tuned<A, NMAX, CHAINS, CHAINS_K> {
    const LANES: usize = A::LANES;
    const NMAX: usize = NMAX;
    const CHAINS: usize = CHAINS;
    const CHAINS_K: usize = CHAINS_K;
    const Q8_BIASED: bool = A::Q8_BIASED;
    const PARTIAL16: bool = A::PARTIAL16;
    type V = A::V;
    type F = A::F;
    type W8 = A::W8;
    delegate! {
        fn zero() -> A::V;
        fn splat8(x: u8) -> A::V;
        fn splat32(x: u32) -> A::V;
        fn load(p: *const u8) -> A::V;
        fn and(a: A::V, b: A::V) -> A::V;
        fn or(a: A::V, b: A::V) -> A::V;
        fn srli16<const S: u32>(a: A::V) -> A::V;
        fn srli32<const S: u32>(a: A::V) -> A::V;
        fn slli32<const S: u32>(a: A::V) -> A::V;
        fn add32(a: A::V, b: A::V) -> A::V;
        fn byte_lane(a: A::V, j: u32) -> A::V;
        fn byte_lane_x2(a: A::V, j: u32) -> A::V;
        fn bcast_i32(p: *const u8) -> A::V;
        fn dot(acc: A::V, w: A::V, a: *const u8) -> A::V;
        fn prep_q8(w: A::V) -> A::W8;
        fn dot_q8(acc: A::V, w: A::W8, a: *const u8) -> A::V;
        fn dot16(acc: A::V, w: A::V, a: *const u8) -> A::V;
        fn madd16(acc: A::V, a: A::V, b: A::V) -> A::V;
        fn sub16(a: A::V, b: A::V) -> A::V;
        fn set_bit4(w: A::V, bits: *const u8) -> A::V;
        fn dot_part(w: A::V, a: *const u8) -> A::V;
        fn add_part(p: A::V, q: A::V) -> A::V;
        fn zero_f() -> A::F;
        fn cvt(a: A::V) -> A::F;
        fn fmadd(a: A::F, b: A::F, c: A::F) -> A::F;
        fn fnmadd(a: A::F, b: A::F, c: A::F) -> A::F;
        fn mul(a: A::F, b: A::F) -> A::F;
        fn add_f(a: A::F, b: A::F) -> A::F;
        fn bcast_f32(p: *const u8) -> A::F;
        fn load_f16(p: *const u8) -> A::F;
        fn load_bf16(p: *const u8) -> A::F;
        fn load_i8f(p: *const u8) -> A::F;
        fn store(a: A::F, p: *mut f32) -> ();
        fn prefetch(p: *const u8) -> ();
    }
}
