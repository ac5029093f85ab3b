// What every matvec slot reader shares. A slot is 16 weights of one row that one thread
// multiplies in one step, and the 16 activations they meet (`Xs`, four vec4s, loaded once
// for all the workgroup's rows). Each type's reader defines SLOT_ELEMS (values per slot),
// `slot_x(s)` (the activations of slot s, each vec4 through matvec.wgsl's `xv`, which
// applies a folded RMSNorm's weight) and `slot_dot(rb, s, x)` (the slot's dot product
// in the row whose bytes start at `rb`), and orders slots so that consecutive slots are
// neighbouring bytes of the row: consecutive threads then read one run of bytes.

struct Xs {
    a: vec4<f32>,
    b: vec4<f32>,
    c: vec4<f32>,
    d: vec4<f32>,
}

// The sum of a slot's activations (for the types that subtract an offset or a min).
fn xs_sum(x: Xs) -> f32 {
    return dot((x.a + x.b) + (x.c + x.d), vec4<f32>(1.0));
}

// Eight bytes at byte `b` (a multiple of 2). An unaligned pair reads a third word, which
// lies inside the buffer: weight buffers end with 16 bytes of padding.
fn w_u32x2(b: u32) -> vec2<u32> {
    let i = b >> 2u;
    let s = (b & 3u) * 8u;
    let w0 = W[i];
    let w1 = W[i + 1u];
    if (s == 0u) {
        return vec2<u32>(w0, w1);
    }
    let w2 = W[i + 2u];
    return vec2<u32>((w0 >> s) | (w1 << (32u - s)), (w1 >> s) | (w2 << (32u - s)));
}

// Sixteen bytes at byte `b` (a multiple of 2), as w_u32x2.
fn w_u32x4(b: u32) -> vec4<u32> {
    return vec4<u32>(w_u32x2(b), w_u32x2(b + 8u));
}
