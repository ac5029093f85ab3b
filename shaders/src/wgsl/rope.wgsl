// RoPE on adjacent pairs (2i, 2i+1), i < n_pairs, of every head, in place. CS holds
// (cos, sin) of every (position, pair), computed on the host exactly as the CPU backend
// computes them.

struct Params {
    rows: u32,
    cols: u32,
    n_heads: u32,
    head_dim: u32,
    n_pairs: u32,
    pos0: u32,
    grid_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> CS: array<vec2<f32>>;
@group(0) @binding(2) var<storage, read_write> X: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let idx = wg_index(wid, P.grid_x) * 256u + lid;
    let per_row = P.n_heads * P.n_pairs;
    if (idx >= P.rows * per_row) {
        return;
    }
    let r = idx / per_row;
    let h = (idx % per_row) / P.n_pairs;
    let i = idx % P.n_pairs;
    let cs = CS[(P.pos0 + r) * P.n_pairs + i];
    let b = r * P.cols + h * P.head_dim + 2u * i;
    let a = X[b];
    let c = X[b + 1u];
    X[b] = a * cs.x - c * cs.y;
    X[b + 1u] = a * cs.y + c * cs.x;
}
