// DEX on the attention output, in place: for each adapted head h (bit h of the mask),
// o_h[j] -= λ · Σ_i o_h[i] · W_D[i][j]. One workgroup per (row, head).

struct Params {
    rows: u32,
    cols: u32,
    n_heads: u32,
    head_dim: u32,
    lambda: f32,
    grid_x: u32,
    _pad0: u32,
    _pad1: u32,
    mask: array<vec4<u32>, 2>, // 256 head bits
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> WD: array<f32>;
@group(0) @binding(2) var<storage, read_write> X: array<f32>;

var<workgroup> seg: array<f32, DEX_MAX_HD>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let item = wg_index(wid, P.grid_x);
    if (item >= P.rows * P.n_heads) {
        return;
    }
    let r = item / P.n_heads;
    let h = item % P.n_heads;
    let word = P.mask[h / 128u][(h / 32u) % 4u];
    if (((word >> (h % 32u)) & 1u) == 0u) {
        return;
    }
    let base = r * P.cols + h * P.head_dim;
    for (var i = lid; i < P.head_dim; i += 64u) {
        seg[i] = X[base + i];
    }
    workgroupBarrier();
    for (var j = lid; j < P.head_dim; j += 64u) {
        var acc = 0.0;
        for (var i = 0u; i < P.head_dim; i++) {
            acc += seg[i] * WD[i * P.head_dim + j];
        }
        X[base + j] = seg[j] - P.lambda * acc;
    }
}
