// The layout of 32 codes of QBITS bits packed into 4·QBITS bytes, duet_quant::kv::pack's (one
// per width): 8 bits, code j in byte j; 6 bits, the low nibbles of codes j and j + 16 in byte
// j of 16, then the top 2 bits of codes j, j + 8, j + 16, j + 24 in bits 0-1, 2-3, 4-5, 6-7 of
// byte 16 + j; 4 bits, code j in the low and j + 16 in the high nibble of byte j.
//
// As two functions, so that a kernel builds any byte on its own from codes wherever they
// lie (a thread's private array, workgroup memory): `packed_src(j)` names the codes (indices
// 0..32 in the group; unused ones repeat) that byte j is made of, `packed_byte(j, c)` makes it
// from their values `c`.

fn packed_src(j: u32) -> vec4<u32> {
    if (QBITS == 8u) {
        return vec4<u32>(j, j, j, j);
    }
    if (QBITS == 4u || j < 16u) {
        return vec4<u32>(j, j + 16u, j, j);
    }
    let i = j - 16u;
    return vec4<u32>(i, i + 8u, i + 16u, i + 24u);
}

fn packed_byte(j: u32, c: vec4<u32>) -> u32 {
    if (QBITS == 8u) {
        return c.x & 0xffu;
    }
    if (QBITS == 4u || j < 16u) {
        return (c.x & 15u) | ((c.y & 15u) << 4u);
    }
    return (c.x >> 4u) | ((c.y >> 4u) << 2u) | ((c.z >> 4u) << 4u) | ((c.w >> 4u) << 6u);
}
