// Residual add and bias: X[i] += Y[i % y_len] (y_len = the length of X for a residual
// add, the row length for a bias broadcast over rows).

struct Params {
    n: u32,
    y_len: u32,
    grid_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> Y: array<f32>;
@group(0) @binding(2) var<storage, read_write> X: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = wg_index(wid, P.grid_x) * 256u + lid;
    if (i >= P.n) {
        return;
    }
    X[i] += Y[i % P.y_len];
}
