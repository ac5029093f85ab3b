//! Repacking a weight matrix into interleaved groups of [`GROUP`] rows ([`PackedMatrix`];
//! the layout per type is in the module docs of `gemm`).

use std::ops::Range;

use crate::GgmlType;
use crate::blocks::{
    BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K, BlockQ8_0, QK, QK_K,
    WeightBlock, as_blocks,
};

/// Rows per packed group.
pub const GROUP: usize = 16;
/// Bytes of one interleaved line (4 bytes of each of the 16 rows).
pub(super) const LINE: usize = 64;

/// Geometry of one packed block (all 16 rows of a group, one block of columns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Layout {
    /// Columns per block.
    pub(super) elems: usize,
    /// Bytes of quants (a multiple of 64).
    pub(super) bulk: usize,
    /// Bytes of scales.
    pub(super) meta: usize,
}

pub(super) fn layout(ty: GgmlType) -> Option<Layout> {
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
pub(super) struct AlignedBytes {
    pub(super) store: Store,
    pub(super) len: usize,
}

pub(super) enum Store {
    Heap(Vec<Line>),
    /// The mapping and the offset of the first 2 MiB boundary in it.
    Mapped(memmap2::MmapMut, usize),
}

#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct Line(pub(super) [u8; LINE]);

/// Huge page size. Buffers of two or more get their own mapping: a smaller one would hold at
/// most one whole huge page after the alignment.
pub(super) const HUGE: usize = 2 << 20;

impl AlignedBytes {
    pub(super) fn zeroed(len: usize) -> AlignedBytes {
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
    pub(super) fn as_ptr(&self) -> *const u8 {
        match &self.store {
            Store::Heap(lines) => lines.as_ptr() as *const u8,
            // SAFETY: offset + len ≤ the mapping's length (it is len + HUGE, offset < HUGE).
            Store::Mapped(map, offset) => unsafe { map.as_ptr().add(*offset) },
        }
    }
    pub(super) fn as_mut_ptr(&mut self) -> *mut u8 {
        match &mut self.store {
            Store::Heap(lines) => lines.as_mut_ptr() as *mut u8,
            // SAFETY: as in as_ptr.
            Store::Mapped(map, offset) => unsafe { map.as_mut_ptr().add(*offset) },
        }
    }
    pub(super) fn as_slice(&self) -> &[u8] {
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
    pub(super) ty: GgmlType,
    pub(super) rows: usize,
    pub(super) cols: usize,
    /// Blocks per row.
    pub(super) nb: usize,
    pub(super) layout: Layout,
    pub(super) group_bytes: usize,
    pub(super) data: AlignedBytes,
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
    pub(super) fn group(&self, g: usize) -> (*const u8, *const u8) {
        debug_assert!(g < self.groups());
        // SAFETY (pointer arithmetic only): g < groups, so both lie inside `data`.
        unsafe {
            let bulk = self.data.as_ptr().add(g * self.group_bytes);
            (bulk, bulk.add(self.nb * self.layout.bulk))
        }
    }
}

#[derive(Clone, Copy)]
pub(super) struct SendPtr(pub(super) *mut u8);
// SAFETY: used only to hand disjoint parts of one buffer to worker threads.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}
impl SendPtr {
    pub(super) fn get(self) -> *mut u8 {
        self.0
    }
}

pub(super) fn put_f16(meta: &mut [u8], r: usize, v: [u8; 2]) {
    meta[2 * r..2 * r + 2].copy_from_slice(&v);
}

/// Packs the rows of one group (`src` holds 1..=16 whole rows).
pub(super) fn pack_group(ty: GgmlType, nb: usize, l: Layout, src: &[u8], row_bytes: usize, dst: &mut [u8]) {
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

pub(super) fn set_mask_bit(bulk: &mut [u8], word: usize, bit: usize, on: bool) {
    if on {
        bulk[8 * word + bit / 8] |= 1 << (bit % 8);
    }
}

pub(super) fn blocks<B: WeightBlock>(row: &[u8]) -> &[B] {
    as_blocks(row).expect("rows are whole blocks (checked by pack)")
}
