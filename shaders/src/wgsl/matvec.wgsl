// Matrix-vector product for decode (`src/matvec.rs` says why it is shaped so): one token
// times the rows of up to four matrices of one weight buffer; a few tokens (several
// sequences' decode steps) each have their own workgroups, one token per dispatch z or
// (mv_start, --gpu-tune mvinterleave) interleaved so that the tokens' workgroups of the
// same rows run side by side and read the weights from memory once; for a handful of
// tokens either beats the tiled matmul's one pass. A workgroup of MV_WG threads
// takes MV_R rows of one matrix; thread t walks slots t, t + MV_WG, … of those rows (see
// matvec_slots/common.wgsl), loading each slot's activations once for all MV_R rows. The
// main entry point (matvec_reduce_*.wgsl) sums the threads' partials and calls mv_finish,
// which applies the epilogue EPI: 0 store, 1 add into O0, 2 SwiGLU (matrix 0 the gate,
// matrix 1 the up rows), 3 split (matrix m into output m). With MV_NORM the input is
// RMSNorm(X)·G: the slot readers multiply each activation by G and add its square to `ssq`,
// the last of the MV_ACC partials, which summed over the workgroup is the row's square norm
// (the threads' slots together are the whole row), and each sum is scaled by 1/rms at the
// end. Products and sums in f32.

struct Params {
    cols: u32,       // elements per row (K), the same for every matrix
    row_bytes: u32,  // bytes per row
    grid_x: u32,     // workgroups along x of the dispatch
    x_stride4: u32,  // vec4s from one token's activations in X to the next's
    out_off: u32,    // added to every output index (a chunk's first row)
    out_stride: u32, // outputs from one token's row to the next's (store, add)
    rows0: u32,      // matrix 0: rows and first byte in W
    woff0: u32,
    rows1: u32,      // matrix 1 (split, SwiGLU's up): rows, first byte, first workgroup
    woff1: u32,
    wg1: u32,
    rows2: u32,
    woff2: u32,
    wg2: u32,
    rows3: u32,
    woff3: u32,
    wg3: u32,
    eps: f32,        // the folded RMSNorm's epsilon (MV_NORM)
    tok_x: u32,      // n > 0: tokens interleaved along x (mv_start), else one per z
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> W: array<u32>;
@group(0) @binding(2) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> O0: array<f32>;

// A workgroup's work: matrix m, its rows and first byte, the workgroup's first row r0
// (r0 >= rows: none).
struct Job {
    m: u32,
    rows: u32,
    woff: u32,
    r0: u32,
}

fn mv_job(wgi: u32) -> Job {
    if (EPI == 3u) {
        if (wgi >= P.wg3) {
            return Job(3u, P.rows3, P.woff3, (wgi - P.wg3) * MV_R);
        }
        if (wgi >= P.wg2) {
            return Job(2u, P.rows2, P.woff2, (wgi - P.wg2) * MV_R);
        }
        if (wgi >= P.wg1) {
            return Job(1u, P.rows1, P.woff1, (wgi - P.wg1) * MV_R);
        }
    }
    return Job(0u, P.rows0, P.woff0, wgi * MV_R);
}

// The workgroup's token and job. With tokens interleaved (P.tok_x = n > 0) workgroup i
// takes token i mod n of job i / n: the n tokens' workgroups of the same rows run side by
// side, so the weights come from memory once and from the cache for the other tokens;
// else the token is the dispatch's z (each token's workgroups stream the whole matrix).
fn mv_start(wid: vec3<u32>) -> Job {
    let i = wg_index(wid, P.grid_x);
    if (P.tok_x > 0u) {
        mv_token(i % P.tok_x);
        return mv_job(i / P.tok_x);
    }
    mv_token(wid.z);
    return mv_job(i);
}

// The sum of squares of the activations this thread has loaded (MV_NORM).
var<private> ssq: f32;

// The workgroup's token (workgroup z): its first vec4 in X.
var<private> tok: u32;
var<private> tok_x: u32;

fn mv_token(z: u32) {
    tok = z;
    tok_x = z * P.x_stride4;
}

// Activations `i` (a vec4 of the token's row): times the norm weight with MV_NORM, their
// squares counted.
fn xv(i: u32) -> vec4<f32> {
    let v = X[tok_x + i];
    if (MV_NORM) {
        ssq += dot(v, v);
        return v * G[i];
    }
    return v;
}

// This thread's partial sums: acc[r] for row r0 + r, (SwiGLU) acc[MV_R + r] for the same
// row of the up matrix, and (MV_NORM) last its squares. Rows past the matrix's end repeat
// its last row (their sums are dropped) so that every thread runs the same loop.
fn mv_partials(job: Job, lid: u32) -> array<f32, MV_ACC> {
    var acc: array<f32, MV_ACC>;
    let n_slots = (P.cols + SLOT_ELEMS - 1u) / SLOT_ELEMS;
    let up = P.woff1 - P.woff0;
    for (var s = lid; s < n_slots; s += MV_WG) {
        let xs = slot_x(s);
        for (var r = 0u; r < MV_R; r++) {
            let rb = job.woff + min(job.r0 + r, job.rows - 1u) * P.row_bytes;
            acc[r] += slot_dot(rb, s, xs);
            if (EPI == 2u) {
                acc[MV_R + r] += slot_dot(rb + up, s, xs);
            }
        }
    }
    if (MV_NORM) {
        acc[MV_ACC - 1u] = ssq;
    }
    return acc;
}

// Row r0 + k's sum `v` (and SwiGLU's up sum `u`; with MV_NORM `sq`, the row's square
// norm) into its output.
fn mv_finish(job: Job, k: u32, v_sum: f32, u_sum: f32, sq: f32) {
    let row = job.r0 + k;
    if (row >= job.rows) {
        return;
    }
    var v = v_sum;
    var u = u_sum;
    if (MV_NORM) {
        // As rms_norm.wgsl: 1 / sqrt(mean + eps).
        let inv = 1.0 / sqrt(sq / f32(P.cols) + P.eps);
        v *= inv;
        u *= inv;
    }
    // Split outputs and SwiGLU's are whole matrices: a token's row is `rows` long.
    var stride = P.out_stride;
    if (EPI >= 2u) {
        stride = job.rows;
    }
    let i = tok * stride + P.out_off + row;
    if (EPI == 1u) {
        O0[i] += v;
    } else if (EPI == 2u) {
        O0[i] = v / (1.0 + exp(-v)) * u;
    } else {
        store_out(job.m, i, v);
    }
}
