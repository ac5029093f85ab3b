// Q4_0: 32 elements in 18 bytes: d f16, qs[16] (qs[j] = q[j] | q[j+16] << 4); d·(q − 8).
const BLOCK_ELEMS: u32 = 32u;
const BLOCK_BYTES: u32 = 18u;

fn decode4(row_byte: u32, k: u32, cols: u32) -> vec4<f32> {
    let blk = row_byte + (k / 32u) * 18u;
    let i = k % 32u;
    let d = w_f16(blk);
    let q = (w_u32(blk + 2u + (i % 16u)) >> select(0u, 4u, i >= 16u)) & 0x0f0f0f0fu;
    return d * (u8x4(q) - vec4<f32>(8.0));
}
