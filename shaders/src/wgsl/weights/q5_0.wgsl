// Q5_0: 32 elements in 22 bytes: d f16, qh u32 (bit j = bit 4 of q[j]), qs[16]; d·(q − 16).
const BLOCK_ELEMS: u32 = 32u;
const BLOCK_BYTES: u32 = 22u;

fn decode4(row_byte: u32, k: u32, cols: u32) -> vec4<f32> {
    let blk = row_byte + (k / 32u) * 22u;
    let i = k % 32u;
    let d = w_f16(blk);
    let qh = w_u32(blk + 2u) >> i;
    let hi = ((qh & 1u) | ((qh & 2u) << 7u) | ((qh & 4u) << 14u) | ((qh & 8u) << 21u)) << 4u;
    let q = ((w_u32(blk + 6u + (i % 16u)) >> select(0u, 4u, i >= 16u)) & 0x0f0f0f0fu) | hi;
    return d * (u8x4(q) - vec4<f32>(16.0));
}
