//! Packed-weight matrix multiplication: `out[t][r] = Σ_k W[r][k] · x[t][k]` for many rows at
//! once, the CPU backend's matmul for prompt processing (several tokens) and decoding (one).
//!
//! The per-row kernels in [`crate::dot`] read one weight row in its GGUF block layout at a
//! time. Here a matrix is repacked once, at load, into groups of [`GROUP`] = 16 rows whose
//! blocks are interleaved so that one 64-byte line holds 4 bytes of each of the 16 rows: one
//! AVX-512 register (two AVX2 registers, four NEON registers) then carries 4 quant bytes of
//! every row of the group, and a single `vpdpbusd` with a broadcast of 4 activation bytes
//! advances 16 row dot products at once. The block scales of the 16 rows are stored together
//! (16 f16 are converted by one `vcvtph2ps`). Several tokens share every unpacked weight
//! register (tiles of 16 rows × up to 8 tokens).
//!
//! Integer arithmetic is exact, as in [`crate::dot::scalar`]: nibbles and 6-bit levels are
//! multiplied unsigned (u8 × i8), and each format's offset (−8 for Q4_0, −16 for Q5_0, −32 for
//! Q6_K, and −128 for Q8_0 whose bytes are stored with the sign bit flipped) is subtracted
//! through per-block activation sums that [`QActs`] caches next to the activations. (The
//! 16-bit forms of two-level prompts, q6k.rs and q8_0.rs, multiply i16 × i16 and take the
//! offset off the unpacked weights instead.) The
//! activation quantization itself is the bit-exact reference ([`crate::legacy::quantize_row_q8_0`],
//! [`crate::legacy::quantize_row_q8_1`], [`crate::kquants::quantize_row_q8_k`]). Only the
//! order and grouping of float operations differ from the scalar reference; `tests.rs` states
//! the bound for every type. (Two places round an integer, a relative 2⁻²⁴ at its conversion
//! to f32, as a float operation would: two-level Q8_0, whose merged pair's sum reaches ~6.7e7,
//! above 2²⁴, and Q4_K on AVX2 without VNNI, whose scaled sub-blocks add up in i32 to ~3.1e7
//! a super-block, ~2e9 for four sub-blocks of a pair; k45.rs.)
//!
//! Memory layout of a [`PackedMatrix`]: groups one after the other, each
//! `[bulk: nb × BULK bytes][meta: nb × META bytes]` (padded to 64 bytes), where `nb` is the
//! number of blocks per row. The bulk (quants) of a block is a sequence of 64-byte *lines*; in
//! a line, bytes `4r..4r+4` belong to row `r` of the group. The meta part holds the scales,
//! row `r`'s f16 at bytes `2r..2r+2` of each 32-byte scale array. Per type (s = step):
//!
//! | type | bulk per block | meta per block |
//! |---|---|---|
//! | Q4_0 | 4 lines: line s = `qs[4s..4s+4]` (low nibbles: elements 4s.., high: 16+4s..) | d[16] |
//! | Q4_1 | as Q4_0 | d[16], m[16] |
//! | Q5_0 | 8 × u64 fifth-bit masks (index 2s+h, bit 4r+j = bit 4 of element 16h+4s+j), then as Q4_0 | d[16] |
//! | Q5_1 | as Q5_0 | d[16], m[16] |
//! | Q8_0 | 8 lines: line s = `qs[4s..4s+4] ^ 0x80` (unsigned: q + 128) | d[16] |
//! | Q4_K | 32 lines: line 8c+s = `qs[32c+4s..+4]` (low: elements 64c+4s.., high: 64c+32+4s..) | d[16], dmin[16], 3 lines of `scales[4p..4p+4]` |
//! | Q5_K | 64 × u64 masks (index 2(8c+s)+h, bit 4r+j = bit 2c+h of `qh[4s+j]`), then as Q4_K | as Q4_K |
//! | Q6_K | for half h, step s: 3 lines; byte j of line k: 6-bit level `q[128h+32k+4s+j]` in bits 0-5, bits 2k..2k+2 of `q[128h+96+4s+j]` in bits 6-7 | scales as `[sub-block][row]` i8 (256 bytes), d[16] |
//! | F16/BF16 | blocks of 16 columns: for column k, the 16 rows' values (32 bytes) | — |
//!
//! Rows past the end of the matrix (the last group) are zero and their results are dropped.

mod k45;
mod kernels;
mod portable;
mod q6k;
mod q8_0;
mod quantize;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::ops::Range;
use std::sync::OnceLock;

use crate::GgmlType;
use crate::blocks::{
    BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K, BlockQ8_0, F16Bytes, QK, QK_K,
    WeightBlock, as_blocks,
};
use crate::second_level;

/// Rows per packed group.
pub const GROUP: usize = 16;
/// Bytes of one interleaved line (4 bytes of each of the 16 rows).
const LINE: usize = 64;

/// Geometry of one packed block (all 16 rows of a group, one block of columns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    /// Columns per block.
    elems: usize,
    /// Bytes of quants (a multiple of 64).
    bulk: usize,
    /// Bytes of scales.
    meta: usize,
}

