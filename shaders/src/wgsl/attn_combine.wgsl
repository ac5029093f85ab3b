// The combine step of attention (attention.wgsl is the attend step): for each (query row,
// unit), merges the n_chunks partials of each softmax — max M = max m_c, sum
// L = Σ l_c·exp(m_c − M), output Σ acc_c·exp(m_c − M) / L — then writes the unit's output:
// standard, that output; DIFF, RMSNorm(o1 − λ·o2) · (optional sub-norm weight) ·
// (1 − λ_init) over its 2·head_dim values; paired (DIFF V2, standard units), units 2i and
// 2i+1 merged into one head, o_i = a_2i − sigmoid(g_i)·a_2i+1 with the gates in SN (the
// pair combine folded in). One workgroup of CB_WG threads per (row, unit) or (row, pair),
// each owning the dims lid + j·CB_WG (j < CB_DIMS). All arithmetic f32.

struct Params {
    rows: u32,
    units: u32,
    head_dim: u32,
    n_chunks: u32,
    q_dim: u32,      // output row stride (n_heads · head_dim; paired: half that)
    grid_x: u32,
    lambda: f32,
    out_scale: f32,  // 1 − λ_init
    eps: f32,
    has_sub_norm: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> PA: array<f32>;
@group(0) @binding(2) var<storage, read> SN: array<f32>;  // sub-norm weight, or (paired) the gates
@group(0) @binding(3) var<storage, read_write> O: array<f32>;

// Each chunk's weight exp(m_c − M) of the softmax being merged.
var<workgroup> cw: array<f32, CB_MAX_CHUNKS>;

// The merged, normalised output of softmax s at dims lid + j·CB_WG of partials `first`.
// The threads take the chunks between them for the max and the weights (a loop over the
// chunks on every thread, each load waiting for the last, took 43 µs a layer for the 64
// chunks of a decode at depth 4,096 on an H200), then each sums its dims over the chunks,
// four loads in flight.
fn merged(first: u32, stride: u32, s: u32, vd: u32, lid: u32) -> array<f32, CB_DIMS> {
    let off = s * (2u + vd);
    var mx = NEG_BIG;
    for (var c = lid; c < P.n_chunks; c += CB_WG) {
        mx = max(mx, PA[first + c * stride + off]);
    }
    mx = workgroup_max(lid, mx);
    var l = 0.0;
    for (var c = lid; c < P.n_chunks; c += CB_WG) {
        let b = first + c * stride + off;
        let w = exp(PA[b] - mx);
        cw[c] = w;
        l += PA[b + 1u] * w;
    }
    // Its barriers also publish cw.
    l = workgroup_sum(lid, l);
    var o: array<f32, CB_DIMS>;
    for (var j = 0u; j < CB_DIMS; j++) {
        let d = lid + j * CB_WG;
        var x = 0.0;
        if (d < vd) {
            let b = first + off + 2u + d;
            var c = 0u;
            for (; c + 4u <= P.n_chunks; c += 4u) {
                let x0 = PA[b + c * stride] * cw[c];
                let x1 = PA[b + (c + 1u) * stride] * cw[c + 1u];
                let x2 = PA[b + (c + 2u) * stride] * cw[c + 2u];
                let x3 = PA[b + (c + 3u) * stride] * cw[c + 3u];
                x += (x0 + x1) + (x2 + x3);
            }
            for (; c < P.n_chunks; c++) {
                x += PA[b + c * stride] * cw[c];
            }
        }
        o[j] = x / l;
    }
    // The next merge rewrites cw.
    workgroupBarrier();
    return o;
}

@compute @workgroup_size(CB_WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let item = wg_index(wid, P.grid_x);
    let per_row = select(P.units, P.units / 2u, ATT_PAIRED);
    // Uniform exit: a whole workgroup leaves or none does (the DIFF path has barriers).
    if (item >= P.rows * per_row) {
        return;
    }
    let row = item / per_row;
    let u = item % per_row;
    let vd = P.head_dim * ATT_NS;
    let stride = ATT_NS * (2u + vd);
    if (ATT_PAIRED) {
        // Units 2u and 2u+1 of the row: their partials are consecutive.
        let first_a = (row * P.units + 2u * u) * P.n_chunks * stride;
        let a = merged(first_a, stride, 0u, vd, lid);
        let b = merged(first_a + P.n_chunks * stride, stride, 0u, vd, lid);
        let lambda = 1.0 / (1.0 + exp(-SN[row * per_row + u]));
        let out = row * P.q_dim + u * vd;
        for (var j = 0u; j < CB_DIMS; j++) {
            let d = lid + j * CB_WG;
            if (d < vd) {
                O[out + d] = a[j] - lambda * b[j];
            }
        }
        return;
    }
    let first = item * P.n_chunks * stride;
    var o = merged(first, stride, 0u, vd, lid);
    let out = row * P.q_dim + u * vd;
    if (ATT_NS == 1u) {
        for (var j = 0u; j < CB_DIMS; j++) {
            let d = lid + j * CB_WG;
            if (d < vd) {
                O[out + d] = o[j];
            }
        }
        return;
    }
    let o2 = merged(first, stride, 1u, vd, lid);
    var sq = 0.0;
    for (var j = 0u; j < CB_DIMS; j++) {
        if (lid + j * CB_WG < vd) {
            o[j] -= P.lambda * o2[j];
            sq += o[j] * o[j];
        }
    }
    let inv = 1.0 / sqrt(workgroup_sum(lid, sq) / f32(vd) + P.eps);
    for (var j = 0u; j < CB_DIMS; j++) {
        let d = lid + j * CB_WG;
        if (d < vd) {
            var g = 1.0;
            if (P.has_sub_norm != 0u) {
                g = SN[d];
            }
            O[out + d] = g * (o[j] * inv) * P.out_scale;
        }
    }
}
