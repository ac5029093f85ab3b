// F32 weights: 4 bytes per element; any row length (elements past `cols` read as 0).
const BLOCK_ELEMS: u32 = 1u;
const BLOCK_BYTES: u32 = 4u;

fn w_one(row_byte: u32, k: u32, cols: u32) -> f32 {
    if (k >= cols) {
        return 0.0;
    }
    return bitcast<f32>(W[(row_byte >> 2u) + k]);
}

// Elements k..k+3 of the row starting at byte `row_byte` (k a multiple of 4).
fn decode4(row_byte: u32, k: u32, cols: u32) -> vec4<f32> {
    if (k + 4u <= cols) {
        let i = (row_byte >> 2u) + k;
        return vec4<f32>(bitcast<f32>(W[i]), bitcast<f32>(W[i + 1u]), bitcast<f32>(W[i + 2u]), bitcast<f32>(W[i + 3u]));
    }
    return vec4<f32>(w_one(row_byte, k, cols), w_one(row_byte, k + 1u, cols), w_one(row_byte, k + 2u, cols), w_one(row_byte, k + 3u, cols));
}