fn layout(ty: GgmlType) -> Option<Layout> {
    let l = |elems, bulk, meta| Some(Layout { elems, bulk, meta });
    match ty {
        GgmlType::Q4_0 => l(QK, 256, 32),
        GgmlType::Q4_1 => l(QK, 256, 64),
        GgmlType::Q5_0 => l(QK, 320, 32),
        GgmlType::Q5_1 => l(QK, 320, 64),
        GgmlType::Q8_0 => l(QK, 512, 32),
        GgmlType::Q4_K => l(QK_K, 2048, 256),
        GgmlType::Q5_K => l(QK_K, 2560, 256),
        GgmlType::Q6_K => l(QK_K, 3072, 288),
        GgmlType::F16 | GgmlType::BF16 => l(16, 512, 0),
        _ => None,
    }
}

/// Weight types that have packed kernels (on some CPU). Others keep the per-row kernels.
pub fn packable(ty: GgmlType) -> bool {
    layout(ty).is_some()
}

/// 64-byte aligned, zero-initialised bytes. Large buffers (packed weight matrices) are an
/// anonymous mapping aligned to 2 MiB and advised for transparent huge pages (Linux; where
/// THP is "madvise", as on Debian, nothing else gets them): decode streams every matrix once
/// per token, and with 4 KiB pages that is a TLB miss every 4 KiB.
struct AlignedBytes {
    store: Store,
    len: usize,
}

enum Store {
    Heap(Vec<Line>),
    /// The mapping and the offset of the first 2 MiB boundary in it.
    Mapped(memmap2::MmapMut, usize),
}

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; LINE]);

/// Huge page size. Buffers of two or more get their own mapping: a smaller one would hold at
/// most one whole huge page after the alignment.
const HUGE: usize = 2 << 20;

impl AlignedBytes {
    fn zeroed(len: usize) -> AlignedBytes {
        if len >= 2 * HUGE
            && let Ok(map) = memmap2::MmapMut::map_anon(len + HUGE)
        {
            let offset = (map.as_ptr() as usize).next_multiple_of(HUGE) - map.as_ptr() as usize;
            // Only whole huge pages: advising the tail too would back its last partial 2 MiB
            // with a whole one (up to 2 MiB more resident memory per matrix).
            #[cfg(target_os = "linux")]
            let _ = map.advise_range(memmap2::Advice::HugePage, offset, len / HUGE * HUGE);
            return AlignedBytes { store: Store::Mapped(map, offset), len };
        }
        AlignedBytes { store: Store::Heap(vec![Line([0; LINE]); len.div_ceil(LINE)]), len }
    }
    fn as_ptr(&self) -> *const u8 {
        match &self.store {
            Store::Heap(lines) => lines.as_ptr() as *const u8,
            // SAFETY: offset + len ≤ the mapping's length (it is len + HUGE, offset < HUGE).
            Store::Mapped(map, offset) => unsafe { map.as_ptr().add(*offset) },
        }
    }
    fn as_mut_ptr(&mut self) -> *mut u8 {
        match &mut self.store {
            Store::Heap(lines) => lines.as_mut_ptr() as *mut u8,
            // SAFETY: as in as_ptr.
            Store::Mapped(map, offset) => unsafe { map.as_mut_ptr().add(*offset) },
        }
    }
    fn as_slice(&self) -> &[u8] {
        // SAFETY: the store holds at least `len` initialised bytes (Line is plain bytes, size
        // 64, no padding; an anonymous mapping reads as zeros).
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len) }
    }
}

impl Clone for AlignedBytes {
    fn clone(&self) -> AlignedBytes {
        let mut c = AlignedBytes::zeroed(self.len);
        // SAFETY: both hold `len` bytes and do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(self.as_ptr(), c.as_mut_ptr(), self.len) };
        c
    }
}

/// A parallel for-loop the caller supplies (the runtime passes its thread pool): calls the
/// closure over disjoint ranges covering `0..n`, possibly concurrently, and returns when all
/// are done.
pub type ParFor<'a> = &'a dyn Fn(usize, &(dyn Fn(Range<usize>) + Sync));

/// Runs `f(0..n)` on the calling thread.
pub fn serial(n: usize, f: &(dyn Fn(Range<usize>) + Sync)) {
    if n > 0 {
        f(0..n)
    }
}

/// Errors from [`PackedMatrix::pack`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PackError {
    #[error("no packed layout for weight type {0}")]
    Unsupported(GgmlType),
    #[error("{ty} matrix of {rows}×{cols} does not fit {bytes} bytes (or its columns are not whole blocks)")]
    Shape { ty: GgmlType, rows: usize, cols: usize, bytes: usize },
}

/// A weight matrix repacked into interleaved groups of 16 rows (see the module docs).
#[derive(Clone)]
pub struct PackedMatrix {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    /// Blocks per row.
    nb: usize,
    layout: Layout,
    group_bytes: usize,
    data: AlignedBytes,
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedMatrix({} {}×{})", self.ty, self.rows, self.cols)
    }
}

