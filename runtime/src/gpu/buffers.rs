//! GPU buffers: activations, weights (kept in their GGUF block bytes, split into row ranges
//! that fit one binding) and the K/V cache (one buffer per layer for K and for V, allocated
//! once for the whole context).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use duet_quant::GgmlType;
use duet_shaders::CacheFormat;

use super::device::GpuContext;
use crate::error::RuntimeError;
use crate::kv_cache::KvCacheSpec;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A buffer with an id (bind groups are cached by the ids of their buffers). When it is
/// dropped its id goes to `dead`, so cached bind groups that hold it can be released.
pub struct Buf {
    pub id: u64,
    pub buffer: wgpu::Buffer,
    pub size: u64,
    dead: Arc<Mutex<Vec<u64>>>,
}

impl Drop for Buf {
    fn drop(&mut self) {
        if let Ok(mut d) = self.dead.lock() {
            d.push(self.id);
        }
    }
}

/// Creates buffers and remembers which were dropped.
#[derive(Default)]
pub struct Allocator {
    pub dead: Arc<Mutex<Vec<u64>>>,
}

impl Allocator {
    /// A zeroed storage buffer of at least `size` bytes (rounded up to 4).
    pub fn storage(&self, ctx: &GpuContext, size: u64, label: &str) -> Arc<Buf> {
        let size = size.max(4).next_multiple_of(4);
        let buffer = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.wrap(buffer, size)
    }

    /// A storage buffer holding `bytes` (padded with zeros to a multiple of 4).
    pub fn init(&self, ctx: &GpuContext, bytes: &[u8], label: &str) -> Arc<Buf> {
        self.init_parts(ctx, bytes.len() as u64, &[(0, bytes)], label)
    }

    /// A storage buffer of at least `size` bytes (rounded up to 4) holding each `(offset,
    /// bytes)` of `parts` at its offset, zeros elsewhere. Written in place through the
    /// mapping, so a large weight is never copied on the host first.
    pub fn init_parts(&self, ctx: &GpuContext, size: u64, parts: &[(usize, &[u8])], label: &str) -> Arc<Buf> {
        let size = size.max(4).next_multiple_of(4);
        // In a browser a mapped range is a copy in wasm memory: a weight would be held twice
        // there while it uploads. The page's queue copies straight out of wasm memory instead
        // (WebGPU zeroes a new buffer, so the gaps need nothing).
        #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
        if parts.iter().all(|&(off, _)| off % 4 == 0) {
            let buffer = ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            for &(off, bytes) in parts {
                // Writes are whole words: a part's last bytes go in one zero-padded word
                // (within the buffer, before the next part: parts start 16-byte aligned).
                let whole = bytes.len() & !3;
                if whole > 0 {
                    ctx.queue.write_buffer(&buffer, off as u64, &bytes[..whole]);
                }
                if whole < bytes.len() {
                    let mut last = [0u8; 4];
                    last[..bytes.len() - whole].copy_from_slice(&bytes[whole..]);
                    ctx.queue.write_buffer(&buffer, (off + whole) as u64, &last);
                }
            }
            return self.wrap(buffer, size);
        }
        let buffer = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: true,
        });
        {
            let mut view = buffer.get_mapped_range_mut(..).expect("a buffer mapped at creation can be written");
            let mut end = 0;
            for &(off, bytes) in parts {
                // Mapped memory is not zeroed where parts leave gaps: clear them.
                view.slice(end..off).fill(0);
                view.slice(off..off + bytes.len()).copy_from_slice(bytes);
                end = off + bytes.len();
            }
            view.slice(end..).fill(0);
        }
        buffer.unmap();
        self.wrap(buffer, size)
    }

    pub fn wrap(&self, buffer: wgpu::Buffer, size: u64) -> Arc<Buf> {
        Arc::new(Buf { id: NEXT_ID.fetch_add(1, Ordering::Relaxed), buffer, size, dead: Arc::clone(&self.dead) })
    }
}

