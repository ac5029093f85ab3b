@group(0) @binding(3) var<storage, read> VC: array<f32>;

// Column c of the cache row holding position `row` (cache_row: the page table).
fn v_at(row: u32, c: u32) -> f32 {
    return VC[cache_row(row) * P.kv_dim + c];
}
