// A $BITS-bit block cache: absmax blocks of 32 (q8/q6/q4, duet_quant::kv::absmax) or
// signed-max blocks of 64 (q8r … q2r, duet_quant::kv::signed_max; rows in each head's
// Hadamard basis). Each row is kv_dim / $PER blocks of an f16 scale d and $PER/32 packed
// groups of 32 codes, padded with zero bytes to a whole u32 word; value = d·q with q the
// two's-complement code at 8 bits and code - 2^($BITS-1) below (both formats' codes), but
// for q3r ($LLOYD_MAX), whose code u stands for lloyd_max_level(u) (cache/lloyd_max.wgsl).
// Values are decoded where they are read.
@group(0) @binding($BINDING) var<storage, read> $BUF: array<u32>;

// Byte b of the cache.
fn $FN_byte(b: u32) -> u32 {
    return ($BUF[b >> 2u] >> ((b & 3u) * 8u)) & 0xffu;
}

// Column c of the cache row holding position `row` (cache_row: the page table).
fn $FN(row: u32, c: u32) -> f32 {
    return $FN_row(row, cache_row(row), c);
}

// The same where the caller has looked up the row's cache row `crow`.
fn $FN_row(row: u32, crow: u32, c: u32) -> f32 {
    let pb = 4u * $BITSu;                       // bytes of 32 packed codes
    let bb = 2u + ($PERu / 32u) * pb;
    let row_bytes = ((P.kv_dim / $PERu) * bb + 3u) & ~3u;
    let o = crow * row_bytes + (c / $PERu) * bb;  // the block (even: the scale is in one word)
    let g = o + 2u + ((c % $PERu) / 32u) * pb;   // its group of 32 codes
    let j = c % 32u;
    let d = half_to_f32($BUF[o >> 2u] >> ((o & 2u) * 8u));
    var q: i32;
    if ($BITSu == 8u) {
        q = extractBits(bitcast<i32>($FN_byte(g + j)), 0u, 8u);
    } else if ($BITSu == 6u) {
        let lo = ($FN_byte(g + (j & 15u)) >> ((j >> 4u) * 4u)) & 15u;
        let hi = ($FN_byte(g + 16u + (j & 7u)) >> ((j >> 3u) * 2u)) & 3u;
        q = i32(lo | (hi << 4u)) - 32;
    } else if ($BITSu < 4u) {
        // 3 and 2 bits: the low 2 bits in byte j % 8; at 3, bit 2 in bit j of the u32 after.
        var u = ($FN_byte(g + (j & 7u)) >> ((j >> 3u) * 2u)) & 3u;
        if ($BITSu == 3u) {
            u |= (($FN_byte(g + 8u + (j >> 3u)) >> (j & 7u)) & 1u) << 2u;
        }
        if ($LLOYD_MAX) {
            q = lloyd_max_level(u);
        } else {
            q = i32(u) - (1 << ($BITSu - 1u));
        }
    } else {
        q = i32(($FN_byte(g + (j & 15u)) >> ((j >> 4u) * 4u)) & 15u) - 8;
    }
    return d * f32(q);
}