impl PackedMatrix {
    /// Repacks `rows` rows of `cols` elements of type `ty` (GGUF block bytes, row-major).
    /// Groups are packed in parallel through `par`.
    pub fn pack(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize, par: ParFor) -> Result<PackedMatrix, PackError> {
        let layout = layout(ty).ok_or(PackError::Unsupported(ty))?;
        let shape = || PackError::Shape { ty, rows, cols, bytes: bytes.len() };
        let row_bytes = crate::row_bytes(ty, cols).ok_or_else(shape)?;
        if rows == 0
            || cols == 0
            || !cols.is_multiple_of(layout.elems)
            || row_bytes.checked_mul(rows) != Some(bytes.len())
        {
            return Err(shape());
        }
        let nb = cols / layout.elems;
        let group_bytes = (nb * (layout.bulk + layout.meta)).next_multiple_of(LINE);
        let n_groups = rows.div_ceil(GROUP);
        let mut data = AlignedBytes::zeroed(n_groups * group_bytes);
        let base = SendPtr(data.as_mut_ptr());
        par(n_groups, &|range| {
            for g in range {
                // SAFETY: each group index is handed out once, so the slices are disjoint and
                // lie inside `data` (n_groups · group_bytes bytes).
                let dst = unsafe { std::slice::from_raw_parts_mut(base.get().add(g * group_bytes), group_bytes) };
                let r0 = g * GROUP;
                let n = GROUP.min(rows - r0);
                let src = &bytes[r0 * row_bytes..(r0 + n) * row_bytes];
                pack_group(ty, nb, layout, src, row_bytes, dst);
            }
        });
        Ok(PackedMatrix { ty, rows, cols, nb, layout, group_bytes, data })
    }

    pub fn ty(&self) -> GgmlType {
        self.ty
    }
    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Number of 16-row groups.
    pub fn groups(&self) -> usize {
        self.rows.div_ceil(GROUP)
    }
    /// Bytes of packed data (weights streamed per token when decoding).
    pub fn bytes(&self) -> usize {
        self.data.len
    }
    /// The packed bytes (for tests and inspection).
    pub fn as_bytes(&self) -> &[u8] {
        self.data.as_slice()
    }

    /// Start of group `g`'s bulk (quants) and meta (scales).
    #[inline(always)]
    fn group(&self, g: usize) -> (*const u8, *const u8) {
        debug_assert!(g < self.groups());
        // SAFETY (pointer arithmetic only): g < groups, so both lie inside `data`.
        unsafe {
            let bulk = self.data.as_ptr().add(g * self.group_bytes);
            (bulk, bulk.add(self.nb * self.layout.bulk))
        }
    }
}

#[derive(Clone, Copy)]
struct SendPtr(*mut u8);
// SAFETY: used only to hand disjoint parts of one buffer to worker threads.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}
impl SendPtr {
    fn get(self) -> *mut u8 {
        self.0
    }
}

fn put_f16(meta: &mut [u8], r: usize, v: [u8; 2]) {
    meta[2 * r..2 * r + 2].copy_from_slice(&v);
}

