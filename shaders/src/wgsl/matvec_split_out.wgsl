// The split epilogue's outputs: matrix m's rows go to O<m>.
@group(0) @binding(4) var<storage, read_write> O1: array<f32>;
@group(0) @binding(5) var<storage, read_write> O2: array<f32>;
@group(0) @binding(6) var<storage, read_write> O3: array<f32>;

fn store_out(m: u32, i: u32, v: f32) {
    if (m == 0u) {
        O0[i] = v;
    } else if (m == 1u) {
        O1[i] = v;
    } else if (m == 2u) {
        O2[i] = v;
    } else {
        O3[i] = v;
    }
}
