// The layout of 32 codes of QBITS bits packed into 4·QBITS bytes, duet_quant::kv::pack's (one
// per width): 8 bits, code j in byte j; 6 bits, the low nibbles of codes j and j + 16 in byte
// j of 16, then the top 2 bits of codes j, j + 8, j + 16, j + 24 in bits 0-1, 2-3, 4-5, 6-7 of
// byte 16 + j; 4 bits, code j in the low and j + 16 in the high nibble of byte j; 3 bits, the
// low 2 bits as at 2 bits, then a u32 whose bit j is bit 2 of code j; 2 bits, code j in bits
// 2·(j / 8) of byte j % 8.
//
// Every byte is an OR of bit fields of codes, so a kernel builds any byte on its own from
// codes wherever they lie (a thread's private array, workgroup memory):
//
//     var b = 0u;
//     for (var k = 0u; k < packed_fan(j); k++) {
//         let f = packed_field(j, k);
//         b |= ((code[f.x] >> f.y) & f.z) << f.w;
//     }
//
// `packed_fan(j)`: how many codes byte j is made of; `packed_field(j, k)`: the k-th one's
// index (0..32 in the group), the shift that brings its field down, the field's mask and
// its place in the byte.

fn packed_fan(j: u32) -> u32 {
    if (QBITS == 8u) {
        return 1u;
    }
    if (QBITS == 4u || (QBITS == 6u && j < 16u)) {
        return 2u;
    }
    if (QBITS == 3u && j >= 8u) {
        return 8u;
    }
    return 4u;
}

fn packed_field(j: u32, k: u32) -> vec4<u32> {
    if (QBITS == 8u) {
        return vec4<u32>(j, 0u, 0xffu, 0u);
    }
    if (QBITS == 4u || (QBITS == 6u && j < 16u)) {
        return vec4<u32>(j + 16u * k, 0u, 15u, 4u * k);
    }
    if (QBITS == 6u) {
        return vec4<u32>(j - 16u + 8u * k, 4u, 3u, 2u * k);
    }
    if (QBITS == 3u && j >= 8u) {
        return vec4<u32>(8u * (j - 8u) + k, 2u, 1u, k);
    }
    return vec4<u32>(j + 8u * k, 0u, 3u, 2u * k);
}