/// Packs the rows of one group (`src` holds 1..=16 whole rows).
fn pack_group(ty: GgmlType, nb: usize, l: Layout, src: &[u8], row_bytes: usize, dst: &mut [u8]) {
    let (bulk_all, meta_all) = dst.split_at_mut(nb * l.bulk);
    for (r, row) in src.chunks_exact(row_bytes).enumerate() {
        for b in 0..nb {
            let bulk = &mut bulk_all[b * l.bulk..(b + 1) * l.bulk];
            let meta = &mut meta_all[b * l.meta..(b + 1) * l.meta];
            // Byte j of row r's 4-byte lane in line `line`.
            let lane = |line: usize, j: usize| LINE * line + 4 * r + j;
            match ty {
                GgmlType::Q4_0 => {
                    let x: &BlockQ4_0 = &blocks::<BlockQ4_0>(row)[b];
                    put_f16(meta, r, x.d.0);
                    for s in 0..4 {
                        for j in 0..4 {
                            bulk[lane(s, j)] = x.qs[4 * s + j];
                        }
                    }
                }
                GgmlType::Q4_1 => {
                    let x: &BlockQ4_1 = &blocks::<BlockQ4_1>(row)[b];
                    put_f16(meta, r, x.d.0);
                    put_f16(&mut meta[32..], r, x.m.0);
                    for s in 0..4 {
                        for j in 0..4 {
                            bulk[lane(s, j)] = x.qs[4 * s + j];
                        }
                    }
                }
                GgmlType::Q5_0 | GgmlType::Q5_1 => {
                    let (qh, qs) = if ty == GgmlType::Q5_0 {
                        let x: &BlockQ5_0 = &blocks::<BlockQ5_0>(row)[b];
                        put_f16(meta, r, x.d.0);
                        (u32::from_le_bytes(x.qh), x.qs)
                    } else {
                        let x: &BlockQ5_1 = &blocks::<BlockQ5_1>(row)[b];
                        put_f16(meta, r, x.d.0);
                        put_f16(&mut meta[32..], r, x.m.0);
                        (u32::from_le_bytes(x.qh), x.qs)
                    };
                    for s in 0..4 {
                        for h in 0..2 {
                            for j in 0..4 {
                                set_mask_bit(bulk, 2 * s + h, 4 * r + j, (qh >> (16 * h + 4 * s + j)) & 1 != 0);
                            }
                        }
                        for j in 0..4 {
                            bulk[LINE + lane(s, j)] = qs[4 * s + j];
                        }
                    }
                }
                GgmlType::Q8_0 => {
                    let x: &BlockQ8_0 = &blocks::<BlockQ8_0>(row)[b];
                    put_f16(meta, r, x.d.0);
                    for s in 0..8 {
                        for j in 0..4 {
                            bulk[lane(s, j)] = (x.qs[4 * s + j] as u8) ^ 0x80;
                        }
                    }
                }
                GgmlType::Q4_K | GgmlType::Q5_K => {
                    let (d, dmin, scales, qs, qh) = if ty == GgmlType::Q4_K {
                        let x: &BlockQ4K = &blocks::<BlockQ4K>(row)[b];
                        (x.d, x.dmin, x.scales, x.qs, None)
                    } else {
                        let x: &BlockQ5K = &blocks::<BlockQ5K>(row)[b];
                        (x.d, x.dmin, x.scales, x.qs, Some(x.qh))
                    };
                    put_f16(meta, r, d.0);
                    put_f16(&mut meta[32..], r, dmin.0);
                    for p in 0..3 {
                        for j in 0..4 {
                            meta[64 + lane(p, j)] = scales[4 * p + j];
                        }
                    }
                    let qs_at = if let Some(qh) = qh {
                        for c in 0..4 {
                            for s in 0..8 {
                                for h in 0..2 {
                                    for j in 0..4 {
                                        let bit = (qh[4 * s + j] >> (2 * c + h)) & 1 != 0;
                                        set_mask_bit(bulk, 2 * (8 * c + s) + h, 4 * r + j, bit);
                                    }
                                }
                            }
                        }
                        512
                    } else {
                        0
                    };
                    for c in 0..4 {
                        for s in 0..8 {
                            for j in 0..4 {
                                bulk[qs_at + lane(8 * c + s, j)] = qs[32 * c + 4 * s + j];
                            }
                        }
                    }
                }
                GgmlType::Q6_K => {
                    let x: &BlockQ6K = &blocks::<BlockQ6K>(row)[b];
                    for j in 0..16 {
                        meta[16 * j + r] = x.scales[j] as u8;
                    }
                    put_f16(&mut meta[256..], r, x.d.0);
                    // The four 6-bit levels of quarter k = 0..4 of half h, element l = 0..32.
                    let level = |h: usize, k: usize, l: usize| {
                        let low = x.ql[64 * h + 32 * (k & 1) + l] >> (4 * (k >> 1)) & 0x0f;
                        low | (x.qh[32 * h + l] >> (2 * k) & 3) << 4
                    };
                    // Three whole levels a byte, the fourth spread over their spare bits: the
                    // kernels take the first three with one AND each (ggml's split into
                    // nibbles and 2-bit pieces cost 4-5 operations a register).
                    for h in 0..2 {
                        for s in 0..8 {
                            let line = 3 * (8 * h + s);
                            for j in 0..4 {
                                let l = 4 * s + j;
                                let fourth = level(h, 3, l);
                                for k in 0..3 {
                                    bulk[lane(line + k, j)] = level(h, k, l) | (fourth >> (2 * k) & 3) << 6;
                                }
                            }
                        }
                    }
                }
                GgmlType::F16 | GgmlType::BF16 => {
                    // Block b: columns 16b..16b+16; column k's 16 values are 32 bytes.
                    for k in 0..16 {
                        let at = 2 * (16 * b + k);
                        bulk[32 * k + 2 * r..32 * k + 2 * r + 2].copy_from_slice(&row[at..at + 2]);
                    }
                }
                _ => unreachable!("layout() admits only the types above"),
            }
        }
    }
}

fn set_mask_bit(bulk: &mut [u8], word: usize, bit: usize, on: bool) {
    if on {
        bulk[8 * word + bit / 8] |= 1 << (bit % 8);
    }
}

fn blocks<B: WeightBlock>(row: &[u8]) -> &[B] {
    as_blocks(row).expect("rows are whole blocks (checked by pack)")
}

// ---------------------------------------------------------------------------------------------
// Activations
// ---------------------------------------------------------------------------------------------

/// The activation format a packed kernel reads (ggml's `vec_dot_type` of the weight type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActKind {
    /// For Q4_0, Q5_0, Q8_0.
    Q8_0,
    /// For Q4_1, Q5_1.
    Q8_1,
    /// For the K-quants.
    Q8K,
    /// Plain f32, for F16/BF16 weights.
    F32,
}

impl ActKind {
    pub fn for_weight(ty: GgmlType) -> Option<ActKind> {
        Some(match ty {
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => ActKind::Q8_0,
            GgmlType::Q4_1 | GgmlType::Q5_1 => ActKind::Q8_1,
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => ActKind::Q8K,
            GgmlType::F16 | GgmlType::BF16 => ActKind::F32,
            _ => return None,
        })
    }

    fn block(self) -> usize {
        match self {
            ActKind::Q8_0 | ActKind::Q8_1 => QK,
            ActKind::Q8K => QK_K,
            ActKind::F32 => 16,
        }
    }
}

