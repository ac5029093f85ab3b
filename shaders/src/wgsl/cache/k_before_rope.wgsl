// A K cache of keys stored before RoPE (q4c, q3c, q2c: duet_quant::kv::CacheFormat::
// keys_before_rope), rotated as they are read: `k_at`/`k_at_row` of key `row` (its position)
// rotate column c with its pair's other column by row·θ_m, m = (c mod head_dim) / 2, as
// RoPE does (runtime/src/cpu/ops.rs: a·cos − b·sin, a·sin + b·cos), from the RoPE table RT
// ((cos, sin) of each of P.rope_pairs pairs, per position). With no pairs (a caller that
// rotates no keys) the keys are read as stored. The stored values come from k_stored_row
// (channel_read.wgsl); a rotated value reads two of them.
@group(0) @binding($RT_BINDING) var<storage, read> RT: array<f32>;

fn k_at(row: u32, c: u32) -> f32 {
    return k_at_row(row, 0u, c);
}

fn k_at_row(row: u32, crow: u32, c: u32) -> f32 {
    let x = k_stored_row(row, crow, c);
    let m = (c % P.head_dim) / 2u;
    if (m >= P.rope_pairs) {
        return x;
    }
    // head_dim is even, so a head starts on an even column and c's partner is c ^ 1.
    let y = k_stored_row(row, crow, c ^ 1u);
    let t = 2u * (row * P.rope_pairs + m);
    if ((c & 1u) == 0u) {
        return x * RT[t] - y * RT[t + 1u];
    }
    return y * RT[t + 1u] + x * RT[t];
}
