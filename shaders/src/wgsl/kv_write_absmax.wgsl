// K/V cache write into a QBITS-bit absmax cache (duet_quant::kv::absmax, the CPU backend's
// recipe bit for bit), driven by cache/block_rows: blocks of 32 values, BB = 2 + 4·QBITS
// bytes each (f16 scale, packed values); two blocks are 68, 52 or 36 bytes.
//
// Per block: amax = max |x|, d = amax / qmax, id = 1 / d (0 when d = 0), q = x·id rounded
// half away from zero, clamped to ±qmax; the scale is stored as f16(d) rounded to nearest
// even. The divisions and the f16 rounding are done in integer arithmetic so that they are
// correctly rounded on every GPU (WGSL's f32 division need not be).

const BLOCK: u32 = 32u;
const BB: u32 = 2u + 4u * QBITS;
const QMAX: f32 = f32((1u << (QBITS - 1u)) - 1u);

// d = amax / qmax of the block whose value of largest magnitude is `m`.
fn block_d(m: f32) -> f32 {
    let amax = abs(m);
    if (amax > 0.0) {
        return div_rn(amax, QMAX);
    }
    return 0.0;
}

// The block's scale: f16(d), rounded to nearest even.
fn block_scale(m: f32) -> u32 {
    return f16_rne(block_d(m));
}

// The code of value `v` of that block: q8 stores the two's-complement byte (Q8_0), q6/q4
// q + 2^(QBITS-1).
fn block_code(v: f32, m: f32, scale: u32) -> u32 {
    let d = block_d(m);
    var id = 0.0;
    if (d != 0.0) {
        id = div_rn(1.0, d);
    }
    let q = i32(clamp(round_away(v * id), -QMAX, QMAX));
    if (QBITS == 8u) {
        return bitcast<u32>(q) & 0xffu;
    }
    return u32(q + i32(QMAX) + 1);
}
