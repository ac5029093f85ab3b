// The attend step of causal attention over the K/V cache, standard (ATT_NS = 1) or
// differential (ATT_NS = 2), for decode (ATT_BR = 1 query row per workgroup) and prefill
// (ATT_BR rows per workgroup); attn_combine.wgsl is the combine step.
//
// A workgroup takes ATT_BR query rows of one unit (a head, or a DIFF head pair j, j + H/2)
// and one chunk of the keys (chunk c: keys c·chunk_keys ..; prefill has one chunk, decode
// splits long caches so that many workgroups share one row: flash-decoding), and walks its
// keys in tiles of ATT_BC with an online softmax: per tile it computes the scores of every
// (softmax, row, key), updates each row's running max and sum, rescales the accumulators
// and adds P·V. Both DIFF softmaxes run in the same pass over K/V and weight the same
// 2·head_dim-wide V (KV heads c and c + Hkv/2). It writes, per (row, unit, chunk) and
// softmax, the running max m, the sum l and the unnormalised P·V (vd values) to the
// partials buffer O; the combine step merges the chunks and normalises. All arithmetic f32.
//
// With lq_qmax > 0 each logit is absmax-quantized before its softmax (the DIFF paper's
// §3.7): s' = step · clamp(round(s / step), −m, m), m = lq_qmax, step = absmax / m, round
// halves away from zero (as the CPU backend's LogitQuant::apply). The absmax of query row r,
// query head h is LA[r · lq_stride + h]: per row (stride n_heads, from logit_absmax) or per
// head (stride 0: static scales, or logit_reduce's per-head / whole-tensor maxima).

