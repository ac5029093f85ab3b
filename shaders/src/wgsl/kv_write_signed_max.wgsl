// K/V cache write into a QBITS-bit rotated cache (q8r/q6r/q4r): signed-max blocks of 64
// values (duet_quant::kv::signed_max, the CPU backend's recipe bit for bit) of rows that
// the rotate kernel already put into each head's Hadamard basis. Rows r < rows of S
// (kv_dim values each, a multiple of 64) go to cache positions pos0 + r. A row is
// kv_dim / 64 blocks of BB = 2 + 8·QBITS bytes (f16 scale, two packed groups of 32),
// padded with zero bytes to a whole u32 word. Two blocks are 2·BB bytes, a multiple of 4
// (132, 100, 68), so each invocation quantizes a pair of blocks (the last of a row may be
// single, then it also writes the row's padding) and owns every word it writes.
//
// Per block, with h = 2^(QBITS-1): m = the value of largest magnitude (the first found),
// d = f16(m · (-1/h)) (exact but for the f16 rounding), q = x / d rounded half away from
// zero (0 when d = 0), clamped to -h ..= h - 1; codes are the two's-complement byte at 8
// bits, q + h below.

struct Params {
    rows: u32,
    kv_dim: u32,  // a multiple of 64
    pos0: u32,
    grid_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> S: array<f32>;
@group(0) @binding(2) var<storage, read_write> C: array<u32>;

const BB: u32 = 2u + 8u * QBITS;
const H: i32 = 1 << (QBITS - 1u);

// Quantizes the 64 values of S at `src` into the block at byte `off` of wbuf.
fn quantize_block(src: u32, off: u32) {
    var m = 0.0;
    for (var i = 0u; i < 64u; i++) {
        let v = S[src + i];
        if (abs(v) > abs(m)) {
            m = v;
        }
    }
    // -1/h is a power of two (ldexp keeps it exact): the product is exact.
    let dh = f16_rne_signed(m * ldexp(-1.0, -i32(QBITS - 1u)));
    put_byte(off, dh);
    put_byte(off + 1u, dh >> 8u);
    let d = half_to_f32(dh);
    for (var half = 0u; half < 2u; half++) {
        for (var i = 0u; i < 32u; i++) {
            var q = 0;
            if (d != 0.0) {
                q = i32(clamp(round_away(div_signed(S[src + 32u * half + i], d)), -f32(H), f32(H - 1)));
            }
            if (QBITS == 8u) {
                codes[i] = bitcast<u32>(q) & 0xffu;
            } else {
                codes[i] = u32(q + H);
            }
        }
        pack_codes(off + 2u + half * 4u * QBITS);
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let p = wg_index(wid, P.grid_x) * 256u + lid;
    let nb = P.kv_dim / 64u;
    let pairs = (nb + 1u) / 2u;
    if (p >= P.rows * pairs) {
        return;
    }
    let r = p / pairs;
    let pair = p % pairs;
    let b0 = 2u * pair;
    let n = min(2u, nb - b0);
    for (var w = 0u; w < WBUF_WORDS; w++) {
        wbuf[w] = 0u;
    }
    for (var k = 0u; k < n; k++) {
        quantize_block(r * P.kv_dim + (b0 + k) * 64u, k * BB);
    }
    let row_words = (nb * BB + 3u) / 4u;
    let base = (P.pos0 + r) * row_words + pair * (BB / 2u);
    let nw = (n * BB + 3u) / 4u;
    for (var w = 0u; w < nw; w++) {
        C[base + w] = wbuf[w];
    }
}
