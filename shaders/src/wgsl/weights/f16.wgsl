// F16 weights: 2 bytes per element; any row length (a row may start at a 2-byte offset).
const BLOCK_ELEMS: u32 = 1u;
const BLOCK_BYTES: u32 = 2u;

fn w_one(row_byte: u32, k: u32, cols: u32) -> f32 {
    if (k >= cols) {
        return 0.0;
    }
    return w_f16(row_byte + 2u * k);
}

fn decode4(row_byte: u32, k: u32, cols: u32) -> vec4<f32> {
    if (k + 4u <= cols) {
        let b = row_byte + 2u * k;
        let lo = unpack2x16float(w_u32(b));
        let hi = unpack2x16float(w_u32(b + 4u));
        return vec4<f32>(lo, hi);
    }
    return vec4<f32>(w_one(row_byte, k, cols), w_one(row_byte, k + 1u, cols), w_one(row_byte, k + 2u, cols), w_one(row_byte, k + 3u, cols));
}
