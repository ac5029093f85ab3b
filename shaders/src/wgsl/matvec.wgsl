// Matrix-vector product for decode: O[out_off + r] = Σ_k W[r][k] · X[k] for one token.
// A workgroup of MV_WG threads computes MV_WG / tpr consecutive weight rows, tpr =
// P.threads_per_row threads per row (a power of two), each summing 4-element groups (decode4 of the weight type) four at a
// time (all four groups' loads issued before any is used: a GPU thread stalls at the first
// use of a load, so this quarters the stalls), and the sums reduced in workgroup memory.
// Products in `act` (f16 or f32), sums in f32.

struct Params {
    n_rows: u32,     // rows of this weight chunk
    cols: u32,       // elements per row (K)
    row_bytes: u32,  // bytes per row in W
    out_off: u32,    // first output column written (the chunk's first row)
    grid_x: u32,     // workgroups along x of the dispatch
    x_off: u32,      // first element of the token in X
    o_base: u32,     // first element of the token's output row in O
    threads_per_row: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> W: array<u32>;
@group(0) @binding(2) var<storage, read> X: array<f32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;

var<workgroup> partial: array<f32, MV_WG>;

fn load_x4(k: u32) -> vec4<f32> {
    let b = P.x_off + k;
    if (k + 4u <= P.cols) {
        return vec4<f32>(X[b], X[b + 1u], X[b + 2u], X[b + 3u]);
    }
    var v = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j++) {
        if (k + j < P.cols) {
            v[j] = X[b + j];
        }
    }
    return v;
}

@compute @workgroup_size(MV_WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let tpr = P.threads_per_row;
    let row = wg_index(wid, P.grid_x) * (MV_WG / tpr) + lid / tpr;
    let t = lid % tpr;
    var acc = 0.0;
    if (row < P.n_rows) {
        let rb = row * P.row_bytes;
        let groups = (P.cols + 3u) / 4u;
        var g = t;
        for (; g + 3u * tpr < groups; g += 4u * tpr) {
            let w0 = vec4<act>(decode4(rb, 4u * g, P.cols));
            let w1 = vec4<act>(decode4(rb, 4u * (g + tpr), P.cols));
            let w2 = vec4<act>(decode4(rb, 4u * (g + 2u * tpr), P.cols));
            let w3 = vec4<act>(decode4(rb, 4u * (g + 3u * tpr), P.cols));
            let x0 = vec4<act>(load_x4(4u * g));
            let x1 = vec4<act>(load_x4(4u * (g + tpr)));
            let x2 = vec4<act>(load_x4(4u * (g + 2u * tpr)));
            let x3 = vec4<act>(load_x4(4u * (g + 3u * tpr)));
            acc += (f32(dot(w0, x0)) + f32(dot(w1, x1))) + (f32(dot(w2, x2)) + f32(dot(w3, x3)));
        }
        for (; g < groups; g += tpr) {
            acc += f32(dot(vec4<act>(decode4(rb, 4u * g, P.cols)), vec4<act>(load_x4(4u * g))));
        }
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var s = tpr / 2u; s > 0u; s >>= 1u) {
        if (t < s) {
            partial[lid] += partial[lid + s];
        }
        workgroupBarrier();
    }
    if (t == 0u && row < P.n_rows) {
        O[P.o_base + P.out_off + row] = partial[lid];
    }
}
