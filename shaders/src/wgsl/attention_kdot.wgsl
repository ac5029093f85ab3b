// The cache access of the decode attend step through the caches' element readers (any
// type): q · k of the query dims qs[qo ..] against columns kc .. kc + head_dim of the key at
// position `key`, and column c of the V row of position `key`; `crow`, the key's cache row,
// was looked up once by its thread (the readers' `_row` forms take it instead of reading
// the page table again for every value).
fn k_dot(key: u32, crow: u32, kc: u32, qo: u32) -> f32 {
    var d = 0.0;
    for (var i = 0u; i < P.head_dim; i++) {
        d += qs[qo + i] * k_at_row(key, crow, kc + i);
    }
    return d;
}

fn v_val(key: u32, crow: u32, c: u32) -> f32 {
    return v_at_row(key, crow, c);
}
