//! WGSL compute shaders for duet's GPU backend, with naga validation.
//!
//! One WGSL file per op under `src/wgsl/`, a shared prelude, one weight decoder per GGUF
//! type (`src/wgsl/weights/`, reading the block bytes exactly as stored, bound as
//! `array<u32>`) and K/V-cache accessors (`src/wgsl/cache/`). [`source`] assembles the
//! WGSL of one [`Variant`]: a header with the variant's constants and the `act` type (f16
//! when the variant uses f16 arithmetic, else f32), the prelude, the snippets the op needs,
//! then the op. The tests in `tests/naga.rs` validate every variant without an adapter.

use std::fmt::{self, Write};

mod matvec;
mod params;

pub use matvec::{MV_MAX_SPLIT, MvEpilogue, MvShape, has_own_slots, norm_binding};
pub use params::*;

/// Weight element types the matmul, matvec and embedding kernels read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WeightType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
}

impl WeightType {
    pub const ALL: [WeightType; 11] = [
        WeightType::F32,
        WeightType::F16,
        WeightType::BF16,
        WeightType::Q4_0,
        WeightType::Q4_1,
        WeightType::Q5_0,
        WeightType::Q5_1,
        WeightType::Q8_0,
        WeightType::Q4K,
        WeightType::Q5K,
        WeightType::Q6K,
    ];

    pub fn name(self) -> &'static str {
        match self {
            WeightType::F32 => "F32",
            WeightType::F16 => "F16",
            WeightType::BF16 => "BF16",
            WeightType::Q4_0 => "Q4_0",
            WeightType::Q4_1 => "Q4_1",
            WeightType::Q5_0 => "Q5_0",
            WeightType::Q5_1 => "Q5_1",
            WeightType::Q8_0 => "Q8_0",
            WeightType::Q4K => "Q4_K",
            WeightType::Q5K => "Q5_K",
            WeightType::Q6K => "Q6_K",
        }
    }

    fn decoder(self) -> &'static str {
        match self {
            WeightType::F32 => include_str!("wgsl/weights/f32.wgsl"),
            WeightType::F16 => include_str!("wgsl/weights/f16.wgsl"),
            WeightType::BF16 => include_str!("wgsl/weights/bf16.wgsl"),
            WeightType::Q4_0 => include_str!("wgsl/weights/q4_0.wgsl"),
            WeightType::Q4_1 => include_str!("wgsl/weights/q4_1.wgsl"),
            WeightType::Q5_0 => include_str!("wgsl/weights/q5_0.wgsl"),
            WeightType::Q5_1 => include_str!("wgsl/weights/q5_1.wgsl"),
            WeightType::Q8_0 => include_str!("wgsl/weights/q8_0.wgsl"),
            WeightType::Q4K => include_str!("wgsl/weights/q4_k.wgsl"),
            WeightType::Q5K => include_str!("wgsl/weights/q5_k.wgsl"),
            WeightType::Q6K => include_str!("wgsl/weights/q6_k.wgsl"),
        }
    }

    fn is_k_quant(self) -> bool {
        matches!(self, WeightType::Q4K | WeightType::Q5K)
    }
}

impl fmt::Display for WeightType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Element type of a K or V cache on the GPU (the CPU's `CacheType`, byte for byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CacheElem {
    F32,
    /// Two IEEE halves per u32.
    F16,
    /// Symmetric absmax blocks of 32 values (`duet_quant::kv::absmax`): an f16 scale, then the
    /// values in 8, 6 or 4 bits — 34, 26 and 18 bytes a block. The blocks of a row are
    /// stored back to back; each row is padded with zero bytes to a whole u32 word
    /// ([`CacheElem::row_bytes`]) so that rows start word-aligned.
    Q8,
    Q6,
    Q4,
    /// Rows in each head's Hadamard basis, in signed-max blocks of 64
    /// (`duet_quant::kv::signed_max`): 66, 50 and 34 bytes a block, rows padded as above.
    Q8r,
    Q6r,
    Q4r,
    /// Per-channel groups of 32 positions (`duet_quant::kv::channel`), then an f16 window of
    /// 32 rows for the positions past the last complete group ([`CacheElem::buffer_bytes`]).
    Q8c,
    Q6c,
    Q4c,
}

