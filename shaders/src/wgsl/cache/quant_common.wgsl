// Exactly rounded arithmetic for the K/V cache write kernels, which must write the bytes the
// CPU backend writes (duet_quant::kv): WGSL's f32 division need not be correctly rounded and
// its f32 -> f16 conversions need not round to nearest even, so both are done in integer
// arithmetic here. Additions, subtractions and single products are correctly rounded in
// WGSL already; the kernels feed a product into an addition (which a compiler may fuse)
// only where the product is exact, dividing instead elsewhere.

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


// The f16 bits of x rounded to nearest even, any sign.
fn f16_rne_signed(x: f32) -> u32 {
    let sign = (bitcast<u32>(x) >> 16u) & 0x8000u;
    return sign | f16_rne(abs(x));
}

// The f16 bits of x >= 0 rounded up (toward +inf).
fn f16_up(x: f32) -> u32 {
    let h = f16_rne(x);
    if (half_to_f32(h) < x) {
        return h + 1u;
    }
    return h;
}

// a / b correctly rounded, any signs (b != 0).
fn div_signed(a: f32, b: f32) -> f32 {
    let q = div_rn(abs(a), abs(b));
    if ((a < 0.0) != (b < 0.0)) {
        return -q;
    }
    return q;
}
