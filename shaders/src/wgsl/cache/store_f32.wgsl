// An f32 K/V cache: one value per element.
@group(0) @binding(2) var<storage, read_write> C: array<f32>;

// Stores elements 2p and 2p+1.
fn store2(p: u32, v: vec2<f32>) {
    C[2u * p] = v.x;
    C[2u * p + 1u] = v.y;
}
