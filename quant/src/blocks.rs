//! Block layouts, byte for byte as ggml-common.h defines them.
//!
//! Weight blocks store their f16 scales as raw little-endian bytes so that every weight
//! block has alignment 1: a row of blocks can then be viewed directly inside a memory-mapped
//! GGUF file (or any `&[u8]`) with `bytemuck::cast_slice`, whatever its offset.
//! The activation-only blocks (`BlockQ8K`) are never read from files and keep natural types.

use bytemuck::{Pod, Zeroable};
use half::f16;

/// Elements per block of the legacy formats.
pub const QK: usize = 32;
/// Elements per super-block of the K-quants.
pub const QK_K: usize = 256;
/// Bytes of the packed 6-bit scales/mins of Q4_K and Q5_K.
pub const K_SCALE_SIZE: usize = 12;

/// An f16 stored as two little-endian bytes (alignment 1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(transparent)]
pub struct F16Bytes(pub [u8; 2]);

impl F16Bytes {
    #[inline(always)]
    pub fn get(self) -> f32 {
        f16::from_bits(u16::from_le_bytes(self.0)).to_f32()
    }
    #[inline(always)]
    pub fn from_f32(v: f32) -> Self {
        F16Bytes(f16::from_f32(v).to_bits().to_le_bytes())
    }
}

/// Q4_0: value = d·(q − 8), q in 0..16. `qs[j]` holds element j (low nibble) and j+16 (high).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4_0 {
    pub d: F16Bytes,
    pub qs: [u8; QK / 2],
}

/// Q4_1: value = d·q + m.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4_1 {
    pub d: F16Bytes,
    pub m: F16Bytes,
    pub qs: [u8; QK / 2],
}

/// Q5_0: value = d·(q − 16); bit j of `qh` is bit 4 of element j.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5_0 {
    pub d: F16Bytes,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// Q5_1: value = d·q + m.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5_1 {
    pub d: F16Bytes,
    pub m: F16Bytes,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// Q8_0: value = d·q.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8_0 {
    pub d: F16Bytes,
    pub qs: [i8; QK],
}

/// Q8_1 (activations for Q4_1/Q5_1 dots): value = d·q, `s` = d·Σq.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8_1 {
    pub d: F16Bytes,
    pub s: F16Bytes,
    pub qs: [i8; QK],
}

/// Q4_K: 8 sub-blocks of 32; value = d·sc·q − dmin·m with 6-bit sc, m packed in `scales`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4K {
    pub d: F16Bytes,
    pub dmin: F16Bytes,
    pub scales: [u8; K_SCALE_SIZE],
    pub qs: [u8; QK_K / 2],
}

/// Q5_K: as Q4_K with a fifth bit per element in `qh`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5K {
    pub d: F16Bytes,
    pub dmin: F16Bytes,
    pub scales: [u8; K_SCALE_SIZE],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

/// Q6_K: 16 sub-blocks of 16; value = d·sc·(q − 32), q 6 bits split over `ql` and `qh`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: F16Bytes,
}

/// Q8_K (activations only): value = d·q; `bsums[i]` = Σ of the 16 q's of group i.
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}

impl Default for BlockQ4K {
    fn default() -> Self {
        Zeroable::zeroed()
    }
}
impl Default for BlockQ5K {
    fn default() -> Self {
        Zeroable::zeroed()
    }
}
impl Default for BlockQ6K {
    fn default() -> Self {
        Zeroable::zeroed()
    }
}
impl Default for BlockQ8K {
    fn default() -> Self {
        Zeroable::zeroed()
    }
}

// The layouts must match ggml-common.h exactly; a wrong size is a compile error.
const _: () = assert!(size_of::<BlockQ4_0>() == 18 && align_of::<BlockQ4_0>() == 1);
const _: () = assert!(size_of::<BlockQ4_1>() == 20 && align_of::<BlockQ4_1>() == 1);
const _: () = assert!(size_of::<BlockQ5_0>() == 22 && align_of::<BlockQ5_0>() == 1);
const _: () = assert!(size_of::<BlockQ5_1>() == 24 && align_of::<BlockQ5_1>() == 1);
const _: () = assert!(size_of::<BlockQ8_0>() == 34 && align_of::<BlockQ8_0>() == 1);
const _: () = assert!(size_of::<BlockQ8_1>() == 36);
const _: () = assert!(size_of::<BlockQ4K>() == 144 && align_of::<BlockQ4K>() == 1);
const _: () = assert!(size_of::<BlockQ5K>() == 176 && align_of::<BlockQ5K>() == 1);
const _: () = assert!(size_of::<BlockQ6K>() == 210 && align_of::<BlockQ6K>() == 1);
const _: () = assert!(size_of::<BlockQ8K>() == 292);

/// Block types that can be viewed in place inside a byte slice.
pub trait WeightBlock: Pod {
    /// Elements per block.
    const ELEMS: usize;
}
impl WeightBlock for BlockQ4_0 {
    const ELEMS: usize = QK;
}
impl WeightBlock for BlockQ4_1 {
    const ELEMS: usize = QK;
}
impl WeightBlock for BlockQ5_0 {
    const ELEMS: usize = QK;
}
impl WeightBlock for BlockQ5_1 {
    const ELEMS: usize = QK;
}
impl WeightBlock for BlockQ8_0 {
    const ELEMS: usize = QK;
}
impl WeightBlock for BlockQ4K {
    const ELEMS: usize = QK_K;
}
impl WeightBlock for BlockQ5K {
    const ELEMS: usize = QK_K;
}
impl WeightBlock for BlockQ6K {
    const ELEMS: usize = QK_K;
}

/// Views `bytes` as blocks. Returns `None` if the length is not a whole number of blocks.
pub fn as_blocks<B: WeightBlock>(bytes: &[u8]) -> Option<&[B]> {
    bytemuck::try_cast_slice(bytes).ok()
}

/// Mutable form of [`as_blocks`].
pub fn as_blocks_mut<B: WeightBlock>(bytes: &mut [u8]) -> Option<&mut [B]> {
    bytemuck::try_cast_slice_mut(bytes).ok()
}
