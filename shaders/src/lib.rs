//! WGSL compute shaders for duet's GPU backend, with naga validation.
//!
//! One WGSL file per op under `src/wgsl/`, a shared prelude, one weight decoder per GGUF
//! type (`src/wgsl/weights/`, reading the block bytes exactly as stored, bound as
//! `array<u32>`) and K/V-cache accessors (`src/wgsl/cache/`). [`source`] assembles the
//! WGSL of one [`Variant`]: a header with the variant's constants and the `act` type (f16
//! when the variant uses f16 arithmetic, else f32), the prelude, the snippets the op needs,
//! then the op. The tests in `tests/naga.rs` validate every variant without an adapter.

use std::fmt::Write;

mod matvec;
mod params;

/// The K/V cache formats, defined once in quant (the GPU pads block rows to u32 words:
/// [`CacheFormat::word_row_bytes`]).
pub use duet_quant::GgmlType;
pub use duet_quant::kv::{CacheFormat, CacheKind};
pub use matvec::{MV_MAX_SPLIT, MvEpilogue, MvShape, has_own_slots, norm_binding};
pub use params::*;

/// The weight types the matrix, matvec and embedding kernels read: ggml's (defined once, in
/// quant), each with a WGSL decoder under `src/wgsl/weights/`.
pub const WEIGHT_TYPES: [GgmlType; 11] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Whether the kernels read weights of type `t` ([`WEIGHT_TYPES`]).
pub fn reads_weight(t: GgmlType) -> bool {
    WEIGHT_TYPES.contains(&t)
}

/// The WGSL that decodes a block of `t`.
///
/// # Panics
/// For a type outside [`WEIGHT_TYPES`].
fn decoder(t: GgmlType) -> &'static str {
    match t {
        GgmlType::F32 => include_str!("wgsl/weights/f32.wgsl"),
        GgmlType::F16 => include_str!("wgsl/weights/f16.wgsl"),
        GgmlType::BF16 => include_str!("wgsl/weights/bf16.wgsl"),
        GgmlType::Q4_0 => include_str!("wgsl/weights/q4_0.wgsl"),
        GgmlType::Q4_1 => include_str!("wgsl/weights/q4_1.wgsl"),
        GgmlType::Q5_0 => include_str!("wgsl/weights/q5_0.wgsl"),
        GgmlType::Q5_1 => include_str!("wgsl/weights/q5_1.wgsl"),
        GgmlType::Q8_0 => include_str!("wgsl/weights/q8_0.wgsl"),
        GgmlType::Q4_K => include_str!("wgsl/weights/q4_k.wgsl"),
        GgmlType::Q5_K => include_str!("wgsl/weights/q5_k.wgsl"),
        GgmlType::Q6_K => include_str!("wgsl/weights/q6_k.wgsl"),
        _ => panic!("no WGSL decoder for {t} weights"),
    }
}

