// The 6-bit scale and min of sub-block j (0..8) of a Q4_K/Q5_K block whose 12 packed
// scale bytes start at byte `s` (ggml's get_scale_min_k4).
fn scale_min_k4(s: u32, j: u32) -> vec2<f32> {
    if (j < 4u) {
        return vec2<f32>(f32(w_u8(s + j) & 63u), f32(w_u8(s + j + 4u) & 63u));
    }
    let a = w_u8(s + j + 4u);
    let sc = (a & 0xfu) | ((w_u8(s + j - 4u) >> 6u) << 4u);
    let m = (a >> 4u) | ((w_u8(s + j) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(m));
}
