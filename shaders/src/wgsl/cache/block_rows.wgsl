// The driver shared by the block-quantized cache writes (kv_write_absmax, kv_write_signed_max):
// rows r < rows of S (kv_dim values each, a multiple of BLOCK) go to the sequence's
// positions pos0 + r (cache_row: its page table). A row is kv_dim / BLOCK blocks of BB
// bytes, padded with zero bytes to a whole u32 word. Two blocks are 2·BB bytes, a multiple
// of 4, so one workgroup of 64 threads writes a pair of blocks (the last of a row may be
// single, then it also writes the row's padding) and owns every word it writes.
//
// The work of a block is spread over the threads, a value each (of BLOCK ≤ 64): the value
// of largest magnitude (the first found, as the CPU's loop finds it) by a reduction, then
// each value's code with the kernel's `block_scale` and `block_code` (correctly rounded
// divisions in integer arithmetic: slow, so one per thread, not 64 in a row), then each
// thread builds and stores one word of the pair's bytes (`block_byte`). A block is its f16
// scale, then BLOCK / 32 packed groups of 32 codes (cache/pack.wgsl). (A thread per block
// pair took 125 µs per q4r row on an H200; a thread per block's values and thread 0 packing
// the pair's 2·BB bytes, 29 µs.)

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

var<workgroup> red_key: array<f32, 64>;
var<workgroup> red_idx: array<u32, 64>;
// Each block's codes (64 a block at most) and f16 scale bits.
var<workgroup> sh_codes: array<u32, 128>;
var<workgroup> sh_scale: array<u32, 2>;

// Byte `off` of block k of the pair, from the scales and codes in workgroup memory.
fn block_byte(k: u32, off: u32) -> u32 {
    if (off < 2u) {
        return (sh_scale[k] >> (8u * off)) & 0xffu;
    }
    let g = (off - 2u) / (4u * QBITS);
    let j = (off - 2u) % (4u * QBITS);
    let b = 64u * k + 32u * g;
    var byte = 0u;
    for (var n = 0u; n < packed_fan(j); n++) {
        let f = packed_field(j, n);
        byte |= ((sh_codes[b + f.x] >> f.y) & f.z) << f.w;
    }
    return byte;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let p = wg_index(wid, P.grid_x);
    let nb = P.kv_dim / BLOCK;
    let pairs = (nb + 1u) / 2u;
    // Uniform exit: the whole workgroup or none.
    if (p >= P.rows * pairs) {
        return;
    }
    let r = p / pairs;
    let pair = p % pairs;
    let b0 = 2u * pair;
    let n = min(2u, nb - b0);
    for (var k = 0u; k < n; k++) {
        let src = r * P.kv_dim + (b0 + k) * BLOCK;
        // (|v|, index) of this thread's value (none: −1), then the largest, the lowest index
        // among equals.
        var key = -1.0;
        if (lid < BLOCK) {
            key = abs(S[src + lid]);
        }
        red_key[lid] = key;
        red_idx[lid] = lid;
        workgroupBarrier();
        for (var w = 32u; w > 0u; w /= 2u) {
            if (lid < w) {
                let ok = red_key[lid + w];
                let oi = red_idx[lid + w];
                if (ok > red_key[lid] || (ok == red_key[lid] && oi < red_idx[lid])) {
                    red_key[lid] = ok;
                    red_idx[lid] = oi;
                }
            }
            workgroupBarrier();
        }
        let m = S[src + red_idx[0]];
        // Every thread has read the winner before the next block reuses the table.
        workgroupBarrier();
        let scale = block_scale(m);
        if (lid == 0u) {
            sh_scale[k] = scale;
        }
        if (lid < BLOCK) {
            sh_codes[64u * k + lid] = block_code(S[src + lid], m, scale);
        }
    }
    workgroupBarrier();
    // Thread lid: word lid of the pair's n·BB bytes (at most 2·(2 + 8·8) = 132 bytes, 33
    // words), the row's zero padding after a single last block included.
    let nw = (n * BB + 3u) / 4u;
    if (lid < nw) {
        var word = 0u;
        for (var i = 0u; i < 4u; i++) {
            let b = 4u * lid + i;
            if (b < n * BB) {
                word |= block_byte(b / BB, b % BB) << (8u * i);
            }
        }
        let row_words = (nb * BB + 3u) / 4u;
        C[cache_row(P.pos0 + r) * row_words + pair * (BB / 2u) + lid] = word;
    }
}
