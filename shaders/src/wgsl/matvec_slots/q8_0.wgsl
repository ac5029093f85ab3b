// Q8_0 slots: half a block, values 16h..16h+15 (h = s mod 2), 16 consecutive bytes.
const SLOT_ELEMS: u32 = 16u;

fn slot_x(s: u32) -> Xs {
    let i = 4u * s;
    return Xs(xv(i), xv(i + 1u), xv(i + 2u), xv(i + 3u));
}

fn slot_dot(rb: u32, s: u32, x: Xs) -> f32 {
    let blk = rb + (s / 2u) * 34u;
    let q = w_u32x4(blk + 2u + 16u * (s % 2u));
    let lo = dot(i8x4(q.x), x.a) + dot(i8x4(q.y), x.b);
    let hi = dot(i8x4(q.z), x.c) + dot(i8x4(q.w), x.d);
    return w_f16(blk) * (lo + hi);
}