/// How a [`CacheElem`] stores its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheKind {
    Plain,
    /// Blocks along each row with one f16 scale per `per_scale` values.
    Blocks {
        bits: u32,
        per_scale: u32,
    },
    Channel {
        bits: u32,
    },
}

impl CacheElem {
    pub const ALL: [CacheElem; 11] = [
        CacheElem::F32,
        CacheElem::F16,
        CacheElem::Q8,
        CacheElem::Q6,
        CacheElem::Q4,
        CacheElem::Q8r,
        CacheElem::Q6r,
        CacheElem::Q4r,
        CacheElem::Q8c,
        CacheElem::Q6c,
        CacheElem::Q4c,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CacheElem::F32 => "f32",
            CacheElem::F16 => "f16",
            CacheElem::Q8 => "q8",
            CacheElem::Q6 => "q6",
            CacheElem::Q4 => "q4",
            CacheElem::Q8r => "q8r",
            CacheElem::Q6r => "q6r",
            CacheElem::Q4r => "q4r",
            CacheElem::Q8c => "q8c",
            CacheElem::Q6c => "q6c",
            CacheElem::Q4c => "q4c",
        }
    }

    pub fn kind(self) -> CacheKind {
        use CacheElem::*;
        match self {
            F32 | F16 => CacheKind::Plain,
            Q8 | Q6 | Q4 => CacheKind::Blocks { bits: self.bits(), per_scale: 32 },
            Q8r | Q6r | Q4r => CacheKind::Blocks { bits: self.bits(), per_scale: 64 },
            Q8c | Q6c | Q4c => CacheKind::Channel { bits: self.bits() },
        }
    }

    /// Bits per stored value.
    pub fn bits(self) -> u32 {
        use CacheElem::*;
        match self {
            F32 => 32,
            F16 => 16,
            Q8 | Q8r | Q8c => 8,
            Q6 | Q6r | Q6c => 6,
            Q4 | Q4r | Q4c => 4,
        }
    }

    /// Whether rows are stored in each head's Hadamard basis.
    pub fn rotated(self) -> bool {
        matches!(self, CacheElem::Q8r | CacheElem::Q6r | CacheElem::Q4r)
    }

    /// Bytes of one cache row of `kv_dim` values as the GPU stores it, for the per-row
    /// kinds (block rows padded to a multiple of 4 bytes; `kv_dim` a multiple of the block).
    pub fn row_bytes(self, kv_dim: usize) -> usize {
        match self.kind() {
            CacheKind::Plain => (self.bits() as usize / 8) * kv_dim,
            CacheKind::Blocks { bits, per_scale } => {
                let per_scale = per_scale as usize;
                (kv_dim / per_scale * (2 + per_scale / 32 * 4 * bits as usize)).next_multiple_of(4)
            }
            CacheKind::Channel { .. } => panic!("a per-channel cache has no rows of its own"),
        }
    }

    /// Bytes of one per-channel group of 32 positions (`kv_dim` a multiple of 32).
    pub fn group_bytes(self, kv_dim: usize) -> usize {
        4 * kv_dim + 32 * kv_dim * self.bits() as usize / 8
    }

    /// Bytes of one layer's cache of `n_pages` pages of 32 positions for `n_seqs`
    /// sequences: rows, or a group per page then each sequence's window.
    pub fn buffer_bytes(self, n_pages: usize, n_seqs: usize, kv_dim: usize) -> usize {
        match self.kind() {
            CacheKind::Channel { .. } => n_pages * self.group_bytes(kv_dim) + n_seqs * 32 * 2 * kv_dim,
            _ => n_pages * 32 * self.row_bytes(kv_dim),
        }
    }
}

/// Attention shape: one query row per workgroup (decode) or a tile of rows (prefill).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AttnShape {
    Decode,
    /// The decode shape over a batch of several sequences' decoded tokens, one row each (a
    /// server's slots in one pass): each row's position and page table from the rows' table
    /// (pages.wgsl's `row_meta`). Plain (f16, f32) caches only.
    DecodeRows,
    Prefill,
}

