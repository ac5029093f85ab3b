// Copies `n` values of X from `src` to O from `dst` (consecutive rows of a tensor into another).

struct Params {
    n: u32,
    src: u32,
    dst: u32,
    grid_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> O: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = wg_index(wid, P.grid_x) * 256u + lid;
    if (i >= P.n) {
        return;
    }
    O[P.dst + i] = X[P.src + i];
}
