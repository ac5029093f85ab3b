@group(0) @binding(2) var<storage, read> KC: array<f32>;

fn k_at(i: u32) -> f32 {
    return KC[i];
}
