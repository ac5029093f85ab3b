// K/V cache write into a QBITS-bit absmax cache (duet_quant::absmax, the CPU backend's
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

var<private> wbuf: array<u32, 17>;  // two blocks, at most 68 bytes
var<private> qv: array<i32, 32>;

fn put_byte(b: u32, v: u32) {
    wbuf[b >> 2u] |= (v & 0xffu) << ((b & 3u) * 8u);
}

// a / b correctly rounded (to nearest even), for positive finite a, b; IEEE division by the
// GPU where the operands or the result are not normal numbers.
fn div_rn(a: f32, b: f32) -> f32 {
    let ua = bitcast<u32>(a);
    let ub = bitcast<u32>(b);
    let ea = i32((ua >> 23u) & 0xffu);
    let eb = i32((ub >> 23u) & 0xffu);
    if (ea == 0 || eb == 0 || ea == 255 || eb == 255) {
        return a / b;
    }
    let mb = (ub & 0x7fffffu) | 0x800000u;
    var rem = (ua & 0x7fffffu) | 0x800000u;
    var e = ea - eb + 127;
    if (rem < mb) {
        rem = rem << 1u;
        e -= 1;
    }
    // 24 quotient bits, the first 1 (mb <= rem < 2·mb).
    var q = 0u;
    for (var i = 0u; i < 24u; i++) {
        q = q << 1u;
        if (rem >= mb) {
            rem -= mb;
            q |= 1u;
        }
        rem = rem << 1u;
    }
    // rem is now twice the remainder: against mb it says above, at or below half an ulp.
    if (rem > mb || (rem == mb && (q & 1u) == 1u)) {
        q += 1u;
    }
    if (q == 0x1000000u) {
        q = q >> 1u;
        e += 1;
    }
    if (e <= 0 || e >= 255) {
        return a / b;
    }
    return bitcast<f32>((u32(e) << 23u) | (q & 0x7fffffu));
}

// The f16 bits of x >= 0, rounded to nearest even (overflow to inf, subnormals kept).
fn f16_rne(x: f32) -> u32 {
    let a = bitcast<u32>(x) & 0x7fffffffu;
    if (a > 0x7f800000u) {
        return 0x7e00u;
    }
    if (a >= 0x477ff000u) {
        return 0x7c00u;
    }
    if (a >= 0x38800000u) {
        let m = a - 0x38000000u;
        return (m + 0xfffu + ((m >> 13u) & 1u)) >> 13u;
    }
    let e = a >> 23u;
    if (e < 102u) {
        return 0u;
    }
    // In units of 2^-24 the value is mant · 2^(e − 126), e − 126 in −24 ..= −14.
    let mant = (a & 0x7fffffu) | 0x800000u;
    let sh = 126u - e;
    var r = mant >> sh;
    let rest = mant & ((1u << sh) - 1u);
    let half = 1u << (sh - 1u);
    if (rest > half || (rest == half && (r & 1u) == 1u)) {
        r += 1u;
    }
    return r;
}

// Rounds half away from zero (C's roundf).
fn round_away(v: f32) -> f32 {
    let t = trunc(v);
    if (abs(v - t) >= 0.5) {
        return t + sign(v);
    }
    return t;
}

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
        qv[i] = i32(clamp(round_away(S[src + i] * id), -QMAX, QMAX));
    }
    let data = off + 2u;
    if (QBITS == 8u) {
        for (var i = 0u; i < 32u; i++) {
            put_byte(data + i, bitcast<u32>(qv[i]));
        }
    } else if (QBITS == 6u) {
        for (var j = 0u; j < 16u; j++) {
            let lo = u32(qv[j] + 32);
            let hi = u32(qv[j + 16u] + 32);
            put_byte(data + j, (lo & 15u) | ((hi & 15u) << 4u));
        }
        for (var j = 0u; j < 8u; j++) {
            let u0 = u32(qv[j] + 32) >> 4u;
            let u1 = u32(qv[j + 8u] + 32) >> 4u;
            let u2 = u32(qv[j + 16u] + 32) >> 4u;
            let u3 = u32(qv[j + 24u] + 32) >> 4u;
            put_byte(data + 16u + j, u0 | (u1 << 2u) | (u2 << 4u) | (u3 << 6u));
        }
    } else {
        for (var j = 0u; j < 16u; j++) {
            put_byte(data + j, u32(qv[j] + 8) | (u32(qv[j + 16u] + 8) << 4u));
        }
    }
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
    for (var w = 0u; w < 17u; w++) {
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
