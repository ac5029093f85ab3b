// The Hadamard rotation of the rotated K/V cache types (duet_quant::kv::hadamard): every
// block of `block` consecutive values of each row of X (rows × cols; block a power of two
// up to ROT_MAX that divides cols) becomes H·x with H = H_n/√n, written to O — optionally
// times W[col mod w_len] afterwards (a DIFF sub-norm weight, applied after the attention
// output is rotated back). The butterflies run in the CPU's order (a + b, a − b at strides
// 1, 2, 4, …) and end with one product by `norm`, so the rotated rows the cache quantizes
// are bit for bit the CPU's. One workgroup per (row, block).

struct Params {
    rows: u32,
    cols: u32,
    block: u32,
    grid_x: u32,
    norm: f32,      // 1/√block, computed on the host as the CPU computes it
    w_len: u32,     // 0: no weight
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read> W: array<f32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;

var<workgroup> s: array<f32, ROT_MAX>;

@compute @workgroup_size(ROT_WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let item = wg_index(wid, P.grid_x);
    let per_row = P.cols / P.block;
    if (item >= P.rows * per_row) {
        return;
    }
    let base = item * P.block;  // rows are cols long, so blocks are contiguous
    let n = P.block;
    for (var i = lid; i < n; i += ROT_WG) {
        s[i] = X[base + i];
    }
    for (var h = 1u; h < n; h *= 2u) {
        workgroupBarrier();
        for (var i = lid; i < n / 2u; i += ROT_WG) {
            let j = (i / h) * 2u * h + i % h;
            let a = s[j];
            let b = s[j + h];
            s[j] = a + b;
            s[j + h] = a - b;
        }
    }
    workgroupBarrier();
    for (var i = lid; i < n; i += ROT_WG) {
        var v = s[i] * P.norm;
        if (P.w_len != 0u) {
            v *= W[(base + i) % P.cols % P.w_len];
        }
        O[base + i] = v;
    }
}