/// `rows × cols` f32 activations (`cap_rows` allocated).
pub struct GpuTensor {
    pub buf: Arc<Buf>,
    pub rows: usize,
    pub cap_rows: usize,
    pub cols: usize,
}

/// A row range of a weight, bound as one `array<u32>`: its rows start at byte `w_off` of
/// `buf` (0, or the weight's place in a group's buffer).
pub struct Chunk {
    pub row0: usize,
    pub rows: usize,
    pub buf: Arc<Buf>,
    pub w_off: usize,
}

pub struct GpuWeight {
    /// The type the kernels read (vectors and DEX matrices are converted to F32 at load).
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
    pub chunks: Vec<Chunk>,
}

impl GpuWeight {
    /// The whole weight as one binding (vectors and small matrices are never split).
    pub fn single(&self) -> &Arc<Buf> {
        assert_eq!(self.chunks.len(), 1, "weight is split into {} chunks", self.chunks.len());
        &self.chunks[0].buf
    }
}

/// `t` if the GPU kernels read it.
pub fn weight_type(t: GgmlType) -> Option<GgmlType> {
    duet_shaders::reads_weight(t).then_some(t)
}

/// Zero bytes after the data of every weight buffer: the matvec's unaligned 8-byte loads
/// read the word after the bytes they need (`matvec_slots/common.wgsl`), and a trusted
/// kernel has no bounds check to catch a read past the buffer.
pub const WEIGHT_PAD: usize = 16;

/// Where each weight of a group starts in the group's buffer (16-byte aligned), and the
/// buffer's size with [`WEIGHT_PAD`]; None when it would not fit one binding of
/// `max_bytes`.
pub fn group_layout(sizes: &[usize], max_bytes: u64) -> Option<(Vec<usize>, u64)> {
    let mut offsets = Vec::with_capacity(sizes.len());
    let mut end = 0usize;
    for &n in sizes {
        let off = end.next_multiple_of(16);
        offsets.push(off);
        end = off + n;
    }
    let size = (end + WEIGHT_PAD) as u64;
    (size <= max_bytes).then_some((offsets, size))
}

/// Uploads `rows` rows of `row_bytes` bytes each, in row ranges whose bytes and
/// [`WEIGHT_PAD`] fit `ctx.max_chunk_bytes`.
pub fn upload_rows(
    ctx: &GpuContext,
    alloc: &Allocator,
    name: &str,
    data: &[u8],
    rows: usize,
    row_bytes: usize,
) -> Result<Vec<Chunk>, RuntimeError> {
    let per_chunk = ((ctx.max_chunk_bytes as usize).saturating_sub(WEIGHT_PAD) / row_bytes.max(1)).min(rows.max(1));
    if per_chunk == 0 {
        return Err(RuntimeError::Device(format!(
            "tensor '{name}': one row is {row_bytes} bytes, more than the adapter binds at once ({} bytes)",
            ctx.max_chunk_bytes
        )));
    }
    let mut chunks = Vec::new();
    let mut row0 = 0;
    while row0 < rows.max(1) {
        let n = per_chunk.min(rows.max(1) - row0);
        let bytes = &data[row0 * row_bytes..((row0 + n) * row_bytes).min(data.len())];
        let size = (bytes.len() + WEIGHT_PAD) as u64;
        let buf = ctx.checked(&format!("tensor '{name}'"), || alloc.init_parts(ctx, size, &[(0, bytes)], name))?;
        chunks.push(Chunk { row0, rows: n, buf, w_off: 0 });
        row0 += n;
    }
    Ok(chunks)
}

