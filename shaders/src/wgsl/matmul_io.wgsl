// What the two prompt products share (matmul.wgsl, the tiled product; matmul_coop.wgsl,
// on cooperative matrices): the parameters (MatMulParams), the bindings and the activation
// reader. O[t][out_off + n] (+)= Σ_k W[n][k] · X[t][k].

struct Params {
    n_rows: u32,     // rows of this weight chunk (N)
    cols: u32,       // K
    row_bytes: u32,
    out_off: u32,    // first output column written
    grid_x: u32,     // workgroups along x (weight-row tiles)
    t_rows: u32,     // tokens (T)
    x_stride: u32,   // elements per token row of X
    o_stride: u32,   // elements per token row of O
    w_off: u32,      // first byte of the weight chunk in W
    accumulate: u32, // 1: O += products (the residual add), 0: O = products
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> W: array<u32>;
@group(0) @binding(2) var<storage, read> X: array<f32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;

// Four activations of token row t from column k (zeros past the row's end).
fn load_x4(t: u32, k: u32) -> vec4<f32> {
    let b = t * P.x_stride + k;
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