impl AttnShape {
    fn name(self) -> &'static str {
        match self {
            AttnShape::Decode => "decode",
            AttnShape::DecodeRows => "decode_rows",
            AttnShape::Prefill => "prefill",
        }
    }
}

/// A kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// One token times a weight matrix (or a group of them, by the epilogue).
    MatVec {
        ty: WeightType,
        epi: MvEpilogue,
        shape: MvShape,
        /// The input is RMSNorm(X)·G, folded into the product (store, SwiGLU and split).
        norm: bool,
    },
    MatMul(WeightType),
    Embed(WeightType),
    RmsNorm,
    Rope,
    SwiGlu,
    /// Residual add and bias broadcast.
    Add,
    CopyRow,
    /// The cache write of an element type (for the per-channel types: the groups a batch
    /// completes).
    KvWrite(CacheElem),
    /// The f16 window of a per-channel cache.
    KvWindow,
    /// RoPE on the new Q and K rows and their write into plain (f16 or f32) caches, in one
    /// pass.
    RopeKv {
        k: CacheElem,
        v: CacheElem,
        /// Rows of several sequences, each with its position and page table from the rows'
        /// table (as [`AttnShape::DecodeRows`]).
        rows: bool,
    },
    /// Hadamard rotation of row blocks (the rotated cache types' K, V, Q and output).
    Rotate,
    /// The attend step: each (query rows, unit, key chunk)'s softmax max, sum and
    /// unnormalised P·V.
    Attention {
        diff: bool,
        shape: AttnShape,
        k: CacheElem,
        v: CacheElem,
    },
    /// The combine step: the chunks merged, normalised and (DIFF) combined and RMS-normalised,
    /// or (`paired`, DIFF V2) each pair of query heads merged into one head with its gate.
    AttnCombine {
        diff: bool,
        paired: bool,
    },
    /// Per (query row, head) absmax of the attention logits over a K cache of this type
    /// (the dynamic attention-logit quantizations).
    LogitAbsmax(CacheElem),
    /// That table reduced to one absmax per head, or one for the whole tensor.
    LogitReduce,
    Dex,
    /// DIFF V2's combine of query-head pairs: `o_i = a_2i − sigmoid(g_i)·a_2i+1`.
    PairCombine,
}

impl Op {
    /// The ops whose arithmetic changes with f16: the prefill matrix product. (The decode
    /// matvec is bound by memory: it multiplies in f32.)
    pub fn uses_f16(self) -> bool {
        matches!(self, Op::MatMul(_))
    }

    /// The ops compiled with subgroup operations (they need the SUBGROUP feature).
    pub fn uses_subgroups(self) -> bool {
        matches!(self, Op::MatVec { shape, .. } if shape.subgroups)
    }

    /// The ops whose every buffer access is in range by construction, so that their
    /// modules may skip naga's bounds checks and loop bounding (`GpuOptions::trusted`):
    /// the matvec, whose weight buffers carry 16 bytes of padding for its unaligned loads,
    /// whose activations are padded to whole slots, and whose loops have fixed bounds.
    pub fn trusted(self) -> bool {
        matches!(self, Op::MatVec { .. })
    }

