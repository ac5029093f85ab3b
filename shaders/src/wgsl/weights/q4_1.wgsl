// Q4_1: 32 elements in 20 bytes: d, m f16, qs[16]; d·q + m.
const BLOCK_ELEMS: u32 = 32u;
const BLOCK_BYTES: u32 = 20u;

fn decode4(row_byte: u32, k: u32, cols: u32) -> vec4<f32> {
    let blk = row_byte + (k / 32u) * 20u;
    let i = k % 32u;
    let dm = unpack2x16float(w_u32(blk));
    let q = (w_u32(blk + 4u + (i % 16u)) >> select(0u, 4u, i >= 16u)) & 0x0f0f0f0fu;
    return dm.x * u8x4(q) + vec4<f32>(dm.y);
}
