@group(0) @binding(2) var<storage, read> KC: array<u32>;

fn k_at(i: u32) -> f32 {
    return unpack2x16float(KC[i >> 1u])[i & 1u];
}
