// RoPE on the new rows' queries and keys and their K/V cache write, in one pass (plain f16
// or f32 caches): instead of a RoPE dispatch for Q, one for K and a write each for K and V.
// One invocation per pair of values: a query pair is rotated in place; a key pair is
// rotated, written back to K (as the separate RoPE leaves it) and stored; a value pair is
// stored. Rows r < rows are positions pos0 + r of the sequence whose page table starts at
// pt_base — or, with ROWS_META (a batch of several sequences' decoded tokens), row r's
// position and page table come from row_meta(r) (pages.wgsl). The rotation is rope.wgsl's:
// pairs (2i, 2i+1), i < n_pairs, of every head, with the host's (cos, sin) table.

struct Params {
    rows: u32,
    q_dim: u32,
    kv_dim: u32,     // even
    head_dim: u32,   // even
    n_pairs: u32,    // rotated pairs per head
    pos0: u32,
    grid_x: u32,
    pt_base: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> CS: array<vec2<f32>>;
@group(0) @binding(2) var<storage, read_write> Q: array<f32>;
@group(0) @binding(3) var<storage, read_write> K: array<f32>;
@group(0) @binding(4) var<storage, read> V: array<f32>;
// Both caches as words: two halves per word (f16) or one f32's bits per word.
@group(0) @binding(5) var<storage, read_write> KC: array<u32>;
@group(0) @binding(6) var<storage, read_write> VC: array<u32>;

// Pair `i` of a head at position `pos`, rotated (i < n_pairs) or as it is.
fn rotate(v: vec2<f32>, pos: u32, i: u32) -> vec2<f32> {
    if (i >= P.n_pairs) {
        return v;
    }
    let cs = CS[pos * P.n_pairs + i];
    return vec2<f32>(v.x * cs.x - v.y * cs.y, v.x * cs.y + v.y * cs.x);
}

// Stores pair `p` (values 2p, 2p+1) of a cache of `half` precision.
fn store_pair(k: bool, p: u32, v: vec2<f32>) {
    let half = select(V_HALF, K_HALF, k);
    if (half) {
        if (k) { KC[p] = pack2x16float(v); } else { VC[p] = pack2x16float(v); }
    } else {
        let w = vec2<u32>(bitcast<u32>(v.x), bitcast<u32>(v.y));
        if (k) {
            KC[2u * p] = w.x;
            KC[2u * p + 1u] = w.y;
        } else {
            VC[2u * p] = w.x;
            VC[2u * p + 1u] = w.y;
        }
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let idx = wg_index(wid, P.grid_x) * 256u + lid;
    let half_q = P.q_dim / 2u;
    let half_kv = P.kv_dim / 2u;
    let per_row = half_q + 2u * half_kv;
    if (idx >= P.rows * per_row) {
        return;
    }
    let r = idx / per_row;
    let j = idx % per_row;
    var pos = P.pos0 + r;
    var pt_base = P.pt_base;
    if (ROWS_META) {
        let m = row_meta(r);
        pos = m.x;
        pt_base = m.y;
    }
    let head_pairs = P.head_dim / 2u;
    if (j < half_q) {
        let b = r * P.q_dim + 2u * j;
        let v = rotate(vec2<f32>(Q[b], Q[b + 1u]), pos, j % head_pairs);
        Q[b] = v.x;
        Q[b + 1u] = v.y;
        return;
    }
    let row = cache_row_at(pt_base, pos);
    if (j < half_q + half_kv) {
        let p = j - half_q;
        let b = r * P.kv_dim + 2u * p;
        let v = rotate(vec2<f32>(K[b], K[b + 1u]), pos, p % head_pairs);
        K[b] = v.x;
        K[b + 1u] = v.y;
        store_pair(true, row * half_kv + p, v);
    } else {
        let p = j - half_q - half_kv;
        let b = r * P.kv_dim + 2u * p;
        store_pair(false, row * half_kv + p, vec2<f32>(V[b], V[b + 1u]));
    }
}