/// Activation rows quantized for the packed kernels: the reference quantization's bytes and
/// scales, plus cached per-block sums. Token t's data is one 64-byte aligned segment:
///
/// * Q8_0: `qs[cols]`, `d[nb]` (f32), `−8·Σq`, `−16·Σq`, `−128·Σq` (`[i32; nb]` each);
/// * Q8_1: `qs[cols]`, `d[nb]`, `s[nb]` (f32, Q8_1's f16 `d·Σq`);
/// * Q8K: `qs[cols]`, `d[nb]`, then per super-block 4 i32 of i16 pairs of sub-block sums
///   (Σ of 32: (b0,b2), (b1,b3), (b4,b6), (b5,b7)), then 16 i32 `−32·bsums[j]`;
/// * Q8_0 and Q8K, second row of a two-level pair of at least [`MERGED_FROM_TOKENS`]
///   tokens: then also (64-byte aligned) room for the pair's *merged* activations
///   `128·q1 + q2` as i16, each 4 elements in the order (a0, a2, a1, a3), for the kernels'
///   16-bit forms (Q6_K; Q8_0 on plain AVX2), written by [`QActs::quantize_two_level`] or
///   [`QActs::add_merged`];
/// * F32: the values.
#[derive(Clone)]
pub struct QActs {
    kind: ActKind,
    /// Two-level: row 2t is token t's first level, row 2t+1 its second, whose step is
    /// exactly 1/[`second_level::RATIO`] of the first's (kernels may merge the pair).
    pairs: bool,
    n_tok: usize,
    cols: usize,
    nb: usize,
    stride: usize,
    d_off: usize,
    x_off: usize,
    /// Offset of the room for the merged i16 activations in a pair's second row (Q8_0 and Q8K
    /// pairs of at least [`MERGED_FROM_TOKENS`] tokens; else 0).
    merged_off: usize,
    /// Whether the merged activations are written (see [`QActs::add_merged`]).
    merged_written: bool,
    buf: AlignedBytes,
}

impl std::fmt::Debug for QActs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QActs({:?} {}×{})", self.kind, self.n_tok, self.cols)
    }
}

impl QActs {
    /// An empty set of activations of `kind`.
    pub fn new(kind: ActKind) -> QActs {
        QActs {
            kind,
            pairs: false,
            n_tok: 0,
            cols: 0,
            nb: 0,
            stride: 0,
            d_off: 0,
            x_off: 0,
            merged_off: 0,
            merged_written: false,
            buf: AlignedBytes::zeroed(0),
        }
    }

    pub fn kind(&self) -> ActKind {
        self.kind
    }
    /// Activation rows (two-level: two per token).
    pub fn n_tok(&self) -> usize {
        self.n_tok
    }
    /// Tokens, i.e. rows of a product's output.
    pub fn tokens(&self) -> usize {
        if self.pairs { self.n_tok / 2 } else { self.n_tok }
    }
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Quantizes `x` (`n_tok` rows of `cols`), reusing this allocation; tokens are spread
    /// over `par`. `cols` must be a multiple of the format's block (32, 256, or 16 for F32).
    pub fn quantize(&mut self, x: &[f32], n_tok: usize, cols: usize, par: ParFor) {
        self.fill(x, n_tok, cols, false, par);
    }

    /// Two-level quantization: 2·`n_tok` rows, row 2t holding token t exactly as
    /// [`QActs::quantize`] does and row 2t+1 that row's rounding error (`x − d·q` per block)
    /// on the grid d/128 ([`crate::second_level`]), with scale d/128. Summing a matmul's
    /// outputs for the two rows gives the product with the activations known to ~1/(2·127·128)
    /// of each block's absmax instead of ~1/254: the integer kernels stay, the activation error
    /// all but vanishes. A product's output has one row per token, the pair's sum.
    /// (F32: the second row is zeros.)
    ///
    /// Batches of at least [`MERGED_FROM_TOKENS`] tokens also get the pairs' merged i16
    /// activations, which some kernels read ([`GemmKernels::reads_merged`]).
    pub fn quantize_two_level(&mut self, x: &[f32], n_tok: usize, cols: usize, par: ParFor) {
        self.fill(x, n_tok, cols, true, par);
        self.add_merged(par);
    }

    /// [`QActs::quantize_two_level`] without the merged activations, which
    /// [`QActs::add_merged`] can add when a kernel that reads them comes: most kernels do not
    /// (writing them is a pass over 2 bytes an element), and the kernels that do fall back to
    /// their 8-bit forms without them, with the same results.
    pub fn quantize_two_level_unmerged(&mut self, x: &[f32], n_tok: usize, cols: usize, par: ParFor) {
        self.fill(x, n_tok, cols, true, par);
    }

    /// Writes the pairs' merged activations if this batch has room for them
    /// ([`MERGED_FROM_TOKENS`]) and they are not written yet.
    pub fn add_merged(&mut self, par: ParFor) {
        if self.merged_off == 0 || self.merged_written {
            return;
        }
        let (base, stride, cols, off) = (SendPtr(self.buf.as_mut_ptr()), self.stride, self.cols, self.merged_off);
        par(self.n_tok / 2, &|range| {
            for p in range {
                // SAFETY: pair p's rows lie inside `buf`; only this thread touches them, and
                // the merged bytes (after `off`) do not overlap the quants read (before `cols`).
                unsafe {
                    let q1 = std::slice::from_raw_parts(base.get().add(2 * p * stride) as *const i8, cols);
                    let lo = base.get().add((2 * p + 1) * stride);
                    let q2 = std::slice::from_raw_parts(lo as *const i8, cols);
                    quantize::merged(std::slice::from_raw_parts_mut(lo.add(off), 2 * cols), q1, q2);
                }
            }
        });
        self.merged_written = true;
    }

