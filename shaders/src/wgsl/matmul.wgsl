// Tiled matrix-matrix product for prefill: O[t][out_off + n] (+)= Σ_k W[n][k] · X[t][k].
// A workgroup of 256 threads computes a tile of MM_TM weight rows × MM_TN tokens; each
// step dequantizes MM_TM × 32 weights (decode4 of the weight type) and loads MM_TN × 32
// activations into workgroup memory (16 KiB in f32, WebGPU's default limit), then every
// thread accumulates 4 × 4 outputs. (Steps of 16 spent two barriers per 64 products.)
// Products in `act` (f16 or f32), sums in f32.
// (Params, the bindings and load_x4: matmul_io.wgsl.)

const TK4: u32 = 8u; // 32 elements of K per step, as 8 groups of 4
var<workgroup> ws: array<vec4<act>, MM_TM * TK4>;
var<workgroup> xs: array<vec4<act>, MM_TN * TK4>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n0 = wid.x * MM_TM;
    let t0 = wid.y * MM_TN;
    let ty = lid / 16u; // 4 weight rows: n0 + 4ty ..
    let tx = lid % 16u; // 4 tokens: t0 + 4tx ..
    var acc: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        acc[i] = vec4<f32>(0.0);
    }
    for (var k0 = 0u; k0 < P.cols; k0 += 4u * TK4) {
        for (var e = lid; e < MM_TM * TK4; e += 256u) {
            let n = n0 + e / TK4;
            var w = vec4<f32>(0.0);
            if (n < P.n_rows) {
                w = decode4(P.w_off + n * P.row_bytes, k0 + 4u * (e % TK4), P.cols);
            }
            ws[e] = vec4<act>(w);
        }
        for (var e = lid; e < MM_TN * TK4; e += 256u) {
            let t = t0 + e / TK4;
            var x = vec4<f32>(0.0);
            if (t < P.t_rows) {
                x = load_x4(t, k0 + 4u * (e % TK4));
            }
            xs[e] = vec4<act>(x);
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TK4; kk++) {
            var b: array<vec4<act>, 4>;
            for (var j = 0u; j < 4u; j++) {
                b[j] = xs[(4u * tx + j) * TK4 + kk];
            }
            for (var i = 0u; i < 4u; i++) {
                let a = ws[(4u * ty + i) * TK4 + kk];
                acc[i] += vec4<f32>(f32(dot(a, b[0])), f32(dot(a, b[1])), f32(dot(a, b[2])), f32(dot(a, b[3])));
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let n = n0 + 4u * ty + i;
        if (n < P.n_rows) {
            for (var j = 0u; j < 4u; j++) {
                let t = t0 + 4u * tx + j;
                if (t < P.t_rows) {
                    let o = t * P.o_stride + P.out_off + n;
                    if (P.accumulate != 0u) {
                        O[o] += acc[i][j];
                    } else {
                        O[o] = acc[i][j];
                    }
                }
            }
        }
    }
}
