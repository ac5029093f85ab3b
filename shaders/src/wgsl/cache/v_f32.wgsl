@group(0) @binding(3) var<storage, read> VC: array<f32>;

// Column c of cache row `row`.
fn v_at(row: u32, c: u32) -> f32 {
    return VC[row * P.kv_dim + c];
}
