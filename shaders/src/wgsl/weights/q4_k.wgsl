// Q4_K: 256 elements in 144 bytes: d, dmin f16, scales[12], qs[128]. Each 64 elements use
// 32 bytes of qs (low nibbles: the first 32, high: the next 32); d·sc·q − dmin·m.
const BLOCK_ELEMS: u32 = 256u;
const BLOCK_BYTES: u32 = 144u;

fn decode4(row_byte: u32, k: u32, cols: u32) -> vec4<f32> {
    let blk = row_byte + (k / 256u) * 144u;
    let i = k % 256u;
    let c = i / 64u;
    let l = i % 64u;
    let sub = 2u * c + select(0u, 1u, l >= 32u);
    let dd = unpack2x16float(w_u32(blk));
    let sm = scale_min_k4(blk + 4u, sub);
    let q = (w_u32(blk + 16u + 32u * c + (l % 32u)) >> select(0u, 4u, l >= 32u)) & 0x0f0f0f0fu;
    return (dd.x * sm.x) * u8x4(q) - vec4<f32>(dd.y * sm.y);
}