    /// Every op variant (the f16 flag aside).
    pub fn all() -> Vec<Op> {
        let mut v = Vec::new();
        // Every type and epilogue in the default shapes of hardware and software adapters,
        // with and without subgroups; every shape for one type (shapes only change constants).
        let mut mv = std::collections::BTreeSet::new();
        for t in WeightType::ALL {
            for epi in MvEpilogue::ALL {
                for (hw, sub) in [(true, true), (true, false), (false, true), (false, false)] {
                    let shape = MvShape::default_for(hw, sub);
                    mv.insert(Op::MatVec { ty: t, epi, shape, norm: false });
                    if epi != MvEpilogue::Add {
                        mv.insert(Op::MatVec { ty: t, epi, shape, norm: true });
                    }
                }
            }
            v.extend([Op::MatMul(t), Op::Embed(t)]);
        }
        for sub in [false, true] {
            for shape in MvShape::all(sub) {
                mv.insert(Op::MatVec { ty: WeightType::Q4_0, epi: MvEpilogue::Store, shape, norm: false });
            }
        }
        v.extend(mv);
        v.extend([
            Op::RmsNorm,
            Op::Rope,
            Op::SwiGlu,
            Op::Add,
            Op::CopyRow,
            Op::Dex,
            Op::PairCombine,
            Op::LogitReduce,
            Op::KvWindow,
            Op::Rotate,
        ]);
        for c in CacheElem::ALL {
            v.extend([Op::KvWrite(c), Op::LogitAbsmax(c)]);
        }
        for k in [CacheElem::F32, CacheElem::F16] {
            for vv in [CacheElem::F32, CacheElem::F16] {
                for rows in [false, true] {
                    v.push(Op::RopeKv { k, v: vv, rows });
                }
            }
        }
        v.push(Op::AttnCombine { diff: false, paired: true });
        for diff in [false, true] {
            v.push(Op::AttnCombine { diff, paired: false });
            for shape in [AttnShape::Decode, AttnShape::Prefill] {
                for k in CacheElem::ALL {
                    for vv in CacheElem::ALL {
                        v.push(Op::Attention { diff, shape, k, v: vv });
                    }
                }
            }
            for k in [CacheElem::F32, CacheElem::F16] {
                for vv in [CacheElem::F32, CacheElem::F16] {
                    v.push(Op::Attention { diff, shape: AttnShape::DecodeRows, k, v: vv });
                }
            }
        }
        v
    }
}

/// An op compiled with or without f16 arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Variant {
    pub op: Op,
    /// f16 products (needs the adapter's SHADER_F16). Only meaningful when
    /// [`Op::uses_f16`]; ignored (treated as false) otherwise.
    pub f16: bool,
}

impl Variant {
    pub fn new(op: Op, f16: bool) -> Variant {
        Variant { op, f16: f16 && op.uses_f16() }
    }

    /// Every distinct variant: each op in f32 and, for the matrix products, in f16.
    pub fn all() -> Vec<Variant> {
        let mut v = Vec::new();
        for op in Op::all() {
            v.push(Variant::new(op, false));
            if op.uses_f16() {
                v.push(Variant::new(op, true));
            }
        }
        v
    }

    /// A short name for labels and error messages.
    pub fn label(&self) -> String {
        let f = if self.f16 { "-f16" } else { "" };
        let c = |c: CacheElem| c.name();
        match self.op {
            Op::MatVec { ty, epi, shape, norm } => {
                format!("matvec-{ty}-{}{}-{shape}", if norm { "norm-" } else { "" }, epi.name())
            }
            Op::MatMul(t) => format!("matmul-{t}{f}"),
            Op::Embed(t) => format!("embed-{t}"),
            Op::RmsNorm => "rms_norm".into(),
            Op::Rope => "rope".into(),
            Op::SwiGlu => "swiglu".into(),
            Op::Add => "add".into(),
            Op::CopyRow => "copy_row".into(),
            Op::Dex => "dex".into(),
            Op::PairCombine => "pair_combine".into(),
            Op::KvWrite(e) => format!("kv_write-{}", c(e)),
            Op::KvWindow => "kv_window".into(),
            Op::RopeKv { k, v, rows } => format!("rope_kv-k{}-v{}{}", c(k), c(v), if rows { "-rows" } else { "" }),
            Op::Rotate => "rotate".into(),
            Op::LogitAbsmax(e) => format!("logit_absmax-k{}", c(e)),
            Op::LogitReduce => "logit_reduce".into(),
            Op::Attention { diff, shape, k, v } => {
                format!("attention-{}-{}-k{}-v{}", if diff { "diff" } else { "std" }, shape.name(), c(k), c(v))
            }
            Op::AttnCombine { diff, paired } => {
                format!(
                    "attn_combine-{}",
                    if paired {
                        "pairs"
                    } else if diff {
                        "diff"
                    } else {
                        "std"
                    }
                )
            }
        }
    }
}