/// Q4_K and Q5_K share the 6-bit scale unpacking (`kscale.wgsl`).
fn is_k_quant(t: GgmlType) -> bool {
    matches!(t, GgmlType::Q4_K | GgmlType::Q5_K)
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
        ty: GgmlType,
        epi: MvEpilogue,
        shape: MvShape,
        /// The input is RMSNorm(X)·G, folded into the product (store, SwiGLU and split).
        norm: bool,
    },
    MatMul(GgmlType),
    /// The prefill product on cooperative matrices (tensor cores): f16 products, f32 sums,
    /// for adapters with the cooperative-matrix feature, 16 × 16 × 16 f16 → f32 matrices
    /// and subgroups of 32 (matmul_coop.wgsl). Vulkan only: wgpu maps 8 × 8 f32 alone on
    /// Metal, and nothing on DX12. `wide`: tiles of 128 tokens rather than 64
    /// ([`coop_tile_tokens`]).
    MatMulCoop {
        ty: GgmlType,
        wide: bool,
    },
    Embed(GgmlType),
    RmsNorm,
    Rope,
    SwiGlu,
    /// Residual add and bias broadcast.
    Add,
    CopyRow,
    /// The cache write of an element type (for the per-channel types: the groups a batch
    /// completes).
    KvWrite(CacheFormat),
    /// The f16 window of a per-channel cache.
    KvWindow,
    /// RoPE on the new Q and K rows and their write into plain (f16 or f32) caches, in one
    /// pass.
    RopeKv {
        k: CacheFormat,
        v: CacheFormat,
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
        k: CacheFormat,
        v: CacheFormat,
    },
    /// The combine step: the chunks merged, normalised and (DIFF) combined and RMS-normalised,
    /// or (`paired`, DIFF V2) each pair of query heads merged into one head with its gate.
    AttnCombine {
        diff: bool,
        paired: bool,
    },
    /// Per (query row, head) absmax of the attention logits over a K cache of this type
    /// (the dynamic attention-logit quantizations).
    LogitAbsmax(CacheFormat),
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

    /// The ops built on cooperative matrices (they need the EXPERIMENTAL_COOPERATIVE_MATRIX
    /// and SHADER_F16 features, whatever the variant's f16 flag).
    pub fn uses_coop(self) -> bool {
        matches!(self, Op::MatMulCoop { .. })
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
        for t in WEIGHT_TYPES {
            for epi in MvEpilogue::ALL {
                for (hw, sub) in [(true, true), (true, false), (false, true), (false, false)] {
                    let shape = MvShape::default_for(hw, sub);
                    mv.insert(Op::MatVec { ty: t, epi, shape, norm: false });
                    if epi != MvEpilogue::Add {
                        mv.insert(Op::MatVec { ty: t, epi, shape, norm: true });
                    }
                }
            }
            v.extend([
                Op::MatMul(t),
                Op::MatMulCoop { ty: t, wide: false },
                Op::MatMulCoop { ty: t, wide: true },
                Op::Embed(t),
            ]);
        }
        for sub in [false, true] {
            for shape in MvShape::all(sub) {
                mv.insert(Op::MatVec { ty: GgmlType::Q4_0, epi: MvEpilogue::Store, shape, norm: false });
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
        for c in CacheFormat::ALL {
            v.extend([Op::KvWrite(c), Op::LogitAbsmax(c)]);
        }
        for k in [CacheFormat::F32, CacheFormat::F16] {
            for vv in [CacheFormat::F32, CacheFormat::F16] {
                for rows in [false, true] {
                    v.push(Op::RopeKv { k, v: vv, rows });
                }
            }
        }
        v.push(Op::AttnCombine { diff: false, paired: true });
        for diff in [false, true] {
            v.push(Op::AttnCombine { diff, paired: false });
            for shape in [AttnShape::Decode, AttnShape::Prefill] {
                for k in CacheFormat::ALL {
                    for vv in CacheFormat::ALL {
                        v.push(Op::Attention { diff, shape, k, v: vv });
                    }
                }
            }
            for k in [CacheFormat::F32, CacheFormat::F16] {
                for vv in [CacheFormat::F32, CacheFormat::F16] {
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
        let c = |c: CacheFormat| c.name();
        match self.op {
            Op::MatVec { ty, epi, shape, norm } => {
                format!("matvec-{ty}-{}{}-{shape}", if norm { "norm-" } else { "" }, epi.name())
            }
            Op::MatMul(t) => format!("matmul-{t}{f}"),
            Op::MatMulCoop { ty, wide } => format!("matmul_coop{}-{ty}", coop_tile_tokens(wide)),
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
/// Tokens per tile of the cooperative-matrix product (its weight rows: [`MM_TM`]): 64, or
/// 128 for the `wide` variant (2 × 4 subgroups of 32, 23 KiB of workgroup memory).
pub const fn coop_tile_tokens(wide: bool) -> u32 {
    if wide { 128 } else { 64 }
}

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
/// The prompt products' parameters, bindings and activation reader (both kernels).
const MATMUL_IO: &str = include_str!("wgsl/matmul_io.wgsl");
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
fn cache_reader(which: char, e: CacheFormat) -> String {
    let (binding, buf, func) = if which == 'k' { ("2", "KC", "k_at") } else { ("3", "VC", "v_at") };
    let template = |src: &str| {
        src.replace("$BINDING", binding)
            .replace("$BUF", buf)
            .replace("$FN", func)
            .replace("$BITS", &e.bits().to_string())
            .replace(
                "$COMPACT",
                &matches!(e.layout(), duet_quant::kv::CacheLayout::Channel(f) if f.compact_header()).to_string(),
            )
            .replace(
                "$LLOYD_MAX",
                &matches!(e.layout(), duet_quant::kv::CacheLayout::Rotated(f) if f.levels().is_some()).to_string(),
            )
    };
    match (which, e.kind()) {
        ('k', CacheKind::Plain) if e == CacheFormat::F32 => include_str!("wgsl/cache/k_f32.wgsl").into(),
        ('k', CacheKind::Plain) => include_str!("wgsl/cache/k_f16.wgsl").into(),
        (_, CacheKind::Plain) if e == CacheFormat::F32 => include_str!("wgsl/cache/v_f32.wgsl").into(),
        (_, CacheKind::Plain) => include_str!("wgsl/cache/v_f16.wgsl").into(),
        (_, CacheKind::Blocks { per_scale, .. }) => {
            template(include_str!("wgsl/cache/absmax_read.wgsl")).replace("$PER", &per_scale.to_string())
        }
        (_, CacheKind::Channel { .. }) => template(include_str!("wgsl/cache/channel_read.wgsl")),
    }
}

/// The K cache's reader, `k_at(row, col)` as [`cache_reader`]'s; for a cache of keys stored
/// before RoPE, the keys rotated as read, from the RoPE table at binding `rt_binding`
/// (`cache/k_before_rope.wgsl`; the kernel's `Params` then has `head_dim` and `rope_pairs`).
fn k_reader(e: CacheFormat, rt_binding: u32) -> String {
    if !e.keys_before_rope() {
        return cache_reader('k', e);
    }
    let stored = cache_reader('k', e).replace("k_at", "k_stored");
    stored + &include_str!("wgsl/cache/k_before_rope.wgsl").replace("$RT_BINDING", &rt_binding.to_string())
}

/// The complete WGSL of `v` (entry point `main`).
pub fn source(v: &Variant) -> String {
    let mut s = String::new();
    let f16 = v.f16 && v.op.uses_f16();
    let _ = writeln!(s, "// duet kernel {}", v.label());
    if v.op.uses_coop() {
        s.push_str("enable f16;\nenable wgpu_cooperative_matrix;\nalias act = f16;\n");
    } else if f16 {
        s.push_str("enable f16;\nalias act = f16;\n");
    } else {
        s.push_str("alias act = f32;\n");
    }
    let _ = writeln!(s, "const MM_TM: u32 = {MM_TM}u;\nconst MM_TN: u32 = {MM_TN}u;");
    let _ = writeln!(s, "const DEX_MAX_HD: u32 = {DEX_MAX_HEAD_DIM}u;\nconst LA_WG: u32 = {LA_WG}u;");
    // A per-channel cache's sink rows (kv_write_channel, channel_read).
    let _ = writeln!(s, "const CHANNEL_SINK: u32 = {}u;", duet_quant::kv::channel::SINK);
    // The compact headers' step grid (kv_write_channel, channel_read): K[i] − 128, a byte
    // each, four to a word — an array indexed at run time would become a function-local
    // copy with an explicit layout, which spirv-val refuses (VUID-StandaloneSpirv-None-10684).
    for (j, four) in duet_quant::kv::channel_header::K.chunks(4).enumerate() {
        let word = four.iter().enumerate().fold(0u32, |w, (b, &k)| w | (k - 128) << (8 * b));
        let _ = writeln!(s, "const COMPACT_K{j}: u32 = {word:#010x}u;");
    }
    s.push_str(include_str!("wgsl/cache/channel_header.wgsl"));
    // q3r's Lloyd–Max levels (kv_write_signed_max, absmax_read): four i8 to a word, for the
    // same reason; the scale 13/512 written out exactly.
    let levels = duet_quant::kv::lloyd_max::LEVELS;
    for (j, four) in levels.chunks(4).enumerate() {
        let word = four.iter().enumerate().fold(0u32, |w, (b, &l)| w | (l as u8 as u32) << (8 * b));
        let _ = writeln!(s, "const LM_LEVELS{j}: u32 = {word:#010x}u;");
    }
    let _ = writeln!(s, "const LM_SCALE: f32 = {};", duet_quant::kv::lloyd_max::SCALE as f64);
    s.push_str(include_str!("wgsl/cache/lloyd_max.wgsl"));
    s.push_str(PRELUDE);
    let weights = |s: &mut String, t: GgmlType| {
        s.push_str(WEIGHTS_COMMON);
        if is_k_quant(t) {
            s.push_str(KSCALE);
        }
        s.push_str(decoder(t));
    };
    match v.op {
        Op::MatVec { ty, epi, shape, norm } => {
            weights(&mut s, ty);
            matvec::source(&mut s, ty, epi, shape, norm);
        }
        Op::MatMul(t) => {
            weights(&mut s, t);
            s.push_str(MATMUL_IO);
            s.push_str(include_str!("wgsl/matmul.wgsl"));
        }
        Op::MatMulCoop { ty: t, wide } => {
            let _ = writeln!(s, "const COOP_SGT: u32 = {}u;", coop_tile_tokens(wide) / 32);
            weights(&mut s, t);
            s.push_str(MATMUL_IO);
            s.push_str(include_str!("wgsl/matmul_coop.wgsl"));
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
                s.push_str(if e == CacheFormat::F32 {
                    include_str!("wgsl/cache/store_f32.wgsl")
                } else {
                    include_str!("wgsl/cache/store_f16.wgsl")
                });
                s.push_str(include_str!("wgsl/kv_write.wgsl"));
            }
            kind => {
                let file = match kind {
                    CacheKind::Blocks { per_scale: 32, .. } => include_str!("wgsl/kv_write_absmax.wgsl"),
                    CacheKind::Blocks { .. } => include_str!("wgsl/kv_write_signed_max.wgsl"),
                    _ => include_str!("wgsl/kv_write_channel.wgsl"),
                };
                let _ = writeln!(s, "const QBITS: u32 = {}u;", e.bits());
                if let duet_quant::kv::CacheLayout::Channel(f) = e.layout() {
                    let _ = writeln!(s, "const CLIP_QUARTERS: u32 = {}u;", duet_quant::kv::channel::CLIP_QUARTERS);
                    let _ = writeln!(s, "const NARROWS_RANGE: bool = {};", f.narrows_range());
                    let _ = writeln!(s, "const COMPACT: bool = {};", f.compact_header());
                }
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
                k == CacheFormat::F16,
                ve == CacheFormat::F16
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
            s.push_str(&k_reader(k, 5));
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
            s.push_str(&k_reader(k, 7));
            s.push_str(&cache_reader('v', ve));
            s.push_str(&workgroup_reduce(ATT_WG));
            // The fast accessors read both caches as f16 rows: where both are.
            s.push_str(if k == CacheFormat::F16 && ve == CacheFormat::F16 {
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
            s.push_str(&k_reader(k, 7));
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
