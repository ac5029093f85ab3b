// The attend step of decode attention (one query row; attention.wgsl is the general one,
// for prompts), standard (ATT_NS = 1) or differential (ATT_NS = 2), flash-decoding: a
// workgroup takes one unit (a head, or a DIFF head pair j, j + H/2) and one chunk of the
// keys, and walks the chunk in tiles of ATT_WG keys with an online softmax:
//   1. thread t scores key kt + t: the unit's query (in workgroup memory) · the key's row
//      (`k_dot`, the K cache's reader), for each softmax;
//   2. the tile's max and sum by workgroup reductions update the running max and sum,
//      every thread holding the same values;
//   3. thread t accumulates the unit's V dims t, t + ATT_WG, … of P·V over the tile's keys
//      (neighbouring threads read neighbouring values of a V row; each key's cache row
//      looked up once, by its thread in step 1, and four rows' values in flight).
// Every thread of the workgroup works in every step: attention.wgsl's decode shape scored
// 16 keys a tile with 16 of its 64 threads and ran each softmax on one thread (24 µs a
// layer at a depth of 64 on an H200, 174 µs at 4,096). It writes the partials as
// attention.wgsl does, per (unit, chunk) and softmax: the running max m, the sum l, the
// unnormalised P·V (vd values); attn_combine merges the chunks. All arithmetic f32.
//
// Logit quantization (lq_qmax > 0) as attention.wgsl's: each score absmax-quantized before
// its softmax, absmax LA[r · lq_stride + h].
//
// With ROWS_META the rows are several sequences' decoded tokens (a server's slots, one pass
// for all): row r's position and page table come from row_meta(r) (pages.wgsl), its chunks
// are counted over the longest row's keys, and a chunk past a row's last key writes an
// empty partial (m = NEG_BIG, l = 0), which the combine step weighs 0. pos0 and pt_base
// then describe no row (pt_base is the rows' table).

