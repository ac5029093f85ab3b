// The matvec's entry point without subgroup operations: a tree over the MV_WG threads'
// partials in workgroup memory, all MV_ACC sums at each step.

var<workgroup> red: array<f32, MV_ACC * MV_WG>;

@compute @workgroup_size(MV_WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let job = mv_start(wid);
    if (job.r0 >= job.rows) {
        return;
    }
    let acc = mv_partials(job, lid);
    for (var i = 0u; i < MV_ACC; i++) {
        red[i * MV_WG + lid] = acc[i];
    }
    workgroupBarrier();
    for (var w = MV_WG / 2u; w > 0u; w /= 2u) {
        if (lid < w) {
            for (var i = 0u; i < MV_ACC; i++) {
                red[i * MV_WG + lid] += red[i * MV_WG + lid + w];
            }
        }
        workgroupBarrier();
    }
    if (lid < MV_R) {
        var u = 0.0;
        if (EPI == 2u) {
            u = red[(MV_R + lid) * MV_WG];
        }
        var sq = 0.0;
        if (MV_NORM) {
            sq = red[(MV_ACC - 1u) * MV_WG];
        }
        mv_finish(job, lid, red[lid * MV_WG], u, sq);
    }
}