/// Tile of the prefill matmul: weight rows × tokens per workgroup (256 threads).
pub const MM_TM: u32 = 64;
pub const MM_TN: u32 = 64;
/// Attention workgroup size and the largest head_dim the kernels accept.
pub const ATT_WG: u32 = 64;
pub const ATT_MAX_HEAD_DIM: u32 = 128;
/// Query rows and keys per tile: (rows, keys) for each shape. Decode (attention_decode.wgsl)
/// scores a key per thread, ATT_WG keys a tile; the keys are split into chunks of whole
/// tiles over many workgroups.
pub const fn attn_tile(shape: AttnShape) -> (u32, u32) {
    match shape {
        AttnShape::Decode | AttnShape::DecodeRows => (1, ATT_WG),
        AttnShape::Prefill => (8, 32),
    }
}
/// Chunks the keys of a decoded row are split into at most (the combine step holds a weight
/// per chunk in workgroup memory).
pub const ATT_MAX_CHUNKS: u32 = 256;
/// Threads of the attention combine step's workgroups, and the output dims each owns
/// (2·ATT_MAX_HEAD_DIM at most, for DIFF).
pub const CB_WG: u32 = 64;
pub const CB_DIMS: u32 = 2 * ATT_MAX_HEAD_DIM / CB_WG;
/// Threads per workgroup of the logit-absmax kernels.
pub const LA_WG: u32 = 64;
/// Largest Hadamard block of the rotate kernel, and its workgroup size.
pub const ROT_MAX: u32 = 256;
pub const ROT_WG: u32 = 64;
/// Largest head_dim of the DEX kernel.
pub const DEX_MAX_HEAD_DIM: u32 = 256;
/// Threads per workgroup of the element-wise kernels (rope, swiglu, add, copy_row, kv_write).
pub const EW_WG: u32 = 256;

const PRELUDE: &str = include_str!("wgsl/prelude.wgsl");
const WEIGHTS_COMMON: &str = include_str!("wgsl/weights/common.wgsl");
const KSCALE: &str = include_str!("wgsl/weights/kscale.wgsl");
/// The shared tree reductions (workgroup_max, workgroup_sum) over `wg` threads.
fn workgroup_reduce(wg: u32) -> String {
    format!("const RED_WG: u32 = {wg}u;\n{}", include_str!("wgsl/workgroup_reduce.wgsl"))
}
const QUANT_COMMON: &str = include_str!("wgsl/cache/quant_common.wgsl");

/// The page table binding (`PT`, at `binding`) and `cache_row`/`cache_page`, which map a
/// sequence's positions to cache rows and pages.
fn page_table(binding: u32) -> String {
    include_str!("wgsl/cache/pages.wgsl").replace("$PT_BINDING", &binding.to_string())
}

/// The reader of the K (`which` = 'k': binding 2, `k_at`) or V ('v': binding 3, `v_at`)
/// cache: `{k,v}_at(row, col)` is the value at column `col` of cache row `row`.
fn cache_reader(which: char, e: CacheElem) -> String {
    let (binding, buf, func) = if which == 'k' { ("2", "KC", "k_at") } else { ("3", "VC", "v_at") };
    let template = |src: &str| {
        src.replace("$BINDING", binding)
            .replace("$BUF", buf)
            .replace("$FN", func)
            .replace("$BITS", &e.bits().to_string())
    };
    match (which, e.kind()) {
        ('k', CacheKind::Plain) if e == CacheElem::F32 => include_str!("wgsl/cache/k_f32.wgsl").into(),
        ('k', CacheKind::Plain) => include_str!("wgsl/cache/k_f16.wgsl").into(),
        (_, CacheKind::Plain) if e == CacheElem::F32 => include_str!("wgsl/cache/v_f32.wgsl").into(),
        (_, CacheKind::Plain) => include_str!("wgsl/cache/v_f16.wgsl").into(),
        (_, CacheKind::Blocks { per_scale, .. }) => {
            template(include_str!("wgsl/cache/absmax_read.wgsl")).replace("$PER", &per_scale.to_string())
        }
        (_, CacheKind::Channel { .. }) => template(include_str!("wgsl/cache/channel_read.wgsl")),
    }
}

