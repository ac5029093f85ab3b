// Q5_1: 32 elements in 24 bytes: d, m f16, qh u32, qs[16]; d·q + m.
const BLOCK_ELEMS: u32 = 32u;
const BLOCK_BYTES: u32 = 24u;

fn decode4(row_byte: u32, k: u32, cols: u32) -> vec4<f32> {
    let blk = row_byte + (k / 32u) * 24u;
    let i = k % 32u;
    let dm = unpack2x16float(w_u32(blk));
    let qh = w_u32(blk + 4u) >> i;
    let hi = ((qh & 1u) | ((qh & 2u) << 7u) | ((qh & 4u) << 14u) | ((qh & 8u) << 21u)) << 4u;
    let q = ((w_u32(blk + 8u + (i % 16u)) >> select(0u, 4u, i >= 16u)) & 0x0f0f0f0fu) | hi;
    return dm.x * u8x4(q) + vec4<f32>(dm.y);
}
