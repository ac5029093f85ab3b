@group(0) @binding(3) var<storage, read> VC: array<u32>;

fn v_at(i: u32) -> f32 {
    return unpack2x16float(VC[i >> 1u])[i & 1u];
}
