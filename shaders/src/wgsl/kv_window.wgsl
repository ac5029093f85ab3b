// The f16 window of a per-channel cache (q8c … q2c, see kv_write_channel): batch rows
// r >= from_row (the batch's last 32, so each slot is written once, with the last position
// that maps to it — what the CPU's window holds after passing every row through it) go to
// window slot (pos0 + r) mod 32, rounded to f16 to nearest even as the CPU rounds them.
// One invocation per pair of values.

struct Params {
    rows: u32,
    kv_dim: u32,        // a multiple of 32
    pos0: u32,
    grid_x: u32,
    from_row: u32,
    window_word: u32,   // the window's first word in the buffer
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> S: array<f32>;
@group(0) @binding(2) var<storage, read_write> C: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = wg_index(wid, P.grid_x) * 256u + lid;
    let half_dim = P.kv_dim / 2u;
    let r = P.from_row + i / half_dim;
    if (r >= P.rows) {
        return;
    }
    let c = 2u * (i % half_dim);
    let slot = (P.pos0 + r) % 32u;
    let src = r * P.kv_dim + c;
    C[P.window_word + slot * half_dim + c / 2u] = f16_rne_signed(S[src]) | (f16_rne_signed(S[src + 1u]) << 16u);
}
