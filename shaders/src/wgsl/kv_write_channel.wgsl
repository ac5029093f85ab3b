// K/V cache write into a QBITS-bit per-channel cache (q8c … q2c): quantizes each group of
// 32 positions that this batch completes (duet_quant::kv::channel, the CPU backend's recipe
// bit for bit). The cache buffer holds a group of GB bytes per page — lo[kv_dim] and
// step[kv_dim] as f16 (at 3 and 2 bits, COMPACT: a u16 word[kv_dim], then an f32 unit per 32
// channels, channel_header.wgsl), then 32 rows of packed codes, RB = kv_dim·QBITS/8 bytes
// each — then
// each sequence's f16 window of its group not yet complete (position p in slot p mod 32;
// this sequence's at word window_word), then the sinks (this sequence's at word
// sink_word). The sequence's group g is page PT[pt_base + g]. A
// group's values are the f16 roundings of its rows: the window's for positions before pos0
// (written by earlier batches), S's rounded here for the batch's own rows (S row r is
// position pos0 + r). The window is written afterwards by kv_window, so nothing read here
// is overwritten first.
//
// One workgroup of 32 per (group, block of 32 channels): thread c finds channel c's range —
// its smallest and largest value, narrowed where that costs less in all (`clipped_range`,
// duet_quant::kv::channel's search, bit for bit) — as lo = f16(bottom) and step = f16 up((top
// of the range - lo) / top), then
// thread t packs row t's 32 codes clamp(round((x - lo) / step), 0, top) (halves away from
// zero; step 0 gives 0; a signed division, as group 0's sink rows and, where the range was
// narrowed, any row may lie below lo). The
// sequence's group 0 leaves its first CHANNEL_SINK rows (the attention sink) out of the
// ranges and copies their f16 values to the sequence's sink, where the readers take them
// from.

