// An f16 K/V cache: two halves per u32 (no SHADER_F16 needed).
@group(0) @binding(2) var<storage, read_write> C: array<u32>;

// Stores elements 2p and 2p+1.
fn store2(p: u32, v: vec2<f32>) {
    C[p] = pack2x16float(v);
}
