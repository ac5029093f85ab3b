// Q4_K slots: 16 per block. Slot j = 4c + h of a block takes bytes 8h..8h+7 of the 32 qs
// bytes of chunk c (64 values): low nibbles are values 64c + 8h.. (sub-block 2c), high
// nibbles 64c + 32 + 8h.. (sub-block 2c + 1). Blocks and their fields are word-aligned
// (144-byte blocks, rows of whole blocks, weights 16-byte aligned).
const SLOT_ELEMS: u32 = 16u;

fn slot_x(s: u32) -> Xs {
    let j = s % 16u;
    let i = 64u * (s / 16u) + 16u * (j / 4u) + 2u * (j % 4u);
    return Xs(xv(i), xv(i + 1u), xv(i + 8u), xv(i + 9u));
}

// Byte `k` (0..11) of the packed scales, without indexing a vector by a run-time value
// (which can put it in local memory).
fn k4_byte(sc: vec3<u32>, k: u32) -> u32 {
    let w = select(select(sc.x, sc.y, k >= 4u), sc.z, k >= 8u);
    return extractBits(w, 8u * (k % 4u), 8u);
}

// ggml's get_scale_min_k4 on the scale words: (scale, min) of sub-block j, both of its
// forms computed and one selected, so that the threads of a warp (whose slots hold
// sub-blocks on both sides of 4) do not diverge.
fn k4_scale_min(sc: vec3<u32>, j: u32) -> vec2<f32> {
    let lo = vec2<u32>(k4_byte(sc, j) & 63u, k4_byte(sc, j + 4u) & 63u);
    let a = k4_byte(sc, j + 4u);
    let jm = select(j, j - 4u, j >= 4u);
    let hi = vec2<u32>((a & 0xfu) | ((k4_byte(sc, jm) >> 6u) << 4u), (a >> 4u) | ((k4_byte(sc, j) >> 6u) << 4u));
    return vec2<f32>(select(hi, lo, j < 4u));
}

fn slot_dot(rb: u32, s: u32, x: Xs) -> f32 {
    let blk = rb + (s / 16u) * 144u;
    let j = s % 16u;
    let c = j / 4u;
    let w = blk >> 2u;
    let dd = unpack2x16float(W[w]);
    let sc = vec3<u32>(W[w + 1u], W[w + 2u], W[w + 3u]);
    let q = vec2<u32>(W[w + 4u + 8u * c + 2u * (j % 4u)], W[w + 5u + 8u * c + 2u * (j % 4u)]);
    let lo_sm = k4_scale_min(sc, 2u * c);
    let hi_sm = k4_scale_min(sc, 2u * c + 1u);
    let lo = dot(u8x4(q.x & 0x0f0f0f0fu), x.a) + dot(u8x4(q.y & 0x0f0f0f0fu), x.b);
    let hi = dot(u8x4((q.x >> 4u) & 0x0f0f0f0fu), x.c) + dot(u8x4((q.y >> 4u) & 0x0f0f0f0fu), x.d);
    let lo_x = dot(x.a + x.b, vec4<f32>(1.0));
    let hi_x = dot(x.c + x.d, vec4<f32>(1.0));
    return dd.x * (lo_sm.x * lo + hi_sm.x * hi) - dd.y * (lo_sm.y * lo_x + hi_sm.y * hi_x);
}