struct Params {
    rows: u32,
    kv_dim: u32,        // a multiple of 32
    pos0: u32,
    grid_x: u32,
    first_group: u32,   // the first group this batch completes
    n_groups: u32,      // how many it completes
    pt_base: u32,       // the sequence's page table in PT
    window_word: u32,   // the sequence's window's first word in the buffer
    sink_word: u32,     // the sequence's sink's first word in the buffer
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> S: array<f32>;
@group(0) @binding(2) var<storage, read_write> C: array<u32>;

const TOP: f32 = f32((1u << QBITS) - 1u);

var<workgroup> lo_s: array<f32, 32>;
var<workgroup> step_s: array<f32, 32>;
var<workgroup> bits_s: array<u32, 96>;
// This thread's row's 32 codes.
var<private> codes: array<u32, 32>;
// This thread's channel's 32 values in the group.
var<private> col: array<f32, 32>;

var<workgroup> unit_s: array<f32, 32>;

// Bytes of a group's header: f16 lo and step, or with COMPACT (3 and 2 bits) a u16 word per
// channel and an f32 unit per 32 (channel_header.wgsl).
fn header_bytes() -> u32 {
    if (COMPACT) {
        return 2u * P.kv_dim + P.kv_dim / 8u;
    }
    return 4u * P.kv_dim;
}

fn group_bytes() -> u32 {
    return header_bytes() + 32u * (P.kv_dim * QBITS / 8u);
}

fn compact_finite(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u;
}

// lo in quarter steps, to nearest (halves away from zero), within ±1024; 0 for a step of 0
// (duet_quant::kv::channel_header's `quarters`).
fn compact_quarters(lo: f32, step: f32) -> i32 {
    if (step == 0.0) {
        return 0;
    }
    let t = div_signed(4.0 * lo, step);
    if (abs(t) > 1024.0) {
        if (t > 0.0) {
            return 1024;
        }
        return -1024;
    }
    return i32(round_away(t));
}

// The header word of a channel whose range is lo with step (channel_header's `encode`): the
// finest step of the grid at least its own whose bottom fits in 255 quarter steps.
fn compact_encode(lo: f32, step: f32, unit: f32) -> u32 {
    if (!(compact_finite(lo) && compact_finite(step) && compact_finite(unit))) {
        return 0x100u;
    }
    var e = 0u;
    for (var bit = 64u; bit > 0u; bit = bit / 2u) {
        if (compact_step(unit, e + bit) >= step) {
            e += bit;
        }
    }
    if (abs(compact_quarters(lo, compact_step(unit, e))) > 255) {
        var fit = 0u;
        for (var bit = 64u; bit > 0u; bit = bit / 2u) {
            if (fit + bit < e && abs(compact_quarters(lo, compact_step(unit, fit + bit))) <= 255) {
                fit += bit;
            }
        }
        e = fit;
    }
    return (e << 9u) | (bitcast<u32>(compact_quarters(lo, compact_step(unit, e))) & 0x1ffu);
}

// The search's measure of header word w over this thread's rows t0.. (in `col`).
fn compact_err(t0: u32, w: u32, unit: f32) -> f32 {
    let d = compact_decode(w, unit);
    var err = 0.0;
    for (var t = t0; t < 32u; t++) {
        let x = col[t];
        let r = round_to_11_bits(x - (d.x + d.y * code_of(x, d.x, d.y)));
        err += r * r;
    }
    return err;
}

// v (finite) rounded to 11 significant bits, to nearest even (duet_quant::kv::channel's
// `round_to_11_bits`): its square is exact in f32.
fn round_to_11_bits(v: f32) -> f32 {
    let b = bitcast<u32>(v);
    return bitcast<f32>((b + 0xfffu + ((b >> 13u) & 1u)) & ~0x1fffu);
}

// The code of x in a channel from lo with step (duet_quant::kv::channel's `code`).
fn code_of(x: f32, lo: f32, step: f32) -> f32 {
    if (step > 0.0) {
        return clamp(round_away(div_signed(x - lo, step)), 0.0, TOP);
    }
    return 0.0;
}

// The f16 bits of lo and step of this thread's channel, whose rows t0.. (in `col`, finite)
// span a..=b: among lo = a + i·s, hi = b − j·s (i, j ≤ CLIP_QUARTERS, s a quarter of the whole
// range's step), the pair leaving the least sum of squared errors over those rows, the
// first in (i, j) order. Bit for bit the CPU's: i·s, j·s, step·code and the square of a
// residual rounded to 11 bits are exact (an f16 value times a small integer, a power of two,
// or an 11-bit value squared), so fusing them into an addition changes nothing; the sums run
// in row order.
fn clipped_range(t0: u32, a: f32, b: f32) -> vec2<u32> {
    let whole = vec2<u32>(f16_rne_signed(a), f16_up(div_rn(b - a, TOP)));
    let s = half_to_f32(whole.y) * 0.25;
    // NARROWS_RANGE: ChannelFormat::narrows_range, where the CPU searches.
    if (!NARROWS_RANGE || b == a || !(s <= 3.0e38)) {
        return whole;
    }
    var best = whole;
    // +inf built from a run-time value: WGSL makes a constant infinity an error (Chrome's
    // compiler refuses it; naga does not check).
    var best_err = bitcast<f32>(0x7f800000u | (t0 & 0u));
    for (var i = 0u; i <= CLIP_QUARTERS; i++) {
        for (var j = 0u; j <= CLIP_QUARTERS; j++) {
            var lo_bits = whole.x;
            if (i > 0u) {
                lo_bits = f16_rne_signed(a + f32(i) * s);
            }
            let lo = half_to_f32(lo_bits);
            let hi = b - f32(j) * s;
            if (hi <= lo) {
                continue;
            }
            let step_bits = f16_up(div_rn(hi - lo, TOP));
            let step = half_to_f32(step_bits);
            var err = 0.0;
            for (var t = t0; t < 32u; t++) {
                let x = col[t];
                let d = round_to_11_bits(x - (lo + step * code_of(x, lo, step)));
                err += d * d;
            }
            if (err < best_err) {
                best_err = err;
                best = vec2<u32>(lo_bits, step_bits);
            }
        }
    }
    return best;
}

// Channel c of position p of the group being quantized, as its f16 value.
fn value(p: u32, c: u32) -> f32 {
    if (p >= P.pos0) {
        return half_to_f32(f16_rne_signed(S[(p - P.pos0) * P.kv_dim + c]));
    }
    let i = 2u * P.window_word + (p % 32u) * P.kv_dim + c;
    return half_to_f32(C[i >> 1u] >> ((i & 1u) * 16u));
}

@compute @workgroup_size(32)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let blocks = P.kv_dim / 32u;
    let item = wg_index(wid, P.grid_x);
    if (item >= P.n_groups * blocks) {
        return;
    }
    let g = P.first_group + item / blocks;
    let c0 = (item % blocks) * 32u;
    let p0 = g * 32u;
    let base = PT[P.pt_base + g] * group_bytes();  // bytes, a multiple of 4

