//! ggml tensor type ids and their block geometry.
//!
//! The table covers every type id a GGUF file may carry (as of ggml's `GGML_TYPE_COUNT`
//! known to gguf-py 0.19), so that `duet info` can describe any file. Only a subset can be
//! quantized, dequantized and multiplied here; see [`GgmlType::is_supported`].

use std::fmt;

/// A ggml tensor element type. The discriminant is the on-disk id.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
    NVFP4 = 40,
    Q1_0 = 41,
}

/// A type id that ggml does not define (or that was removed from the format).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownGgmlType(pub u32);

impl fmt::Display for UnknownGgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown ggml type id {}", self.0)
    }
}

impl std::error::Error for UnknownGgmlType {}

use GgmlType::*;

/// (type, name, elements per block, bytes per block)
const TABLE: &[(GgmlType, &str, usize, usize)] = &[
    (F32, "F32", 1, 4),
    (F16, "F16", 1, 2),
    (Q4_0, "Q4_0", 32, 18),
    (Q4_1, "Q4_1", 32, 20),
    (Q5_0, "Q5_0", 32, 22),
    (Q5_1, "Q5_1", 32, 24),
    (Q8_0, "Q8_0", 32, 34),
    // ggml-common.h: 2·f16 + 32 bytes. (gguf-py 0.19 says 40, a leftover of the old f32 layout.)
    (Q8_1, "Q8_1", 32, 36),
    (Q2_K, "Q2_K", 256, 84),
    (Q3_K, "Q3_K", 256, 110),
    (Q4_K, "Q4_K", 256, 144),
    (Q5_K, "Q5_K", 256, 176),
    (Q6_K, "Q6_K", 256, 210),
    (Q8_K, "Q8_K", 256, 292),
    (IQ2_XXS, "IQ2_XXS", 256, 66),
    (IQ2_XS, "IQ2_XS", 256, 74),
    (IQ3_XXS, "IQ3_XXS", 256, 98),
    (IQ1_S, "IQ1_S", 256, 50),
    (IQ4_NL, "IQ4_NL", 32, 18),
    (IQ3_S, "IQ3_S", 256, 110),
    (IQ2_S, "IQ2_S", 256, 82),
    (IQ4_XS, "IQ4_XS", 256, 136),
    (I8, "I8", 1, 1),
    (I16, "I16", 1, 2),
    (I32, "I32", 1, 4),
    (I64, "I64", 1, 8),
    (F64, "F64", 1, 8),
    (IQ1_M, "IQ1_M", 256, 56),
    (BF16, "BF16", 1, 2),
    (TQ1_0, "TQ1_0", 256, 54),
    (TQ2_0, "TQ2_0", 256, 66),
    (MXFP4, "MXFP4", 32, 17),
    (NVFP4, "NVFP4", 64, 36),
    (Q1_0, "Q1_0", 128, 18),
];

impl GgmlType {
    /// Every type this table knows, in id order.
    pub fn all() -> impl Iterator<Item = GgmlType> {
        TABLE.iter().map(|row| row.0)
    }

    pub fn from_id(id: u32) -> Result<GgmlType, UnknownGgmlType> {
        TABLE.iter().find(|row| row.0 as u32 == id).map(|row| row.0).ok_or(UnknownGgmlType(id))
    }

    /// Parses a name as gguf-py and llama.cpp print it ("Q4_K", "q4_k", "bf16").
    pub fn from_name(name: &str) -> Option<GgmlType> {
        TABLE.iter().find(|row| row.1.eq_ignore_ascii_case(name)).map(|row| row.0)
    }

    pub fn id(self) -> u32 {
        self as u32
    }

    fn row(self) -> &'static (GgmlType, &'static str, usize, usize) {
        // The table has a row for every variant (checked by a test), so this cannot fail.
        TABLE.iter().find(|row| row.0 == self).expect("every GgmlType has a table row")
    }

    pub fn name(self) -> &'static str {
        self.row().1
    }

    /// Elements per block (1 for plain float/int types).
    pub fn block_size(self) -> usize {
        self.row().2
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        self.row().3
    }

    /// True for block-quantized types.
    pub fn is_quantized(self) -> bool {
        !matches!(self, F32 | F16 | BF16 | I8 | I16 | I32 | I64 | F64)
    }

    /// Every weight type duet both writes and multiplies: the supported types but F32 and
    /// the activation-only Q8_K. The kernel, GPU and oracle tests sweep these.
    pub const WEIGHT_TYPES: [GgmlType; 10] = [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16];

    /// Types this crate can quantize to, dequantize from and multiply with.
    pub fn is_supported(self) -> bool {
        matches!(self, F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4_K | Q5_K | Q6_K | Q8_K)
    }

    /// Bytes taken by `n` elements, or `None` if `n` is not a whole number of blocks or
    /// the size overflows.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n.is_multiple_of(bs) {
            return None;
        }
        (n / bs).checked_mul(self.type_size() as u64)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for t in GgmlType::all() {
            assert!(seen.insert(t.id()), "duplicate id {}", t.id());
            assert_eq!(GgmlType::from_id(t.id()), Ok(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
            assert_eq!(GgmlType::from_name(&t.name().to_lowercase()), Some(t));
        }
        // Removed ids (Q4_2, Q4_3, the repacked Q4_0_x_y) must be rejected.
        for removed in [4, 5, 31, 32, 33, 36, 37, 38, 43, u32::MAX] {
            assert_eq!(GgmlType::from_id(removed), Err(UnknownGgmlType(removed)));
        }
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(GgmlType::Q4_0.bytes_for(64), Some(36));
        assert_eq!(GgmlType::Q4_0.bytes_for(33), None);
        assert_eq!(GgmlType::Q6_K.bytes_for(512), Some(420));
        assert_eq!(GgmlType::F32.bytes_for(u64::MAX), None);
    }
}
