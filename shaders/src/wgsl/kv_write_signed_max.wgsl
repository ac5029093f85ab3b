// K/V cache write into a QBITS-bit rotated cache (q8r … q2r): signed-max blocks of 64
// values (duet_quant::kv::signed_max, the CPU backend's recipe bit for bit) of rows that
// the rotate kernel already put into each head's Hadamard basis, driven by
// cache/block_rows: BB = 2 + 8·QBITS bytes a block (f16 scale, two packed groups of 32);
// two blocks are 132, 100, 68, 52 or 36 bytes.
//
// Per block, with h = 2^(QBITS-1): m = the value of largest magnitude (the first found),
// d = f16(m · (-1/h)) (exact but for the f16 rounding), q = x / d rounded half away from
// zero (0 when d = 0), clamped to -h ..= h - 1; codes are the two's-complement byte at 8
// bits, q + h below. At 3 bits (q3r) the codes are those of Lloyd–Max levels instead
// (duet_quant::kv::lloyd_max; cache/lloyd_max.wgsl): d = f16(|m| · LM_SCALE), a correctly
// rounded product, and each value's code that of the nearest level of x / d.

const BLOCK: u32 = 64u;
const BB: u32 = 2u + 8u * QBITS;
const H: i32 = 1 << (QBITS - 1u);

// The block's scale: the f16 bits of d. (-1/h is a power of two, ldexp keeps it exact:
// the product is exact.)
fn block_scale(m: f32) -> u32 {
    if (QBITS == 3u) {
        return f16_rne(abs(m) * LM_SCALE);
    }
    return f16_rne_signed(m * ldexp(-1.0, -i32(QBITS - 1u)));
}

fn block_code(v: f32, m: f32, scale: u32) -> u32 {
    let d = half_to_f32(scale);
    if (QBITS == 3u) {
        // As duet_quant::kv::lloyd_max::code_of: a zero scale or a subnormal value is zero.
        if (d == 0.0 || abs(v) < 1.17549435e-38) {
            return 4u;
        }
        return lloyd_max_code(div_signed(v, d));
    }
    var q = 0;
    if (d != 0.0) {
        q = i32(clamp(round_away(div_signed(v, d)), -f32(H), f32(H - 1)));
    }
    if (QBITS == 8u) {
        return bitcast<u32>(q) & 0xffu;
    }
    return u32(q + H);
}
