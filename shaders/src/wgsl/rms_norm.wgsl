// RMSNorm: O[r] = X[r] / sqrt(mean(X[r]²) + eps) · G, one workgroup of RED_WG threads per row.

struct Params {
    rows: u32,
    cols: u32,
    eps: f32,
    grid_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read> G: array<f32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;

@compute @workgroup_size(RED_WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = wg_index(wid, P.grid_x);
    if (r >= P.rows) {
        return;
    }
    let base = r * P.cols;
    var ss = 0.0;
    for (var c = lid; c < P.cols; c += RED_WG) {
        let v = X[base + c];
        ss += v * v;
    }
    let inv = 1.0 / sqrt(workgroup_sum(lid, ss) / f32(P.cols) + P.eps);
    for (var c = lid; c < P.cols; c += RED_WG) {
        O[base + c] = G[c] * (X[base + c] * inv);
    }
}
