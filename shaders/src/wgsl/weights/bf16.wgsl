// BF16 weights: the top half of an f32; any row length.
const BLOCK_ELEMS: u32 = 1u;
const BLOCK_BYTES: u32 = 2u;

fn w_one(row_byte: u32, k: u32, cols: u32) -> f32 {
    if (k >= cols) {
        return 0.0;
    }
    return bitcast<f32>(w_u16(row_byte + 2u * k) << 16u);
}

fn decode4(row_byte: u32, k: u32, cols: u32) -> vec4<f32> {
    return vec4<f32>(w_one(row_byte, k, cols), w_one(row_byte, k + 1u, cols), w_one(row_byte, k + 2u, cols), w_one(row_byte, k + 3u, cols));
}