    fn fill(&mut self, x: &[f32], n_tok: usize, cols: usize, two_level: bool, par: ParFor) {
        let bs = self.kind.block();
        assert!(cols.is_multiple_of(bs), "{:?} activations need a multiple of {bs} columns, got {cols}", self.kind);
        assert_eq!(x.len(), n_tok * cols, "activation buffer is not n_tok × cols");
        let nb = cols / bs;
        let (d_off, x_off, end) = match self.kind {
            ActKind::Q8_0 => (cols, cols + 4 * nb, cols + 16 * nb),
            ActKind::Q8_1 => (cols, cols + 4 * nb, cols + 8 * nb),
            ActKind::Q8K => (cols, cols + 4 * nb, cols + 4 * nb + 80 * nb),
            ActKind::F32 => (0, 0, 4 * cols),
        };
        let (merged_off, end) =
            if two_level && n_tok >= MERGED_FROM_TOKENS && matches!(self.kind, ActKind::Q8_0 | ActKind::Q8K) {
                let at = end.next_multiple_of(LINE);
                (at, at + 2 * cols)
            } else {
                (0, end)
            };
        let stride = end.next_multiple_of(LINE);
        let rows = if two_level { 2 * n_tok } else { n_tok };
        if self.buf.len < rows * stride {
            self.buf = AlignedBytes::zeroed(rows * stride);
        }
        (self.n_tok, self.cols, self.nb, self.stride, self.d_off, self.x_off) = (rows, cols, nb, stride, d_off, x_off);
        self.merged_off = merged_off;
        self.merged_written = false;
        self.pairs = two_level;
        let base = SendPtr(self.buf.as_mut_ptr());
        let this = &*self;
        // SAFETY: row segments are disjoint (each token's rows are written by one thread)
        // and lie inside `buf`.
        let seg = |row: usize| unsafe { std::slice::from_raw_parts_mut(base.get().add(row * stride), stride) };
        par(n_tok, &|range| {
            for t in range {
                let xt = &x[t * cols..(t + 1) * cols];
                if two_level {
                    let hi = seg(2 * t);
                    this.quantize_token(xt, hi);
                    this.second_level(xt, hi, seg(2 * t + 1));
                } else {
                    this.quantize_token(xt, seg(t));
                }
            }
        });
    }

    /// Quantizes one token into `seg`.
    fn quantize_token(&self, x: &[f32], seg: &mut [u8]) {
        let (cols, nb) = (self.cols, self.nb);
        let (qs, rest) = seg.split_at_mut(cols);
        let (d, extra) = rest.split_at_mut(self.x_off - self.d_off);
        match self.kind {
            ActKind::Q8_0 | ActKind::Q8_1 => {
                for b in 0..nb {
                    let xb: &[f32; QK] = x[QK * b..QK * (b + 1)].try_into().expect("32 values");
                    let y = quantize::q8_block(xb);
                    qs[QK * b..QK * (b + 1)].copy_from_slice(bytemuck::cast_slice(&y.qs));
                    put_f32(d, b, y.d.get());
                    if self.kind == ActKind::Q8_0 {
                        put_q8_0_sums(extra, nb, b, y.sum);
                    } else {
                        put_f32(extra, b, y.s.get());
                    }
                }
            }
            ActKind::Q8K => {
                for b in 0..nb {
                    let xb: &[f32; QK_K] = x[QK_K * b..QK_K * (b + 1)].try_into().expect("256 values");
                    let y = quantize::q8_k_block(xb);
                    qs[QK_K * b..QK_K * (b + 1)].copy_from_slice(bytemuck::cast_slice(&y.qs));
                    put_f32(d, b, y.d);
                    put_q8k_sums(&mut extra[80 * b..80 * (b + 1)], &y.bsums);
                }
            }
            ActKind::F32 => {
                for (i, &v) in x.iter().enumerate() {
                    put_f32(seg, i, v);
                }
            }
        }
    }

    /// Writes into `lo` the second level of `x`, whose first level is `hi` (a segment written
    /// by [`QActs::quantize_token`]): the quants of [`crate::second_level`], scale d/128 (exact
    /// in f32), and the same cached sums as a first level's.
    fn second_level(&self, x: &[f32], hi: &[u8], lo: &mut [u8]) {
        let (cols, nb) = (self.cols, self.nb);
        if self.kind == ActKind::F32 {
            lo[..4 * cols].fill(0);
            return;
        }
        let (q1, hi_rest) = hi.split_at(cols);
        let q1: &[i8] = bytemuck::cast_slice(q1);
        let (qs, rest) = lo.split_at_mut(cols);
        let qs: &mut [i8] = bytemuck::cast_slice_mut(qs);
        let (d, extra) = rest.split_at_mut(self.x_off - self.d_off);
        let bs = self.kind.block();
        for b in 0..nb {
            let e = b * bs..(b + 1) * bs;
            let d1 = f32::from_le_bytes(hi_rest[4 * b..4 * b + 4].try_into().expect("4 bytes"));
            let sum = second_level::quantize_block(&x[e.clone()], d1, &q1[e.clone()], &mut qs[e.clone()]);
            let d2 = d1 / second_level::RATIO;
            put_f32(d, b, d2);
            match self.kind {
                ActKind::Q8_0 => put_q8_0_sums(extra, nb, b, sum),
                // As the per-row path has it: Q8_1's f16 s = d1·Σq2 on the first level's
                // scale, divided by 128 (ActRow::second_level_into).
                ActKind::Q8_1 => put_f32(extra, b, F16Bytes::from_f32(d1 * sum as f32).get() / second_level::RATIO),
                _ => {
                    let bsums = quantize::q8_k_bsums(qs[e.clone()].try_into().expect("256 quants"));
                    put_q8k_sums(&mut extra[80 * b..80 * (b + 1)], &bsums);
                }
            }
        }
    }

