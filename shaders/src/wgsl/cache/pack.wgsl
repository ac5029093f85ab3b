// Packing of 32 codes of QBITS bits into bytes, duet_quant::kv::pack's layout (one per
// width): 8 bits, code j in byte j; 6 bits, the low nibbles of codes j and j + 16 in byte j
// of 16, then the top 2 bits of codes j, j + 8, j + 16, j + 24 in bits 0-1, 2-3, 4-5, 6-7
// of byte 16 + j; 4 bits, code j in the low and j + 16 in the high nibble of byte j.
// The kernel declares WBUF_WORDS, the words it assembles before storing them.

var<private> wbuf: array<u32, WBUF_WORDS>;
var<private> codes: array<u32, 32>;

fn put_byte(b: u32, v: u32) {
    wbuf[b >> 2u] |= (v & 0xffu) << ((b & 3u) * 8u);
}

// Packs codes[0..32] at byte `off` of wbuf (whose bytes there must be zero).
fn pack_codes(off: u32) {
    if (QBITS == 8u) {
        for (var i = 0u; i < 32u; i++) {
            put_byte(off + i, codes[i]);
        }
    } else if (QBITS == 6u) {
        for (var j = 0u; j < 16u; j++) {
            put_byte(off + j, (codes[j] & 15u) | ((codes[j + 16u] & 15u) << 4u));
        }
        for (var j = 0u; j < 8u; j++) {
            let b = (codes[j] >> 4u) | ((codes[j + 8u] >> 4u) << 2u) | ((codes[j + 16u] >> 4u) << 4u)
                | ((codes[j + 24u] >> 4u) << 6u);
            put_byte(off + 16u + j, b);
        }
    } else {
        for (var j = 0u; j < 16u; j++) {
            put_byte(off + j, codes[j] | (codes[j + 16u] << 4u));
        }
    }
}
