// K/V cache write into a QBITS-bit absmax cache (duet_quant::kv::absmax, the CPU backend's
// recipe bit for bit): rows r < rows of S (kv_dim values each, a multiple of 32) go to cache
// positions pos0 + r. A row is kv_dim / 32 blocks of BB = 2 + 4·QBITS bytes (f16 scale,
// packed values), padded with zero bytes to a whole u32 word. Two blocks are 2·BB bytes, a
// multiple of 4 (68, 52, 36), so each invocation quantizes a pair of blocks (the last of a
// row may be single, then it also writes the row's padding) and owns every word it writes.
//
// Per block: amax = max |x|, d = amax / qmax, id = 1 / d (0 when d = 0), q = x·id rounded
// half away from zero, clamped to ±qmax; the scale is stored as f16(d) rounded to nearest
// even. The divisions and the f16 rounding are done in integer arithmetic so that they are
// correctly rounded on every GPU (WGSL's f32 division need not be).

struct Params {
    rows: u32,
    kv_dim: u32,  // a multiple of 32
    pos0: u32,
    grid_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> S: array<f32>;
@group(0) @binding(2) var<storage, read_write> C: array<u32>;

const BB: u32 = 2u + 4u * QBITS;
const QMAX: f32 = f32((1u << (QBITS - 1u)) - 1u);

// Quantizes the 32 values of S at `src` into the block at byte `off` of wbuf.
fn quantize_block(src: u32, off: u32) {
    var amax = 0.0;
    for (var i = 0u; i < 32u; i++) {
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
    for (var i = 0u; i < 32u; i++) {
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

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let p = wg_index(wid, P.grid_x) * 256u + lid;
    let nb = P.kv_dim / 32u;
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
        quantize_block(r * P.kv_dim + (b0 + k) * 32u, k * BB);
    }
    let row_words = (nb * BB + 3u) / 4u;
    let base = (P.pos0 + r) * row_words + pair * (BB / 2u);
    let nw = (n * BB + 3u) / 4u;
    for (var w = 0u; w < nw; w++) {
        C[base + w] = wbuf[w];
    }
}
