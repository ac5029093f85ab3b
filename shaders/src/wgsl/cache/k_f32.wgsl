@group(0) @binding(2) var<storage, read> KC: array<f32>;

// Column c of the cache row holding position `row` (cache_row: the page table).
fn k_at(row: u32, c: u32) -> f32 {
    return k_at_row(row, cache_row(row), c);
}

// The same where the caller has looked up the row's cache row `crow`.
fn k_at_row(row: u32, crow: u32, c: u32) -> f32 {
    return KC[crow * P.kv_dim + c];
}
