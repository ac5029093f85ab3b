// Q6_K: 256 elements in 210 bytes: ql[128], qh[64], i8 scales[16], d f16; d·sc·(q − 32).
// Per 128 elements (half n): group g of 32 takes ql[64n + l + 32(g&1)] nibble g>>1 and
// bits 2g..2g+1 of qh[32n + l]; scale index 8n + l/16 + 2g.
const BLOCK_ELEMS: u32 = 256u;
const BLOCK_BYTES: u32 = 210u;

fn decode4(row_byte: u32, k: u32, cols: u32) -> vec4<f32> {
    let blk = row_byte + (k / 256u) * 210u;
    let i = k % 256u;
    let n = i / 128u;
    let g = (i % 128u) / 32u;
    let l = i % 32u;
    let lo = (w_u32(blk + 64u * n + l + 32u * (g & 1u)) >> (4u * (g >> 1u))) & 0x0f0f0f0fu;
    let hi = ((w_u32(blk + 128u + 32u * n + l) >> (2u * g)) & 0x03030303u) << 4u;
    let sc = f32(extractBits(bitcast<i32>(w_u8(blk + 192u + 8u * n + l / 16u + 2u * g)), 0u, 8u));
    return (w_f16(blk + 208u) * sc) * (u8x4(lo | hi) - vec4<f32>(32.0));
}
