// A $BITS-bit absmax K/V cache (duet_quant::absmax): each row is kv_dim / 32 blocks of
// 2 + 4·$BITS bytes (an f16 scale d, then the packed values q; value = d·q), padded with
// zero bytes to a whole u32 word. Values are decoded where they are read.
@group(0) @binding($BINDING) var<storage, read> $BUF: array<u32>;

// Byte b of the cache.
fn $FN_byte(b: u32) -> u32 {
    return ($BUF[b >> 2u] >> ((b & 3u) * 8u)) & 0xffu;
}

// Column c of cache row `row`.
fn $FN(row: u32, c: u32) -> f32 {
    let bb = 2u + 4u * $BITSu;
    let row_bytes = ((P.kv_dim / 32u) * bb + 3u) & ~3u;
    let o = row * row_bytes + (c / 32u) * bb;  // the block (even: the scale is in one word)
    let j = c % 32u;
    let d = half_to_f32($BUF[o >> 2u] >> ((o & 2u) * 8u));
    var q: i32;
    if ($BITSu == 8u) {
        q = extractBits(bitcast<i32>($FN_byte(o + 2u + j)), 0u, 8u);
    } else if ($BITSu == 6u) {
        let lo = ($FN_byte(o + 2u + (j & 15u)) >> ((j >> 4u) * 4u)) & 15u;
        let hi = ($FN_byte(o + 18u + (j & 7u)) >> ((j >> 3u) * 2u)) & 3u;
        q = i32(lo | (hi << 4u)) - 32;
    } else {
        q = i32(($FN_byte(o + 2u + (j & 15u)) >> ((j >> 4u) * 4u)) & 15u) - 8;
    }
    return d * f32(q);
}
