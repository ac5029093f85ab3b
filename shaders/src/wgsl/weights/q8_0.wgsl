// Q8_0: 32 elements in 34 bytes: d f16, i8 qs[32]; d·q.
const BLOCK_ELEMS: u32 = 32u;
const BLOCK_BYTES: u32 = 34u;

fn decode4(row_byte: u32, k: u32, cols: u32) -> vec4<f32> {
    let blk = row_byte + (k / 32u) * 34u;
    let i = k % 32u;
    return w_f16(blk) * i8x4(w_u32(blk + 2u + i));
}
