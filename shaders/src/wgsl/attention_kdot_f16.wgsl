// The cache access of the decode attend step over f16 K and V caches: the key's cache row
// `crow` looked up once; K read two halves a word (kv_dim and head_dim are even, so a head's
// columns start on a word), four words in flight.
fn k_dot(key: u32, crow: u32, kc: u32, qo: u32) -> f32 {
    let w = (crow * P.kv_dim + kc) / 2u;
    var d = 0.0;
    var i = 0u;
    for (; i + 4u <= P.head_dim / 2u; i += 4u) {
        let h0 = unpack2x16float(KC[w + i]);
        let h1 = unpack2x16float(KC[w + i + 1u]);
        let h2 = unpack2x16float(KC[w + i + 2u]);
        let h3 = unpack2x16float(KC[w + i + 3u]);
        let q = qo + 2u * i;
        d += (dot(vec4<f32>(qs[q], qs[q + 1u], qs[q + 2u], qs[q + 3u]), vec4<f32>(h0, h1))
            + dot(vec4<f32>(qs[q + 4u], qs[q + 5u], qs[q + 6u], qs[q + 7u]), vec4<f32>(h2, h3)));
    }
    for (; i < P.head_dim / 2u; i++) {
        let h = unpack2x16float(KC[w + i]);
        d += qs[qo + 2u * i] * h.x + qs[qo + 2u * i + 1u] * h.y;
    }
    return d;
}

// Column c of the f16 V row in cache row `crow`.
fn v_val(key: u32, crow: u32, c: u32) -> f32 {
    let i = crow * P.kv_dim + c;
    return unpack2x16float(VC[i >> 1u])[i & 1u];
}
