@group(0) @binding(2) var<storage, read> KC: array<f32>;

// Column c of cache row `row`.
fn k_at(row: u32, c: u32) -> f32 {
    return KC[row * P.kv_dim + c];
}
