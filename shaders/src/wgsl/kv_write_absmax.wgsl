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

// Quantizes the BLOCK values of S at `src` into the block at byte `off` of wbuf.
fn quantize_block(src: u32, off: u32) {
    var amax = 0.0;
    for (var i = 0u; i < BLOCK; i++) {
        amax = max(amax, abs(S[src + i]));
    }
    var d = 0.0;
    if (amax > 0.0) {
        d = div_rn(amax, QMAX);
    }
    var id = 0.0;
    if (d != 0.0) {
        id = div_rn(1.0, d);
    }
    let h = f16_rne(d);
    put_byte(off, h);
    put_byte(off + 1u, h >> 8u);
    for (var i = 0u; i < BLOCK; i++) {
        let q = i32(clamp(round_away(S[src + i] * id), -QMAX, QMAX));
        // q8 stores the two's-complement byte (Q8_0), q6/q4 q + 2^(QBITS-1).
        if (QBITS == 8u) {
            codes[i] = bitcast<u32>(q) & 0xffu;
        } else {
            codes[i] = u32(q + i32(QMAX) + 1);
        }
    }
    pack_codes(off + 2u);
}
