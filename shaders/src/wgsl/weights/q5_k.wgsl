// Q5_K: 256 elements in 176 bytes: d, dmin f16, scales[12], qh[32], qs[128]; as Q4_K with
// a fifth bit: bit 2c (first 32 of chunk c) or 2c+1 (next 32) of qh[l % 32].
const BLOCK_ELEMS: u32 = 256u;
const BLOCK_BYTES: u32 = 176u;

fn decode4(row_byte: u32, k: u32, cols: u32) -> vec4<f32> {
    let blk = row_byte + (k / 256u) * 176u;
    let i = k % 256u;
    let c = i / 64u;
    let l = i % 64u;
    let upper = l >= 32u;
    let sub = 2u * c + select(0u, 1u, upper);
    let dd = unpack2x16float(w_u32(blk));
    let sm = scale_min_k4(blk + 4u, sub);
    let lo = (w_u32(blk + 48u + 32u * c + (l % 32u)) >> select(0u, 4u, upper)) & 0x0f0f0f0fu;
    let hi = ((w_u32(blk + 16u + (l % 32u)) >> sub) & 0x01010101u) << 4u;
    return (dd.x * sm.x) * u8x4(lo | hi) - vec4<f32>(dd.y * sm.y);
}
