// The driver shared by the block-quantized cache writes (kv_write_absmax, kv_write_signed_max):
// rows r < rows of S (kv_dim values each, a multiple of BLOCK) go to the sequence's
// positions pos0 + r (cache_row: its page table). A row is kv_dim / BLOCK blocks of BB bytes, padded with zero bytes to a whole
// u32 word. Two blocks are 2·BB bytes, a multiple of 4, so each invocation quantizes a pair
// of blocks with the kernel's quantize_block (the last of a row may be single, then it also
// writes the row's padding) and owns every word it writes.

struct Params {
    rows: u32,
    kv_dim: u32,  // a multiple of BLOCK
    pos0: u32,
    grid_x: u32,
    pt_base: u32,  // the sequence's page table in PT
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> S: array<f32>;
@group(0) @binding(2) var<storage, read_write> C: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let p = wg_index(wid, P.grid_x) * 256u + lid;
    let nb = P.kv_dim / BLOCK;
    let pairs = (nb + 1u) / 2u;
    if (p >= P.rows * pairs) {
        return;
    }
    let r = p / pairs;
    let pair = p % pairs;
    let b0 = 2u * pair;
    let n = min(2u, nb - b0);
    for (var w = 0u; w < WBUF_WORDS; w++) {
        wbuf[w] = 0u;
    }
    for (var k = 0u; k < n; k++) {
        quantize_block(r * P.kv_dim + (b0 + k) * BLOCK, k * BB);
    }
    let row_words = (nb * BB + 3u) / 4u;
    let base = cache_row(P.pos0 + r) * row_words + pair * (BB / 2u);
    let nw = (n * BB + 3u) / 4u;
    for (var w = 0u; w < nw; w++) {
        C[base + w] = wbuf[w];
    }
}
