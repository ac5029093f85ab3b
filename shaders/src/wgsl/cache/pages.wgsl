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