    // Thread lid: channel c0 + lid.
    var lo = 3.0e38;
    var hi = -3.0e38;
    var t0 = 0u;
    if (g == 0u) {
        t0 = CHANNEL_SINK;
    }
    for (var t = t0; t < 32u; t++) {
        let x = value(p0 + t, c0 + lid);
        col[t] = x;
        lo = min(lo, x);
        hi = max(hi, x);
    }
    var lo_bits = 0u;
    var step_bits = 0x7e00u;
    var lo_val = lo;
    let finite = abs(lo) <= 65504.0 && abs(hi) <= 65504.0;
    if (finite) {
        let r = clipped_range(t0, lo, hi);
        lo_bits = r.x;
        step_bits = r.y;
        lo_val = half_to_f32(lo_bits);
    } else if (abs(lo) <= 65504.0) {
        // A column holding ±inf (an f16 overflow) decodes as NaN, as on the CPU: lo 0 unless
        // finite, step NaN, codes 0.
        lo_bits = f16_rne_signed(lo);
    }
    var step_val = half_to_f32(step_bits);
    if (COMPACT) {
        // The searched range and the whole one, both finite or neither; the block's unit
        // from both (channel_header's `unit`), then the word of the one leaving less error.
        let whole = vec2<f32>(half_to_f32(f16_rne_signed(lo)), half_to_f32(f16_up(div_rn(hi - lo, TOP))));
        unit_s[lid] = 0.0;
        if (finite && compact_finite(whole.y)) {
            unit_s[lid] = max(max(step_val, abs(lo_val) * (1.0 / 32.0)), max(whole.y, abs(whole.x) * (1.0 / 32.0)));
        }
        workgroupBarrier();
        if (lid == 0u) {
            var m = 0.0;
            for (var i = 0u; i < 32u; i++) {
                m = max(m, unit_s[i]);
            }
            unit_s[0] = bitcast<f32>((bitcast<u32>(m) + 0xffffu) & 0xffff0000u);
        }
        workgroupBarrier();
        let unit = unit_s[0];
        var w = 0x100u;
        if (finite) {
            w = compact_encode(lo_val, step_val, unit);
            let ww = compact_encode(whole.x, whole.y, unit);
            if (compact_err(t0, ww, unit) < compact_err(t0, w, unit)) {
                w = ww;
            }
        }
        let d = compact_decode(w, unit);
        lo_val = d.x;
        step_val = d.y;
        bits_s[lid] = w;
        if (lid == 0u) {
            C[(base + 2u * P.kv_dim) / 4u + c0 / 32u] = bitcast<u32>(unit);
        }
    } else {
        bits_s[lid] = lo_bits;
        bits_s[32u + lid] = step_bits;
    }
    lo_s[lid] = lo_val;
    step_s[lid] = step_val;
    workgroupBarrier();
    if (lid % 2u == 0u) {
        C[(base + 2u * (c0 + lid)) / 4u] = bits_s[lid] | (bits_s[lid + 1u] << 16u);
        if (!COMPACT) {
            C[(base + 2u * (P.kv_dim + c0 + lid)) / 4u] = bits_s[32u + lid] | (bits_s[33u + lid] << 16u);
        }
    }
    // Group 0: the sink rows' f16 values, row by row, to the sink.
    for (var t = 0u; t < t0; t++) {
        workgroupBarrier();
        bits_s[64u + lid] = f16_rne_signed(value(p0 + t, c0 + lid));
        workgroupBarrier();
        if (lid % 2u == 0u) {
            C[P.sink_word + (t * P.kv_dim + c0 + lid) / 2u] = bits_s[64u + lid] | (bits_s[65u + lid] << 16u);
        }
    }

    // Thread lid: row lid's codes for these 32 channels.
    for (var j = 0u; j < 32u; j++) {
        var u = 0.0;
        if (step_s[j] > 0.0) {
            u = clamp(round_away(div_signed(value(p0 + lid, c0 + j) - lo_s[j], step_s[j])), 0.0, TOP);
        }
        codes[j] = u32(u);
    }
    // ... packed into QBITS words.
    let at = (base + header_bytes() + lid * (P.kv_dim * QBITS / 8u) + (c0 / 32u) * 4u * QBITS) / 4u;
    for (var w = 0u; w < QBITS; w++) {
        var word = 0u;
        for (var i = 0u; i < 4u; i++) {
            let j = 4u * w + i;
            for (var k = 0u; k < packed_fan(j); k++) {
                let f = packed_field(j, k);
                word |= ((codes[f.x] >> f.y) & f.z) << (f.w + 8u * i);
            }
        }
        C[at + w] = word;
    }
}
