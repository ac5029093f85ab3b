// The page table of the sequence a dispatch serves (runtime/src/kv_pages.rs): its position
// p is row p mod 32 of page PT[P.pt_base + p / 32] of the cache.
@group(0) @binding($PT_BINDING) var<storage, read> PT: array<u32>;

// The page holding position `pos`.
fn cache_page(pos: u32) -> u32 {
    return PT[P.pt_base + pos / 32u];
}

// The cache row holding position `pos`.
fn cache_row(pos: u32) -> u32 {
    return cache_page(pos) * 32u + pos % 32u;
}

// The cache row holding position `pos` of the sequence whose page table starts at `pt_base`
// (the batched kernels, whose rows belong to several sequences).
fn cache_row_at(pt_base: u32, pos: u32) -> u32 {
    return PT[pt_base + pos / 32u] * 32u + pos % 32u;
}

// Row `r` of a batch of several sequences' decoded tokens (ROWS_META): (its position, the
// first entry of its sequence's page table), from the rows' table that the host writes
// past the page tables, at P.pt_base.
fn row_meta(r: u32) -> vec2<u32> {
    return vec2<u32>(PT[P.pt_base + 2u * r], PT[P.pt_base + 2u * r + 1u]);
}