/// Per layer, K and V for `n_pages` pages of 32 positions (and a per-channel cache's
/// windows and sinks), and the sequences' page tables: row `slot` of `page_tables` (`pages_per_seq`
/// entries) is the pages of the sequence in that slot, uploaded when they change. Past the
/// rows, at word `rows_table`, the rows' table of a batch of several sequences' decoded
/// tokens ((position, page-table row) per token, one token per slot at most).
pub struct GpuKvCache {
    pub k: Vec<Arc<Buf>>,
    pub v: Vec<Arc<Buf>>,
    pub k_elem: CacheFormat,
    pub v_elem: CacheFormat,
    pub n_ctx: usize,
    pub n_pages: usize,
    pub n_seqs: usize,
    pub kv_dim: usize,
    pub head_dim: usize,
    pub page_tables: Arc<Buf>,
    pub pages_per_seq: usize,
    /// What `page_tables` holds (or will hold once the writes queued so far land), per slot.
    pub uploaded: Vec<Vec<u32>>,
    /// The first word of the rows' table, and what it holds (as `uploaded`).
    pub rows_table: usize,
    pub rows_uploaded: Vec<u32>,
}

impl GpuKvCache {
    /// Block rows are [`CacheFormat::word_row_bytes`] (the CPU's block bytes padded to a
    /// whole u32 word); a per-channel layer is the CPU's groups, windows and sinks,
    /// unpadded ([`CacheFormat::layer_bytes`]).
    pub fn new(ctx: &GpuContext, alloc: &Allocator, spec: &KvCacheSpec) -> Result<GpuKvCache, RuntimeError> {
        spec.check()?;
        let (k_elem, v_elem) = (spec.k_type, spec.v_type);
        let (n_pages, n_seqs) = (spec.n_pages(), spec.n_seqs);
        let k_bytes = k_elem.layer_bytes(n_pages, n_seqs, spec.kv_dim, true) as u64;
        let v_bytes = v_elem.layer_bytes(n_pages, n_seqs, spec.kv_dim, true) as u64;
        let limit = ctx.limits.max_storage_buffer_binding_size.min(ctx.limits.max_buffer_size);
        if k_bytes.max(v_bytes) > limit {
            // The largest context whose layers fit, by bisection (bytes grow with positions).
            let fits = |n: usize| {
                let pages = n_seqs * crate::kv_pages::pages_for(n);
                [k_elem, v_elem].iter().all(|e| e.layer_bytes(pages, n_seqs, spec.kv_dim, true) as u64 <= limit)
            };
            let (mut lo, mut hi) = (0usize, spec.n_ctx);
            while lo + 1 < hi {
                let mid = lo + (hi - lo) / 2;
                if fits(mid) { lo = mid } else { hi = mid }
            }
            return Err(RuntimeError::Device(format!(
                "one layer's K/V cache ({} bytes for {n_seqs} × {} positions) exceeds what the GPU binds at once ({limit} bytes): the largest context that fits is {lo} tokens (lower --ctx-size)",
                k_bytes.max(v_bytes),
                spec.n_ctx
            )));
        }
        if !spec.kv_dim.is_multiple_of(2) {
            return Err(RuntimeError::Unsupported(format!(
                "the GPU K/V cache needs an even row width, not {}",
                spec.kv_dim
            )));
        }
        let mut k = Vec::with_capacity(spec.n_layers);
        let mut v = Vec::with_capacity(spec.n_layers);
        for il in 0..spec.n_layers {
            k.push(ctx.checked("the K/V cache", || alloc.storage(ctx, k_bytes, &format!("K cache {il}")))?);
            v.push(ctx.checked("the K/V cache", || alloc.storage(ctx, v_bytes, &format!("V cache {il}")))?);
        }
        let pages_per_seq = crate::kv_pages::pages_for(spec.n_ctx);
        let page_tables = ctx.checked("the K/V cache's page tables", || {
            alloc.storage(ctx, (4 * n_seqs * (pages_per_seq + 2)) as u64, "K/V page tables")
        })?;
        Ok(GpuKvCache {
            k,
            v,
            k_elem,
            v_elem,
            n_ctx: spec.n_ctx,
            n_pages,
            n_seqs,
            kv_dim: spec.kv_dim,
            head_dim: spec.head_dim,
            page_tables,
            pages_per_seq,
            uploaded: vec![Vec::new(); n_seqs],
            rows_table: n_seqs * pages_per_seq,
            rows_uploaded: Vec::new(),
        })
    }
}
