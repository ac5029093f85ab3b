// A $BITS-bit per-channel cache (q8c … q2c, duet_quant::kv::channel): P.cache_groups
// groups of 32 positions, one per page — lo[kv_dim] and step[kv_dim] as f16, or at 3 and 2
// bits a compact header (channel_header.wgsl: a u16 word[kv_dim], then an f32 unit per 32
// columns), then 32 rows of codes, each kv_dim·$BITS/8 bytes packed 32 at a time (value =
// lo + step·code) — then
// f16 rows: each sequence's window holding its positions past its last complete group
// (position p in slot p mod 32 of window P.window), then the sinks (the first CHANNEL_SINK
// positions, read from there once group 0 is complete; this sequence's from f16 row
// P.sink_row). After this batch's write, the sequence's groups complete are those below
// (pos0 + rows) / 32, group g on page PT[pt_base + g]. Values are decoded where they are
// read.
@group(0) @binding($BINDING) var<storage, read> $BUF: array<u32>;

fn $FN_half(i: u32) -> f32 {
    return half_to_f32($BUF[i >> 1u] >> ((i & 1u) * 16u));
}

// Column c of position `row` of the sequence.
fn $FN(row: u32, c: u32) -> f32 {
    return $FN_row(row, 0u, c);
}

// The same where the caller has looked up the row's cache row `crow` (page · 32 + row mod
// 32; read only for rows in the groups). 0 means "look the page up": callers without a
// crow pass it, and where 0 is a real cache row (page 0, row mod 32 = 0) the look-up finds
// that same page.
fn $FN_row(row: u32, crow: u32, c: u32) -> f32 {
    let rb = P.kv_dim * $BITSu / 8u;
    var hb = 4u * P.kv_dim;
    if ($COMPACT) {
        hb = 2u * P.kv_dim + P.kv_dim / 8u;
    }
    let gb = hb + 32u * rb;
    let grouped = (P.pos0 + P.rows) / 32u * 32u;
    if (row >= grouped) {
        return $FN_half((P.cache_groups * gb) / 2u + (P.window * 32u + row % 32u) * P.kv_dim + c);
    }
    if (row < CHANNEL_SINK) {
        return $FN_half((P.cache_groups * gb) / 2u + (P.sink_row + row) * P.kv_dim + c);
    }
    var page = crow / 32u;
    if (crow == 0u) {
        page = cache_page(row);
    }
    let base = page * gb;
    var lo: f32;
    var step: f32;
    if ($COMPACT) {
        let w = $BUF[(base + 2u * c) >> 2u] >> ((c & 1u) * 16u);
        let d = compact_decode(w, bitcast<f32>($BUF[(base + 2u * P.kv_dim) / 4u + c / 32u]));
        lo = d.x;
        step = d.y;
    } else {
        lo = $FN_half(base / 2u + c);
        step = $FN_half(base / 2u + P.kv_dim + c);
    }
    let g = base + hb + (row % 32u) * rb + (c / 32u) * 4u * $BITSu;
    let j = c % 32u;
    var u: u32;
    if ($BITSu == 8u) {
        u = ($BUF[(g + j) >> 2u] >> (((g + j) & 3u) * 8u)) & 0xffu;
    } else if ($BITSu == 6u) {
        let b0 = g + (j & 15u);
        let b1 = g + 16u + (j & 7u);
        let lo4 = (($BUF[b0 >> 2u] >> ((b0 & 3u) * 8u)) >> ((j >> 4u) * 4u)) & 15u;
        let hi2 = (($BUF[b1 >> 2u] >> ((b1 & 3u) * 8u)) >> ((j >> 3u) * 2u)) & 3u;
        u = lo4 | (hi2 << 4u);
    } else if ($BITSu < 4u) {
        // 3 and 2 bits: the low 2 bits in byte j % 8; at 3, bit 2 in bit j of the word after
        // (g is word-aligned: rows and groups are whole words).
        let b0 = g + (j & 7u);
        u = (($BUF[b0 >> 2u] >> ((b0 & 3u) * 8u)) >> ((j >> 3u) * 2u)) & 3u;
        if ($BITSu == 3u) {
            u |= (($BUF[(g + 8u) >> 2u] >> j) & 1u) << 2u;
        }
    } else {
        let b0 = g + (j & 15u);
        u = (($BUF[b0 >> 2u] >> ((b0 & 3u) * 8u)) >> ((j >> 4u) * 4u)) & 15u;
    }
    return lo + step * f32(u);
}
