// K/V cache write: rows r < rows of S (kv_dim values each) go to the sequence's positions
// pos0 + r (cache_row: its page table). The cache's element type comes from the store2
// snippet (f32 or two f16 per u32).

struct Params {
    rows: u32,
    kv_dim: u32,  // even
    pos0: u32,
    grid_x: u32,
    pt_base: u32, // the sequence's page table in PT
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> S: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let p = wg_index(wid, P.grid_x) * 256u + lid;
    let half_dim = P.kv_dim / 2u;
    if (p >= P.rows * half_dim) {
        return;
    }
    let row = cache_row(P.pos0 + p / half_dim);
    store2(row * half_dim + p % half_dim, vec2<f32>(S[2u * p], S[2u * p + 1u]));
}
