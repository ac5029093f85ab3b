// The largest (workgroup_max) or the sum (workgroup_sum) of the RED_WG threads' values,
// returned to every thread: a tree reduction in workgroup memory, the same tree for every
// kernel. The kernel sets RED_WG (its workgroup size, a power of two). Call from uniform
// control flow: they hold workgroup barriers, the last after every thread has read the
// result, so that calls may follow each other.

var<workgroup> red: array<f32, RED_WG>;

fn workgroup_max(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var w = RED_WG / 2u; w > 0u; w /= 2u) {
        if (lid < w) {
            red[lid] = max(red[lid], red[lid + w]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn workgroup_sum(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var w = RED_WG / 2u; w > 0u; w /= 2u) {
        if (lid < w) {
            red[lid] += red[lid + w];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}
