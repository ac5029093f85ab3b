// The largest of the LA_WG threads' values, returned to every thread (a tree reduction in
// workgroup memory). Call from uniform control flow: it holds workgroup barriers.

var<workgroup> red: array<f32, LA_WG>;

fn workgroup_max(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var w = LA_WG / 2u; w > 0u; w /= 2u) {
        if (lid < w) {
            red[lid] = max(red[lid], red[lid + w]);
        }
        workgroupBarrier();
    }
    return red[0];
}
