// DIFF V2's combine step: query heads 2i and 2i+1 attended separately (A holds 2·n_pairs
// heads per row); their outputs become one head, o_i = a_2i − sigmoid(g_i)·a_2i+1, where g
// (n_pairs per row) is lambda_proj of the layer's normalised input. One invocation per value
// of O (rows × n_pairs·head_dim).

struct Params {
    rows: u32,
    n_pairs: u32,
    head_dim: u32,
    grid_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> G: array<f32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = wg_index(wid, P.grid_x) * 256u + lid;
    let width = P.n_pairs * P.head_dim;
    if (i >= P.rows * width) {
        return;
    }
    let r = i / width;
    let pair = (i % width) / P.head_dim;
    let c = i % P.head_dim;
    let lambda = 1.0 / (1.0 + exp(-G[r * P.n_pairs + pair]));
    let a = r * 2u * width + 2u * pair * P.head_dim + c;
    O[i] = A[a] - lambda * A[a + P.head_dim];
}
