// The matvec's entry point where the adapter has subgroup operations: each subgroup sums
// its partials with subgroupAdd, its first lane parks them in workgroup memory, and thread
// k < MV_R adds up the subgroups' sums of row k.

var<workgroup> red: array<f32, MV_ACC * MV_WG>;

@compute @workgroup_size(MV_WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) n_sg: u32,
) {
    let job = mv_start(wid);
    if (job.r0 >= job.rows) {
        return;
    }
    let acc = mv_partials(job, lid);
    for (var i = 0u; i < MV_ACC; i++) {
        let v = subgroupAdd(acc[i]);
        if (lane == 0u) {
            red[i * MV_WG + sg] = v;
        }
    }
    workgroupBarrier();
    if (lid < MV_R) {
        var v = 0.0;
        var u = 0.0;
        var sq = 0.0;
        for (var j = 0u; j < n_sg; j++) {
            v += red[lid * MV_WG + j];
            if (EPI == 2u) {
                u += red[(MV_R + lid) * MV_WG + j];
            }
            if (MV_NORM) {
                sq += red[(MV_ACC - 1u) * MV_WG + j];
            }
        }
        mv_finish(job, lid, v, u, sq);
    }
}
