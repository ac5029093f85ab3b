// Slots of any weight type: 16 consecutive values through the type's decode4. Values past
// the row's end (float types of any length) decode to 0 and their activations are masked,
// since whatever follows the row in X may be any number.
const SLOT_ELEMS: u32 = 16u;

fn slot_x4(i: u32, k: u32) -> vec4<f32> {
    if (k + 4u <= P.cols) {
        return xv(i);
    }
    if (k >= P.cols) {
        return vec4<f32>(0.0);
    }
    // Straddling the row's end (a float row whose length is not a multiple of 4; such rows
    // never have a folded norm): masked, whatever follows the row.
    return select(vec4<f32>(0.0), X[tok_x + i], vec4<u32>(k, k + 1u, k + 2u, k + 3u) < vec4<u32>(P.cols));
}

fn slot_x(s: u32) -> Xs {
    let k = 16u * s;
    return Xs(slot_x4(4u * s, k), slot_x4(4u * s + 1u, k + 4u), slot_x4(4u * s + 2u, k + 8u), slot_x4(4u * s + 3u, k + 12u));
}

fn slot_dot(rb: u32, s: u32, x: Xs) -> f32 {
    let k = 16u * s;
    let lo = dot(decode4(rb, k, P.cols), x.a) + dot(decode4(rb, k + 4u, P.cols), x.b);
    let hi = dot(decode4(rb, k + 8u, P.cols), x.c) + dot(decode4(rb, k + 12u, P.cols), x.d);
    return lo + hi;
}
