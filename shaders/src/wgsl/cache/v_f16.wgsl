@group(0) @binding(3) var<storage, read> VC: array<u32>;

// Column c of the cache row holding position `row` (cache_row: the page table).
fn v_at(row: u32, c: u32) -> f32 {
    return v_at_row(row, cache_row(row), c);
}

// The same where the caller has looked up the row's cache row `crow`.
fn v_at_row(row: u32, crow: u32, c: u32) -> f32 {
    let i = crow * P.kv_dim + c;
    return unpack2x16float(VC[i >> 1u])[i & 1u];
}
