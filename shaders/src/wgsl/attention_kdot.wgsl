// The cache access of the decode attend step through the caches' element readers (any
// type): q · k of the query dims qs[qo ..] against columns kc .. kc + head_dim of the key at
// position `key`, and column c of the V row of position `key` (`crow`, its cache row, is
// for the plain caches' readers: attention_kdot_f16.wgsl).
fn k_dot(key: u32, crow: u32, kc: u32, qo: u32) -> f32 {
    var d = 0.0;
    for (var i = 0u; i < P.head_dim; i++) {
        d += qs[qo + i] * k_at(key, kc + i);
    }
    return d;
}

fn v_val(key: u32, crow: u32, c: u32) -> f32 {
    return v_at(key, c);
}
