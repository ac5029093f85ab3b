// Reading GGUF weight bytes exactly as uploaded. The op declares `W: array<u32>` (the
// tensor's bytes, or a row range of them). Blocks are 18, 20, 22, 24, 34, 144, 176 or 210
// bytes long, so a field may start at any byte: these helpers take byte offsets.

// Four bytes starting at byte `b` (any alignment), little-endian.
fn w_u32(b: u32) -> u32 {
    let i = b >> 2u;
    let s = (b & 3u) * 8u;
    if (s == 0u) {
        return W[i];
    }
    return (W[i] >> s) | (W[i + 1u] << (32u - s));
}

// The byte at `b`.
fn w_u8(b: u32) -> u32 {
    return (W[b >> 2u] >> ((b & 3u) * 8u)) & 0xffu;
}

// The little-endian u16 at an even byte offset `b`.
fn w_u16(b: u32) -> u32 {
    return (W[b >> 2u] >> ((b & 2u) * 8u)) & 0xffffu;
}

// The IEEE half at an even byte offset `b`, as f32.
fn w_f16(b: u32) -> f32 {
    return unpack2x16float(w_u16(b)).x;
}
