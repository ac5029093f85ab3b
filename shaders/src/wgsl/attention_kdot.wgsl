// q · k for the decode attend step, through the K cache's element reader: the query dims
// qs[qo ..] against columns kc .. kc + head_dim of the key's row.
fn k_dot(key: u32, kc: u32, qo: u32) -> f32 {
    var d = 0.0;
    for (var i = 0u; i < P.head_dim; i++) {
        d += qs[qo + i] * k_at(key, kc + i);
    }
    return d;
}
