// Embedding lookup: O[i] = row IDS[i] of the table, dequantized. Dispatched once per row
// chunk of the table; a token whose row lies in another chunk is left to that dispatch.

struct Params {
    n_tokens: u32,
    cols: u32,
    row_bytes: u32,
    row0: u32,    // first table row in this chunk
    n_rows: u32,  // rows in this chunk
    grid_x: u32,
    w_off: u32,   // first byte of the chunk in W
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> W: array<u32>;
@group(0) @binding(2) var<storage, read> IDS: array<u32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = wg_index(wid, P.grid_x);
    if (i >= P.n_tokens) {
        return;
    }
    let id = IDS[i];
    if (id < P.row0 || id >= P.row0 + P.n_rows) {
        return;
    }
    let rb = P.w_off + (id - P.row0) * P.row_bytes;
    let groups = (P.cols + 3u) / 4u;
    for (var g = lid; g < groups; g += 64u) {
        let v = decode4(rb, 4u * g, P.cols);
        for (var j = 0u; j < 4u; j++) {
            let k = 4u * g + j;
            if (k < P.cols) {
                O[i * P.cols + k] = v[j];
            }
        }
    }
}
