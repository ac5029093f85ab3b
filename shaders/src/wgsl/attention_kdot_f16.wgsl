// q · k for the decode attend step over an f16 K cache: the key's row found once, read two
// halves a word (kv_dim and head_dim are even, so a head's columns start on a word).
fn k_dot(key: u32, kc: u32, qo: u32) -> f32 {
    let w = (cache_row(key) * P.kv_dim + kc) / 2u;
    var d = 0.0;
    for (var i = 0u; i < P.head_dim / 2u; i++) {
        let h = unpack2x16float(KC[w + i]);
        d += qs[qo + 2u * i] * h.x + qs[qo + 2u * i + 1u] * h.y;
    }
    return d;
}
