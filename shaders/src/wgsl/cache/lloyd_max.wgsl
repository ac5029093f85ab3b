// The 3-bit rotated cache's levels (q3r; duet_quant::kv::lloyd_max, the definition): code u
// stands for level LEVELS[u] = byte u % 4 (signed) of LM_LEVELS0 (u < 4) or LM_LEVELS1, a
// block's scale d = f16(|m| · LM_SCALE) with m its value of largest magnitude. Both words and
// LM_SCALE are generated from the definition (shaders/src/lib.rs).
fn lloyd_max_level(u: u32) -> i32 {
    let w = select(LM_LEVELS1, LM_LEVELS0, u < 4u);
    return extractBits(bitcast<i32>(w), 8u * (u & 3u), 8u);
}

// The code of t = x / d: its nearest level, ties away from zero, ±0, a subnormal t (which a
// GPU may flush) and NaN code 4.
fn lloyd_max_code(t: f32) -> u32 {
    let a = abs(t);
    if (a < 1.17549435e-38) {
        return 4u;
    }
    let i = select(0u, 1u, a >= 8.0) + select(0u, 1u, a >= 17.0) + select(0u, 1u, a >= 28.5);
    return select(4u + i, 3u - i, t < 0.0);
}