    /// Whether the pairs' merged i16 activations are written (see [`MERGED_FROM_TOKENS`],
    /// [`QActs::add_merged`]).
    #[inline(always)]
    fn has_merged(&self) -> bool {
        self.merged_written
    }

    /// Pair row `t` (a second level)'s merged i16 activations (Q8_0 and Q8K pairs).
    #[inline(always)]
    fn merged(&self, t: usize) -> *const u8 {
        debug_assert!(self.pairs && self.merged_written && t % 2 == 1);
        self.tok(t).wrapping_add(self.merged_off)
    }

    /// Start of token t's segment.
    #[inline(always)]
    fn tok(&self, t: usize) -> *const u8 {
        debug_assert!(t < self.n_tok);
        // SAFETY (pointer arithmetic only): t < n_tok, inside `buf`.
        unsafe { self.buf.as_ptr().add(t * self.stride) }
    }
}

/// Two-level activations of this many tokens and more have room for the pairs' merged i16
/// values, for the kernels' 16-bit forms, written by [`QActs::quantize_two_level`] or
/// [`QActs::add_merged`]. Fewer (decoding) do without: writing them was 1-1.5% of a 1.1B
/// decode (cold lines, on the one thread that quantizes a token), and the kernels take their
/// 8-bit forms instead, which give the same bits.
const MERGED_FROM_TOKENS: usize = 4;

/// Stores `v` as the i-th little-endian 4-byte value of `dst`.
fn put_i32(dst: &mut [u8], i: usize, v: i32) {
    dst[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_f32(dst: &mut [u8], i: usize, v: f32) {
    dst[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
}

/// A Q8_0 block's cached offsets (see [`QActs`]): −8·Σq, −16·Σq, −128·Σq of block b, in the
/// three arrays of nb values after the scales.
fn put_q8_0_sums(extra: &mut [u8], nb: usize, b: usize, sum: i32) {
    put_i32(extra, b, -8 * sum);
    put_i32(extra, nb + b, -16 * sum);
    put_i32(extra, 2 * nb + b, -128 * sum);
}

/// A Q8_K block's cached sums (see [`QActs`]): the four i16 pairs of 32-sub-block sums, then
/// `−32·bsums[j]` for its 16 sub-blocks of 16.
fn put_q8k_sums(e: &mut [u8], bsums: &[i16; QK_K / 16]) {
    let bs = |j: usize| bsums[2 * j] as i32 + bsums[2 * j + 1] as i32;
    for (i, (lo, hi)) in [(0, 2), (1, 3), (4, 6), (5, 7)].into_iter().enumerate() {
        let pair = (bs(lo) as u16 as u32) | ((bs(hi) as u16 as u32) << 16);
        put_i32(e, i, pair as i32);
    }
    for (j, &b) in bsums.iter().enumerate() {
        put_i32(e, 4 + j, -32 * b as i32);
    }
}

// ---------------------------------------------------------------------------------------------
// Kernel sets
// ---------------------------------------------------------------------------------------------

/// Computes the rows of `groups` for every token of `acts`: `out[t·ld + r]`.
type GemmFn = unsafe fn(&PackedMatrix, &QActs, Range<usize>, *mut f32, usize);

/// One set of packed kernels (one instruction set), by weight type.
#[derive(Clone, Copy)]
pub struct GemmKernels {
    /// "avx512vnni", "avx2+avxvnni", "avx2" or "portable".
    pub name: &'static str,
    /// Whether this set's kernel for a weight type reads two-level pairs' merged activations.
    reads_merged: fn(GgmlType) -> bool,
    q4_0: GemmFn,
    q4_1: GemmFn,
    q5_0: GemmFn,
    q5_1: GemmFn,
    q8_0: GemmFn,
    q4_k: GemmFn,
    q5_k: GemmFn,
    q6_k: GemmFn,
    f16: GemmFn,
    bf16: GemmFn,
    /// Whether this set is worth using over the per-row kernels (the portable one is a
    /// reference, not a speed-up).
    pub fast: bool,
}

impl std::fmt::Debug for GemmKernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GemmKernels({})", self.name)
    }
}

/// Errors from [`GemmKernels::gemm`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GemmError {
    #[error("activations are {got:?}, {ty} weights need {want:?}")]
    WrongActivation { ty: GgmlType, got: ActKind, want: ActKind },
    #[error("activation rows have {got} columns, the weight rows {want}")]
    Width { got: usize, want: usize },
    #[error("groups {0:?} outside the matrix")]
    Groups(Range<usize>),
    #[error("output holds {got} values, {want} needed")]
    Output { got: usize, want: usize },
}

