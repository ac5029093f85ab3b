// Tiled matrix-matrix product for prefill on cooperative matrices (tensor cores):
// O[t][out_off + n] (+)= Σ_k W[n][k] · X[t][k], the same product, parameters and bindings
// as matmul.wgsl (matmul_io.wgsl). A workgroup of 2 × COOP_SGT subgroups of 32 threads
// (the runtime picks this kernel only where subgroups have 32 lanes, since a cooperative
// matrix belongs to one subgroup) computes a tile of MM_TM (64) weight rows × COOP_TN (32
// · COOP_SGT: 64 or 128) tokens; each subgroup owns a 32 × 32 block of it as 2 × 2
// accumulators of 16 × 16 f32. Each step of CK = 32 values of k dequantizes 64 × 32
// weights (decode4 of the weight type) and loads COOP_TN × 32 activations into workgroup
// memory as f16, then every subgroup does 2 × 4 multiply-adds of 16 × 16 × 16 (f16
// products, f32 sums); the wider tile dequantizes each weight once for twice the tokens.
// The accumulators leave through a 16 × 16 staging area per subgroup, so that the edges of
// the tile are bounds-checked and the residual add is done as in matmul.wgsl.
//
// Two assumptions beyond the WGSL spec, both true of NVIDIA's Vulkan driver and checked
// there by gpu_ops' matmul_on_cooperative_matrices (which gpu_speed.sh makes mandatory on
// NVIDIA machines): invocations 32s .. 32s + 31 form subgroup s (a cooperative matrix's
// operands must be uniform across its subgroup; Vulkan does not promise this mapping, so
// the runtime takes this kernel only where subgroups are exactly 32 lanes), and the
// hand-offs through wt, xt and ct across workgroupBarrier hold although naga, once the
// module uses cooperative matrices, emits the Vulkan memory model without marking these
// workgroup accesses NonPrivatePointer.

const CK: u32 = 32u;
// Row stride of the tiles in halves: 32 values and 8 of padding, so that the 16 rows a
// cooperative load reads fall in different memory banks; 80 bytes keeps every row start
// 16-byte aligned, as Vulkan requires of a cooperative load's pointer and stride.
const LDS: u32 = 40u;
// wt[n * LDS + k]: weight row n0 + n (A, row-major); xt[t * LDS + k]: token t0 + t (B, k
// down a column: column-major); ct[s * 256 + t * 16 + n]: subgroup s's staging (C,
// column-major), zero at the start (the accumulators' initial value). 14 KiB in all for
// 64 tokens, 23 KiB for 128.
const COOP_TN: u32 = 32u * COOP_SGT;
const COOP_WG: u32 = 64u * COOP_SGT;
var<workgroup> wt: array<f16, MM_TM * LDS>;
var<workgroup> xt: array<f16, COOP_TN * LDS>;
var<workgroup> ct: array<f32, 512u * COOP_SGT>;

// Subgroup `sg`'s accumulator `c` (its quarter's block (bn, bt) of 16 × 16) out to O.
fn write_block(c: coop_mat16x16<f32, C>, sg: u32, lane: u32, n_base: u32, t_base: u32) {
    coopStore(c, &ct[sg * 256u], 16u);
    workgroupBarrier();
    for (var i = 0u; i < 8u; i++) {
        let e = lane + 32u * i;
        let n = n_base + e % 16u;
        let t = t_base + e / 16u;
        if (n < P.n_rows && t < P.t_rows) {
            let o = t * P.o_stride + P.out_off + n;
            let v = ct[sg * 256u + e];
            if (P.accumulate != 0u) {
                O[o] += v;
            } else {
                O[o] = v;
            }
        }
    }
    workgroupBarrier();
}

@compute @workgroup_size(COOP_WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n0 = wid.x * MM_TM;
    let t0 = wid.y * COOP_TN;
    let sg = lid / 32u;
    let lane = lid % 32u;
    let sn = (sg % 2u) * 32u; // the subgroup's block: rows sn.., tokens st..
    let st = (sg / 2u) * 32u;
    for (var e = lid; e < 512u * COOP_SGT; e += COOP_WG) {
        ct[e] = 0.0;
    }
    workgroupBarrier();
    var c00 = coopLoad<coop_mat16x16<f32, C>>(&ct[0], 16u);
    var c01 = c00;
    var c10 = c00;
    var c11 = c00;
    for (var k0 = 0u; k0 < P.cols; k0 += CK) {
        // 64 rows × 8 vec4 of weights, COOP_TN × 8 of activations.
        for (var e = lid; e < MM_TM * 8u; e += COOP_WG) {
            let n = e / 8u;
            let k = 4u * (e % 8u);
            var w = vec4<f32>(0.0);
            if (n0 + n < P.n_rows) {
                w = decode4(P.w_off + (n0 + n) * P.row_bytes, k0 + k, P.cols);
            }
            let i = n * LDS + k;
            wt[i] = f16(w.x);
            wt[i + 1u] = f16(w.y);
            wt[i + 2u] = f16(w.z);
            wt[i + 3u] = f16(w.w);
        }
        for (var e = lid; e < COOP_TN * 8u; e += COOP_WG) {
            let t = e / 8u;
            let k = 4u * (e % 8u);
            var x = vec4<f32>(0.0);
            if (t0 + t < P.t_rows) {
                x = load_x4(t0 + t, k0 + k);
            }
            let i = t * LDS + k;
            xt[i] = f16(x.x);
            xt[i + 1u] = f16(x.y);
            xt[i + 2u] = f16(x.z);
            xt[i + 3u] = f16(x.w);
        }
        workgroupBarrier();
        for (var kb = 0u; kb < CK; kb += 16u) {
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&wt[sn * LDS + kb], LDS);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&wt[(sn + 16u) * LDS + kb], LDS);
            let b0 = coopLoad<coop_mat16x16<f16, B>>(&xt[st * LDS + kb], LDS);
            let b1 = coopLoad<coop_mat16x16<f16, B>>(&xt[(st + 16u) * LDS + kb], LDS);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
        }
        workgroupBarrier();
    }
    write_block(c00, sg, lane, n0 + sn, t0 + st);
    write_block(c01, sg, lane, n0 + sn, t0 + st + 16u);
    write_block(c10, sg, lane, n0 + sn + 16u, t0 + st);
    write_block(c11, sg, lane, n0 + sn + 16u, t0 + st + 16u);
}
