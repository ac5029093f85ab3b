// The compact header of a 3- or 2-bit per-channel group (duet_quant::kv::channel_header, the
// definition): per block of 32 columns an f32 `unit` of 8 significant bits, per column a u16
// (e << 9) | (m & 0x1ff) — step = unit · K[e mod 16] · 2^-(8 + e / 16), lo = step · m / 4,
// m = -256 marking a column that held ±inf or NaN. Every product is exact in f32, so a
// compiler's fusing changes nothing.

// The grid's mantissa K[i], i < 16 (duet_quant::kv::channel_header::K): 128 + byte i of the
// words COMPACT_K0..3.
fn compact_k(i: u32) -> f32 {
    let w = select(select(COMPACT_K0, COMPACT_K1, i >= 4u), select(COMPACT_K2, COMPACT_K3, i >= 12u), i >= 8u);
    return f32(128u + ((w >> (8u * (i & 3u))) & 0xffu));
}

fn compact_step(unit: f32, e: u32) -> f32 {
    return unit * compact_k(e & 15u) * bitcast<f32>((119u - (e >> 4u)) << 23u);
}

// (lo, step) of header word w (its low 16 bits).
fn compact_decode(w: u32, unit: f32) -> vec2<f32> {
    let m = bitcast<i32>(w << 23u) >> 23u;
    if (m == -256) {
        // A NaN built from the run-time word: WGSL makes a constant NaN an error (Chrome's
        // compiler refuses it; naga does not check).
        let nan = bitcast<f32>(0x7fc00000u | (w & 0u));
        return vec2<f32>(nan, nan);
    }
    let step = compact_step(unit, (w >> 9u) & 0x7fu);
    return vec2<f32>(step * f32(m) * 0.25, step);
}