/// The complete WGSL of `v` (entry point `main`).
pub fn source(v: &Variant) -> String {
    let mut s = String::new();
    let f16 = v.f16 && v.op.uses_f16();
    let _ = writeln!(s, "// duet kernel {}", v.label());
    if f16 {
        s.push_str("enable f16;\nalias act = f16;\n");
    } else {
        s.push_str("alias act = f32;\n");
    }
    let _ = writeln!(s, "const MM_TM: u32 = {MM_TM}u;\nconst MM_TN: u32 = {MM_TN}u;");
    let _ = writeln!(s, "const DEX_MAX_HD: u32 = {DEX_MAX_HEAD_DIM}u;\nconst LA_WG: u32 = {LA_WG}u;");
    s.push_str(PRELUDE);
    let weights = |s: &mut String, t: WeightType| {
        s.push_str(WEIGHTS_COMMON);
        if t.is_k_quant() {
            s.push_str(KSCALE);
        }
        s.push_str(t.decoder());
    };
    match v.op {
        Op::MatVec { ty, epi, shape, norm } => {
            weights(&mut s, ty);
            matvec::source(&mut s, ty, epi, shape, norm);
        }
        Op::MatMul(t) => {
            weights(&mut s, t);
            s.push_str(include_str!("wgsl/matmul.wgsl"));
        }
        Op::Embed(t) => {
            weights(&mut s, t);
            s.push_str(include_str!("wgsl/embed.wgsl"));
        }
        Op::RmsNorm => {
            s.push_str(&workgroup_reduce(256));
            s.push_str(include_str!("wgsl/rms_norm.wgsl"));
        }
        Op::Rope => s.push_str(include_str!("wgsl/rope.wgsl")),
        Op::SwiGlu => s.push_str(include_str!("wgsl/swiglu.wgsl")),
        Op::Add => s.push_str(include_str!("wgsl/add.wgsl")),
        Op::CopyRow => s.push_str(include_str!("wgsl/copy_row.wgsl")),
        Op::Dex => s.push_str(include_str!("wgsl/dex.wgsl")),
        Op::PairCombine => s.push_str(include_str!("wgsl/pair_combine.wgsl")),
        Op::KvWrite(e) => match e.kind() {
            CacheKind::Plain => {
                s.push_str(&page_table(3));
                s.push_str(if e == CacheElem::F32 {
                    include_str!("wgsl/cache/store_f32.wgsl")
                } else {
                    include_str!("wgsl/cache/store_f16.wgsl")
                });
                s.push_str(include_str!("wgsl/kv_write.wgsl"));
            }
            kind => {
                // The words one invocation assembles: two blocks (absmax 2 + 4·bits bytes,
                // signed-max 2 + 8·bits), or one row's 32 codes of a channel group.
                let (file, words) = match kind {
                    CacheKind::Blocks { per_scale: 32, bits } => {
                        (include_str!("wgsl/kv_write_absmax.wgsl"), (2 + 4 * bits) / 2)
                    }
                    CacheKind::Blocks { bits, .. } => {
                        (include_str!("wgsl/kv_write_signed_max.wgsl"), (2 + 8 * bits) / 2)
                    }
                    _ => (include_str!("wgsl/kv_write_channel.wgsl"), e.bits()),
                };
                let _ = writeln!(s, "const QBITS: u32 = {}u;\nconst WBUF_WORDS: u32 = {words}u;", e.bits());
                s.push_str(&page_table(3));
                s.push_str(QUANT_COMMON);
                s.push_str(include_str!("wgsl/cache/pack.wgsl"));
                s.push_str(file);
                if matches!(kind, CacheKind::Blocks { .. }) {
                    s.push_str(include_str!("wgsl/cache/block_rows.wgsl"));
                }
            }
        },
        Op::RopeKv { k, v: ve, rows } => {
            assert!(
                [k, ve].iter().all(|e| e.kind() == CacheKind::Plain),
                "rope_kv writes plain caches, not {k:?}/{ve:?}"
            );
            let _ = writeln!(
                s,
                "const K_HALF: bool = {};\nconst V_HALF: bool = {};\nconst ROWS_META: bool = {rows};",
                k == CacheElem::F16,
                ve == CacheElem::F16
            );
            s.push_str(&page_table(7));
            s.push_str(include_str!("wgsl/rope_kv.wgsl"));
        }
        Op::KvWindow => {
            s.push_str(QUANT_COMMON);
            s.push_str(include_str!("wgsl/kv_window.wgsl"));
        }
        Op::Rotate => {
            let _ = writeln!(s, "const ROT_MAX: u32 = {ROT_MAX}u;\nconst ROT_WG: u32 = {ROT_WG}u;");
            s.push_str(include_str!("wgsl/rotate.wgsl"));
        }
        Op::LogitAbsmax(k) => {
            s.push_str(&page_table(4));
            s.push_str(&cache_reader('k', k));
            s.push_str(&workgroup_reduce(LA_WG));
            s.push_str(include_str!("wgsl/logit_absmax.wgsl"));
        }
        Op::LogitReduce => {
            s.push_str(&workgroup_reduce(LA_WG));
            s.push_str(include_str!("wgsl/logit_reduce.wgsl"));
        }
        Op::Attention { diff, shape: shape @ (AttnShape::Decode | AttnShape::DecodeRows), k, v: ve } => {
            let ns = if diff { 2 } else { 1 };
            let rows = shape == AttnShape::DecodeRows;
            assert!(
                !rows || [k, ve].iter().all(|e| e.kind() == CacheKind::Plain),
                "the batched decode step reads plain caches, not {k:?}/{ve:?}"
            );
            let _ = writeln!(
                s,
                "const ATT_NS: u32 = {ns}u;\nconst ATT_WG: u32 = {ATT_WG}u;\nconst ATT_MAX_HD: u32 = {ATT_MAX_HEAD_DIM}u;\nconst ATT_DPT: u32 = {}u;\nconst ROWS_META: bool = {rows};",
                (ATT_MAX_HEAD_DIM * ns).div_ceil(ATT_WG)
            );
            s.push_str(&page_table(6));
            s.push_str(&cache_reader('k', k));
            s.push_str(&cache_reader('v', ve));
            s.push_str(&workgroup_reduce(ATT_WG));
            // The fast accessors read both caches as f16 rows: where both are.
            s.push_str(if k == CacheElem::F16 && ve == CacheElem::F16 {
                include_str!("wgsl/attention_kdot_f16.wgsl")
            } else {
                include_str!("wgsl/attention_kdot.wgsl")
            });
            s.push_str(include_str!("wgsl/attention_decode.wgsl"));
        }
        Op::Attention { diff, shape, k, v: ve } => {
            let ns = if diff { 2 } else { 1 };
            let (br, bc) = attn_tile(shape);
            let acc = (br * ATT_MAX_HEAD_DIM * ns).div_ceil(ATT_WG);
            let _ = writeln!(
                s,
                "const ATT_NS: u32 = {ns}u;\nconst ATT_BR: u32 = {br}u;\nconst ATT_BC: u32 = {bc}u;\nconst ATT_WG: u32 = {ATT_WG}u;\nconst ATT_ACC: u32 = {acc}u;"
            );
            s.push_str(&page_table(6));
            s.push_str(&cache_reader('k', k));
            s.push_str(&cache_reader('v', ve));
            s.push_str(include_str!("wgsl/attention.wgsl"));
        }
        Op::AttnCombine { diff, paired } => {
            assert!(!(diff && paired), "a DIFF unit has no query-head pairs");
            let ns = if diff { 2 } else { 1 };
            let _ = writeln!(
                s,
                "const ATT_NS: u32 = {ns}u;\nconst ATT_PAIRED: bool = {paired};\nconst CB_WG: u32 = {CB_WG}u;\nconst CB_DIMS: u32 = {CB_DIMS}u;\nconst CB_MAX_CHUNKS: u32 = {ATT_MAX_CHUNKS}u;"
            );
            s.push_str(&workgroup_reduce(CB_WG));
            s.push_str(include_str!("wgsl/attn_combine.wgsl"));
        }
    }
    s
}
