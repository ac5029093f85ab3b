// Reduces logit_absmax's rows × n_heads table to one absmax per query head (over all rows)
// or, with whole_tensor, to the largest of all, written to each head's slot. One workgroup.

struct Params {
    rows: u32,
    n_heads: u32,
    whole_tensor: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> LA: array<f32>;         // rows × n_heads
@group(0) @binding(2) var<storage, read_write> LH: array<f32>;   // n_heads

@compute @workgroup_size(LA_WG)
fn main(@builtin(local_invocation_index) lid: u32) {
    var t = 0.0;
    for (var h = lid; h < P.n_heads; h += LA_WG) {
        var m = 0.0;
        for (var r = 0u; r < P.rows; r++) {
            m = max(m, LA[r * P.n_heads + h]);
        }
        LH[h] = m;
        t = max(t, m);
    }
    let all = workgroup_max(lid, t);
    if (P.whole_tensor != 0u) {
        for (var h = lid; h < P.n_heads; h += LA_WG) {
            LH[h] = all;
        }
    }
}
