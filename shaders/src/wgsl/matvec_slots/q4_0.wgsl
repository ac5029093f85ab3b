// Q4_0 slots: half a block, qs bytes 8h..8h+7 (h = s mod 2): their low nibbles are values
// 8h..8h+7 of the block, their high nibbles 16+8h..16+8h+7. d·Σ(q − 8)·x = d·(Σq·x − 8·Σx).
const SLOT_ELEMS: u32 = 16u;

fn slot_x(s: u32) -> Xs {
    let i = 8u * (s / 2u) + 2u * (s % 2u);
    return Xs(xv(i), xv(i + 1u), xv(i + 4u), xv(i + 5u));
}

fn slot_dot(rb: u32, s: u32, x: Xs) -> f32 {
    let blk = rb + (s / 2u) * 18u;
    let q = w_u32x2(blk + 2u + 8u * (s % 2u));
    let lo = dot(u8x4(q.x & 0x0f0f0f0fu), x.a) + dot(u8x4(q.y & 0x0f0f0f0fu), x.b);
    let hi = dot(u8x4((q.x >> 4u) & 0x0f0f0f0fu), x.c) + dot(u8x4((q.y >> 4u) & 0x0f0f0f0fu), x.d);
    return w_f16(blk) * ((lo + hi) - 8.0 * xs_sum(x));
}
