// Causal attention over the K/V cache, standard (ATT_NS = 1) or differential (ATT_NS = 2),
// for decode (ATT_BR = 1 query row per workgroup) and prefill (ATT_BR rows per workgroup).
//
// A workgroup takes ATT_BR query rows of one unit (a head, or a DIFF head pair j, j + H/2)
// and walks the keys in tiles of ATT_BC with an online softmax: per tile it computes the
// scores of every (softmax, row, key), updates each row's running max and sum, rescales
// the accumulators and adds P·V. Both DIFF softmaxes run in the same pass over K/V and
// weight the same 2·head_dim-wide V (KV heads c and c + Hkv/2). The DIFF output is
// RMSNorm(o1 − λ·o2) · (optional sub-norm weight) · (1 − λ_init). All arithmetic is f32.
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
    lambda: f32,
    out_scale: f32,  // 1 − λ_init
    eps: f32,
    has_sub_norm: u32,
    units: u32,      // n_heads (standard) or n_heads / 2 (differential)
    lq_qmax: f32,    // 2^(bits−1) − 1 of the logit quantization, 0: off
    lq_stride: u32,  // LA's row stride (n_heads or 0)
    cache_groups: u32,  // groups a per-channel cache holds (its readers need it)
    pt_base: u32,       // the sequence's page table in PT (binding 7)
    window: u32,        // the sequence's window in a per-channel cache
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> Q: array<f32>;
// binding 2: KC (k_at), binding 3: VC (v_at), from the cache readers
@group(0) @binding(4) var<storage, read_write> O: array<f32>;
@group(0) @binding(5) var<storage, read> SN: array<f32>;
@group(0) @binding(6) var<storage, read> LA: array<f32>;
// binding 7: PT, the page tables (pages.wgsl)

const NSC: u32 = ATT_NS * ATT_BR * ATT_BC;

var<workgroup> sc: array<f32, NSC>;
var<workgroup> m_s: array<f32, ATT_NS * ATT_BR>;
var<workgroup> l_s: array<f32, ATT_NS * ATT_BR>;
var<workgroup> a_s: array<f32, ATT_NS * ATT_BR>;
var<workgroup> ss: array<f32, ATT_BR * ATT_WG>;
var<workgroup> inv_s: array<f32, ATT_BR>;

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
    if (item >= n_tiles * P.units) {
        return;
    }
    let u = item % P.units;
    let r0 = (item / P.units) * ATT_BR;
    let nr = min(ATT_BR, P.rows - r0);
    let hd = P.head_dim;
    let gqa = P.n_heads / P.n_kv_heads;
    let vd = hd * ATT_NS;
    let last_key = P.pos0 + r0 + nr - 1u;

    if (lid < ATT_NS * ATT_BR) {
        m_s[lid] = NEG_BIG;
        l_s[lid] = 0.0;
    }
    var acc: array<f32, ATT_NS * ATT_ACC>;
    for (var i = 0u; i < ATT_NS * ATT_ACC; i++) {
        acc[i] = 0.0;
    }
    workgroupBarrier();

    for (var kt = 0u; kt <= last_key; kt += ATT_BC) {
        // Scores of this tile.
        for (var e = lid; e < NSC; e += ATT_WG) {
            let s = e / (ATT_BR * ATT_BC);
            let r = (e / ATT_BC) % ATT_BR;
            let key = kt + e % ATT_BC;
            var v = NEG_BIG;
            if (r < nr && key <= P.pos0 + r0 + r) {
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
        let n_keys = min(ATT_BC, last_key + 1u - kt);
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

    // Normalise; DIFF: combine the two softmaxes and RMS-normalise each row's 2·hd values.
    for (var r = 0u; r < ATT_BR; r++) {
        ss[r * ATT_WG + lid] = 0.0;
    }
    for (var i = 0u; i < ATT_ACC; i++) {
        let a = lid + i * ATT_WG;
        if (a < nr * vd) {
            let r = a / vd;
            var o = acc[i] / l_s[r];
            if (ATT_NS == 2u) {
                o -= P.lambda * acc[ATT_ACC + i] / l_s[ATT_BR + r];
            }
            acc[i] = o;
            ss[r * ATT_WG + lid] += o * o;
        }
    }
    if (ATT_NS == 2u) {
        workgroupBarrier();
        if (lid < ATT_BR) {
            var t = 0.0;
            for (var j = 0u; j < ATT_WG; j++) {
                t += ss[lid * ATT_WG + j];
            }
            inv_s[lid] = 1.0 / sqrt(t / f32(vd) + P.eps);
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < ATT_ACC; i++) {
        let a = lid + i * ATT_WG;
        if (a < nr * vd) {
            let r = a / vd;
            let d = a % vd;
            var o = acc[i];
            if (ATT_NS == 2u) {
                var g = 1.0;
                if (P.has_sub_norm != 0u) {
                    g = SN[d];
                }
                o = g * (o * inv_s[r]) * P.out_scale;
            }
            O[(r0 + r) * P.q_dim + u * vd + d] = o;
        }
    }
}
