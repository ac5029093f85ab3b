// Q6_K slots: 16 per block. Slot j = 8n + t of a block takes positions l = 4t..4t+3 of all
// four 32-value groups g of half n: values 128n + 32g + l. Their low four bits are nibble
// g>>1 of ql[64n + 32(g&1) + l], their top two bits 2g..2g+1 of qh[32n + l]: three words
// for 16 values. Group g's scale is the i8 at 192 + 8n + l/16 + 2g.
const SLOT_ELEMS: u32 = 16u;

fn slot_x(s: u32) -> Xs {
    let j = s % 16u;
    let i = 64u * (s / 16u) + 32u * (j / 8u) + (j % 8u);
    return Xs(xv(i), xv(i + 8u), xv(i + 16u), xv(i + 24u));
}

fn q6_scale(b: u32) -> f32 {
    return f32(extractBits(bitcast<i32>(w_u8(b)), 0u, 8u));
}

fn slot_dot(rb: u32, s: u32, x: Xs) -> f32 {
    let blk = rb + (s / 16u) * 210u;
    let j = s % 16u;
    let n = j / 8u;
    let l = 4u * (j % 8u);
    let qa = w_u32(blk + 64u * n + l);
    let qb = w_u32(blk + 64u * n + 32u + l);
    let qh = w_u32(blk + 128u + 32u * n + l);
    let q0 = u8x4((qa & 0x0f0f0f0fu) | ((qh & 0x03030303u) << 4u));
    let q1 = u8x4((qb & 0x0f0f0f0fu) | (((qh >> 2u) & 0x03030303u) << 4u));
    let q2 = u8x4(((qa >> 4u) & 0x0f0f0f0fu) | (((qh >> 4u) & 0x03030303u) << 4u));
    let q3 = u8x4(((qb >> 4u) & 0x0f0f0f0fu) | (((qh >> 6u) & 0x03030303u) << 4u));
    let sb = blk + 192u + 8u * n + l / 16u;
    let one = vec4<f32>(1.0);
    let g0 = q6_scale(sb) * (dot(q0, x.a) - 32.0 * dot(x.a, one));
    let g1 = q6_scale(sb + 2u) * (dot(q1, x.b) - 32.0 * dot(x.b, one));
    let g2 = q6_scale(sb + 4u) * (dot(q2, x.c) - 32.0 * dot(x.c, one));
    let g3 = q6_scale(sb + 6u) * (dot(q3, x.d) - 32.0 * dot(x.d, one));
    return w_f16(blk + 208u) * ((g0 + g1) + (g2 + g3));
}
