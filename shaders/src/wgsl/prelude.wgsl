// Shared prelude of every duet kernel. The Rust side (duet_shaders::source) puts a header
// before it: `enable f16;` when the variant uses f16 arithmetic, `alias act = f16|f32;`
// (the element type of matmul products) and the kernel's constants.

// Masked attention scores (WGSL has no infinity literal; every mask uses this value).
const NEG_BIG: f32 = -1.0e30;

// The flat index of a workgroup of a 2-D dispatch grid `grid_x` workgroups wide (large
// dispatches are folded into 2-D because each dimension is limited to 65535).
fn wg_index(wid: vec3<u32>, grid_x: u32) -> u32 {
    return wid.y * grid_x + wid.x;
}

// f32 <-> f16 bit patterns (the f16 K/V cache stores two values per u32).
fn half_to_f32(bits: u32) -> f32 {
    return unpack2x16float(bits & 0xffffu).x;
}

// The four bytes of `v` as unsigned values.
fn u8x4(v: u32) -> vec4<f32> {
    return vec4<f32>(f32(v & 0xffu), f32((v >> 8u) & 0xffu), f32((v >> 16u) & 0xffu), f32(v >> 24u));
}

// The four bytes of `v` as signed (two's complement) values.
fn i8x4(v: u32) -> vec4<f32> {
    let s = bitcast<i32>(v);
    return vec4<f32>(
        f32(extractBits(s, 0u, 8u)),
        f32(extractBits(s, 8u, 8u)),
        f32(extractBits(s, 16u, 8u)),
        f32(extractBits(s, 24u, 8u)),
    );
}