struct Params {
    rows: u32,       // 1, or the batch's rows with ROWS_META
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    pos0: u32,       // the row's position: keys 0 ..= pos0
    q_dim: u32,
    kv_dim: u32,
    grid_x: u32,
    scale: f32,
    chunk_keys: u32, // keys per chunk (a multiple of ATT_WG)
    n_chunks: u32,
    units: u32,
    lq_qmax: f32,
    lq_stride: u32,
    cache_groups: u32,
    pt_base: u32,
    window: u32,
    sink_row: u32,
    rope_pairs: u32,    // RoPE pairs a head where K is stored before RoPE (k_before_rope), else 0
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> Q: array<f32>;
// binding 2: KC (k_at, k_dot), binding 3: VC (v_at), from the cache readers
@group(0) @binding(4) var<storage, read_write> O: array<f32>;
@group(0) @binding(5) var<storage, read> LA: array<f32>;
// binding 6: PT, the page tables (pages.wgsl)
// binding 7: RT, the RoPE table, where K is stored before RoPE (k_before_rope.wgsl)

// The unit's query (both heads of a DIFF pair), the tile's probabilities, and the cache row
// of each of the tile's keys (looked up once in the page table by the key's thread, so that
// step 3's loads do not each wait for a page-table load first).
var<workgroup> qs: array<f32, ATT_NS * ATT_MAX_HD>;
var<workgroup> ps: array<f32, ATT_NS * ATT_WG>;
var<workgroup> crows: array<u32, ATT_WG>;

// Logit s absmax-quantized against `absmax` (attention.wgsl's).
fn quantize_logit(s: f32, absmax: f32) -> f32 {
    let step = absmax / P.lq_qmax;
    if (step == 0.0) {
        return 0.0;
    }
    if (!(step < 3.0e38)) {
        return s;
    }
    let x = s / step;
    var n = trunc(x);
    if (abs(x - n) >= 0.5) {
        n += sign(x);
    }
    return step * clamp(n, -P.lq_qmax, P.lq_qmax);
}

// Where dimension d of the unit's V lives inside a cache row (attention.wgsl's).
fn v_offset(u: u32, d: u32, gqa: u32) -> u32 {
    let hd = P.head_dim;
    let c = u / gqa;
    if (ATT_NS == 1u || d < hd) {
        return c * hd + d;
    }
    return (c + P.n_kv_heads / 2u) * hd + (d - hd);
}

@compute @workgroup_size(ATT_WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let item = wg_index(wid, P.grid_x);
    // Uniform exit: the whole workgroup or none (the steps hold barriers).
    if (item >= P.rows * P.units * P.n_chunks) {
        return;
    }
    let u = item % P.units;
    let chunk = (item / P.units) % P.n_chunks;
    let row = item / (P.units * P.n_chunks);
    let hd = P.head_dim;
    let gqa = P.n_heads / P.n_kv_heads;
    let vd = hd * ATT_NS;
    var pos = P.pos0;
    var pt_base = P.pt_base;
    if (ROWS_META) {
        let m = row_meta(row);
        pos = m.x;
        pt_base = m.y;
    }
    let first_key = chunk * P.chunk_keys;
    let end_key = min(first_key + P.chunk_keys, pos + 1u);
    let stride = ATT_NS * (2u + vd);
    let b = ((row * P.units + u) * P.n_chunks + chunk) * stride;
    if (first_key >= end_key) {
        // A chunk past this row's keys (ROWS_META): an empty partial.
        for (var s = 0u; s < ATT_NS; s++) {
            for (var i = lid; i < 2u + vd; i += ATT_WG) {
                O[b + s * (2u + vd) + i] = select(0.0, NEG_BIG, i == 0u);
            }
        }
        return;
    }

    for (var i = lid; i < ATT_NS * hd; i += ATT_WG) {
        let qh = u + (i / hd) * (P.n_heads / 2u);
        qs[i] = Q[row * P.q_dim + qh * hd + i % hd];
    }
    workgroupBarrier();

    var m: array<f32, ATT_NS>;
    var l: array<f32, ATT_NS>;
    var acc: array<f32, ATT_NS * ATT_DPT>;
    for (var s = 0u; s < ATT_NS; s++) {
        m[s] = NEG_BIG;
        l[s] = 0.0;
    }
    for (var i = 0u; i < ATT_NS * ATT_DPT; i++) {
        acc[i] = 0.0;
    }
    for (var kt = first_key; kt < end_key; kt += ATT_WG) {
        let key = kt + lid;
        let valid = key < end_key;
        var crow = 0u;
        if (valid) {
            crow = cache_row_at(pt_base, key);
        }
        crows[lid] = crow;
        // 1-2. Scores, then each softmax's online update.
        for (var s = 0u; s < ATT_NS; s++) {
            var sc = NEG_BIG;
            let qh = u + s * (P.n_heads / 2u);
            if (valid) {
                sc = k_dot(key, crow, (qh / gqa) * hd, s * hd) * P.scale;
                if (P.lq_qmax > 0.0) {
                    sc = quantize_logit(sc, LA[row * P.lq_stride + qh]);
                }
            }
            let m_new = max(m[s], workgroup_max(lid, sc));
            let p = select(0.0, exp(sc - m_new), valid);
            ps[s * ATT_WG + lid] = p;
            let alpha = exp(m[s] - m_new);
            // (Its barriers also publish ps for step 3.)
            l[s] = l[s] * alpha + workgroup_sum(lid, p);
            m[s] = m_new;
            for (var j = 0u; j < ATT_DPT; j++) {
                acc[s * ATT_DPT + j] *= alpha;
            }
        }
        // 3. P·V over the tile's keys (its barriers published crows and ps), four keys'
        // values loaded before any is used.
        let n = min(ATT_WG, end_key - kt);
        for (var j = 0u; j < ATT_DPT; j++) {
            let d = lid + j * ATT_WG;
            if (d < vd) {
                let vo = v_offset(u, d, gqa);
                var c = 0u;
                for (; c + 4u <= n; c += 4u) {
                    let v0 = v_val(kt + c, crows[c], vo);
                    let v1 = v_val(kt + c + 1u, crows[c + 1u], vo);
                    let v2 = v_val(kt + c + 2u, crows[c + 2u], vo);
                    let v3 = v_val(kt + c + 3u, crows[c + 3u], vo);
                    for (var s = 0u; s < ATT_NS; s++) {
                        let pb = s * ATT_WG + c;
                        acc[s * ATT_DPT + j] += (ps[pb] * v0 + ps[pb + 1u] * v1) + (ps[pb + 2u] * v2 + ps[pb + 3u] * v3);
                    }
                }
                for (; c < n; c++) {
                    let v = v_val(kt + c, crows[c], vo);
                    for (var s = 0u; s < ATT_NS; s++) {
                        acc[s * ATT_DPT + j] += ps[s * ATT_WG + c] * v;
                    }
                }
            }
        }
        // The next tile rewrites ps.
        workgroupBarrier();
    }

    // The partials: m and l (thread 0), then P·V.
    for (var s = 0u; s < ATT_NS; s++) {
        if (lid == 0u) {
            O[b + s * (2u + vd)] = m[s];
            O[b + s * (2u + vd) + 1u] = l[s];
        }
        for (var j = 0u; j < ATT_DPT; j++) {
            let d = lid + j * ATT_WG;
            if (d < vd) {
                O[b + s * (2u + vd) + 2u + d] = acc[s * ATT_DPT + j];
            }
        }
    }
}
