// The absmax of the attention logits `scale · q · k` of each (query row, query head) over
// the row's causal keys 0 ..= pos0 + row: the scale source of the dynamic attention-logit
// quantizations (the per-row one directly; per head and per tensor after logit_reduce).
// One workgroup per (row, head); its threads stride over the keys. The dot product runs in
// the same order as attention.wgsl's, so a row's absmax is the largest logit it quantizes.

struct Params {
    rows: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    pos0: u32,
    q_dim: u32,      // n_heads · head_dim
    kv_dim: u32,     // n_kv_heads · head_dim
    grid_x: u32,
    scale: f32,
    cache_groups: u32,  // groups a per-channel cache holds (its reader needs it)
    pt_base: u32,       // the sequence's page table in PT (binding 4)
    window: u32,        // the sequence's window in a per-channel cache
    sink_row: u32,      // and its sink's first f16 row (channel_read)
    rope_pairs: u32,    // RoPE pairs a head where K is stored before RoPE (k_before_rope), else 0
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> Q: array<f32>;
// binding 2: KC (k_at), from the cache reader
@group(0) @binding(3) var<storage, read_write> LA: array<f32>;   // rows × n_heads
// binding 4: PT, the page tables (pages.wgsl)
// binding 5: RT, the RoPE table, where K is stored before RoPE (k_before_rope.wgsl)

@compute @workgroup_size(LA_WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let item = wg_index(wid, P.grid_x);
    if (item >= P.rows * P.n_heads) {
        return;
    }
    let r = item / P.n_heads;
    let qh = item % P.n_heads;
    let hd = P.head_dim;
    let qb = r * P.q_dim + qh * hd;
    let kc = (qh / (P.n_heads / P.n_kv_heads)) * hd;
    var m = 0.0;
    for (var key = lid; key <= P.pos0 + r; key += LA_WG) {
        var d = 0.0;
        for (var i = 0u; i < hd; i++) {
            d += Q[qb + i] * k_at(key, kc + i);
        }
        m = max(m, abs(d * P.scale));
    }
    let all = workgroup_max(lid, m);
    if (lid == 0u) {
        LA[item] = all;
    }
}
