// One output (every epilogue but split).
fn store_out(m: u32, i: u32, v: f32) {
    O0[i] = v;
}
