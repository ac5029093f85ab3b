@group(0) @binding(3) var<storage, read> VC: array<f32>;

fn v_at(i: u32) -> f32 {
    return VC[i];
}