impl GemmKernels {
    fn get(&self, ty: GgmlType) -> GemmFn {
        match ty {
            GgmlType::Q4_0 => self.q4_0,
            GgmlType::Q4_1 => self.q4_1,
            GgmlType::Q5_0 => self.q5_0,
            GgmlType::Q5_1 => self.q5_1,
            GgmlType::Q8_0 => self.q8_0,
            GgmlType::Q4_K => self.q4_k,
            GgmlType::Q5_K => self.q5_k,
            GgmlType::Q6_K => self.q6_k,
            GgmlType::F16 => self.f16,
            GgmlType::BF16 => self.bf16,
            _ => unreachable!("a PackedMatrix has a packable type"),
        }
    }

    /// Whether this set's kernel for `ty` reads the merged activations of two-level batches
    /// (see [`QActs::add_merged`]); without them it takes a slower form with the same results.
    pub fn reads_merged(&self, ty: GgmlType) -> bool {
        (self.reads_merged)(ty)
    }

    fn check(&self, w: &PackedMatrix, acts: &QActs, groups: &Range<usize>) -> Result<(), GemmError> {
        let want = ActKind::for_weight(w.ty).expect("packable types have an activation kind");
        if acts.kind != want {
            return Err(GemmError::WrongActivation { ty: w.ty, got: acts.kind, want });
        }
        if acts.cols != w.cols {
            return Err(GemmError::Width { got: acts.cols, want: w.cols });
        }
        if groups.start > groups.end || groups.end > w.groups() {
            return Err(GemmError::Groups(groups.clone()));
        }
        Ok(())
    }

    /// `out[t·rows + r] = Σ_k W[r][k]·x[t][k]` for all rows and tokens, on this thread
    /// (two-level activations: one output row per token, the sum of its pair's products).
    pub fn gemm(&self, w: &PackedMatrix, acts: &QActs, out: &mut [f32]) -> Result<(), GemmError> {
        self.check(w, acts, &(0..w.groups()))?;
        let want = acts.tokens() * w.rows;
        if out.len() < want {
            return Err(GemmError::Output { got: out.len(), want });
        }
        // SAFETY: checked shapes; `out` holds tokens()·rows values and is borrowed mutably.
        unsafe { (self.get(w.ty))(w, acts, 0..w.groups(), out.as_mut_ptr(), w.rows) };
        Ok(())
    }

    /// The rows of `groups` (rows 16·g.., clipped to the matrix) for every token:
    /// `out[t·ld + r]` (as [`GemmKernels::gemm`]). For splitting one matmul over threads.
    ///
    /// # Safety
    /// `out` must be valid for writes of `out[t·ld + r]` for every token t < `acts.tokens()`
    /// and every row r of `groups`, and no other thread may access those elements during
    /// the call. `ld` must be at least `w.rows()`.
    pub unsafe fn gemm_groups(
        &self,
        w: &PackedMatrix,
        acts: &QActs,
        groups: Range<usize>,
        out: *mut f32,
        ld: usize,
    ) -> Result<(), GemmError> {
        self.check(w, acts, &groups)?;
        assert!(ld >= w.rows, "output stride {ld} < rows {}", w.rows);
        // SAFETY: shapes checked; the caller guarantees the output region.
        unsafe { (self.get(w.ty))(w, acts, groups, out, ld) };
        Ok(())
    }
}

static CHOSEN_GEMM: OnceLock<Option<GemmKernels>> = OnceLock::new();

/// The packed kernel set of this process: the fastest this CPU has if any beats the
/// per-row kernels, or what [`choose_gemm_kernels`] chose (decided once, at first use).
pub fn gemm_kernels() -> Option<&'static GemmKernels> {
    CHOSEN_GEMM.get_or_init(|| available().into_iter().find(|k| k.fast)).as_ref()
}

/// A program's choice of packed kernels for the rest of the process: `"off"` (the per-row
/// kernels only) or a set's name (`"avx512vnni"`, `"avx2"`, `"portable"`; [`available`] lists
/// this CPU's). Refused for a name this CPU cannot run, and once kernels were used.
pub fn choose_gemm_kernels(name: &str) -> Result<(), String> {
    let all = available();
    let chosen = match name {
        "off" => None,
        _ => Some(all.iter().find(|k| k.name == name).copied().ok_or_else(|| {
            let names: Vec<&str> = all.iter().map(|k| k.name).collect();
            format!("no packed matmul kernels named {name:?} on this CPU (it has: off, {})", names.join(", "))
        })?),
    };
    let want = chosen.map(|k| k.name);
    CHOSEN_GEMM.set(chosen).or_else(|_| {
        if gemm_kernels().map(|k| k.name) == want { Ok(()) } else { Err("the packed matmul kernels were chosen before".into()) }
    })
}

/// Alternative tunings (tile size, accumulation chains) of the sets this CPU can run, for
/// benchmarks and tests; never picked by [`gemm_kernels`].
pub fn variants() -> Vec<GemmKernels> {
    #[cfg(target_arch = "x86_64")]
    return x86::variants();
    #[cfg(not(target_arch = "x86_64"))]
    Vec::new()
}

/// Every packed kernel set this CPU can run, fastest first (the portable one last).
pub fn available() -> Vec<GemmKernels> {
    let mut v = Vec::new();
    #[cfg(target_arch = "x86_64")]
    v.extend(x86::available());
    v.push(portable::KERNELS);
    v
}