struct Params {
    rows: u32,       // query rows (positions pos0 ..)
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    pos0: u32,
    q_dim: u32,      // n_heads · head_dim
    kv_dim: u32,     // n_kv_heads · head_dim
    grid_x: u32,
    scale: f32,
    chunk_keys: u32, // keys per chunk (a multiple of ATT_BC)
    n_chunks: u32,   // chunks per (row tile, unit)
    units: u32,      // n_heads (standard) or n_heads / 2 (differential)
    lq_qmax: f32,    // 2^(bits−1) − 1 of the logit quantization, 0: off
    lq_stride: u32,  // LA's row stride (n_heads or 0)
    cache_groups: u32,  // groups a per-channel cache holds (its readers need it)
    pt_base: u32,       // the sequence's page table in PT (binding 6)
    window: u32,        // the sequence's window in a per-channel cache
    sink_row: u32,      // and its sink's first f16 row (channel_read)
    rope_pairs: u32,    // RoPE pairs a head where K is stored before RoPE (k_before_rope), else 0
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> Q: array<f32>;
// binding 2: KC (k_at), binding 3: VC (v_at), from the cache readers
// The partials: per ((row · units + unit) · n_chunks + chunk), ATT_NS blocks of
// [m, l, P·V (vd values)].
@group(0) @binding(4) var<storage, read_write> O: array<f32>;
@group(0) @binding(5) var<storage, read> LA: array<f32>;
// binding 6: PT, the page tables (pages.wgsl)
// binding 7: RT, the RoPE table, where K is stored before RoPE (k_before_rope.wgsl)

const NSC: u32 = ATT_NS * ATT_BR * ATT_BC;

var<workgroup> sc: array<f32, NSC>;
var<workgroup> m_s: array<f32, ATT_NS * ATT_BR>;
var<workgroup> l_s: array<f32, ATT_NS * ATT_BR>;
var<workgroup> a_s: array<f32, ATT_NS * ATT_BR>;

// Logit s absmax-quantized against `absmax` (see the header).
fn quantize_logit(s: f32, absmax: f32) -> f32 {
    let step = absmax / P.lq_qmax;
    if (step == 0.0) {
        return 0.0;
    }
    if (!(step < 3.0e38)) {
        return s;  // an infinite or NaN absmax leaves the logits as they are
    }
    let x = s / step;
    var n = trunc(x);
    if (abs(x - n) >= 0.5) {
        n += sign(x);
    }
    return step * clamp(n, -P.lq_qmax, P.lq_qmax);
}

// Where dimension d of the unit's V lives inside a cache row.
fn v_offset(u: u32, d: u32, gqa: u32) -> u32 {
    let hd = P.head_dim;
    let c = (u + 0u) / gqa;
    if (ATT_NS == 1u || d < hd) {
        return c * hd + d;
    }
    return (c + P.n_kv_heads / 2u) * hd + (d - hd);
}

@compute @workgroup_size(ATT_WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let item = wg_index(wid, P.grid_x);
    let n_tiles = (P.rows + ATT_BR - 1u) / ATT_BR;
    if (item >= n_tiles * P.units * P.n_chunks) {
        return;
    }
    let u = item % P.units;
    let chunk = (item / P.units) % P.n_chunks;
    let r0 = (item / (P.units * P.n_chunks)) * ATT_BR;
    let nr = min(ATT_BR, P.rows - r0);
    let hd = P.head_dim;
    let gqa = P.n_heads / P.n_kv_heads;
    let vd = hd * ATT_NS;
    // This chunk's keys: first_key .. end_key (exclusive), never empty (the host sizes the
    // chunks so that the last one starts at or before the tile's last key).
    let first_key = chunk * P.chunk_keys;
    let end_key = min(first_key + P.chunk_keys, P.pos0 + r0 + nr);

    if (lid < ATT_NS * ATT_BR) {
        m_s[lid] = NEG_BIG;
        l_s[lid] = 0.0;
    }
    var acc: array<f32, ATT_NS * ATT_ACC>;
    for (var i = 0u; i < ATT_NS * ATT_ACC; i++) {
        acc[i] = 0.0;
    }
    workgroupBarrier();

    for (var kt = first_key; kt < end_key; kt += ATT_BC) {
        // Scores of this tile.
        for (var e = lid; e < NSC; e += ATT_WG) {
            let s = e / (ATT_BR * ATT_BC);
            let r = (e / ATT_BC) % ATT_BR;
            let key = kt + e % ATT_BC;
            var v = NEG_BIG;
            if (r < nr && key <= P.pos0 + r0 + r && key < end_key) {
                let qh = u + s * (P.n_heads / 2u);
                let qb = (r0 + r) * P.q_dim + qh * hd;
                let kc = (qh / gqa) * hd;
                var d = 0.0;
                for (var i = 0u; i < hd; i++) {
                    d += Q[qb + i] * k_at(key, kc + i);
                }
                v = d * P.scale;
                if (P.lq_qmax > 0.0) {
                    v = quantize_logit(v, LA[(r0 + r) * P.lq_stride + qh]);
                }
            }
            sc[e] = v;
        }
        workgroupBarrier();
        // Online softmax: new running max, rescale factor, probabilities, running sum.
        if (lid < ATT_NS * ATT_BR) {
            let b = lid * ATT_BC;
            let m_old = m_s[lid];
            var mx = m_old;
            for (var c = 0u; c < ATT_BC; c++) {
                mx = max(mx, sc[b + c]);
            }
            let alpha = exp(m_old - mx);
            var sum = 0.0;
            for (var c = 0u; c < ATT_BC; c++) {
                let x = sc[b + c];
                let p = select(0.0, exp(x - mx), x > 0.5 * NEG_BIG);
                sc[b + c] = p;
                sum += p;
            }
            l_s[lid] = l_s[lid] * alpha + sum;
            m_s[lid] = mx;
            a_s[lid] = alpha;
        }
        workgroupBarrier();
        // P·V for the (row, dim) pairs this thread owns.
        let n_keys = min(ATT_BC, end_key - kt);
        for (var i = 0u; i < ATT_ACC; i++) {
            let a = lid + i * ATT_WG;
            if (a < nr * vd) {
                let r = a / vd;
                let vo = v_offset(u, a % vd, gqa);
                for (var s = 0u; s < ATT_NS; s++) {
                    let pb = (s * ATT_BR + r) * ATT_BC;
                    var x = acc[s * ATT_ACC + i] * a_s[s * ATT_BR + r];
                    for (var c = 0u; c < n_keys; c++) {
                        x += sc[pb + c] * v_at(kt + c, vo);
                    }
                    acc[s * ATT_ACC + i] = x;
                }
            }
        }
        workgroupBarrier();
    }

    // The partials of each row: m and l (one thread per (softmax, row)), then P·V.
    let stride = ATT_NS * (2u + vd);
    if (lid < ATT_NS * ATT_BR) {
        let s = lid / ATT_BR;
        let r = lid % ATT_BR;
        if (r < nr) {
            let b = (((r0 + r) * P.units + u) * P.n_chunks + chunk) * stride + s * (2u + vd);
            O[b] = m_s[lid];
            O[b + 1u] = l_s[lid];
        }
    }
    for (var i = 0u; i < ATT_ACC; i++) {
        let a = lid + i * ATT_WG;
        if (a < nr * vd) {
            let r = a / vd;
            let b = (((r0 + r) * P.units + u) * P.n_chunks + chunk) * stride + 2u + a % vd;
            for (var s = 0u; s < ATT_NS; s++) {
                O[b + s * (2u + vd)] = acc[s * ATT_ACC + i];
            }
        }
    }
}
