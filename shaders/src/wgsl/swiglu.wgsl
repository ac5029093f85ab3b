// SwiGLU: G = silu(G) · U, element-wise.

struct Params {
    n: u32,
    grid_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> U: array<f32>;
@group(0) @binding(2) var<storage, read_write> G: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = wg_index(wid, P.grid_x) * 256u + lid;
    if (i >= P.n) {
        return;
    }
    let g = G[i];
    G[i] = g / (1.0 + exp(-g)) * U[i];
}
